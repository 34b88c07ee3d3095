"""Benchmark of DiscoveringDynamicSharedInformerFactory on a real local control plane (etcd + kube-apiserver).

Usage (cwd /work/main):  .venv/bin/python bench/discovery_bench.py [--crds 50] [--idle-crds 300] [--idle 60]
                             [--json OUT.json] [--wait-quiet 1500]

(a) CRD Established -> its informer synced AND a subscriber notified: ``--crds`` CRDs created one after
    another (group bench-a<i>.example.com each), a pause of ``--gap`` s between two, measured in this process.
(b) CRD Established -> a handler sees an object created right after Established, for our factory (a handler
    added through ``add_gvr_handler`` on each new informer, in this process) and for kopf
    (kopf_crd_runner.py, its own process), on the same CRDs and the same objects: ``--crds`` CRDs whose object
    is created by server-side apply (bench-ks<i>, no server-side hold) then ``--post-crds`` whose object is
    POSTed (bench-kp<i>; kube-apiserver holds such a create 2 s, see disc_stamp.py).
(c) ``--idle-crds`` CRD GVRs with informers, idle for ``--idle`` s: RSS per informer, CPU, TCP connections
    (disc_idle_probe.py, its own process, on a fresh control plane).
(d) cost of one discovery pass with those CRDs served (same process as (c)).

Established is time-stamped by disc_stamp.py (its own process, one CRD watch): the moment the watch event
that shows Established=True arrives. All times are CLOCK_MONOTONIC, shared by the processes.
One warm-up CRD precedes (a) and (b) and is not counted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import disc_common as dc  # noqa: E402

from informers import (  # noqa: E402
    GVR, ApiClient, DiscoveringDynamicSharedInformerFactory, DiscoveryOptions, FuncHandler, ResourceFilter, SharedIndexInformer,
)
from syncer.testing import ControlPlane  # noqa: E402

from loguru import logger  # noqa: E402


def gvr_of(group: str) -> GVR:
    return GVR(group, "v1", dc.PLURAL)


class Ours:
    """The factory under test, a subscriber recording when each GVR is first in the synced dict after a tick,
    and a GVR handler that puts an object handler on every new informer."""

    def __init__(self, client: ApiClient) -> None:
        self.f = DiscoveringDynamicSharedInformerFactory(
            client, DiscoveryOptions(filter=ResourceFilter(include=["bench-*.example.com/*"])))
        self.first_synced: dict[GVR, float] = {}
        self.obj_seen: dict[GVR, tuple[float, bool]] = {}
        self.ticks = 0
        self._changed = asyncio.Event()
        # Observation only: time every discovery request round of the factory's passes (start, end, bench GVRs
        # served), so each row can say when passes ran relative to Established.
        self.pass_log: list[tuple[float, float, frozenset[GVR]]] = []
        discover = self.f.discovery.discover

        async def timed_discover() -> Any:
            t = time.monotonic()
            r = await discover()
            self.pass_log.append((t, time.monotonic(), frozenset(g for g in r.resources if g.group.startswith("bench-"))))
            return r

        self.f.discovery.discover = timed_discover  # type: ignore[method-assign]

    def passes_between(self, gvr: GVR, t0: float, t1: float, ref: float) -> list[dict[str, Any]]:
        return [{"start": round(a - ref, 4), "end": round(b - ref, 4), "served": gvr in served}
                for a, b, served in self.pass_log if t0 <= a <= t1]

    async def start(self) -> None:
        await self.f.start()
        self.f.add_gvr_handler(self)
        self._task = asyncio.create_task(self._subscriber())

    async def _subscriber(self) -> None:
        async for _ in self.f.subscribe("bench"):
            t = time.monotonic()
            self.ticks += 1
            synced, _ = self.f.informers()
            for gvr in synced:
                if gvr not in self.first_synced:
                    self.first_synced[gvr] = t
            self._changed.set()

    # GVRHandler
    def on_gvr_added(self, gvr: GVR, inf: SharedIndexInformer) -> None:
        def on_add(obj: dict, initial: bool) -> None:
            if obj["metadata"]["name"] == dc.OBJ_NAME and gvr not in self.obj_seen:
                self.obj_seen[gvr] = (time.monotonic(), initial)
                self._changed.set()

        inf.add_event_handler(FuncHandler(on_add=on_add, name="bench-object"))

    async def wait(self, pred: Any, timeout: float) -> bool:
        return await dc.wait_until(self._changed, pred, timeout)

    async def stop(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        await self.f.shutdown()


async def phase_a(args: argparse.Namespace, driver: ApiClient, stamper: dc.Stamper, ours: Ours) -> dict[str, Any]:
    rows = []
    for i in range(-1, args.crds):  # -1: warm-up
        group = f"bench-a{i if i >= 0 else 'warm'}.example.com"
        gvr = gvr_of(group)
        passes0, ticks0 = ours.f.passes, ours.ticks
        t_post = await dc.create_crd(driver, group)
        t_est = await stamper.established(group, 30)
        ok = await ours.wait(lambda: gvr in ours.first_synced, 30)
        row = {"group": group, "t_post_return": t_post, "t_established": t_est,
               "t_synced_tick": ours.first_synced.get(gvr), "passes": ours.f.passes - passes0,
               "ticks": ours.ticks - ticks0, "ok": ok and t_est is not None}
        if row["ok"]:
            row["latency"] = row["t_synced_tick"] - t_est
            row["pass_log"] = ours.passes_between(gvr, t_post - 1, row["t_synced_tick"], t_est)
        if i >= 0:
            rows.append(row)
        print(f"[a] {group}: {row.get('latency', float('nan')) * 1000:.0f} ms, passes {row['passes']} "
              f"(POST returned {1000 * (t_post - t_est) if t_est else float('nan'):+.0f} ms; pass starts "
              f"{[(round(p['start'] * 1000), p['served']) for p in row.get('pass_log', [])]} ms)",
              file=sys.stderr, flush=True)
        await asyncio.sleep(args.gap)
    lat = [r["latency"] for r in rows if r["ok"]]
    return {"rows": rows, "summary": dc.summary_ms(lat), "failed": sum(not r["ok"] for r in rows),
            "passes_total": sum(r["passes"] for r in rows)}


async def phase_b(args: argparse.Namespace, driver: ApiClient, stamper: dc.Stamper, ours: Ours,
                  kopf: dc.Lines, mode: str, count: int) -> dict[str, Any]:
    rows = []
    tag = {"apply": "ks", "post": "kp"}[mode]
    for i in range(-1, count):
        group = f"bench-{tag}{i if i >= 0 else 'warm'}.example.com"
        gvr = gvr_of(group)
        t_post = await dc.create_crd(driver, group)
        t_est = await stamper.established(group, 30)
        created = await stamper.created(group, 30)

        async def ours_seen() -> bool:
            return await ours.wait(lambda: gvr in ours.obj_seen, args.timeout)

        ok_ours, kopf_msg = await asyncio.gather(
            ours_seen(), kopf.wait(lambda m: m.get("ev") == "seen" and m.get("group") == group, args.kopf_timeout))
        kopf_listed = await kopf.wait(lambda m: m.get("ev") == "listed" and m.get("group") == group, 2)
        row: dict[str, Any] = {"group": group, "t_post_return": t_post, "t_established": t_est,
                               "created": created, "ours_ok": ok_ours and t_est is not None,
                               "kopf_ok": kopf_msg is not None and t_est is not None}
        if row["ours_ok"]:
            t, initial = ours.obj_seen[gvr]
            row.update(ours_latency=t - t_est, ours_initial_list=initial,
                       synced_tick_latency=ours.first_synced[gvr] - t_est if gvr in ours.first_synced else None)
        if row["kopf_ok"]:
            row.update(kopf_latency=kopf_msg["t"] - t_est, kopf_event_type=kopf_msg.get("type"))
        if kopf_listed is not None and t_est is not None:
            row["kopf_listed_latency"] = kopf_listed["t"] - t_est
        if created and created.get("ev") == "created" and t_est is not None:
            row["object_created_after"] = created["t"] - t_est
            row["create_attempts"] = created.get("attempts")
            if row["ours_ok"]:
                row["ours_after_create"] = ours.obj_seen[gvr][0] - created["t"]
            if row["kopf_ok"]:
                row["kopf_after_create"] = kopf_msg["t"] - created["t"]
        if i >= 0:
            rows.append(row)
        print(f"[b/{mode}] {group}: synced/listed ours {row.get('synced_tick_latency') or float('nan'):.3f} s "
              f"kopf {row.get('kopf_listed_latency', float('nan')):.3f} s; object seen "
              f"ours {row.get('ours_latency', float('nan')) * 1000:.0f} ms, "
              f"kopf {row.get('kopf_latency', float('nan')) * 1000:.0f} ms "
              f"(object created +{row.get('object_created_after', float('nan')) * 1000:.0f} ms, "
              f"{row.get('create_attempts')} attempts)", file=sys.stderr, flush=True)
        await asyncio.sleep(args.gap)
    for r in rows:  # what became of those kopf missed, by the end of the phase
        if not r["kopf_ok"]:
            late = await kopf.wait(lambda m, g=r["group"]: m.get("ev") == "seen" and m.get("group") == g, 0)
            r["kopf_seen_late_after"] = late["t"] - r["t_established"] if late and r["t_established"] else None
            r["kopf_listed_ever"] = await kopf.wait(
                lambda m, g=r["group"]: m.get("ev") == "listed" and m.get("group") == g, 0) is not None
    return {
        "rows": rows,
        "kopf_missed_groups": [(r["group"], r.get("kopf_seen_late_after"), r.get("kopf_listed_ever"))
                               for r in rows if not r["kopf_ok"]],
        "ours": dc.summary_ms([r["ours_latency"] for r in rows if r["ours_ok"]]),
        "kopf": dc.summary_ms([r["kopf_latency"] for r in rows if r["kopf_ok"]]),
        "created_after": dc.summary_ms([r["object_created_after"] for r in rows if "object_created_after" in r]),
        "ours_synced": dc.summary_ms([r["synced_tick_latency"] for r in rows if r.get("synced_tick_latency")]),
        "kopf_listed": dc.summary_ms([r["kopf_listed_latency"] for r in rows if "kopf_listed_latency" in r]),
        "ours_after_create": dc.summary_ms([r["ours_after_create"] for r in rows if "ours_after_create" in r]),
        "kopf_after_create": dc.summary_ms([r["kopf_after_create"] for r in rows if "kopf_after_create" in r]),
        "ours_missed": sum(not r["ours_ok"] for r in rows), "kopf_missed": sum(not r["kopf_ok"] for r in rows),
        "kopf_event_types": sorted({str(r.get("kopf_event_type")) for r in rows if r["kopf_ok"]}),
        "ours_initial_list": sum(1 for r in rows if r.get("ours_initial_list")),
    }


async def run_ab(args: argparse.Namespace, cp: ControlPlane, logdir: Path) -> dict[str, Any]:
    kubeconfig = str(cp.kubeconfig)
    driver = ApiClient.from_kubeconfig(kubeconfig)
    client = ApiClient.from_kubeconfig(kubeconfig)
    stamper = await dc.Stamper().launch(kubeconfig, "bench-", {"bench-ks": "apply", "bench-kp": "post"},
                                        logdir / "stamp-ab.log")
    ours = Ours(client)
    await ours.start()
    result: dict[str, Any] = {}
    kopf = dc.Lines("kopf")
    try:
        result["a"] = await phase_a(args, driver, stamper, ours)
        if not args.skip_kopf:
            await kopf.start([dc.PY, str(dc.BENCH / "kopf_crd_runner.py"), "--kubeconfig", kubeconfig,
                              "--prefix", "bench-k", "--object", dc.OBJ_NAME], logdir / "kopf.log")
            if await kopf.wait(lambda m: m.get("ev") == "ready", 60) is None:
                raise RuntimeError(f"kopf did not start; see {logdir / 'kopf.log'}")
            await asyncio.sleep(2)  # its initial resource scan and CRD watch
        result["b_apply"] = await phase_b(args, driver, stamper, ours, kopf, "apply", args.crds)
        result["b_post"] = await phase_b(args, driver, stamper, ours, kopf, "post", args.post_crds)
        await asyncio.sleep(args.gap)
        result["kopf_missed_at_end"] = {}  # kopf's late sightings of the groups it missed, at the end of (b)
        for key in ("b_apply", "b_post"):
            for r in result[key]["rows"]:
                if not r["kopf_ok"]:
                    late = await kopf.wait(lambda m, g=r["group"]: m.get("ev") in ("seen", "listed")
                                           and m.get("group") == g, 0)
                    result["kopf_missed_at_end"][r["group"]] = (
                        {"ev": late["ev"], "after_s": late["t"] - r["t_established"]} if late else
                        f"never, {time.monotonic() - r['t_established']:.0f}s after Established")
        result["kopf_log_tail"] = _tail(logdir / "kopf.log")
    finally:
        if kopf.proc is not None:
            result["kopf_exit"] = await kopf.stop()
        await ours.stop()
        await stamper.stop()
        await client.close()
        await driver.close()
    return result


async def run_cd(args: argparse.Namespace, cp: ControlPlane, logdir: Path) -> dict[str, Any]:
    kubeconfig = str(cp.kubeconfig)
    probe = dc.Lines("probe")
    await probe.start([dc.PY, str(dc.BENCH / "disc_idle_probe.py"), "--kubeconfig", kubeconfig,
                       "--include", "bench-idle-*.example.com/*", "--expect", str(args.idle_crds),
                       "--idle", str(args.idle), "--settle", str(args.settle),
                       "--ssl-read-buffer", str(args.ssl_read_buffer)], logdir / "probe.log")
    base = await probe.wait(lambda m: m.get("ev") == "baseline", 120)
    if base is None:
        raise RuntimeError(f"idle probe failed; see {logdir / 'probe.log'}")
    driver = ApiClient.from_kubeconfig(kubeconfig)
    sem = asyncio.Semaphore(4)
    t0 = time.monotonic()

    async def one(i: int) -> None:
        async with sem:
            await dc.create_crd(driver, f"bench-idle-{i}.example.com")

    await asyncio.gather(*(one(i) for i in range(args.idle_crds)))
    created_in = time.monotonic() - t0
    await driver.close()
    synced = await probe.wait(lambda m: m.get("ev") == "all_synced", 900)
    idle = await probe.wait(lambda m: m.get("ev") == "idle", args.idle + args.settle + 120)
    cost = await probe.wait(lambda m: m.get("ev") == "pass_cost", 300)
    rc = await probe.stop(30)
    out: dict[str, Any] = {"baseline": base, "all_synced": synced, "idle": idle, "pass_cost": cost,
                           "crd_create_seconds": created_in, "probe_exit": rc}
    if idle and base:
        n = idle["informers"]
        out["rss_per_informer_kib"] = (idle["before"]["rss"] - base["rss"]) / n / 1024 if n else None
        out["rss_raw_per_informer_kib"] = (idle["before"]["rss_raw"] - base["rss_raw"]) / n / 1024 if n else None
        out["rss_after_idle_per_informer_kib"] = (idle["after"]["rss"] - base["rss"]) / n / 1024 if n else None
    return out


def _tail(path: Path, n: int = 15) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-n:]
    except OSError:
        return []


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--crds", type=int, default=50)
    p.add_argument("--post-crds", type=int, default=None, help="CRDs for (b) with a POSTed object (default --crds)")
    p.add_argument("--idle-crds", type=int, default=300)
    p.add_argument("--idle", type=float, default=60.0)
    p.add_argument("--settle", type=float, default=10.0)
    p.add_argument("--gap", type=float, default=0.5, help="pause between two CRDs in (a)/(b)")
    p.add_argument("--timeout", type=float, default=30.0, help="per-CRD time-out for our side")
    p.add_argument("--kopf-timeout", type=float, default=5.0, help="per-CRD time-out for kopf")
    p.add_argument("--ssl-read-buffer", type=int, default=0,
                   help="diagnosis only, (c): asyncio's per-TLS-connection read buffer size in the probe process")
    p.add_argument("--skip-kopf", action="store_true")
    p.add_argument("--skip-ab", action="store_true")
    p.add_argument("--skip-cd", action="store_true")
    p.add_argument("--wait-quiet", type=float, default=0.0, help="wait up to this long for informer_bench.py to end")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    if args.post_crds is None:
        args.post_crds = args.crds
    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    note = dc.wait_for_quiet_machine(args.wait_quiet) if args.wait_quiet else "no wait for other benchmarks"
    result: dict[str, Any] = {"env": dc.environment(), "argv": sys.argv, "args": vars(args)}
    logdir = Path(tempfile.mkdtemp(prefix="discovery-bench-"))
    result["logdir"] = str(logdir)
    t0 = time.monotonic()
    if not args.skip_ab:
        cp = ControlPlane().start()
        try:
            result["ab"] = asyncio.run(run_ab(args, cp, logdir))
        finally:
            cp.stop()
    if not args.skip_cd:
        cp = ControlPlane().start()
        try:
            result["cd"] = asyncio.run(run_cd(args, cp, logdir))
        finally:
            cp.stop()
    result["wall_seconds"] = time.monotonic() - t0
    result["machine_note"] = dc.note_concurrent(note)
    dc.write_json(args.json, result)
    print(json.dumps(report(result), indent=2))
    return 0


def report(r: dict[str, Any]) -> dict[str, Any]:
    """The headline numbers (the JSON file has every row)."""
    out: dict[str, Any] = {"machine_note": r["machine_note"], "wall_seconds": r["wall_seconds"]}
    if "ab" in r:
        out["a"] = r["ab"]["a"]["summary"] | {"failed": r["ab"]["a"]["failed"]}
        for key in ("b_apply", "b_post"):
            b = r["ab"][key]
            out[key] = {k: b[k] for k in ("ours", "kopf", "created_after", "ours_synced", "kopf_listed",
                                          "ours_after_create", "kopf_after_create", "ours_missed", "kopf_missed",
                                          "kopf_event_types", "ours_initial_list")}
    if "cd" in r:
        cd = r["cd"]
        out["c"] = {k: cd.get(k) for k in ("rss_per_informer_kib", "rss_raw_per_informer_kib",
                                           "rss_after_idle_per_informer_kib", "crd_create_seconds")}
        if cd.get("idle"):
            out["c"] |= {k: cd["idle"][k] for k in ("cpu_pct", "informers", "passes_during", "watch_events")}
            out["c"]["conns"] = cd["idle"]["before"]["conns"]
        if cd.get("pass_cost"):
            out["d"] = cd["pass_cost"]
    return out


if __name__ == "__main__":
    sys.exit(main())
