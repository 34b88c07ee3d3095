"""kopf side of discovery_bench.py (b): a standalone kopf operator that handles resources of CRDs created later.

Usage: kopf_crd_runner.py --kubeconfig K --prefix bench-b [--object probe]

One ``@kopf.on.event`` handler whose resource selector is a callable (kopf 1.45 accepts
``kopf.on.event(fn)`` with ``fn(resource) -> bool``; see ``kopf/_cogs/structs/references.py`` Selector): it
matches every resource whose API group starts with ``--prefix``, whenever such a resource appears. kopf
learns about new resources by watching CRDs and, on each CRD event, re-reading the discovery documents of that
CRD's group (``kopf/_core/reactor/observation.py``), then starts a watcher per matching resource.

The operator runs cluster-wide, standalone (no peering), in this process, with logging at WARNING (no
per-event log lines). The handler is a coroutine. For every object named ``--object`` it prints
``{"ev": "seen", "group": G, "t": time.monotonic(), "type": <watch event type; null for kopf's initial list>}``
once per group, and ``{"ev": "listed", "group": G, "t"}`` when kopf's watcher of G's resource has finished its
initial list (an observation-only wrapper around kopf's internal watch generator: kopf has no public signal).
Prints ``{"ev": "ready"}`` when kopf has raised its ready flag.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time

p = argparse.ArgumentParser()
p.add_argument("--kubeconfig", required=True)
p.add_argument("--prefix", required=True)
p.add_argument("--object", default="probe")
args = p.parse_args()
os.environ["KUBECONFIG"] = args.kubeconfig  # kopf logs in through the kubernetes client, which reads it

import kopf  # noqa: E402
from kopf._cogs.clients import watching  # noqa: E402

logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                    format="%(asctime)s %(levelname)s %(name)s: %(message)s")
seen: set[str] = set()
listed: set[str] = set()


def out(**kw: object) -> None:
    sys.stdout.write(json.dumps(kw) + "\n")
    sys.stdout.flush()


# Observation only: kopf has no public "this resource's watcher has listed" signal (the equivalent of our
# informer's has-synced). Its watcher yields an internal Bookmark.LISTED marker when the initial list is over;
# wrap the generator that produces it (looked up by name from infinite_watch at every call) to time-stamp it.
_continuous_watch = watching.continuous_watch


async def _timed_continuous_watch(*, resource, **kw):  # type: ignore[no-untyped-def]
    async for item in _continuous_watch(resource=resource, **kw):
        if item is watching.Bookmark.LISTED and resource.group.startswith(args.prefix) \
                and resource.group not in listed:
            listed.add(resource.group)
            out(ev="listed", group=resource.group, t=time.monotonic())
        yield item


watching.continuous_watch = _timed_continuous_watch


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: object) -> None:
    settings.posting.enabled = False  # no k8s Events for handler outcomes (on.event posts none anyway)


@kopf.on.event(lambda resource: resource.group.startswith(args.prefix))
async def on_event(event: dict, body: kopf.Body, resource: kopf.Resource, **_: object) -> None:
    t = time.monotonic()
    if body.get("metadata", {}).get("name") != args.object or resource.group in seen:
        return
    if event.get("type") in (None, "ADDED", "MODIFIED"):
        seen.add(resource.group)
        out(ev="seen", group=resource.group, t=t, type=event.get("type"))


async def main() -> None:
    ready = asyncio.Event()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    import signal  # noqa: PLC0415

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    operator = asyncio.create_task(kopf.operator(standalone=True, clusterwide=True, ready_flag=ready,
                                                 stop_flag=stop))
    await asyncio.wait([operator, asyncio.create_task(ready.wait())], return_when=asyncio.FIRST_COMPLETED)
    out(ev="ready", t=time.monotonic())
    await asyncio.wait([operator, asyncio.create_task(stop.wait())], return_when=asyncio.FIRST_COMPLETED)
    if operator.done() and operator.exception():
        out(ev="operator_exited", error=repr(operator.exception()))
    sys.stdout.flush()
    os._exit(0)  # kopf's graceful exit waits for idle workers; nothing left to report


if __name__ == "__main__":
    asyncio.run(main())
