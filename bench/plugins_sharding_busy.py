"""Bench-only plugin for bench/sharding_bench.py: one per-cluster controller reconciling the ConfigMap ``tick`` of
the watched namespace.

``[plugin_settings.plugins_sharding_busy]``:

- ``iterations`` (default 0): pure-Python CPU work per reconcile (a loop of that many integer steps; the bench
  calibrates it to ~5 ms on an idle core). 0: the reconcile does nothing.
- ``requeue`` (default false): re-run the reconcile after ``requeue_after`` seconds (default 0: straight back into
  the queue, no rate limiter), so each cluster's controller reconciles back to back while its unit runs.
- ``yield`` (default true): ``await asyncio.sleep(0)`` once per reconcile. Without it a reconcile that never awaits,
  requeued at once, never gives the event loop back (the worker's ``queue.get()`` does not suspend while the
  queue holds an item), which starves the process (lease renewals included); see bench/RESULTS-sharding.md.
- ``stall_s`` (default 0): the first reconcile of the process blocks the event loop that long (``time.sleep``),
  as a long GC pause or a blocking call would.

Every finished reconcile adds one to ``bench_busy_reconciles_total`` and ``bench_busy_cluster_reconciles_total
{cluster}`` (this process's default registry, served on ``/metrics``), and its work loop's thread CPU time to
``bench_busy_work_seconds_total``.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from prometheus_client import Counter

from controllers import Controller, ControllerContext, ManagedController, Request, Result
from informers import GVR

CONFIGMAPS = GVR("", "v1", "configmaps")
RECONCILES = Counter("bench_busy_reconciles", "Reconciles finished by the bench's busy controller.")
PER_CLUSTER = Counter("bench_busy_cluster_reconciles", "Reconciles finished, by cluster.", ["cluster"])
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
    requeue_after = float(settings.get("requeue_after", 0.0))
    yield_ = bool(settings.get("yield", True))
    stall = [float(settings.get("stall_s", 0.0))]

    def create(ctx: ControllerContext) -> Any:
        cluster = PER_CLUSTER.labels(ctx.cluster or "local")

        async def reconcile(req: Request) -> Result | None:
            if stall[0]:
                seconds, stall[0] = stall[0], 0.0
                time.sleep(seconds)
            if iterations:
                t0 = time.thread_time()
                burn(iterations)
                WORK_SECONDS.inc(time.thread_time() - t0)
            RECONCILES.inc()
            cluster.inc()
            if yield_:
                await asyncio.sleep(0)
            return Result(requeue_after=requeue_after) if requeue else None

        return Controller("busy", reconcile, workers=ctx.workers).watch(
            CONFIGMAPS, predicate=lambda obj: obj["metadata"]["name"] == "tick").run

    return {"busy": ManagedController([CONFIGMAPS], create)}
