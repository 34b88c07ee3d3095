"""Bench-only plugin for bench/fleet_sidecar_bench.py: one per-cluster controller on ConfigMaps that prints, on
the sidecar's stdout, one JSON line the first time it reconciles in each member cluster:
``{"event": "reconciled", "cluster": NAME, "t": UNIX_TIME}`` (the sidecar logs to stderr, so stdout is free).
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from controllers import Controller, ControllerContext, ManagedController, Request
from informers import GVR

CONFIGMAPS = GVR("", "v1", "configmaps")


def syncer_controllers(settings: dict[str, Any]) -> dict[str, ManagedController]:
    """The plugin hook: the probe controller, in every member."""
    def create(ctx: ControllerContext) -> Any:
        seen = False

        async def reconcile(request: Request) -> None:
            nonlocal seen
            if not seen:
                seen = True
                sys.stdout.write(json.dumps({"event": "reconciled", "cluster": ctx.cluster, "t": time.time()}) + "\n")
                sys.stdout.flush()

        return Controller("fleet-probe", reconcile, workers=ctx.workers).for_(CONFIGMAPS).run

    return {"fleet-probe": ManagedController([CONFIGMAPS], create)}
