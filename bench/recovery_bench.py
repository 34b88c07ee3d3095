"""Recovery after an apiserver outage (issue 9): how soon do informers watch again, and see a new object?

Usage: .venv/bin/python bench/recovery_bench.py [--informers 20] [--outage 30] [--probe-after 3] [--reps 3]
       [--out bench/out]

One local control plane; ``--informers`` ConfigMap informers, one per namespace, all on one ApiClient (as in a
sidecar). Each repetition stops the apiserver for ``--outage`` seconds and starts it again. "Ready" is the first
200 from /readyz, which a second client polls every 50 ms from the restart on. ``--probe-after`` seconds after
ready, that client creates one ConfigMap in every namespace. Measured from ready:

- **watching again**: per informer, the moment from which, to the end of the repetition, its watch stream is
  open (response received) and it needs no relist. Polled every 10 ms.
- **probe seen**: per informer, when its handler gets the probe ConfigMap.

The writes and every other request of the bench go through a separate client, so that the only server answers
the informers' client gets are their own. To measure another version of ``informers/`` (e.g. the code before a
change), put a copy first on PYTHONPATH: see bench/RESULTS-recovery.md.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import statistics
import time
from collections import Counter
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, AsyncIterator, Mapping

import aiohttp
from prometheus_client import CollectorRegistry

import informers
from informers import GVR, ApiClient, ApiError, DynamicSharedInformerFactory, FuncHandler, SharedIndexInformer
from syncer.testing import ControlPlane

CONFIGMAPS = GVR("", "v1", "configmaps")
POLL = 0.01


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class StreamTrackingClient(ApiClient):
    """Counts the watch streams open right now, per path (once the server's response has arrived)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.open_streams: Counter[str] = Counter()

    @asynccontextmanager
    async def stream(self, path: str, params: Mapping[str, str],
                     inactivity_timeout: float | None = None) -> AsyncIterator[AsyncIterator[dict[str, Any]]]:
        async with super().stream(path, params, inactivity_timeout) as events:
            self.open_streams[path] += 1
            try:
                yield events
            finally:
                self.open_streams[path] -= 1


class Watched:
    """One namespace's informer and what the bench observes of it."""

    def __init__(self, client: StreamTrackingClient, namespace: str, registry: CollectorRegistry) -> None:
        self.client = client
        self.namespace = namespace
        self.path = CONFIGMAPS.path(namespace)
        self.factory = DynamicSharedInformerFactory(client, namespace=namespace, metrics_registry=registry)
        self.informer: SharedIndexInformer = self.factory.for_resource(CONFIGMAPS)[0]
        self.seen: dict[str, float] = {}
        self.informer.add_event_handler(FuncHandler(on_add=self._added, name="bench"))
        self.watching_since: float | None = None

    def _added(self, obj: dict[str, Any], initial: bool) -> None:
        self.seen.setdefault(obj["metadata"]["name"], time.monotonic())

    def poll(self, now: float) -> None:
        watching = self.client.open_streams[self.path] > 0 and not self.informer.reflector._need_list
        if not watching:
            self.watching_since = None
        elif self.watching_since is None:
            self.watching_since = now


async def poller(watched: list[Watched]) -> None:
    while True:
        now = time.monotonic()
        for w in watched:
            w.poll(now)
        await asyncio.sleep(POLL)


async def first_ready(admin: ApiClient) -> float:
    """When /readyz first answers 200."""
    while True:
        try:
            await admin.request_bytes("GET", "/readyz", timeout=2)
            return time.monotonic()
        except (ApiError, aiohttp.ClientError, OSError, TimeoutError):
            await asyncio.sleep(0.05)


async def one_outage(cp: ControlPlane, admin: ApiClient, watched: list[Watched], rep: int,
                     args: argparse.Namespace) -> dict[str, Any]:
    log(f"rep {rep}: stopping the apiserver for {args.outage:g}s")
    await asyncio.to_thread(cp.stop_apiserver)
    await asyncio.sleep(args.outage)
    starting = asyncio.create_task(asyncio.to_thread(cp.start_apiserver))
    ready = await first_ready(admin)
    log(f"rep {rep}: apiserver ready")
    await starting
    await asyncio.sleep(max(0.0, ready + args.probe_after - time.monotonic()))
    probe = f"probe-{rep}"
    await asyncio.gather(*(admin.request("POST", w.path, body={"metadata": {"name": probe}}) for w in watched))
    created = time.monotonic()
    deadline = ready + args.cap
    while time.monotonic() < deadline and not all(probe in w.seen and w.watching_since is not None for w in watched):
        await asyncio.sleep(0.1)
    await asyncio.sleep(args.settle)  # a watch that opens and fails at once must not count as "watching"
    missing = [w.namespace for w in watched if probe not in w.seen or w.watching_since is None]
    watching = [w.watching_since - ready for w in watched if w.watching_since is not None]
    seen = [w.seen[probe] - ready for w in watched if probe in w.seen]
    result = {
        "rep": rep, "probe_created_after_ready_s": created - ready, "missing": missing,
        "watching_again_s": {"max": max(watching, default=None), "median": statistics.median(watching) if watching
                             else None, "all": sorted(watching)},
        "probe_seen_s": {"max": max(seen, default=None), "median": statistics.median(seen) if seen else None,
                         "all": sorted(seen)},
    }
    log(f"rep {rep}: every informer watching again {_fmt(result['watching_again_s']['max'])} s after ready "
        f"(median {_fmt(result['watching_again_s']['median'])}); probe seen by all "
        f"{_fmt(result['probe_seen_s']['max'])} s after ready; missing: {missing or 'none'}")
    return result


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f}"


async def main(args: argparse.Namespace) -> None:
    log(f"informers imported from {Path(informers.__file__).parent}")
    cp = await asyncio.to_thread(lambda: ControlPlane().start())
    try:
        admin = ApiClient.from_kubeconfig(str(cp.kubeconfig))
        client = StreamTrackingClient(admin.configuration)
        namespaces = [f"recovery-{i:02d}" for i in range(args.informers)]
        await asyncio.gather(*(admin.request("POST", "/api/v1/namespaces", body={"metadata": {"name": ns}})
                               for ns in namespaces))
        registry = CollectorRegistry()
        watched = [Watched(client, ns, registry) for ns in namespaces]
        for w in watched:
            w.factory.start()
        assert all(await asyncio.gather(*(w.informer.wait_for_sync(60) for w in watched)))
        poll_task = asyncio.create_task(poller(watched))
        results = []
        try:
            for rep in range(args.reps):
                # Let every watch settle between outages (and the reflectors' backoff, which resets after 2 min
                # without errors, stay as the previous outage left it: that is what a real second outage meets).
                await asyncio.sleep(args.between)
                results.append(await one_outage(cp, admin, watched, rep, args))
        finally:
            poll_task.cancel()
            await asyncio.gather(poll_task, return_exceptions=True)
            await asyncio.gather(*(w.factory.shutdown() for w in watched))
            await client.close()
            await admin.close()
    finally:
        await asyncio.to_thread(cp.stop)
    out = {
        "args": vars(args), "informers_package": str(Path(informers.__file__).parent),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpus": os.cpu_count(), "python": platform.python_version(), "load_avg_at_end": os.getloadavg(),
        "reps": results,
    }
    Path(args.out).mkdir(parents=True, exist_ok=True)
    path = Path(args.out) / f"recovery-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(out, indent=2))
    print(f"\nresults: {path}\n")
    print("| rep | every informer watching again (s after ready) | median | probe (created at +"
          f"{args.probe_after:g} s) seen by all | median |")
    print("|---:|---:|---:|---:|---:|")
    for r in results:
        print(f"| {r['rep']} | {_fmt(r['watching_again_s']['max'])} | {_fmt(r['watching_again_s']['median'])} | "
              f"{_fmt(r['probe_seen_s']['max'])} | {_fmt(r['probe_seen_s']['median'])} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--informers", type=int, default=20)
    parser.add_argument("--outage", type=float, default=30.0)
    parser.add_argument("--probe-after", type=float, default=3.0)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--between", type=float, default=5.0, help="seconds of normal operation before an outage")
    parser.add_argument("--settle", type=float, default=2.0, help="seconds observed after everything recovered")
    parser.add_argument("--cap", type=float, default=150.0, help="give up on a repetition after this many seconds")
    parser.add_argument("--out", default="bench/out")
    asyncio.run(main(parser.parse_args()))
