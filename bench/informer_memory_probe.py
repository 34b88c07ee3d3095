"""Where does our informer's RSS per cached object go? (diagnosis behind a finding in RESULTS.md)

Usage: .venv/bin/python bench/informer_memory_probe.py [--objects 10000]

Starts a control plane, creates the same ~1 KiB ConfigMaps as informer_bench.py, then syncs our informer
once per variant, each in a fresh process (so RSS is its own), and prints RSS growth per object:

- default:  DynamicSharedInformerFactory defaults (watch-list sync, drop_managed_fields transform);
- keep:     transform=None, so managedFields stay cached;
- early:    defaults, but managedFields are dropped the moment each watch event is decoded (done here by
            wrapping orjson.loads in informers.client for this process only; the package is not changed);
- list:     defaults with ReflectorOptions(watch_list=False) (paged LIST + WATCH);
- live:     defaults, measured with tracemalloc: Python memory still referenced after the sync.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import subprocess
import sys
import types
from pathlib import Path

BENCH = Path(__file__).resolve().parent
VARIANTS = ("default", "keep", "early", "list", "live")


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return -1


async def probe(kubeconfig: str, namespace: str, variant: str) -> dict[str, float]:
    import orjson
    import tracemalloc

    import informers.client
    from informers import ApiClient, DynamicSharedInformerFactory, FuncHandler, GVR, ReflectorOptions

    if variant == "early":
        def loads(raw: bytes | memoryview) -> object:
            event = orjson.loads(raw)
            obj = event.get("object") if isinstance(event, dict) else None
            if isinstance(obj, dict):
                obj.get("metadata", {}).pop("managedFields", None)
            return event
        informers.client.orjson = types.SimpleNamespace(  # type: ignore[assignment]
            loads=loads, dumps=orjson.dumps, JSONDecodeError=orjson.JSONDecodeError)

    client = ApiClient.from_kubeconfig(kubeconfig)
    kwargs: dict[str, object] = {}
    if variant == "keep":
        kwargs["transform"] = None
    if variant == "list":
        kwargs["options"] = ReflectorOptions(watch_list=False)
    factory = DynamicSharedInformerFactory(client, namespace=namespace, **kwargs)  # type: ignore[arg-type]
    inf, _ = factory.for_resource(GVR("", "v1", "configmaps"))
    reg = inf.add_event_handler(FuncHandler(on_add=lambda obj, initial: None))
    gc.collect()
    before = rss_bytes()
    if variant == "live":
        tracemalloc.start()
    factory.start()
    await inf.wait_for_sync()
    await reg.wait_for_sync()
    gc.collect()
    n = len(inf.store)
    result = {"variant": variant, "objects": n, "rss_per_obj": (rss_bytes() - before) / n}
    if variant == "live":
        current, _peak = tracemalloc.get_traced_memory()
        result["live_per_obj"] = current / n
        del result["rss_per_obj"]  # tracemalloc's own bookkeeping inflates RSS
    await factory.shutdown()
    await client.close()
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--objects", type=int, default=10000)
    p.add_argument("--child", nargs=3, metavar=("KUBECONFIG", "NAMESPACE", "VARIANT"), help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        print(json.dumps(asyncio.run(probe(*args.child))), flush=True)
        return

    sys.path.insert(0, str(BENCH))
    from informer_bench import create_objects
    from syncer.testing import ControlPlane

    cp = ControlPlane().start()  # main thread: its processes die with this thread
    try:
        ns = f"probe-{args.objects}"
        asyncio.run(create_objects(str(cp.kubeconfig), ns, args.objects))
        for variant in VARIANTS:
            out = subprocess.run([sys.executable, __file__, "--child", str(cp.kubeconfig), ns, variant],
                                 capture_output=True, text=True, check=True)
            r = json.loads(out.stdout.strip().splitlines()[-1])
            figure = (f"live Python memory {r['live_per_obj']:,.0f} B/object" if "live_per_obj" in r
                      else f"RSS growth {r['rss_per_obj']:,.0f} B/object")
            print(f"{variant:8} {figure}", flush=True)
    finally:
        cp.stop()


if __name__ == "__main__":
    main()
