"""Bench-only plugin for bench/failover_bench.py: one controller reconciling every ConfigMap it watches.

It does no work per reconcile. The first finished reconcile of the process in each cluster sets
``bench_failover_first_reconcile_time_seconds{cluster}`` (Unix time; ``cluster`` is the member's name in
multi-cluster mode, empty otherwise) and every one adds to ``bench_failover_reconciles_total{cluster}`` (this
process's default registry, served on ``/metrics``).
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import Counter, Gauge

from controllers import Controller, ControllerContext, ManagedController, Request
from informers import GVR

CONFIGMAPS = GVR("", "v1", "configmaps")
FIRST = Gauge("bench_failover_first_reconcile_time_seconds", "Unix time of this process's first reconcile in a "
              "cluster.", ["cluster"])
RECONCILES = Counter("bench_failover_reconciles", "Reconciles finished.", ["cluster"])


def syncer_controllers(settings: dict[str, Any]) -> dict[str, ManagedController]:
    """The plugin hook: the controller ``failover`` on ConfigMaps."""
    reconciled: set[str] = set()  # the clusters this process has reconciled in

    def create(ctx: ControllerContext) -> Any:
        cluster = ctx.cluster or ""
        done = RECONCILES.labels(cluster)

        async def reconcile(req: Request) -> None:
            if cluster not in reconciled:
                reconciled.add(cluster)
                FIRST.labels(cluster).set(time.time())
            done.inc()

        return Controller("failover", reconcile, workers=ctx.workers).watch(CONFIGMAPS).run

    return {"failover": ManagedController([CONFIGMAPS], create)}
