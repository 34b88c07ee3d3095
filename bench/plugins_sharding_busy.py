"""Bench-only plugin for bench/sharding_bench.py: one per-cluster controller reconciling the ConfigMap ``tick`` of
the watched namespace.

``[plugin_settings.plugins_sharding_busy]``:

- ``iterations`` (default 0): pure-Python CPU work per reconcile (a loop of that many integer steps; the bench
  calibrates it to ~5 ms on an idle core). 0: the reconcile does nothing.
- ``requeue`` (default false): re-run the reconcile at once (``Result(requeue_after=0)``: straight back into the
  queue, no rate limiter), so each cluster's controller reconciles back to back while its unit runs.

Every finished reconcile adds one to ``bench_busy_reconciles_total`` (this process's default registry, served on
``/metrics``), and its CPU work's process time to ``bench_busy_work_seconds_total``.
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import Counter

from controllers import Controller, ControllerContext, ManagedController, Request, Result
from informers import GVR

CONFIGMAPS = GVR("", "v1", "configmaps")
RECONCILES = Counter("bench_busy_reconciles", "Reconciles finished by the bench's busy controller.")
WORK_SECONDS = Counter("bench_busy_work_seconds", "Thread CPU time spent in the busy controller's work loop.")


def burn(iterations: int) -> int:
    """Pure-Python CPU work: ``iterations`` steps of integer arithmetic."""
    x = 0
    for i in range(iterations):
        x = (x * 31 + i) & 0xFFFFFFF
    return x


def syncer_controllers(settings: dict[str, Any]) -> dict[str, ManagedController]:
    iterations = int(settings.get("iterations", 0))
    requeue = bool(settings.get("requeue", False))

    def create(ctx: ControllerContext) -> Any:
        async def reconcile(req: Request) -> Result | None:
            if iterations:
                t0 = time.thread_time()
                burn(iterations)
                WORK_SECONDS.inc(time.thread_time() - t0)
            RECONCILES.inc()
            return Result(requeue_after=0) if requeue else None

        return Controller("busy", reconcile, workers=ctx.workers).watch(
            CONFIGMAPS, predicate=lambda obj: obj["metadata"]["name"] == "tick").run

    return {"busy": ManagedController([CONFIGMAPS], create)}
