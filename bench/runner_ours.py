"""Contender (a): our informers package, default factory settings, a no-op FuncHandler.

Usage: runner_ours.py --kubeconfig K --namespace NS --expect N [--mode updates --updates U] [--list-watch]
       [--mutable-cache]

``--list-watch`` forces paged LIST + WATCH instead of the default (watch-list streaming when the server
supports it, which this apiserver does), to show what the sync path choice costs. ``--mutable-cache`` turns the
read-only cache off (``KUBE_SYNCER_READONLY_CACHE=0``: objects stay the decoded dicts), to show what it costs.
In sync mode, after "synced", it times lister reads over the whole cache and reports them as a "reads" line.
(normally started by informer_bench.py; see _runner_common.py for the output protocol).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

import orjson

sys.path.insert(0, str(Path(__file__).parent))
import _runner_common as rc  # noqa: E402

import informers  # noqa: E402
from informers import ApiClient, DynamicSharedInformerFactory, FuncHandler, GVR, Lister, ReflectorOptions  # noqa: E402
from informers import FrozenDict, deep_copy  # noqa: E402
from informers.frozen import READ_ONLY_ENV  # noqa: E402


def _flags(p: Any) -> None:
    p.add_argument("--list-watch", action="store_true")
    p.add_argument("--mutable-cache", action="store_true")


def _best(fn: Callable[[], object], reps: int = 5) -> float:
    """The fastest of ``reps`` timed calls, in seconds (the least disturbed by the other processes)."""
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def time_reads(lister: Lister, namespace: str) -> dict[str, Any]:
    """What reading the whole cache through the lister costs: per object (µs) and per whole list (ms)."""
    objs = lister.list()
    names = [o["metadata"]["name"] for o in objs]
    n = len(names)

    def get_and_read() -> None:
        for name in names:  # what a reconcile typically reads of the object it got
            o = lister.get(name, namespace)
            assert o is not None
            o["metadata"]["resourceVersion"], o.get("data"), "app" in o["metadata"]["labels"]

    per_obj = {
        "get_us": lambda: [lister.get(name, namespace) for name in names],
        "get_read_us": get_and_read,
        "dumps_us": lambda: [orjson.dumps(o) for o in objs],
        "deep_copy_us": lambda: [deep_copy(o) for o in objs],
    }
    whole = {
        "list_ms": lister.list,
        "list_ns_ms": lambda: lister.list(namespace=namespace),
        "list_selector_ms": lambda: lister.list(namespace=namespace, label_selector="shard=3"),
    }
    out: dict[str, Any] = {k: _best(fn) / n * 1e6 for k, fn in per_obj.items()}
    out.update({k: _best(fn) * 1e3 for k, fn in whole.items()})
    return {"objects": n, "read_only": isinstance(objs[0], FrozenDict), **out}


async def main() -> int:
    args = rc.parse_args(__doc__ or "", _flags)
    if args.mutable_cache:
        os.environ[READ_ONLY_ENV] = "0"  # read when the informer is created
    client = ApiClient.from_kubeconfig(args.kubeconfig)
    options = ReflectorOptions(watch_list=False) if args.list_watch else None
    factory = DynamicSharedInformerFactory(client, namespace=args.namespace, options=options)
    inf, lister = factory.for_resource(GVR("", "v1", "configmaps"))

    adds = 0
    latencies: list[float] = []
    all_updates = asyncio.Event()

    def on_add(obj: dict, initial: bool) -> None:
        nonlocal adds
        adds += 1

    def on_update(old: dict, new: dict) -> None:
        lat = rc.latency_of(new.get("data"))
        if lat is not None:
            latencies.append(lat)
            if len(latencies) == args.updates:
                all_updates.set()

    reg = inf.add_event_handler(FuncHandler(on_add=on_add, on_update=on_update, on_delete=lambda obj: None))

    base = rc.baseline()
    factory.start()
    ok = await inf.wait_for_sync(args.timeout) and await reg.wait_for_sync(args.timeout)
    rc.synced(base, objects=len(inf.store), adds=adds, expect=args.expect, ok=ok,
              watch_list=inf.reflector.use_watch_list is not False, module=informers.__file__)
    if ok and args.mode == "sync" and len(inf.store):
        rc.emit("reads", **time_reads(lister, args.namespace))

    if ok and args.mode == "updates":
        # The driver starts the writers only after "started": read stdin off the loop so watching goes on.
        await rc.measure_updates(all_updates, latencies, args.timeout)

    # A clean shutdown is part of what we ship, so it runs (and is timed) rather than os._exit.
    last_error = repr(inf.last_error) if inf.last_error else None
    t = time.monotonic()
    await factory.shutdown()
    await client.close()
    rc.emit("shutdown", seconds=time.monotonic() - t, last_error=last_error)
    return 0 if ok else 2


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
