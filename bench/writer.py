"""Update stream for the sustained-updates benchmark: concurrent writers patching existing ConfigMaps.

Usage: writer.py --kubeconfig K --namespace NS --objects N --updates U [--writers 4] [--rate R]

Each of ``--writers`` coroutines merge-patches ``data.ts`` = its ``time.time()`` just before sending, so a
handler can compute write-to-handler latency. Objects are taken round-robin (cm-00000, cm-00001, ...), so
consecutive patches of one object are N updates apart: no contender can coalesce two updates of one object.
``--rate`` caps the total patches per second (a shared schedule, not per writer), so every contender faces
the same offered load instead of one that depends on how much CPU the contender leaves to the apiserver.
Prints one JSON line with what was achieved.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from informers import ApiClient, ApiError


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--namespace", required=True)
    p.add_argument("--objects", type=int, required=True)
    p.add_argument("--updates", type=int, required=True)
    p.add_argument("--writers", type=int, default=4)
    p.add_argument("--rate", type=float, default=0.0, help="total patches/s; 0 = as fast as possible")
    args = p.parse_args()

    client = ApiClient.from_kubeconfig(args.kubeconfig)
    path = f"/api/v1/namespaces/{args.namespace}/configmaps/"
    next_index = 0
    errors = 0
    start = time.monotonic()

    async def writer() -> None:
        nonlocal next_index, errors
        while next_index < args.updates:
            i = next_index
            next_index += 1
            if args.rate:
                # Patch i is due at start + i/rate: writers that fall behind catch up without bursting above it.
                delay = start + i / args.rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
            name = f"cm-{i % args.objects:05d}"
            try:
                await client.request("PATCH", path + name, body={"data": {"ts": repr(time.time())}})
            except ApiError:
                errors += 1

    await asyncio.gather(*(writer() for _ in range(args.writers)))
    elapsed = time.monotonic() - start
    await client.close()
    print(json.dumps({"event": "writer", "updates": args.updates, "errors": errors, "elapsed": elapsed,
                      "rate": args.updates / elapsed}), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
