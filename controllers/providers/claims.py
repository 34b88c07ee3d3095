"""What the providers that read cluster state share: who holds a name several objects claim, and a kubeconfig's
bytes out of a Secret.

Holders are decided from the objects alone (never from the order events came in), so every replica and every
restart computes the same one: the oldest claimant (``creationTimestamp``), then the first by namespace and name.
"""

from __future__ import annotations

import base64
import binascii
from typing import Iterable

from loguru import logger

from informers.store import Obj, object_key

MALFORMED = b"\x00not base64"
"""What ``secret_data`` gives for a value that is not base64: the kubeconfig loader reports it as malformed, per
member, like any other bad kubeconfig (not a crash of the provider)."""


def claim_order(obj: Obj) -> tuple[str, str, str]:
    """The sort key of a claimant: oldest first, then by namespace and name. metav1.Time is serialized in UTC at
    second precision (RFC 3339), so the strings order as the times."""
    meta = obj["metadata"]
    return meta.get("creationTimestamp") or "", meta.get("namespace") or "", meta["name"]


def oldest_first(objs: Iterable[Obj]) -> list[Obj]:
    """``objs`` in claim order (``claim_order``), each key once: the holder is the first."""
    unique = {object_key(obj): obj for obj in objs}
    return sorted(unique.values(), key=claim_order)


def secret_data(secret: Obj, key: str) -> bytes | None:
    """The decoded value of data key ``key`` of ``secret``: None when missing or empty, ``MALFORMED`` when it is
    not base64."""
    encoded = (secret.get("data") or {}).get(key)
    if not encoded:
        return None
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        return MALFORMED


class ConflictLog:
    """Logs each lost claim once per holder (a claimant that keeps losing to the same holder is not logged again
    on every settle; one that now loses to another holder is)."""

    def __init__(self, component: str) -> None:
        self._log = logger.bind(component=component)
        self._logged: dict[str, tuple[str, str]] = {}  # claimant -> (cluster, holder) last logged

    def lost(self, claimant: str, cluster: str, holder: str, hint: str) -> None:
        """``claimant`` names ``cluster``, which ``holder`` holds; ``hint``: how to resolve it."""
        if self._logged.get(claimant) == (cluster, holder):
            return
        self._logged[claimant] = (cluster, holder)
        self._log.error("{} names cluster {!r}, which {} holds; it is ignored while that one does ({})", claimant,
                        cluster, holder, hint)
