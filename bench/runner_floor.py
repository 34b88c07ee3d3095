"""Reference for the updates benchmark only: a bare watch through ``ApiClient.stream`` (aiohttp + TLS + line
splitting + orjson), no reflector, no cache, no handler queue.

Usage: runner_floor.py --kubeconfig K --namespace NS --expect N --mode updates --updates U

Its CPU per event is the floor that any asyncio/aiohttp informer pays before doing any informer work; the
difference between "ours" and this row is what the reflector, store and handler dispatch cost.
It has no initial sync: "synced" is reported as soon as the watch is open (wall 0, not a sync figure).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import _runner_common as rc  # noqa: E402

from informers import ApiClient  # noqa: E402


async def main() -> int:
    args = rc.parse_args(__doc__ or "")
    if args.mode != "updates":
        rc.emit("error", error="runner_floor only measures updates")
        return 2
    client = ApiClient.from_kubeconfig(args.kubeconfig)
    path = f"/api/v1/namespaces/{args.namespace}/configmaps"
    # Watch from "now": a one-item list gives the current resourceVersion without loading the namespace.
    rv = (await client.request("GET", path, {"limit": "1"}))["metadata"]["resourceVersion"]
    base = rc.baseline()
    latencies: list[float] = []
    all_updates = asyncio.Event()
    opened = asyncio.Event()

    async def watch() -> None:
        params = {"watch": "1", "resourceVersion": rv, "allowWatchBookmarks": "true", "timeoutSeconds": "3600"}
        async with client.stream(path, params) as events:
            opened.set()
            async for ev in events:
                if ev["type"] != "MODIFIED":
                    continue
                lat = rc.latency_of(ev["object"].get("data"))
                if lat is not None:
                    latencies.append(lat)
                    if len(latencies) == args.updates:
                        all_updates.set()
                        return

    task = asyncio.create_task(watch())
    await opened.wait()
    rc.synced(base, objects=0, adds=0, expect=args.expect, ok=True)
    await rc.measure_updates(all_updates, latencies, args.timeout)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await client.close()
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
