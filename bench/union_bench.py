"""Union informer costs: the overhead per event of going through a UnionInformer, and the memory of an idle cluster.

    .venv/bin/python bench/union_bench.py [--events 200000] [--reps 9] [--clusters 200] [--live 40]

1. Overhead per event, no server. One SharedIndexInformer whose cache holds 1,000 ConfigMaps is fed ``--events``
   MODIFIED events with ``informer.apply`` (what its reflector does per watch event), in chunks of 1,000 with a
   yield between; the time (wall, and this process's CPU, which other load on the machine disturbs less) runs
   until the handler has been given the last one. Variants, rotated between reps; medians compared:
   - ``plain``: the handler registered on the informer itself, ``on_update(old, new)``;
   - ``union``: the same handler registered on a UnionInformer whose only sub is that informer;
   - ``union+cluster``: through the union, a handler that takes the cluster, ``on_update(old, new, cluster)``.
   Also, with ``timeit``, the call alone: ``fn(old, new)`` against what the union installs for a method that
   takes the cluster (and against ``functools.partial(fn, cluster=...)``, the obvious binding).
2. Memory per idle cluster, no server (tracemalloc, Python memory still referenced): ``--clusters`` informers
   started and parked on a watch that never answers, with one handler each, registered directly or through a
   union. Their difference is the union's own cost per cluster.
3. Memory per idle cluster against a real control plane (``--live`` clusters, 0 to skip): each cluster is an
   ApiClient of its own (its own TLS connection, as a real cluster would have) and a ConfigMap informer of an
   empty namespace, added to one union with one handler. RSS growth per cluster once all have synced and idled
   for 2 s, each variant in a fresh process: with asyncio's default TLS read buffers, and with the sidecar's
   ``small_tls_read_buffers()``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import json
import os
import statistics
import subprocess
import sys
import time
import timeit
import tracemalloc
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from prometheus_client import CollectorRegistry  # noqa: E402

from informers import (  # noqa: E402
    GVR, ApiClient, FuncHandler, InformerMetrics, SharedIndexInformer, UnionInformer,
)
from informers.union_informer import _for_cluster  # noqa: E402  (exactly what the union installs)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _runner_common import rss_bytes  # noqa: E402

CONFIGMAPS = GVR("", "v1", "configmaps")
VARIANTS = ("plain", "union", "union+cluster")
_METRICS = InformerMetrics.for_registry(CollectorRegistry())


class IdleClient:
    """A server that never answers: the reflector waits on its first watch until it is cancelled."""

    recoveries = 0

    @asynccontextmanager
    async def stream(self, path: str, params: dict[str, str], inactivity_timeout: float | None = None
                     ) -> AsyncIterator[None]:
        await asyncio.get_running_loop().create_future()
        yield


def idle_informer() -> SharedIndexInformer:
    return SharedIndexInformer(IdleClient(), CONFIGMAPS, metrics=_METRICS)  # type: ignore[arg-type]


def configmap(i: int) -> dict[str, Any]:
    return {"metadata": {"name": f"cm-{i}", "namespace": "ns", "resourceVersion": str(i), "labels": {"a": "b"}},
            "data": {"k": "v" * 100}}


# -- 1. overhead per event -------------------------------------------------------------------------------------
async def per_event(variant: str, events: int, objs: list[dict[str, Any]]) -> tuple[float, float]:
    """Nanoseconds per event from the first apply to the handler's last call: (wall, CPU of this process)."""
    inf = idle_informer()
    inf.start()
    inf.replace(objs, "1")
    done = asyncio.Event()
    seen = 0

    def on_update(old: Any, new: Any) -> None:
        nonlocal seen
        seen += 1
        if seen == events:
            done.set()

    def on_update_cluster(old: Any, new: Any, cluster: str) -> None:
        nonlocal seen
        seen += 1
        if seen == events:
            done.set()

    union = UnionInformer()
    if variant == "plain":
        reg: Any = inf.add_event_handler(FuncHandler(on_update=on_update))
    else:
        await union.add("cluster-1", inf)
        reg = union.add_event_handler(FuncHandler(on_update=on_update_cluster if variant == "union+cluster"
                                                  else on_update))
    await reg.wait_for_sync()
    n = len(objs)
    start, cpu = time.perf_counter(), time.process_time()
    for i in range(events):
        inf.apply("MODIFIED", objs[i % n])
        if i % 1000 == 999:
            await asyncio.sleep(0)
    await done.wait()
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    await union.remove("cluster-1")
    await inf.stop()
    return wall / events * 1e9, cpu / events * 1e9


def call_cost() -> dict[str, float]:
    """Nanoseconds per handler call: a plain function, what the union installs for a cluster-aware one, and the
    keyword partial that a simpler binding would cost."""
    def fn(old: Any, new: Any, cluster: str = "") -> None:
        pass

    installed = _for_cluster(FuncHandler(on_update=fn), "cluster-1").on_update
    assert installed is not None
    partial = functools.partial(fn, cluster="cluster-1")
    obj: dict[str, Any] = {}
    n = 2_000_000

    def ns(call: Callable[[], None]) -> float:
        return min(timeit.repeat(call, number=n, repeat=5)) / n * 1e9

    plain = ns(lambda: fn(obj, obj))
    union = ns(lambda: installed(obj, obj))
    return {"plain_call_ns": plain, "union_call_ns": union, "added_ns": union - plain,
            "partial_call_ns": ns(lambda: partial(obj, obj))}


async def overhead(events: int, reps: int) -> dict[str, Any]:
    objs = [configmap(i) for i in range(1000)]
    for v in VARIANTS:  # warm-up
        await per_event(v, events // 10, objs)
    wall: dict[str, list[float]] = {v: [] for v in VARIANTS}
    cpu: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for rep in range(reps):
        for v in VARIANTS[rep % 3:] + VARIANTS[:rep % 3]:
            gc.collect()
            w, c = await per_event(v, events, objs)
            wall[v].append(w)
            cpu[v].append(c)
    med_wall = {v: statistics.median(r) for v, r in wall.items()}
    med = {v: statistics.median(r) for v, r in cpu.items()}
    return {"wall_runs_ns": wall, "cpu_runs_ns": cpu, "median_wall_ns": med_wall, "median_cpu_ns": med,
            "overhead_cpu_pct": {v: 100 * (med[v] / med["plain"] - 1) for v in VARIANTS[1:]},
            "overhead_wall_pct": {v: 100 * (med_wall[v] / med_wall["plain"] - 1) for v in VARIANTS[1:]}}


# -- 2. memory per idle cluster, no server ---------------------------------------------------------------------
async def memory_offline(clusters: int) -> dict[str, float]:
    def handler() -> FuncHandler:
        return FuncHandler(on_add=lambda obj, initial: None)

    async def traced(build: Callable[[list[SharedIndexInformer]], Any]) -> float:
        gc.collect()
        tracemalloc.start()
        infs = [idle_informer() for _ in range(clusters)]
        for inf in infs:
            inf.start()
        keep = build(infs)
        if asyncio.iscoroutine(keep):
            keep = await keep
        await asyncio.sleep(0.1)  # every task parked
        gc.collect()
        current, _ = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        for inf in infs:
            await inf.stop()
        del keep
        return current / clusters

    def direct(infs: list[SharedIndexInformer]) -> list[Any]:
        return [inf.add_event_handler(handler()) for inf in infs]

    async def through_union(infs: list[SharedIndexInformer]) -> UnionInformer:
        union = UnionInformer()
        union.add_event_handler(handler())
        for i, inf in enumerate(infs):
            await union.add(f"cluster-{i}", inf)
        return union

    bare = await traced(lambda infs: None)
    plain = await traced(direct)
    union = await traced(through_union)
    return {"informer_only_B": bare, "informer_plus_handler_B": plain, "union_sub_B": union,
            "union_own_B": union - plain}


# -- 3. memory per idle cluster, real control plane -------------------------------------------------------------
async def live_probe(kubeconfig: str, clusters: int, small_tls: bool) -> dict[str, float]:
    if small_tls:
        from syncer.runtime import small_tls_read_buffers
        small_tls_read_buffers()
    union = UnionInformer()
    union.add_event_handler(FuncHandler(on_add=lambda obj, initial: None))
    warm = ApiClient.from_kubeconfig(kubeconfig)  # imports, SSL context and first connection out of the figure
    await warm.request("GET", "/version")
    gc.collect()
    before = rss_bytes()
    clients, subs = [], []
    for i in range(clusters):
        client = ApiClient.from_kubeconfig(kubeconfig)
        sub = SharedIndexInformer(client, CONFIGMAPS, namespace="default", metrics=_METRICS)
        await union.add(f"cluster-{i}", sub)
        sub.start()
        clients.append(client)
        subs.append(sub)
    for sub in subs:
        await sub.wait_for_sync()
    await asyncio.sleep(2)
    gc.collect()
    per_cluster = (rss_bytes() - before) / clusters
    for i, sub in enumerate(subs):
        await union.remove(f"cluster-{i}")
        await sub.stop()
    for client in [*clients, warm]:
        await client.close()
    return {"rss_per_cluster_B": per_cluster, "clusters": clusters, "small_tls": small_tls}


def live(clusters: int) -> dict[str, Any]:
    from syncer.testing import ControlPlane

    cp = ControlPlane().start()
    try:
        out = {}
        for small in (False, True):
            cmd = [sys.executable, __file__, "--child", str(cp.kubeconfig), str(clusters), str(int(small))]
            res = subprocess.run(cmd, capture_output=True, text=True, check=True)
            out["small_tls" if small else "default_tls"] = json.loads(res.stdout.strip().splitlines()[-1])
        return out
    finally:
        cp.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--events", type=int, default=200_000)
    p.add_argument("--reps", type=int, default=9)
    p.add_argument("--clusters", type=int, default=200)
    p.add_argument("--live", type=int, default=40)
    p.add_argument("--child", nargs=3, metavar=("KUBECONFIG", "CLUSTERS", "SMALL_TLS"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        kubeconfig, clusters, small = args.child
        print(json.dumps(asyncio.run(live_probe(kubeconfig, int(clusters), small == "1"))), flush=True)
        return
    result: dict[str, Any] = {"events": args.events, "reps": args.reps,
                              "read_only_cache": os.environ.get("KUBE_SYNCER_READONLY_CACHE", "1") != "0"}
    result["overhead"] = asyncio.run(overhead(args.events, args.reps))
    o = result["overhead"]
    for v in VARIANTS:
        runs = ", ".join(f"{x:.0f}" for x in o["cpu_runs_ns"][v])
        extra = "" if v == "plain" else (f" ({o['overhead_cpu_pct'][v]:+.1f} %; wall {o['median_wall_ns'][v]:.0f} ns, "
                                         f"{o['overhead_wall_pct'][v]:+.1f} %)")
        print(f"{v:14} median CPU {o['median_cpu_ns'][v]:5.0f} ns/event{extra}  CPU runs: {runs}", flush=True)
    result["call"] = call_cost()
    print("handler call (ns):", {k: round(v, 1) for k, v in result["call"].items()}, flush=True)
    result["memory_offline"] = asyncio.run(memory_offline(args.clusters))
    print("idle cluster, no server (B):", {k: round(v) for k, v in result["memory_offline"].items()}, flush=True)
    if args.live:
        result["memory_live"] = live(args.live)
        print("idle cluster, control plane:", json.dumps(result["memory_live"]), flush=True)
    out = Path(__file__).resolve().parent / "out" / f"union-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"raw results: {out.relative_to(Path.cwd()) if out.is_relative_to(Path.cwd()) else out}")


if __name__ == "__main__":
    main()
