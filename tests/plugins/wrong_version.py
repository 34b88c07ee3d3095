"""Test plugin: a controller requiring ``configmaps.v2``, which no API server serves (the user meant v1)."""

from __future__ import annotations

from typing import Any

from controllers import ManagedController
from informers import GVR


def syncer_controllers(settings: dict[str, Any]) -> dict[str, ManagedController]:
    return {"wrong-version": ManagedController([GVR.parse("configmaps.v2")], lambda ctx: None)}
