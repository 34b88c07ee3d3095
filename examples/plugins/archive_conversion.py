"""Example plugin: the conversion webhook of the example ``Archive`` CRD (``examples/crds/archive.json``), whose
``v1`` (stored) says ``spec.retentionDays: 7`` and whose ``v2`` says ``spec.retention: "7d"``.

Hub and spoke: ``v1`` is the hub, ``v2`` a spoke with a converter each way. A ``v2`` retention that is no number
of days (``"forever"``) cannot be stored as ``v1``: its converter raises, and the client that wrote it reads
``conversion webhook for examples.kube-syncer.io/v2, Kind=Archive failed: archives.examples.kube-syncer.io
default/a: the converter from v2 to v1 raised ValueError: spec.retention must be a number of days like '7d', got
'forever' ...``.

Run it with ``syncer run --local`` and ``plugins = ["examples.plugins.archive_conversion"]``: against a local
control plane the sidecar points the CRD's ``spec.conversion`` at itself, and sets it back to ``None`` when it stops.
"""

from __future__ import annotations

import re
from typing import Any

from syncer.webhook import Conversion

CRD = "archives.examples.kube-syncer.io"
_DAYS = re.compile(r"^([0-9]+)d$")


def v2_to_v1(archive: dict[str, Any]) -> dict[str, Any]:
    """``spec.retention: "7d"`` becomes ``spec.retentionDays: 7``."""
    spec = archive.get("spec") or {}
    if "retention" in spec:
        retention = spec.pop("retention")
        days = _DAYS.match(retention) if isinstance(retention, str) else None
        if days is None:
            raise ValueError(f"spec.retention must be a number of days like '7d', got {retention!r}")
        spec["retentionDays"] = int(days.group(1))
    return archive


def v1_to_v2(archive: dict[str, Any]) -> dict[str, Any]:
    """``spec.retentionDays: 7`` becomes ``spec.retention: "7d"``."""
    spec = archive.get("spec") or {}
    if "retentionDays" in spec:
        spec["retention"] = f"{spec.pop('retentionDays')}d"
    return archive


def syncer_conversions(settings: dict[str, Any]) -> list[Conversion]:
    """The plugin hook: Archives convert through v1."""
    return [Conversion(CRD, hub="v1", spokes={"v2": (v2_to_v1, v1_to_v2)})]
