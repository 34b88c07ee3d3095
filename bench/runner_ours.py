"""Contender (a): our informers package, default factory settings, a no-op FuncHandler.

Usage: runner_ours.py --kubeconfig K --namespace NS --expect N [--mode updates --updates U] [--list-watch]

``--list-watch`` forces paged LIST + WATCH instead of the default (watch-list streaming when the server
supports it, which this apiserver does), to show what the sync path choice costs.
(normally started by informer_bench.py; see _runner_common.py for the output protocol).
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import _runner_common as rc  # noqa: E402

import informers  # noqa: E402
from informers import ApiClient, DynamicSharedInformerFactory, FuncHandler, GVR, ReflectorOptions  # noqa: E402


async def main() -> int:
    args = rc.parse_args(__doc__ or "", lambda p: p.add_argument("--list-watch", action="store_true"))
    client = ApiClient.from_kubeconfig(args.kubeconfig)
    options = ReflectorOptions(watch_list=False) if args.list_watch else None
    factory = DynamicSharedInformerFactory(client, namespace=args.namespace, options=options)
    inf, _lister = factory.for_resource(GVR("", "v1", "configmaps"))

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
