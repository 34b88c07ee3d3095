"""Metadata-only informers (issue 23) vs full ones: memory per cached object, and what a consumer that needs
whole objects (the cached-resources source side) pays in GETs when its informer holds only metadata.

Usage: .venv/bin/python bench/metadata_bench.py [--objects 10000] [--rounds 3] [--changes 1000] [--rate 100]

One run starts one local control plane and creates ``--objects`` ConfigMaps twice: ~1 KiB each (informer_bench's
objects) in one namespace and with a 2,048-byte value more (the cached-resources bench's big bodies) in another.
Each measurement is a fresh process; full and metadata-only alternate within every round, so both see the same
machine state. Medians over the rounds are printed, with their ratio.

1. Memory: RSS growth per object from the informer's start to its sync ((RSS after - before) / N, after a
   gc), and, in separate processes, the live Python memory per object by tracemalloc.
2. Source side of a replication (``syncer/builtin/cached_resources/replication.py`` builds each wrapper from the
   whole source object): "full" reads the object from its event; "metadata" is told by a metadata-only informer
   which object changed and GETs it (4 workers, as the replication's reconciles). Reported: the time until every
   object is in hand after the start, GETs per initial object and per change (the apiserver's own
   ``apiserver_request_total{verb="GET"}``), and the lag from a write to the whole new object in hand, at
   ``--rate`` merge patches per second for ``--changes`` changes.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import re
import statistics
import subprocess
import sys
import time
from typing import Any

from informer_memory_probe import rss_bytes  # the script's directory is on sys.path

MEMORY_VARIANTS = ("full", "metadata", "full-live", "metadata-live")
SOURCE_VARIANTS = ("source-full", "source-metadata")
WORKERS = 4


async def get_count(client: Any) -> float:
    """The apiserver's count of single-object GETs of ConfigMaps."""
    text = await client.request_text("/metrics")
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("apiserver_request_total{") and 'verb="GET"' in line
               and re.search(r'[{,]resource="configmaps"', line))


async def memory(kubeconfig: str, namespace: str, variant: str) -> dict[str, Any]:
    import tracemalloc

    from informers import GVR, ApiClient, DynamicSharedInformerFactory

    gvr = GVR("", "v1", "configmaps")
    client = ApiClient.from_kubeconfig(kubeconfig)
    factory = DynamicSharedInformerFactory(client, namespace=namespace)
    inf, _ = factory.for_resource(gvr.only_metadata() if variant.startswith("metadata") else gvr)
    gc.collect()
    before = rss_bytes()
    live = variant.endswith("-live")
    if live:
        tracemalloc.start()
    factory.start()
    await inf.wait_for_sync()
    gc.collect()
    n = len(inf.store)
    out: dict[str, Any] = {"objects": n}
    if live:
        out["live_per_obj"] = tracemalloc.get_traced_memory()[0] / n
    else:
        out["rss_per_obj"] = (rss_bytes() - before) / n
    await factory.shutdown()
    await client.close()
    return out


async def source(kubeconfig: str, namespace: str, variant: str, total: int, changes: int,
                 rate: float) -> dict[str, Any]:
    from informers import GVR, ApiClient, DynamicSharedInformerFactory, FuncHandler

    gvr = GVR("", "v1", "configmaps")
    metadata = variant == "source-metadata"
    client = ApiClient.from_kubeconfig(kubeconfig)
    writer = ApiClient.from_kubeconfig(kubeconfig)
    factory = DynamicSharedInformerFactory(client, namespace=namespace)
    inf, _ = factory.for_resource(gvr.only_metadata() if metadata else gvr)
    whole: dict[str, dict[str, Any]] = {}  # name -> the whole object in hand
    queue: asyncio.Queue[str] = asyncio.Queue()
    sent: dict[str, float] = {}  # stamp -> send time
    lags: list[float] = []
    everything = asyncio.Event()

    def in_hand(obj: dict[str, Any]) -> None:
        whole[obj["metadata"]["name"]] = obj
        stamp = (obj.get("data") or {}).get("stamp")
        if stamp in sent:
            lags.append(time.monotonic() - sent.pop(stamp))
        if len(whole) == total:
            everything.set()

    def changed(obj: dict[str, Any]) -> None:
        if metadata:
            queue.put_nowait(obj["metadata"]["name"])
        else:
            in_hand(obj)

    async def fetcher() -> None:
        while True:
            name = await queue.get()
            in_hand(await client.request("GET", gvr.path(namespace, name)))

    inf.add_event_handler(FuncHandler(on_add=lambda o, _: changed(o), on_update=lambda _, o: changed(o)))
    gets_before = await get_count(writer)
    fetchers = [asyncio.create_task(fetcher()) for _ in range(WORKERS)] if metadata else []
    start = time.monotonic()
    factory.start()
    await everything.wait()
    initial_s = time.monotonic() - start
    gets_initial = await get_count(writer) - gets_before
    names = sorted(whole)
    interval = 1.0 / rate
    next_at = time.monotonic()
    for i in range(changes):
        stamp = f"{i}-{time.monotonic():.6f}"
        sent[stamp] = time.monotonic()
        await writer.request("PATCH", gvr.path(namespace, names[i % len(names)]), body={"data": {"stamp": stamp}})
        next_at += interval
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))
    deadline = time.monotonic() + 30
    while sent and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    gets_changes = await get_count(writer) - gets_before - gets_initial
    for t in fetchers:
        t.cancel()
    await asyncio.gather(*fetchers, return_exceptions=True)
    await factory.shutdown()
    await client.close()
    await writer.close()
    lags.sort()
    return {"objects": total, "initial_s": initial_s, "gets_per_initial_object": gets_initial / total,
            "gets_per_change": gets_changes / changes, "lost": len(sent),
            "lag_p50_ms": 1000 * lags[len(lags) // 2], "lag_p99_ms": 1000 * lags[int(len(lags) * 0.99)]}


async def create(kubeconfig: str, namespace: str, n: int, extra: int) -> None:
    from informer_bench import configmap

    from informers import ApiClient

    async with ApiClient.from_kubeconfig(kubeconfig) as client:
        await client.request("POST", "/api/v1/namespaces", body={"metadata": {"name": namespace}})
        sem = asyncio.Semaphore(32)

        async def one(i: int) -> None:
            body = configmap(i)
            if extra:
                body["data"]["big"] = "x" * extra
            async with sem:
                await client.request("POST", f"/api/v1/namespaces/{namespace}/configmaps", body=body)

        await asyncio.gather(*(one(i) for i in range(n)))


def child(*args: str) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--child", *args], capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--objects", type=int, default=10000)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--changes", type=int, default=1000)
    p.add_argument("--rate", type=float, default=100.0)
    p.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        kubeconfig, namespace, variant, *rest = args.child
        if variant in SOURCE_VARIANTS:
            result = asyncio.run(source(kubeconfig, namespace, variant, int(rest[0]), int(rest[1]),
                                        float(rest[2])))
        else:
            result = asyncio.run(memory(kubeconfig, namespace, variant))
        print(json.dumps(result), flush=True)
        return

    from syncer.testing import ControlPlane

    cp = ControlPlane().start()
    try:
        kubeconfig = str(cp.kubeconfig)
        bodies = {"1KiB": 0, "3KiB": 2048}
        for label, extra in bodies.items():
            asyncio.run(create(kubeconfig, f"meta-{label.lower()}", args.objects, extra))
        results: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for r in range(args.rounds):
            for label in bodies:
                ns = f"meta-{label.lower()}"
                for pair in (("full", "metadata"), ("full-live", "metadata-live"), SOURCE_VARIANTS):
                    for variant in pair if r % 2 == 0 else reversed(pair):
                        extra_args = [str(args.objects), str(args.changes), str(args.rate)] \
                            if variant in SOURCE_VARIANTS else []
                        results.setdefault((label, variant), []).append(child(kubeconfig, ns, variant, *extra_args))
                        print(f"round {r + 1} {label} {variant}: {results[(label, variant)][-1]}", flush=True)
        report(results, args)
    finally:
        cp.stop()


def report(results: dict[tuple[str, str], list[dict[str, Any]]], args: argparse.Namespace) -> None:
    def med(label: str, variant: str, key: str) -> float:
        return statistics.median(r[key] for r in results[(label, variant)])

    print(f"\nmedians over {args.rounds} rounds, {args.objects} ConfigMaps per body size\n")
    print("| body | measure | full | metadata-only | metadata / full |\n|---|---|---:|---:|---:|")
    for label in ("1KiB", "3KiB"):
        rows = [("RSS growth per object (B)", "full", "metadata", "rss_per_obj"),
                ("live Python memory per object (B)", "full-live", "metadata-live", "live_per_obj"),
                ("source side: all objects in hand after start (s)", "source-full", "source-metadata", "initial_s"),
                ("source side: GETs per initial object", "source-full", "source-metadata",
                 "gets_per_initial_object"),
                ("source side: GETs per change", "source-full", "source-metadata", "gets_per_change"),
                ("source side: lag p50, write to whole object (ms)", "source-full", "source-metadata", "lag_p50_ms"),
                ("source side: lag p99 (ms)", "source-full", "source-metadata", "lag_p99_ms")]
        for name, a, b, key in rows:
            x, y = med(label, a, key), med(label, b, key)
            ratio = f"{y / x:.2f}" if x else "-"
            print(f"| {label} | {name} | {x:,.2f} | {y:,.2f} | {ratio} |")


if __name__ == "__main__":
    main()
