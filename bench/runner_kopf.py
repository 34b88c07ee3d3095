"""Contender (c): kopf, a no-op ``@kopf.on.event('configmaps')`` handler, operator run in-process.

Usage: runner_kopf.py --kubeconfig K --namespace NS --expect N [--mode updates --updates U]
(normally started by informer_bench.py; see _runner_common.py for the output protocol).

kopf has no informer cache nor a has-synced signal: "synced" is the moment the handler has seen every one of
the ``--expect`` objects. The operator runs standalone (no peering), restricted to the namespace, with kopf's
own defaults otherwise. Logging is left unconfigured (root logger at WARNING), which is cheaper for kopf
than ``kopf run``'s INFO level: that one logs "Handler ... succeeded" for every event.
The handler is a coroutine: kopf runs plain-function handlers in a thread pool, which would only cost more.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import _runner_common as rc  # noqa: E402

args = rc.parse_args(__doc__ or "")
# kopf logs in through the kubernetes client when it is installed, which reads $KUBECONFIG.
os.environ["KUBECONFIG"] = args.kubeconfig

import kopf  # noqa: E402

seen: set[str] = set()
all_seen = asyncio.Event()
latencies: list[float] = []
all_updates = asyncio.Event()


@kopf.on.event("configmaps")
async def on_event(event: dict, body: kopf.Body, **_: object) -> None:
    if event.get("type") in (None, "ADDED"):  # None: the object came from kopf's initial listing
        seen.add(body["metadata"]["uid"])
        if len(seen) == args.expect:
            all_seen.set()
    elif event.get("type") == "MODIFIED":
        lat = rc.latency_of(body.get("data"))
        if lat is not None:
            latencies.append(lat)
            if len(latencies) == args.updates:
                all_updates.set()


async def main() -> int:
    stop = asyncio.Event()
    base = rc.baseline()
    operator = asyncio.create_task(kopf.operator(
        standalone=True, clusterwide=False, namespaces=[args.namespace], stop_flag=stop,
    ))
    try:
        await asyncio.wait_for(all_seen.wait(), args.timeout)
        ok = True
    except TimeoutError:
        ok = False
    rc.synced(base, objects=len(seen), adds=len(seen), expect=args.expect, ok=ok)

    if ok and args.mode == "updates":
        await rc.measure_updates(all_updates, latencies, args.timeout)

    if operator.done():
        rc.emit("note", note=f"kopf operator exited early: {operator.exception()!r}")
    # kopf's graceful exit waits for idle per-object workers; the figures are already out.
    sys.stdout.flush()
    os._exit(0 if ok else 2)


if __name__ == "__main__":
    asyncio.run(main())
