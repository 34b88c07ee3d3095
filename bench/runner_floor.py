"""Reference for the updates benchmark only: bare watches through ``ApiClient.stream`` (aiohttp + TLS + line
splitting + orjson, or the client's HTTP/2 transport), no reflector, no cache, no handler queue.

Usage: runner_floor.py --kubeconfig K --namespace NS --expect N --mode updates --updates U
       [--streams S] [--http2 none|on|off] [--loop asyncio|uvloop]

Its CPU per event is the floor that any asyncio/aiohttp informer pays before doing any informer work; the
difference between "ours" and this row is what the reflector, store and handler dispatch cost.
It has no initial sync: "synced" is reported as soon as every watch is open (wall 0, not a sync figure).

``--streams S`` (bench/transport_bench.py) opens S watches at once, watch ``j`` selecting label ``s<S>=j``, so
that each object's updates reach one stream; ``--updates`` counts the events of all of them. ``--http2`` passes
that setting to ``ApiClient`` (``none``: not at all, for a client without it).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import aiohttp  # noqa: E402

import _runner_common as rc  # noqa: E402
from informers import ApiError  # noqa: E402
from _transport_common import client_class  # noqa: E402


def _flags(p: Any) -> None:
    p.add_argument("--streams", type=int, default=1)
    p.add_argument("--http2", choices=("none", "on", "off"), default="none")
    p.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")


async def main(args: Any) -> int:
    if args.mode != "updates":
        rc.emit("error", error="runner_floor only measures updates")
        return 2
    client = client_class({"none": None, "on": True, "off": False}[args.http2]).from_kubeconfig(args.kubeconfig)
    path = f"/api/v1/namespaces/{args.namespace}/configmaps"
    # Watch from "now": a one-item list gives the current resourceVersion without loading the namespace.
    rv = (await client.request("GET", path, {"limit": "1"}))["metadata"]["resourceVersion"]
    base = rc.baseline()
    latencies: list[float] = []
    all_updates = asyncio.Event()
    opened = 0
    all_open = asyncio.Event()

    async def watch(j: int) -> None:
        nonlocal opened
        params = {"watch": "1", "resourceVersion": rv, "allowWatchBookmarks": "true", "timeoutSeconds": "3600"}
        if args.streams > 1:
            params["labelSelector"] = f"s{args.streams}={j}"
        first = True
        while True:  # a stream that ends or fails is noted and re-opened where it stopped, as a watch would be
            try:
                async with client.stream(path, params) as events:
                    if first:
                        first = False
                        opened += 1
                        if opened == args.streams:
                            all_open.set()
                    async for ev in events:
                        if ev["type"] == "ERROR":  # e.g. a 410: this bare watch cannot relist, so it stops
                            rc.emit("note", note=f"stream {j}: {ev['object']}", events=len(latencies))
                            return
                        params["resourceVersion"] = ev["object"]["metadata"]["resourceVersion"]
                        if ev["type"] != "MODIFIED":
                            continue
                        lat = rc.latency_of(ev["object"].get("data"))
                        if lat is not None:
                            latencies.append(lat)
                            if len(latencies) == args.updates:
                                all_updates.set()
                rc.emit("note", note=f"stream {j} ended; re-opened", events=len(latencies))
            except (OSError, TimeoutError, ValueError, ApiError, aiohttp.ClientError) as e:
                rc.emit("note", note=f"stream {j} failed: {e!r}; re-opened", events=len(latencies))
                await asyncio.sleep(0.1)

    tasks = [asyncio.create_task(watch(j)) for j in range(args.streams)]
    try:
        async with asyncio.timeout(args.timeout):
            await all_open.wait()
        rc.synced(base, objects=0, adds=0, expect=args.expect, ok=True, streams=args.streams)
        await rc.measure_updates(all_updates, latencies, args.timeout)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await client.close()
    return 0


if __name__ == "__main__":
    args = rc.parse_args(__doc__ or "", _flags)
    if args.loop == "uvloop":
        import uvloop

        sys.exit(uvloop.run(main(args)))
    sys.exit(asyncio.run(main(args)))
