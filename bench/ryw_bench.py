"""Read-your-writes (issue 32): what the barrier costs a single-cluster controller, on against off in one run.

Usage (cwd the repository):  .venv/bin/python bench/ryw_bench.py [--objects 300] [--steps 5] [--rounds 3] \
                                 [--workers 2] [--json bench/out/ryw.json]

One local control plane (``syncer.testing.ControlPlane``). Each measurement is one ``ControllerManager`` (as
``syncer run`` makes it) running one ``Controller`` over the ConfigMaps of a fresh namespace holding
``--objects`` ConfigMaps, with ``read_your_writes`` at 0 (off) or 2 s (on, the default), on a
``DiscoveringDynamicSharedInformerFactory`` of that namespace; the objects are created before and not timed.
Scenarios:

- ``write-once``: the typical controller. A reconcile reads its ConfigMap from the cache and, while it lacks the
  annotation ``done``, merge-patches it in; it never requeues. Done when every object's reconcile has seen
  ``done`` in the cache (the write's own watch event brings that reconcile).
- ``requeue-write``: the barrier's worst case. A reconcile reads the annotation ``count`` from the cache, patches
  ``count + 1`` and requeues at once (``requeue_after=0``) until ``--steps``: with the barrier on, every
  reconcile but the first waits for the previous write's watch event; off, it reads a stale count and patches
  the same value again (no-op writes) until the event comes.
- ``requeue-read``: the read path when nothing was written: ``--steps`` reconciles per object requeued at once,
  no writes.

Measured from ``manager.start()`` to done: wall seconds, this process's CPU seconds (``time.process_time``:
controller, informer, client; the control plane runs in its own processes), reconciles, writes, and the
barrier's waits and timeouts. On and off alternate, in rotating order, within each round; medians over rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loguru import logger  # noqa: E402
from prometheus_client import CollectorRegistry  # noqa: E402

from controllers import (  # noqa: E402
    Controller, ControllerManager, ManagedController, ReconcileContext, Request, Result,
)
from controllers.metrics import read_your_writes_metrics  # noqa: E402
from informers import GVR, ApiClient, DiscoveringDynamicSharedInformerFactory, DiscoveryOptions, ResourceFilter  # noqa: E402
from syncer.testing import ControlPlane  # noqa: E402

CONFIGMAPS = GVR("", "v1", "configmaps")
VARIANTS = {"off": 0.0, "on": 2.0}
SCENARIOS = ("write-once", "requeue-write", "requeue-read")


class Workload:
    """One scenario's reconcile, its counters, and when it is done."""

    def __init__(self, scenario: str, objects: int, steps: int) -> None:
        self.scenario, self.objects, self.steps = scenario, objects, steps
        self.reconciles = 0
        self.writes = 0
        self.finished: set[str] = set()
        self.counts: dict[str, int] = {}
        self.done = asyncio.Event()

    def _finish(self, name: str) -> None:
        self.finished.add(name)
        if len(self.finished) == self.objects:
            self.done.set()

    async def __call__(self, req: Request, rc: ReconcileContext) -> Result | None:
        self.reconciles += 1
        cm = rc.lister().get(req.name, req.namespace)
        if cm is None:
            return None
        annotations = cm["metadata"].get("annotations") or {}
        if self.scenario == "write-once":
            if "done" in annotations:
                self._finish(req.name)
                return None
            await self._patch(rc, req, {"done": "1"})
            return None
        if self.scenario == "requeue-write":
            n = int(annotations.get("count", "0"))
            if n >= self.steps:
                self._finish(req.name)
                return None
            await self._patch(rc, req, {"count": str(n + 1)})
            return Result(requeue_after=0)
        n = self.counts[req.name] = self.counts.get(req.name, 0) + 1
        if n >= self.steps:
            self._finish(req.name)
            return None
        return Result(requeue_after=0)

    async def _patch(self, rc: ReconcileContext, req: Request, annotations: dict[str, str]) -> None:
        self.writes += 1
        await rc.client.patch(req.name, {"metadata": {"annotations": annotations}}, type="merge",
                              namespace=req.namespace)


async def fresh_namespace(api: ApiClient, objects: int) -> str:
    ns = f"ryw-{uuid.uuid4().hex[:8]}"
    await api.request("POST", "/api/v1/namespaces", body={"metadata": {"name": ns}})
    sem = asyncio.Semaphore(32)

    async def make(i: int) -> None:
        async with sem:
            await api.request("POST", CONFIGMAPS.path(ns), body={"metadata": {"name": f"cm-{i}"},
                                                                   "data": {"x": "y" * 200}})

    await asyncio.gather(*(make(i) for i in range(objects)))
    return ns


async def measure(api: ApiClient, client: ApiClient, scenario: str, variant: str, args: argparse.Namespace,
                  timeout: float) -> dict[str, Any]:
    ns = await fresh_namespace(api, args.objects)
    registry = CollectorRegistry()
    work = Workload(scenario, args.objects, args.steps)
    factory = DiscoveringDynamicSharedInformerFactory(
        client, DiscoveryOptions(namespace=ns, filter=ResourceFilter(include=["core/configmaps"])),
        metrics_registry=registry)
    make: Callable[[Any], Any] = lambda ctx: Controller("bench", work, workers=ctx.workers,
                                                        metrics_registry=registry).for_(CONFIGMAPS).run
    mgr = ControllerManager("ryw-bench", factory, {"c": ManagedController([CONFIGMAPS], make)}, client=client,
                            metrics_registry=registry, workers=args.workers, read_your_writes=VARIANTS[variant])
    await factory.start()
    wall, cpu = time.monotonic(), time.process_time()
    await mgr.start()
    try:
        await asyncio.wait_for(work.done.wait(), timeout)
        wall, cpu = time.monotonic() - wall, time.process_time() - cpu
    finally:
        await mgr.stop()
        await factory.shutdown()
        await api.request("DELETE", f"/api/v1/namespaces/{ns}")
    ryw = read_your_writes_metrics("bench", registry)
    return {"wall_s": wall, "cpu_s": cpu, "reconciles": work.reconciles, "writes": work.writes,
            "ryw_waits": ryw.caught_up, "ryw_timeouts": ryw.timeouts,
            "ryw_wait_s": ryw.durations.total}


async def run(args: argparse.Namespace, cp: ControlPlane) -> dict[str, Any]:
    kubeconfig = str(cp.kubeconfig)
    async with ApiClient.from_kubeconfig(kubeconfig) as api, ApiClient.from_kubeconfig(kubeconfig) as client:
        await measure(api, client, "write-once", "on", args, 120)  # warm-up, not counted
        results: dict[str, dict[str, list[dict[str, Any]]]] = {s: {v: [] for v in VARIANTS} for s in SCENARIOS}
        for r in range(args.rounds):
            for scenario in SCENARIOS:
                order = list(VARIANTS) if (r + SCENARIOS.index(scenario)) % 2 == 0 else list(reversed(VARIANTS))
                for variant in order:
                    results[scenario][variant].append(await measure(api, client, scenario, variant, args, 300))
                    print(scenario, variant, r, json.dumps(results[scenario][variant][-1]), file=sys.stderr)
    return results


def summary(results: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for scenario, variants in results.items():
        med = {v: {k: statistics.median(run[k] for run in runs) for k in runs[0]} for v, runs in variants.items()}
        out[scenario] = {**med, "on/off": {k: (med["on"][k] / med["off"][k] if med["off"][k] else None)
                                           for k in ("wall_s", "cpu_s", "reconciles", "writes")}}
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--objects", type=int, default=300)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    cp = ControlPlane().start()
    try:
        results = asyncio.run(run(args, cp))
    finally:
        cp.stop()
    out = {"argv": sys.argv, "args": vars(args), "runs": results, "summary": summary(results)}
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(out, indent=2))
    print(json.dumps(out["summary"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
