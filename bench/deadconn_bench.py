"""A dead connection under 50 watches: every watch's recovery time after the proxy cuts its connections, and the
final caches against a fresh LIST (issue 23: every watch back within 2 s, 0 divergent objects).

    .venv/bin/python bench/deadconn_bench.py [--watches 50] [--objects 20] [--rate 200] [--cuts 3] \
        [--fault cut|freeze] [--http2 off|on|both] [--json bench/out/deadconn.json]
    .venv/bin/python bench/fleet_report.py transport --deadconn bench/out/deadconn.json \
        --transport bench/out/transport.json          # -> bench/RESULTS-transport.md

One member (one ApiClient, as one member of the fleet has) reaches a local control plane through a loopback TCP
proxy (tests/proxy.py). It runs ``--watches`` ConfigMap informers, one per namespace (so 50 watch streams: 50
connections over HTTP/1.1, one or a few over HTTP/2). A writer on a direct client (not through the proxy)
changes the objects all the time: round-robin over the namespaces at ``--rate`` requests/s in all, each change
stamps ``data.ts`` with its wall time; every tenth change of a namespace deletes one object and creates another.

Per cut, with the writer running, the proxy closes every connection it carries (``--fault cut``: both sides
aborted, as a dropped NAT entry or a restarted load balancer would; ``freeze``: the connections go silent
without closing, the half-open case, which only a keepalive PING or the inactivity timeout detects). Per watch
(namespace) it notes, from the cut:

- ``reopen``: the informer's watch stream was answered again (``ApiClient.stream``, seen through a subclass);
- ``event``: the informer's handler got an object written after the cut: the watch delivers again. Its
  resolution is one writer period per namespace (``--watches / --rate`` s).

After the last cut the writer stops, and each informer's cache (names and resourceVersions) is compared with
a fresh LIST of its namespace, waiting up to ``--settle`` s for it to catch up: objects missing, extra or at
another resourceVersion at the end are divergent.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import _record  # noqa: E402
from _transport_common import client_class, http2_modes, transport_name  # noqa: E402
from informers import GVR, ApiClient, DynamicSharedInformerFactory, FuncHandler  # noqa: E402
from tests.proxy import Proxy  # noqa: E402

CONFIGMAPS = GVR("", "v1", "configmaps")
OUT = ROOT / "bench" / "out"
LABELS = {"bench": "deadconn"}


def q(values: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(p * len(s) + 0.5)) - 1))]


class Writer:
    """Changes the objects of every namespace round-robin at a fixed total rate until stopped."""

    def __init__(self, api: ApiClient, namespaces: list[str], objects: int, rate: float) -> None:
        self.api, self.namespaces, self.rate = api, namespaces, rate
        self.names = {ns: [f"cm-{i:03d}" for i in range(objects)] for ns in namespaces}
        self.created = 0
        self.requests = 0
        self.errors = 0

    async def run(self) -> None:
        t0, i = time.monotonic(), 0
        while True:
            ns = self.namespaces[i % len(self.namespaces)]
            turn = i // len(self.namespaces)
            try:
                if turn % 10 == 9:  # churn: one object goes, a new one comes
                    gone = self.names[ns].pop(0)
                    await self.api.request("DELETE", CONFIGMAPS.path(ns, gone))
                    self.created += 1
                    new = f"new-{self.created:05d}"
                    await self.api.request("POST", CONFIGMAPS.path(ns), body={
                        "metadata": {"name": new, "labels": LABELS}, "data": {"ts": repr(time.time())}})
                    self.names[ns].append(new)
                    self.requests += 2
                else:
                    name = self.names[ns][turn % len(self.names[ns])]
                    await self.api.request("PATCH", CONFIGMAPS.path(ns, name),
                                           body={"data": {"ts": repr(time.time())}},
                                           headers={"Content-Type": "application/merge-patch+json"})
                    self.requests += 1
            except Exception as e:  # the writer goes direct, so an error here is the server's, not the cut's
                self.errors += 1
                print(f"writer: {ns}: {e}", file=sys.stderr)
            i += 1
            if (wait := t0 + i / self.rate - time.monotonic()) > 0:
                await asyncio.sleep(wait)


async def divergence(api: ApiClient, listers: dict[str, Any], settle: float) -> tuple[int, float]:
    """Objects whose name or resourceVersion differ between the caches and a fresh LIST; polled until 0 or
    ``settle`` s; (divergent at the end, seconds until then)."""
    t0 = time.monotonic()
    while True:
        divergent = 0
        for ns, lister in listers.items():
            listed = await api.request("GET", CONFIGMAPS.path(ns))
            truth = {o["metadata"]["name"]: o["metadata"]["resourceVersion"] for o in listed["items"]}
            cached = {o["metadata"]["name"]: o["metadata"]["resourceVersion"] for o in lister.list(ns)}
            divergent += len(truth.keys() ^ cached.keys()) + sum(
                1 for k in truth.keys() & cached.keys() if truth[k] != cached[k])
        took = time.monotonic() - t0
        if divergent == 0 or took >= settle:
            return divergent, took
        await asyncio.sleep(0.2)


async def one_mode(cp: Any, direct: ApiClient, namespaces: list[str], http2: bool | None,
                   args: argparse.Namespace) -> dict[str, Any]:
    proxy = await Proxy(cp.port).start()
    kubeconfig = OUT / "deadconn-member.kubeconfig"
    kubeconfig.write_bytes(cp.member_kubeconfig(server=f"https://127.0.0.1:{proxy.port}"))
    opened: dict[str, list[float]] = {ns: [] for ns in namespaces}
    fresh: dict[str, list[float]] = {ns: [] for ns in namespaces}  # arrival of objects written after the cut
    cut_wall = [float("inf")]

    def on_stream(path: str, t: float) -> None:
        parts = path.split("/")
        if "namespaces" in parts:
            ns = parts[parts.index("namespaces") + 1]
            if ns in opened:
                opened[ns].append(t)

    def seen(ns: str, obj: Any) -> None:
        ts = (obj.get("data") or {}).get("ts")
        if ts is not None and float(ts) >= cut_wall[0]:
            fresh[ns].append(time.monotonic())

    client = client_class(http2, on_stream).from_kubeconfig(str(kubeconfig))
    factories, listers = [], {}
    for ns in namespaces:
        f = DynamicSharedInformerFactory(client, namespace=ns)
        inf, listers[ns] = f.for_resource(CONFIGMAPS)
        inf.add_event_handler(FuncHandler(on_add=lambda o, _i, ns=ns: seen(ns, o),
                                          on_update=lambda _o, n, ns=ns: seen(ns, n)))
        factories.append(f)
    writer = Writer(direct, namespaces, args.objects, args.rate)
    writing: asyncio.Task[None] | None = None
    cuts: list[dict[str, Any]] = []
    try:
        for f in factories:
            f.start()
        synced = await asyncio.gather(*(f.wait_for_cache_sync(60) for f in factories))
        if not all(all(s.values()) for s in synced):
            raise RuntimeError("not every informer synced within 60 s")
        writing = asyncio.create_task(writer.run())
        await asyncio.sleep(args.warmup)
        for c in range(args.cuts):
            conns = proxy.open_connections
            t_cut, cut_wall[0] = time.monotonic(), time.time()
            proxy.cut() if args.fault == "cut" else proxy.freeze()
            deadline = t_cut + args.recover_timeout
            while time.monotonic() < deadline and not all(any(t > t_cut for t in fresh[ns]) for ns in namespaces):
                await asyncio.sleep(0.05)
            if args.fault == "freeze":
                proxy.cut()  # free the frozen pipes (their clients have left them or will be counted as lost)
            reopen = [min((t - t_cut for t in opened[ns] if t > t_cut), default=None) for ns in namespaces]
            event = [min((t - t_cut for t in fresh[ns] if t > t_cut), default=None) for ns in namespaces]
            got = [x for x in event if x is not None]
            reo = [x for x in reopen if x is not None]
            cut = {"cut": c, "connections_before": conns, "watches": len(namespaces),
                   "recovered": len(got), "reopened": len(reo),
                   "event_max_s": max(got, default=None), "event_p50_s": statistics.median(got) if got else None,
                   "reopen_max_s": max(reo, default=None), "reopen_p50_s": statistics.median(reo) if reo else None,
                   "within_2s": sum(1 for x in got if x <= 2.0), "event_s": event, "reopen_s": reopen}
            cuts.append(cut)
            print(json.dumps({k: v for k, v in cut.items() if k not in ("event_s", "reopen_s")}),
                  file=sys.stderr, flush=True)
            cut_wall[0] = float("inf")
            await asyncio.sleep(args.between)
        writing.cancel()
        await asyncio.gather(writing, return_exceptions=True)
        writing = None
        divergent, settle_s = await divergence(direct, listers, args.settle)
        every = [x for c in cuts for x in c["event_s"]]
        return {"transport": transport_name(http2), "http2": http2, "cuts": cuts, "divergent": divergent,
                "settle_s": settle_s, "writer_requests": writer.requests, "writer_errors": writer.errors,
                "proxy_accepted": proxy.accepted,
                "all_recovered": all(x is not None for x in every),
                "event_max_s": max((x for x in every if x is not None), default=None),
                "event_p50_s": statistics.median([x for x in every if x is not None]) if any(
                    x is not None for x in every) else None,
                "event_p99_s": q([x for x in every if x is not None], 0.99) if any(
                    x is not None for x in every) else None,
                "reopen_max_s": max((x for c in cuts for x in c["reopen_s"] if x is not None), default=None),
                "resolution_s": len(namespaces) / args.rate}
    finally:
        if writing is not None:
            writing.cancel()
            await asyncio.gather(writing, return_exceptions=True)
        await asyncio.gather(*(f.shutdown() for f in factories))
        await client.close()
        await proxy.stop()


async def harness(args: argparse.Namespace) -> dict[str, Any]:
    from syncer.testing import ControlPlane

    OUT.mkdir(exist_ok=True)
    modes = http2_modes(args.http2)
    namespaces = [f"dc-{i:03d}" for i in range(args.watches)]
    with ControlPlane(name="deadconn-bench") as cp:
        async with ApiClient.from_kubeconfig(str(cp.kubeconfig)) as direct:
            sem = asyncio.Semaphore(32)

            async def post(path: str, body: dict[str, Any]) -> None:
                async with sem:
                    await direct.request("POST", path, body=body)

            await asyncio.gather(*(post("/api/v1/namespaces", {"metadata": {"name": ns}}) for ns in namespaces))
            results = {**_record.start("deadconn_bench.py", args), "modes": []}
            for k, http2 in enumerate(modes):
                # Each mode starts from the same objects: recreate them (a fresh writer renames as it churns).
                for ns in namespaces:
                    await direct.request("DELETE", CONFIGMAPS.path(ns), params={"labelSelector": "bench=deadconn"})
                await asyncio.gather(*(post(CONFIGMAPS.path(ns), {
                    "metadata": {"name": f"cm-{i:03d}", "labels": LABELS}, "data": {"ts": "0"}})
                    for ns in namespaces for i in range(args.objects)))
                results["modes"].append(await one_mode(cp, direct, namespaces, http2, args))
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--watches", type=int, default=50, help="informers (one namespace each) on the member")
    p.add_argument("--objects", type=int, default=20, help="ConfigMaps per namespace")
    p.add_argument("--rate", type=float, default=200.0, help="writer requests/s over all namespaces")
    p.add_argument("--cuts", type=int, default=3)
    p.add_argument("--fault", choices=("cut", "freeze"), default="cut")
    p.add_argument("--http2", choices=("off", "on", "both"), default="both",
                   help="when ApiClient has an http2 setting (else HTTP/1.1 only)")
    p.add_argument("--warmup", type=float, default=3.0, help="seconds of writes before the first cut")
    p.add_argument("--between", type=float, default=5.0, help="seconds between cuts")
    p.add_argument("--recover-timeout", type=float,
                   help="seconds a cut waits for every watch (default 30; with --fault freeze 200, above the "
                        "reflector's 150 s inactivity timeout that notices a frozen HTTP/1.1 stream)")
    p.add_argument("--settle", type=float, default=10.0, help="seconds the final caches may take to catch up")
    p.add_argument("--json", default=str(OUT / "deadconn.json"))
    args = p.parse_args()
    from loguru import logger

    logger.remove()  # the reflectors' retry notes, 50 per cut, would drown the results
    logger.add(sys.stderr, level="WARNING")
    if args.recover_timeout is None:
        args.recover_timeout = 200.0 if args.fault == "freeze" else 30.0
    _record.write(asyncio.run(harness(args)), args.json)


if __name__ == "__main__":
    main()
