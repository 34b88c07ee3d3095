"""Fleet scale, ours against client-go in one run: per-member cost at 50, 200 and 500 members (issue 23).

    .venv/bin/python bench/fleet_bench.py [--clusters 50,200,500] [--idle 300] [--apiservers 1] \
        [--peer-bin bench/out/clientgo_multicluster] [--json bench/out/fleet.json]
    .venv/bin/python bench/fleet_bench.py --quick          # smoke run: 10 members (or --clusters), 20 s idle
    .venv/bin/python bench/fleet_report.py fleet bench/out/fleet.json   # -> bench/RESULTS-fleet.md

The contenders, the member Secrets and the workload are those of bench/multicluster_bench.py (ours is its
``--runner``: ClusterRegistry + ClusterControllers as ``syncer run`` sets them up; client-go is
bench/clientgo_multicluster with one transport per member). Every member is its own client on both sides (ours:
one ApiClient per member; client-go: a dialer of its own per member, so no transport is shared), so each member
costs what a separate API server would, although all of them point at one (or ``--apiservers`` K, members spread
round-robin) local control plane.

Per size N, one round, a fresh process of each contender, both running at once (each on a Secret namespace of
its own):

1. both started, 3 s settle: start-up RSS and connections with 0 members;
2. one contender at a time (order alternating by size): its N Secrets created at once, every member's first
   reconcile awaited: time to all synced and the process's CPU over that; 5 s later RSS and TCP connections;
3. then both idle together for ``--idle`` seconds: CPU time / wall time of each whole process (and of the
   apiservers), connections sampled every ``--sample`` seconds, RSS and connections at the end.

Idling both at once halves the wall time (3 x 300 s instead of 6 x 300 s keeps the full run near 25 minutes):
an idle process of either kind uses well under 10 % of a core, so on 2 cores the two do not wait for each other,
and each one's CPU is its own process's counter, not wall time. The first contender of a size has idled a few
seconds longer than the second when the window starts; the order alternates by size.

The apiserver runs with raised limits (``APISERVER_FLAGS``): kube-apiserver v1.36's defaults are
--max-requests-inflight=400 and --max-mutating-requests-inflight=200 (k8s.io/apiserver pkg/server/config.go);
with priority and fairness on (the default) their sum is the server's concurrency shared by the priority
levels. The members' admin user is system:masters, which is exempt, so they only bind a member running as
another user (as in a real fleet): raised tenfold so that they never decide a figure. Watches are long-running
and do not count once established. --http2-max-streams-per-connection stays at its default of 100
(pkg/server/secure_serving.go): every member of either contender opens at most ~6 streams per connection, and
a transport that needs another connection past 100 is what the issue asks for. The process's file limit is
raised to its hard limit before the contenders start (they inherit it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import _record  # noqa: E402
from _transport_common import supports_http2  # noqa: E402
from informers import ApiClient  # noqa: E402
from multicluster_bench import (  # noqa: E402
    CONFIGMAPS, OUT, SECRETS, WIDGETS, Proc, build_peer, put_secret, setup_workload,
)

CONTENDERS = ("ours", "client-go")
APISERVER_FLAGS = ("--max-requests-inflight=4000", "--max-mutating-requests-inflight=2000")


def raise_fd_limit() -> int:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def cpu_of(pids: list[int]) -> float:
    import psutil

    total = 0.0
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
        except psutil.Error:
            continue
        total += t.user + t.system
    return total


async def bring_up(mgmt: ApiClient, p: Proc, namespace: str, members: list[bytes], timeout: float
                   ) -> dict[str, float]:
    """Create every member's Secret at once; wait for all first reconciles; RSS and connections 5 s later."""
    n = len(members)
    cpu0, t0 = p.cpu(), time.time()
    sem = asyncio.Semaphore(100)  # the management plane's own request rate is not what is measured

    async def put(i: int) -> None:
        async with sem:
            await put_secret(mgmt, namespace, f"m{i:04d}", members[i])

    await asyncio.gather(*(put(i) for i in range(n)))
    posted = time.time() - t0
    rec = await p.wait(lambda e: e["event"] == "reconciled", n, timeout)
    syn = [e for e in p.events if e["event"] == "synced"]
    res = {"posted_s": posted, "all_synced_s": max(e["t"] for e in syn) - t0,
           "all_reconciled_s": max(e["t"] for e in rec) - t0, "sync_cpu_s": p.cpu() - cpu0}
    await asyncio.sleep(5)
    res.update(rss_mib=p.rss() / 2**20, conn=p.connections())
    return res


async def one_size(mgmt: ApiClient, make: Any, members: list[bytes], order: tuple[str, ...], idle: float,
                   sample: float, server_pids: list[int]) -> dict[str, Any]:
    n = len(members)
    procs: dict[str, Proc] = {}
    namespaces = {c: f"fleet-{c.replace('-', '')}-{n}" for c in order}
    try:
        for c in order:
            await mgmt.request("POST", "/api/v1/namespaces", body={"metadata": {"name": namespaces[c]}})
            procs[c] = make(c, namespaces[c], f"n{n}")
            await procs[c].start()
        await asyncio.sleep(3)
        res: dict[str, dict[str, Any]] = {
            c: {"base_rss_mib": p.rss() / 2**20, "base_conn": p.connections()} for c, p in procs.items()}
        for c in order:
            res[c].update(await bring_up(mgmt, procs[c], namespaces[c], members, timeout=120 + n * 2.0))
            print(json.dumps({"size": n, "contender": c, "phase": "synced",
                              **{k: round(v, 3) for k, v in res[c].items()}}), file=sys.stderr, flush=True)
        cpu0 = {c: p.cpu() for c, p in procs.items()}
        srv0, w0 = cpu_of(server_pids), time.monotonic()
        conns: dict[str, list[int]] = {c: [] for c in procs}
        while (left := w0 + idle - time.monotonic()) > 0:
            await asyncio.sleep(min(sample, left))
            for c, p in procs.items():
                conns[c].append(p.connections())
        wall = time.monotonic() - w0
        server_cpu = (cpu_of(server_pids) - srv0) / wall * 100
        for c, p in procs.items():
            r = res[c]
            r.update(idle_s=wall, idle_cpu_pct=(p.cpu() - cpu0[c]) / wall * 100, rss_end_mib=p.rss() / 2**20,
                     conn_end=conns[c][-1] if conns[c] else p.connections(),
                     conn_idle_min=min(conns[c], default=0), conn_idle_max=max(conns[c], default=0))
            for key, base in (("rss_mib", "base_rss_mib"), ("rss_end_mib", "base_rss_mib")):
                r[key.replace("_mib", "_per_member_kib")] = (r[key] - r[base]) * 1024 / n
            for key in ("conn", "conn_end", "conn_idle_max"):
                r[f"{key}_per_member"] = (r[key] - r["base_conn"]) / n
            r["idle_cpu_pct_per_member"] = r["idle_cpu_pct"] / n
            print(json.dumps({"size": n, "contender": c, "phase": "idle",
                              **{k: round(v, 4) for k, v in r.items()}}), file=sys.stderr, flush=True)
        return {"order": list(order), "server_idle_cpu_pct": server_cpu, **res}
    finally:
        for p in procs.values():
            await p.stop()
        for ns in namespaces.values():
            try:
                await mgmt.request("DELETE", f"/api/v1/namespaces/{ns}")
            except Exception as e:  # a namespace never created (a contender failed to start) is no second error
                print(f"cleanup of namespace {ns}: {e}", file=sys.stderr)


async def harness(args: argparse.Namespace) -> dict[str, Any]:
    from syncer.testing import ControlPlane

    peer_bin = Path(args.peer_bin) if args.peer_bin else build_peer()
    OUT.mkdir(exist_ok=True)
    gvrs = ",".join(f"{g.group}/{g.version}/{g.resource}" for g in (CONFIGMAPS, SECRETS, WIDGETS))
    mgmt_cp = ControlPlane(name="fleet-mgmt")
    work_cps = [ControlPlane(name=f"fleet-work{i}", extra_apiserver_flags=APISERVER_FLAGS)
                for i in range(args.apiservers)]
    try:
        for cp in (mgmt_cp, *work_cps):
            cp.start()
        kubeconfig = str(mgmt_cp.kubeconfig)
        datas = [cp.member_kubeconfig() for cp in work_cps]
        server_pids = [pid for cp in work_cps for pid in cp.pids]

        def make(name: str, ns: str, tag: str) -> Proc:
            log = OUT / f"fleet-{name}-{tag}.log"
            log.write_bytes(b"")
            if name == "ours":
                argv = [sys.executable, str(ROOT / "bench" / "multicluster_bench.py"), "--runner",
                        "--kubeconfig", kubeconfig, "--namespace", ns]
            else:
                argv = [str(peer_bin), "-kubeconfig", kubeconfig, "-namespace", ns, "-gvrs", gvrs, "-workers", "2"]
            return Proc(name, argv, log)

        results = {**_record.start("fleet_bench.py", args), "apiserver_flags": list(APISERVER_FLAGS),
                   "fd_limit": raise_fd_limit(), "client_has_http2_setting": supports_http2(), "sizes": {}}
        async with ApiClient.from_kubeconfig(kubeconfig) as mgmt:
            for cp in work_cps:
                async with ApiClient.from_kubeconfig(str(cp.kubeconfig)) as work:
                    await setup_workload(work)
            for k, n in enumerate(args.clusters):
                order = CONTENDERS if k % 2 == 0 else CONTENDERS[::-1]
                results["sizes"][str(n)] = await one_size(
                    mgmt, make, [datas[i % len(datas)] for i in range(n)], order, args.idle, args.sample,
                    server_pids)
        return results
    finally:
        for cp in (mgmt_cp, *work_cps):
            cp.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clusters", help="comma-separated member counts, one round each (default 50,200,500)")
    p.add_argument("--idle", type=float, default=300.0, help="seconds both contenders idle at each size")
    p.add_argument("--sample", type=float, default=30.0, help="seconds between connection counts while idle")
    p.add_argument("--apiservers", type=int, default=1, help="workload control planes the members spread over")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: --idle 20 --sample 5, and --clusters 10 unless --clusters is given")
    p.add_argument("--peer-bin", help="a built bench/clientgo_multicluster (default: go build it)")
    p.add_argument("--json", default=str(OUT / "fleet.json"))
    args = p.parse_args()
    if args.quick:  # an explicit --clusters list is kept: a quick run at the sizes being compared
        args.clusters, args.idle, args.sample = args.clusters or "10", 20.0, 5.0
    args.clusters = args.clusters or "50,200,500"
    try:
        args.clusters = [int(x) for x in args.clusters.split(",") if x]
    except ValueError:
        p.error(f"--clusters: not a comma-separated list of integers: {args.clusters!r}")
    if not args.clusters or min(args.clusters) < 1 or len(set(args.clusters)) < len(args.clusters):
        p.error(f"--clusters needs distinct positive member counts, got {args.clusters}")
    if args.apiservers < 1:
        p.error("--apiservers needs at least 1")
    _record.write(asyncio.run(harness(args)), args.json)


if __name__ == "__main__":
    main()
