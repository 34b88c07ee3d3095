"""discovery_bench.py (c) and (d), the measured process: one DiscoveringDynamicSharedInformerFactory, nothing else.

Usage: disc_idle_probe.py --kubeconfig K --include 'bench-idle-*.example.com/*' --expect 300 --idle 60

JSON lines on stdout:
  {"ev": "baseline", ...}   factory started, 0 matching GVRs: RSS (after gc + malloc_trim, and as is), TCP conns
  {"ev": "all_synced", ...} ``--expect`` informers synced (the parent creates the CRDs after "baseline")
  {"ev": "idle", ...}       after ``--idle`` s of doing nothing: CPU, RSS, connections, passes, watch events
  {"ev": "pass_cost", ...}  ``f.discovery.discover()`` and one whole factory pass, each timed ``--repeat`` times
"""

from __future__ import annotations

import argparse
import asyncio
import asyncio.sslproto
import sys
import time
from pathlib import Path
from urllib.parse import urlparse

sys.path.insert(0, str(Path(__file__).resolve().parent))
import disc_common as dc  # noqa: E402

from informers import ApiClient, DiscoveringDynamicSharedInformerFactory, DiscoveryOptions, ResourceFilter  # noqa: E402


def out(**kw: object) -> None:
    import json  # noqa: PLC0415

    sys.stdout.write(json.dumps(kw, default=str) + "\n")
    sys.stdout.flush()


def memory(port: int) -> dict[str, object]:
    raw = dc.rss_bytes()
    dc.trim_heap()
    return {"rss_raw": raw, "rss": dc.rss_bytes(), "conns": dc.tcp_connections_to(port),
            "tasks": len(asyncio.all_tasks())}


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--include", required=True)
    p.add_argument("--expect", type=int, required=True)
    p.add_argument("--idle", type=float, default=60.0)
    p.add_argument("--settle", type=float, default=10.0)
    p.add_argument("--repeat", type=int, default=5)
    p.add_argument("--timeout", type=float, default=600.0)
    p.add_argument("--ssl-read-buffer", type=int, default=0,
                   help="diagnosis only: set asyncio.sslproto.SSLProtocol.max_size (the per-connection TLS read "
                        "buffer, 256 KiB in CPython 3.11) to see how much of the RSS per informer it is")
    args = p.parse_args()
    if args.ssl_read_buffer:
        asyncio.sslproto.SSLProtocol.max_size = args.ssl_read_buffer
    client = ApiClient.from_kubeconfig(args.kubeconfig)
    port = urlparse(client.host).port or 443
    f = DiscoveringDynamicSharedInformerFactory(client, DiscoveryOptions(filter=ResourceFilter(include=[args.include])))
    await f.start()
    await asyncio.sleep(args.settle)
    synced, pending = f.informers()
    out(ev="baseline", informers=len(synced) + len(pending), passes=f.passes, **memory(port))

    sub = f.subscribe("probe")
    t0 = time.monotonic()
    async with asyncio.timeout(args.timeout):
        async for _ in sub:
            synced, pending = f.informers()
            if len(synced) >= args.expect and not pending:
                break
    out(ev="all_synced", informers=len(synced), after=time.monotonic() - t0, passes=f.passes)

    await asyncio.sleep(args.settle)
    before = memory(port)
    events0 = {g: dict(inf.reflector.event_counts) for g, inf in f.informers()[0].items()}
    passes0 = f.passes
    c0, w0 = dc.cpu_seconds(), time.monotonic()
    await asyncio.sleep(args.idle)
    c1, w1 = dc.cpu_seconds(), time.monotonic()
    synced, pending = f.informers()
    delta: dict[str, int] = {}
    for g, inf in synced.items():
        for k, v in inf.reflector.event_counts.items():
            delta[k] = delta.get(k, 0) + v - events0.get(g, {}).get(k, 0)
    out(ev="idle", informers=len(synced), not_synced=len(pending), cpu_s=c1 - c0, wall_s=w1 - w0,
        cpu_pct=100 * (c1 - c0) / (w1 - w0), passes_during=f.passes - passes0, watch_events=delta,
        before=before, after=memory(port))

    disc = []
    for _ in range(args.repeat):
        c, w = time.process_time(), time.perf_counter()
        r = await f.discovery.discover()
        disc.append({"cpu_ms": (time.process_time() - c) * 1000, "wall_ms": (time.perf_counter() - w) * 1000,
                     "requests": r.requests, "resources": len(r.resources), "aggregated": r.aggregated})
    whole = []
    for _ in range(args.repeat):
        c, w = time.process_time(), time.perf_counter()
        await f._pass(periodic=False)  # the factory's whole pass (private: no public way to run one and await it)
        whole.append({"cpu_ms": (time.process_time() - c) * 1000, "wall_ms": (time.perf_counter() - w) * 1000,
                      "requests": f.last_pass.requests if f.last_pass else None})
    sizes = {}
    for path in ("/api", "/apis"):
        raw = await client.request_bytes("GET", path, headers={"Accept": dc_aggregated()})
        sizes[path] = len(raw)
    out(ev="pass_cost", discover=disc, whole_pass=whole, last_pass_requests=f.last_pass.requests if f.last_pass
        else None, response_bytes=sizes, resources_served=len(f.last_pass.resources) if f.last_pass else None)
    await f.shutdown()
    await client.close()


def dc_aggregated() -> str:
    from informers.discovery import _AGGREGATED  # noqa: PLC0415

    return _AGGREGATED


if __name__ == "__main__":
    asyncio.run(main())
