"""The sidecar's event loop: asyncio's default loop against uvloop, side by side in one run.

Usage: .venv/bin/python bench/uvloop_bench.py [--objects 10000] [--rounds 5] [--updates 10000] [--rate 350]
       [--idle-informers 200] [--synced-informers 50] [--synced-objects 200] [--idle-rounds 3] [--out bench/out]

One local control plane, one namespace of ``--objects`` ConfigMaps (the same objects as informer_bench.py), and
three measurements, each taken ``--rounds`` (``--idle-rounds``) times with the loops interleaved and their order
alternating from round to round. Every process prepares its loop as ``syncer run`` does: asyncio's TLS read buffer
shrunk to 16 KiB (``small_tls_read_buffers()``), then the loop ``syncer.cli.event_loop`` picks.

1. Initial sync client CPU: runner_ours.py (our informer, a no-op handler) syncing the namespace, once with the
   default watch-list sync and once with paged LIST + WATCH; CPU is user+sys of the process from just before the
   informer starts to "the handler has every object" (informer_bench.py's run_sync).
2. CPU per watch event: the same runner after its sync, while writer.py patches the objects at ``--rate``/s
   until the runner has seen ``--updates`` update events (informer_bench.py's run_updates).
3. Idle RSS per informer: one process starts one informer per namespace (one watch connection each),
   ``--idle-informers`` of them after a warm-up informer; RSS growth / informers, after gc and malloc_trim. Once
   with empty namespaces, once with ``--synced-informers`` namespaces of ``--synced-objects`` ConfigMaps each: a
   sync pushes a burst through each connection, which is what makes uvloop's lazily allocated TLS read buffer
   resident (the growth then includes the cached objects, the same for every loop).
   Besides the two loops it measures ``asyncio-256k``: asyncio without the sidecar's TLS read-buffer shrink,
   which is what the shrink saves (uvloop has its own TLS implementation, which the shrink does not reach).

Raw results: <out>/uvloop-<timestamp>.json; the tables are printed and written to <out>/uvloop-<timestamp>.md.
"""

from __future__ import annotations

import argparse
import asyncio
import asyncio.sslproto
import ctypes
import datetime
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import _runner_common as rc  # bench/ is sys.path[0] when this script runs

BENCH = Path(__file__).resolve().parent
PYTHON = sys.executable
LOOPS = ("asyncio", "uvloop")
IDLE_LOOPS = (*LOOPS, "asyncio-256k")
TLS_READ_BUFFER = 16 * 1024  # syncer/runtime.py's


# -- the measured processes ----------------------------------------------------------------------------------
def prepare(loop: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """Set this process up as ``syncer run`` does for ``loop`` (``small_tls_read_buffers()`` in
    syncer/runtime.py, then the factory of ``event_loop()`` in syncer/cli.py); return the loop factory.

    Written out rather than imported: the measured processes import only the informers snapshot, so that other
    people's work in syncer/ during a run cannot change or break what is measured.
    """
    if loop != "asyncio-256k":
        asyncio.sslproto.SSLProtocol.max_size = TLS_READ_BUFFER
    if loop != "uvloop":
        return None
    import uvloop

    return uvloop.new_event_loop


def runner_child(loop: str, argv: list[str]) -> int:
    """runner_ours.py with ``argv``, on ``loop``."""
    factory = prepare(loop)
    sys.argv = [str(BENCH / "runner_ours.py"), *argv]
    import runner_ours

    async def main() -> int:
        rc.emit("loop", module=type(asyncio.get_running_loop()).__module__)  # the driver keeps it in the notes
        return await runner_ours.main()

    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main())


def _trimmed_rss() -> int:
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    return rc.rss_bytes()


async def idle_probe(kubeconfig: str, prefix: str, informers: int, settle: float) -> dict[str, Any]:
    import psutil

    from informers import GVR, ApiClient, DynamicSharedInformerFactory

    client = ApiClient.from_kubeconfig(kubeconfig)
    port = int(client.host.rsplit(":", 1)[1])
    factories: list[DynamicSharedInformerFactory] = []

    async def start(namespace: str) -> None:
        factory = DynamicSharedInformerFactory(client, namespace=namespace)
        inf, _ = factory.for_resource(GVR("", "v1", "configmaps"))
        factories.append(factory)
        factory.start()
        if not await inf.wait_for_sync(120):
            raise RuntimeError(f"informer for {namespace} did not sync")

    def conns() -> int:
        return sum(1 for c in psutil.Process().net_connections(kind="tcp") if c.raddr and c.raddr.port == port)

    # The warm-up informer puts the imports, the client session and a first connection into the baseline.
    await start(f"{prefix}-0")
    await asyncio.sleep(settle)
    base, conns0 = _trimmed_rss(), conns()
    for first in range(1, informers + 1, 25):
        await asyncio.gather(*(start(f"{prefix}-{i}") for i in range(first, min(first + 25, informers + 1))))
    await asyncio.sleep(settle)
    raw = rc.rss_bytes()
    after, conns1 = _trimmed_rss(), conns()
    objects = sum(len(inf.store) for f in factories for inf in f.informers().values())
    for factory in factories:
        await factory.shutdown()
    await client.close()
    return {"informers": informers, "rss_base": base, "rss": after, "rss_raw": raw,
            "per_informer": (after - base) / informers, "raw_per_informer": (raw - base) / informers,
            "conns_added": conns1 - conns0, "objects": objects,
            "loop_module": type(asyncio.get_running_loop()).__module__}


def idle_child(loop: str, kubeconfig: str, prefix: str, informers: int, settle: float) -> int:
    factory = prepare(loop)
    with asyncio.Runner(loop_factory=factory) as runner:
        print(json.dumps(runner.run(idle_probe(kubeconfig, prefix, informers, settle))), flush=True)
    return 0


# -- the driver ------------------------------------------------------------------------------------------------
def ran_on(r: dict[str, Any]) -> str | None:
    """The loop module a runner reported (see runner_child), or None."""
    return next((n["module"] for n in r.get("notes", []) if n.get("event") == "loop"), None)


def idle_scenarios(a: dict[str, Any]) -> list[tuple[str, str, int, int]]:
    """(name, namespace prefix, informers, objects per namespace) of the idle RSS measurements."""
    return [("empty", "empty", a["idle_informers"], 0),
            ("synced", "synced", a["synced_informers"], a["synced_objects"])]


async def _gather(coros: Any) -> None:
    await asyncio.gather(*coros)


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def interleaved(rounds: int, names: tuple[str, ...]) -> list[tuple[int, str]]:
    """(round, name) pairs: every name once a round, the order reversed every other round."""
    return [(r, n) for r in range(rounds) for n in (names if r % 2 == 0 else tuple(reversed(names)))]


def report(results: dict[str, Any]) -> str:
    a = results["args"]
    out = [f"uvloop {results['versions']['uvloop']}, Python {results['versions']['python']}; "
           f"{results['machine']['cpus']} CPUs, load {results['machine']['load_at_start'][0]:.1f} at the start, "
           f"{results['machine']['load_at_end'][0]:.1f} at the end; run took {results['total_seconds'] / 60:.1f} min"]

    def row(label: str, key: str, rows: list[dict[str, Any]], spec: str, scale: float = 1.0) -> None:
        meds = {}
        each = {}
        for loop in LOOPS:
            vals = [r[key] * scale for r in rows if r.get("loop") == loop and r.get(key) is not None]
            meds[loop] = median(vals)
            each[loop] = ", ".join(format(v, spec) for v in vals)
        ratio = (meds["uvloop"] / meds["asyncio"]) if meds["asyncio"] and meds["uvloop"] is not None else None
        out.append(f"| {label} | {_fmt(meds['asyncio'], spec)} | {_fmt(meds['uvloop'], spec)} | "
                   f"**{_fmt(ratio, '.2f')}** | {each['asyncio']} | {each['uvloop']} |")

    out.append(f"\n| measure (median of {a['rounds']}) | asyncio | uvloop | uvloop / asyncio | asyncio, each round "
               "| uvloop, each round |")
    out.append("|---|---:|---:|---:|---|---|")
    for mode in ("watch-list", "list"):
        rows = [r for r in results["sync"] if r["sync"] == mode]
        row(f"initial sync of {a['objects']:,}, {mode}: client CPU s", "cpu_sync", rows, ".3f")
        row(f"initial sync of {a['objects']:,}, {mode}: wall s", "wall", rows, ".3f")
    row("watch events: client CPU s / 10k events", "cpu_per_10k", results["updates"], ".3f")
    row("watch events: latency p50 ms", "lat_p50", results["updates"], ".2f", 1e3)
    row("watch events: latency p99 ms", "lat_p99", results["updates"], ".2f", 1e3)

    out.append(f"\n| idle informers (median of {a['idle_rounds']}) | loop | RSS KiB / informer | same before "
               "malloc_trim | watch connections added | each round, KiB / informer |")
    out.append("|---|---|---:|---:|---:|---|")
    for scenario, _, n, objects in idle_scenarios(a):
        for loop in IDLE_LOOPS:
            rows = [r for r in results["idle"]
                    if r["scenario"] == scenario and r["loop"] == loop and "per_informer" in r]
            per = [r["per_informer"] / 1024 for r in rows]
            out.append(f"| {n} informers, {objects} objects each | {loop} | {_fmt(median(per), ',.0f')} | "
                       f"{_fmt(median([r['raw_per_informer'] / 1024 for r in rows]), ',.0f')} | "
                       f"{_fmt(median([float(r['conns_added']) for r in rows]), '.0f')} | "
                       f"{', '.join(format(v, ',.0f') for v in per)} |")
    wrong = [r for part in ("sync", "updates", "idle") for r in results[part]
             if (r.get("loop_module") or "").startswith("uvloop") != (r["loop"] == "uvloop")]
    out.append(f"\nEvery measured process reported the loop it ran on: {len(wrong)} ran on the wrong one.")
    failed = [r for part in ("sync", "updates", "idle") for r in results[part] if r.get("error") or r.get("capped")]
    if failed:
        out.append(f"\n{len(failed)} measurement(s) failed: "
                   + "; ".join(f"{r.get('loop')}: {r.get('error') or 'capped'}" for r in failed))
    return "\n".join(out)


def _fmt(v: float | None, spec: str) -> str:
    return "n/a" if v is None else format(v, spec)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--objects", type=int, default=10000)
    p.add_argument("--rounds", type=int, default=5, help="rounds of the sync and the updates measurements")
    p.add_argument("--updates", type=int, default=10000, help="update events per updates measurement")
    p.add_argument("--rate", type=float, default=350.0, help="patches per second in all (informer_bench.py's)")
    p.add_argument("--idle-informers", type=int, default=200)
    p.add_argument("--synced-informers", type=int, default=50,
                   help="informers for the idle RSS after a sync of --synced-objects objects each")
    p.add_argument("--synced-objects", type=int, default=200)
    p.add_argument("--idle-rounds", type=int, default=3)
    p.add_argument("--settle", type=float, default=5.0, help="seconds of quiet before each idle RSS reading")
    p.add_argument("--cap", type=float, default=600.0)
    p.add_argument("--out", default=str(BENCH / "out"))
    p.add_argument("--child", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    p.add_argument("--idle-child", nargs=5, metavar=("LOOP", "KUBECONFIG", "PREFIX", "N", "SETTLE"),
                   help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        sys.exit(runner_child(args.child[0], args.child[1:]))
    if args.idle_child:
        loop, kubeconfig, prefix, n, settle = args.idle_child
        sys.exit(idle_child(loop, kubeconfig, prefix, int(n), float(settle)))

    import informer_bench as ib
    from syncer.testing import ControlPlane

    import importlib.metadata

    out = Path(args.out)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    logs = out / f"logs-uvloop-{stamp}"
    logs.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    snapshot = ib.snapshot_informers(out / f"snapshot-uvloop-{stamp}")
    for loop in LOOPS:
        ib.CONTENDERS[loop] = [PYTHON, __file__, "--child", loop]
        ib.CONTENDERS[f"{loop}-list"] = [PYTHON, __file__, "--child", loop, "--list-watch"]
    results: dict[str, Any] = {
        "args": {k: v for k, v in vars(args).items() if k not in ("child", "idle_child")},
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "load_at_start": os.getloadavg()},
        "versions": {"python": platform.python_version(), "uvloop": importlib.metadata.version("uvloop"),
                     "aiohttp": importlib.metadata.version("aiohttp")},
        "informers": snapshot, "sync": [], "updates": [], "idle": [],
    }
    log(f"measuring informers/ as of {snapshot['commit']} (digest {snapshot['digest']}); starting the control plane")
    cp = ControlPlane().start()  # main thread: its processes die with this thread
    try:
        ns = f"uvloop-{args.objects}"
        asyncio.run(ib.create_objects(str(cp.kubeconfig), ns, args.objects))
        for rnd, loop in interleaved(args.rounds, LOOPS):
            for mode, name in (("watch-list", loop), ("list", f"{loop}-list")):
                r = {**ib.run_sync(cp, name, ns, args.objects, args.cap, logs), "loop": loop, "sync": mode,
                     "round": rnd}
                r["loop_module"] = ran_on(r)
                results["sync"].append(r)
                log(f"round {rnd} sync {mode:10} {loop:8} " + (
                    f"cpu {r['cpu_sync']:.3f}s wall {r['wall']:.3f}s" if "wall" in r else f"FAILED {r}"))
        for rnd, loop in interleaved(args.rounds, LOOPS):
            r = {**ib.run_updates(cp, loop, ns, args.objects, args.updates, args.rate, args.cap, logs),
                 "loop": loop, "round": rnd}
            r["loop_module"] = ran_on(r)
            results["updates"].append(r)
            log(f"round {rnd} updates {loop:8} " + (
                f"{r['events']} events cpu {r['cpu']:.2f}s ({r['cpu_per_10k']:.3f} s/10k) p50 "
                f"{r['lat_p50'] * 1e3:.1f} ms writer {r['writer'].get('rate', 0):.0f}/s" if "events" in r
                else f"FAILED {r.get('error')}"))
        for scenario, prefix, n, objects in idle_scenarios(vars(args)):
            if objects:
                for first in range(0, n + 1, 4):  # the warm-up namespace (0) too, so all informers are alike
                    asyncio.run(_gather(ib.create_objects(str(cp.kubeconfig), f"{prefix}-{i}", objects, 8)
                                        for i in range(first, min(first + 4, n + 1))))
            for rnd, loop in interleaved(args.idle_rounds, IDLE_LOOPS):
                proc = subprocess.run([PYTHON, __file__, "--idle-child", loop, str(cp.kubeconfig), prefix, str(n),
                                       str(args.settle)],
                                      capture_output=True, text=True, env=ib.CHILD_ENV, timeout=args.cap)
                r = {"loop": loop, "round": rnd, "scenario": scenario}
                try:
                    r.update(json.loads(proc.stdout.strip().splitlines()[-1]))
                    log(f"round {rnd} idle {scenario:6} {loop:12} {r['per_informer'] / 1024:,.0f} KiB/informer "
                        f"({r['conns_added']} connections added, {r['objects']} objects cached, "
                        f"loop {r['loop_module']})")
                except (IndexError, json.JSONDecodeError):
                    r["error"] = proc.stderr[-2000:]
                    log(f"round {rnd} idle {scenario:6} {loop:12} FAILED: {proc.stderr[-500:]}")
                results["idle"].append(r)
    finally:
        results["total_seconds"] = time.monotonic() - started
        results["machine"]["load_at_end"] = os.getloadavg()
        (out / f"uvloop-{stamp}.json").write_text(json.dumps(results, indent=1, default=str))
        cp.stop()
    table = report(results)
    (out / f"uvloop-{stamp}.md").write_text(table + "\n")
    print(table)
    log(f"raw results in {out / f'uvloop-{stamp}.json'}")


if __name__ == "__main__":
    main()
