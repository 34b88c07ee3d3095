"""Client CPU per watch event through ``ApiClient.stream`` at 1, 50 and 500 concurrent watch streams, HTTP/1.1
against HTTP/2 when the client has that setting (issue 23: the transport must not cost more per event).

    .venv/bin/python bench/transport_bench.py [--streams 1,50,500] [--http2 both|off|on] [--updates 20000] \
        [--rate 350] [--reps 2] [--loop asyncio|uvloop] [--json bench/out/transport.json]
    .venv/bin/python bench/fleet_report.py transport --transport bench/out/transport.json \
        --deadconn bench/out/deadconn.json            # -> bench/RESULTS-transport.md

The updates phase of bench/informer_bench.py with one contender per (streams, transport): the same ConfigMaps
(``configmap(i)``, ~1.1 KB events), the same writer (bench/writer.py: ``--rate`` merge patches/s in all, stamped
with ``data.ts``), the same runner protocol (bench/_runner_common.py) and CPU figure (the runner's own user+sys
from "go" to its ``--updates``-th event). The runner (bench/runner_floor.py with ``--streams S``) opens S watches
on the namespace of ``--objects`` ConfigMaps, watch ``j`` selecting label ``s<S>=j`` (object ``i`` has ``s<S>=i % S``),
so every update reaches exactly one stream and the client sees the same ``--rate`` events/s whatever S is, spread
over S streams: S connections over HTTP/1.1, S streams on one connection over HTTP/2 (the apiserver allows
``--max-streams`` per connection, raised from its default of 100 so that 500 fit on one).

S=1 over HTTP/1.1 is the "watch-floor" contender of bench/RESULTS.md (the same runner), so its CPU per 10k
events compares with that table's row directly; rerun that table with

    .venv/bin/python bench/informer_bench.py --sizes 10000 --reps 1 --update-reps 2 \
        --contenders ours,watch-floor,client-go
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))
sys.path.insert(0, str(BENCH))

OBJECTS = 1000


async def label_objects(kubeconfig: str, namespace: str, n: int, streams: list[int]) -> None:
    """Give object i the labels s<S>=i % S that the runners' watches select on."""
    from informers import ApiClient

    sem = asyncio.Semaphore(32)
    async with ApiClient.from_kubeconfig(kubeconfig) as api:
        async def one(i: int) -> None:
            async with sem:
                await api.request("PATCH", f"/api/v1/namespaces/{namespace}/configmaps/cm-{i:05d}",
                                  body={"metadata": {"labels": {f"s{s}": str(i % s) for s in streams}}},
                                  headers={"Content-Type": "application/merge-patch+json"})

        await asyncio.gather(*(one(i) for i in range(n)))


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--streams", default="1,50,500", help="comma-separated concurrent watch streams")
    p.add_argument("--http2", choices=("off", "on", "both"), default="both",
                   help="when ApiClient has an http2 setting (else HTTP/1.1 only)")
    p.add_argument("--updates", type=int, default=20000, help="events per measurement")
    p.add_argument("--rate", type=float, default=350.0, help="patches per second in all, 0 = unthrottled")
    p.add_argument("--reps", type=int, default=2,
                   help="measurements per (streams, transport), the order reversed each rep")
    p.add_argument("--objects", type=int, default=OBJECTS, help="ConfigMaps the writer cycles through")
    p.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio",
                   help="the runner's event loop (asyncio: as the watch-floor row of bench/RESULTS.md)")
    p.add_argument("--max-streams", type=int, default=1000, help="apiserver --http2-max-streams-per-connection")
    p.add_argument("--cap", type=float, default=600.0, help="seconds before a measurement is given up")
    p.add_argument("--json", default=str(BENCH / "out" / "transport.json"))
    args = p.parse_args()
    try:
        streams = [int(x) for x in args.streams.split(",") if x]
    except ValueError:
        p.error(f"--streams: not a comma-separated list of integers: {args.streams!r}")
    if not streams or min(streams) < 1 or max(streams) > args.objects:
        p.error(f"--streams must be between 1 and --objects ({args.objects})")

    import json

    import _record
    import informer_bench as ib
    from _transport_common import http2_modes, transport_name
    from syncer.testing import ControlPlane

    modes = http2_modes(args.http2)
    out = Path(args.json).parent
    logs = out / f"transport-logs-{time.strftime('%Y%m%d-%H%M%S')}"
    logs.mkdir(parents=True, exist_ok=True)
    results = {**_record.start("transport_bench.py", args),
               "apiserver_flags": [f"--http2-max-streams-per-connection={args.max_streams}"], "runs": []}
    ns = "transport"
    with ControlPlane(name="transport-bench", extra_apiserver_flags=results["apiserver_flags"]) as cp:
        asyncio.run(ib.create_objects(str(cp.kubeconfig), ns, args.objects))
        asyncio.run(label_objects(str(cp.kubeconfig), ns, args.objects, [s for s in streams if s > 1]))
        cases = [(s, h) for s in streams for h in modes]
        for rep in range(args.reps):
            for s, h in (cases if rep % 2 == 0 else cases[::-1]):
                name = f"stream-{s}-{args.http2 if h is None else ('h2' if h else 'h1')}"
                # informer_bench runs contenders by name: this one is the runner above with its settings.
                ib.CONTENDERS[name] = [*ib.CONTENDERS["watch-floor"], "--streams", str(s),
                                       "--http2", {None: "none", True: "on", False: "off"}[h], "--loop", args.loop]
                r = ib.run_updates(cp, name, ns, args.objects, args.updates, args.rate, args.cap, logs)
                r.update(streams=s, http2=h, transport=transport_name(h), rep=rep)
                results["runs"].append(r)
                print(json.dumps({k: r.get(k) for k in ("streams", "transport", "events", "cpu_per_10k", "lat_p50",
                                                        "lat_p99", "error")}), file=sys.stderr, flush=True)
    results["medians"] = [
        {"streams": s, "http2": h, "transport": transport_name(h),
         "cpu_per_10k": statistics.median(v) if (v := [r["cpu_per_10k"] for r in results["runs"]
                                                      if r["streams"] == s and r["http2"] == h
                                                      and r.get("cpu_per_10k")]) else None}
        for s in streams for h in modes]
    _record.write(results, args.json)


if __name__ == "__main__":
    main()
