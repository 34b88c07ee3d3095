"""Bench-only plugin for bench/failover_bench.py: one controller reconciling every ConfigMap it watches.

It does no work per reconcile. The first finished reconcile of the process sets
``bench_failover_first_reconcile_time_seconds`` (Unix time, 0 before) and every one adds to
``bench_failover_reconciles_total`` (this process's default registry, served on ``/metrics``).
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import Counter, Gauge

from controllers import Controller, ControllerContext, ManagedController, Request
from informers import GVR

CONFIGMAPS = GVR("", "v1", "configmaps")
FIRST = Gauge("bench_failover_first_reconcile_time_seconds", "Unix time of this process's first reconcile.")
RECONCILES = Counter("bench_failover_reconciles", "Reconciles finished.")


def syncer_controllers(settings: dict[str, Any]) -> dict[str, ManagedController]:
    """The plugin hook: the controller ``failover`` on ConfigMaps."""
    first = [True]

    def create(ctx: ControllerContext) -> Any:
        async def reconcile(req: Request) -> None:
            if first[0]:
                first[0] = False
                FIRST.set(time.time())
            RECONCILES.inc()

        return Controller("failover", reconcile, workers=ctx.workers).watch(CONFIGMAPS).run

    return {"failover": ManagedController([CONFIGMAPS], create)}
