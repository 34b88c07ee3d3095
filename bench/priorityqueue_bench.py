"""A live change during a fleet bring-up: how long until it is reconciled, with the priority queue on and off.

    .venv/bin/python bench/priorityqueue_bench.py [--members 500] [--objects 20] [--join-rate 100] \
        [--reconcile-ms 2] [--change-every-ms 20] [--rounds 3]

In one process, no API server: a ``FleetLoop`` (2 workers, the ``FleetController`` default) over ``--members``
member clusters that join at ``--join-rate`` a second, each with an informer of ``--objects`` objects that has
synced (the test fakes' informer: the bench feeds its cache), through the path a real bring-up takes (the
cluster's informer joins the loop's union, which replays its cache to the loop's handler as an initial list).
A reconcile awaits ``--reconcile-ms`` (an API round trip). Meanwhile, every ``--change-every-ms``, an object of
a member already in is changed (a watch event on its informer), and the time from that event to the start of
the first reconcile that reads the changed object is its latency. Changes stop when the initial lists have all
been reconciled (the bring-up's end). Rounds alternate the queue on and off; the figures are over every round.
The target (issue): p99 <= 1 s during a 500-member bring-up.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loguru import logger  # noqa: E402
from prometheus_client import CollectorRegistry  # noqa: E402

from controllers.cluster import ClusterContext  # noqa: E402
from controllers.fleet import FleetContext, FleetController, FleetLoop, _Feed  # noqa: E402
from controllers.reconcile import Request  # noqa: E402
from informers import GVR, SharedIndexInformer  # noqa: E402
from informers.metrics import InformerMetrics  # noqa: E402

WIDGETS = GVR("bench.example.com", "v1", "widgets")


def widget(name: str, rv: int) -> dict[str, Any]:
    return {"apiVersion": "bench.example.com/v1", "kind": "Widget",
            "metadata": {"name": name, "namespace": "ns", "resourceVersion": str(rv)}}


def member_informer(metrics: InformerMetrics, cluster: str, objects: int) -> SharedIndexInformer:
    """A synced informer of the member's objects, whose cache the bench feeds in place of a reflector."""
    inf = SharedIndexInformer(None, WIDGETS, metrics=metrics.for_cluster(cluster))  # type: ignore[arg-type]
    inf.reflector.run = asyncio.Event().wait  # type: ignore[method-assign]
    inf.start()
    inf.replace([widget(f"w{i}", 1) for i in range(objects)], "1")
    return inf


async def one_round(args: argparse.Namespace, prioritized: bool, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    initial_left = args.members * args.objects
    pending: dict[tuple[str, str], tuple[int, float]] = {}  # (cluster, name) -> (changed rv, when)
    latencies: list[float] = []
    informers: dict[str, SharedIndexInformer] = {}
    seen_initial: set[tuple[str, str]] = set()
    done = asyncio.Event()

    class Reconciler:
        def __init__(self, ctx: FleetContext) -> None:
            self.ctx = ctx

        async def reconcile(self, cluster: str, request: Request) -> None:
            nonlocal initial_left
            key = (cluster, request.name)
            obj = informers[cluster].store.get(f"ns/{request.name}")
            change = pending.get(key)
            if change is not None and obj is not None and int(obj["metadata"]["resourceVersion"]) >= change[0]:
                latencies.append(time.monotonic() - change[1])
                del pending[key]
            if key not in seen_initial:
                seen_initial.add(key)
                initial_left -= 1
                if not initial_left:
                    done.set()
            await asyncio.sleep(args.reconcile_ms / 1000)

    loop = FleetLoop(f"bench-{'on' if prioritized else 'off'}", FleetController(WIDGETS, Reconciler, workers=2),
                     clients=None, priority_queue=prioritized)  # type: ignore[arg-type]
    metrics = InformerMetrics.for_registry(CollectorRegistry())
    run = asyncio.create_task(loop.run())
    started = time.monotonic()

    async def join_all() -> None:
        for i in range(args.members):
            name = f"member-{i:04}"
            inf = informers[name] = member_informer(metrics, name, args.objects)
            await _Feed(loop, ClusterContext(name), name, WIDGETS).on_gvr_synced(WIDGETS, inf)
            await asyncio.sleep(max(0.0, started + (i + 1) / args.join_rate - time.monotonic()))

    async def change_live() -> None:
        rv = 1
        while not done.is_set():
            await asyncio.sleep(args.change_every_ms / 1000)
            joined = list(informers)
            cluster, name = rng.choice(joined), f"w{rng.randrange(args.objects)}"
            if (cluster, name) in pending:
                continue
            rv += 1
            pending[(cluster, name)] = (rv, time.monotonic())
            informers[cluster].apply("MODIFIED", widget(name, rv))

    joiner = asyncio.create_task(join_all())
    changer = asyncio.create_task(change_live())
    await done.wait()
    bring_up = time.monotonic() - started
    await changer
    await asyncio.wait_for(_drained(pending), 60)  # the changes made at the very end are reconciled too
    await joiner
    run.cancel()
    await asyncio.gather(run, return_exceptions=True)
    await loop.close()
    for inf in informers.values():
        await inf.stop()
    return {"prioritized": prioritized, "bring_up": bring_up, "latencies": latencies}


async def _drained(pending: dict[Any, Any]) -> None:
    while pending:
        await asyncio.sleep(0.01)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--members", type=int, default=500)
    p.add_argument("--objects", type=int, default=20, help="objects per member")
    p.add_argument("--join-rate", type=float, default=100.0, help="members joining per second")
    p.add_argument("--reconcile-ms", type=float, default=2.0)
    p.add_argument("--change-every-ms", type=float, default=20.0)
    p.add_argument("--rounds", type=int, default=3, help="rounds of each mode, alternating")
    args = p.parse_args()
    logger.remove()  # a line per member joining, twice per round
    logger.add(sys.stderr, level="WARNING")
    results: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
    for r in range(args.rounds):
        for prioritized in ((True, False) if r % 2 == 0 else (False, True)):
            res = asyncio.run(one_round(args, prioritized, seed=r))
            results[prioritized].append(res)
            lat = res["latencies"]
            print(f"round {r} {'on ' if prioritized else 'off'}: bring-up {res['bring_up']:.1f}s, {len(lat)} live "
                  f"changes, p50 {percentile(lat, 0.5) * 1000:.0f} ms, p99 {percentile(lat, 0.99) * 1000:.0f} ms, "
                  f"max {max(lat) * 1000:.0f} ms", flush=True)
    print(f"\nmembers={args.members} objects={args.objects} join-rate={args.join_rate}/s "
          f"reconcile={args.reconcile_ms} ms change-every={args.change_every_ms} ms rounds={args.rounds}")
    print(f"{'priority queue':>15} {'changes':>8} {'p50 ms':>8} {'p90 ms':>8} {'p99 ms':>8} {'max ms':>8} "
          f"{'bring-up s (median)':>20}")
    for prioritized in (True, False):
        lat = [x for res in results[prioritized] for x in res["latencies"]]
        bring_up = statistics.median(res["bring_up"] for res in results[prioritized])
        print(f"{'on' if prioritized else 'off':>15} {len(lat):>8} {percentile(lat, 0.5) * 1000:>8.1f} "
              f"{percentile(lat, 0.9) * 1000:>8.1f} {percentile(lat, 0.99) * 1000:>8.1f} {max(lat) * 1000:>8.1f} "
              f"{bring_up:>20.1f}")


if __name__ == "__main__":
    main()
