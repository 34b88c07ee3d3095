"""Fleet shape of sharding: many member clusters over several ``syncer run`` replicas, members hashed into
Lease-backed buckets (``[sharding] buckets``), against the design before buckets (``buckets = 0``: a Lease per
member) in the same run.

    python bench/fleet_sharded_bench.py [--members 2000] [--replicas 4] [--apiservers 2] [--buckets 60,0]
        [--idle 60] [--json bench/out/fleet-sharded.json]

Control planes (``syncer.testing.ControlPlane``): one management plane (the member Secrets, namespace ``secrets``;
the shard group's Leases, namespace ``default``) and ``--apiservers`` workload planes; member i's kubeconfig points
at workload plane ``i % apiservers`` (every member is its own client, so it costs what a cluster of its own would).
Every workload plane has the ConfigMap ``probe/tick``; the replicas run the bench plugin
``bench/plugins_sharding_busy.py`` (one per-cluster controller on it, doing nothing), ``namespace = "probe"``,
``watch = "required"``: each engaged member is a connection, its discovery and one ConfigMap watch. Sharding
timings are the defaults (15 s / 10 s / 2 s), ``min_hold = 0s``.

Per value of ``--buckets`` (each a shard group of its own, a fresh set of replicas):

1. bring-up: the replicas started together; every replica's ``/status`` polled every 2 s until every member runs
   on exactly one replica: the time from the start ("every member engaged exactly once"); a member shown running
   on two replicas in any poll is counted.
2. steady state: 10 s settle, then ``--idle`` seconds with nothing polled: Lease requests at the management
   apiserver (``apiserver_request_total{resource="leases"}``, by verb) per second, each replica's CPU
   (utime+stime) over the window and its RSS at the end, and the CPU of each plane's apiserver + etcd.
3. SIGKILL of replica r1: the others' ``/status`` polled every 0.5 s until every member runs exactly once again;
   per member of r1, the time to the first poll showing it running elsewhere; members shown on two replicas.

Raw results: ``--json``; replica logs: bench/out/sharding-fleet*-*.log.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import aiohttp  # noqa: E402

from fleet_bench import APISERVER_FLAGS, cpu_of, raise_fd_limit  # noqa: E402
from informers import ApiClient  # noqa: E402
from sharding_bench import (  # noqa: E402
    LABELS, OUT, Apiserver, Replica, View, delta, kill_everything, log, shard_status,
)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def setup(mgmt: ApiClient, works: list[ApiClient], datas: list[bytes], members: int) -> None:
    await mgmt.request("POST", "/api/v1/namespaces", body={"metadata": {"name": "secrets"}})
    for w in works:
        await w.request("POST", "/api/v1/namespaces", body={"metadata": {"name": "probe"}})
        await w.request("POST", "/api/v1/namespaces/probe/configmaps", body={"metadata": {"name": "tick"},
                                                                            "data": {"k": "v"}})
    encoded = [base64.b64encode(d).decode() for d in datas]
    sem = asyncio.Semaphore(50)

    async def put(i: int) -> None:
        async with sem:
            await mgmt.request("POST", "/api/v1/namespaces/secrets/secrets", body={
                "metadata": {"name": f"m{i:05d}", "labels": LABELS},
                "data": {"kubeconfig": encoded[i % len(encoded)]}})

    await asyncio.gather(*(put(i) for i in range(members)))
    log("secrets created", members=members)


def exactly_once(v: View, n: int) -> bool:
    return len(v.units) == n and len(v.running) == n and all(len(r) == 1 for r in v.running.values())


def doubles(v: View) -> int:
    return sum(1 for r in v.running.values() if len(r) > 1)


async def one_config(http: aiohttp.ClientSession, mgmt_cp: Any, planes: dict[str, list[int]], api_m: Apiserver,
                     args: argparse.Namespace, buckets: int) -> dict[str, Any]:
    n = args.members
    tag = f"fleet{buckets}"
    reps = [Replica(f"r{i}", mgmt_cp, tag, f"fleet-b{buckets}", "secrets", buckets=buckets)
            for i in range(args.replicas)]
    out: dict[str, Any] = {"buckets": buckets, "members": n, "replicas": args.replicas}
    try:
        # 1. bring-up
        t0 = time.time()
        for r in reps:
            r.start()
        double_polls = 0
        v: View | None = None
        while True:
            await asyncio.sleep(2.0)
            v = View(time.time(), await shard_status(http, reps))
            double_polls += doubles(v) > 0
            if exactly_once(v, n):
                break
            if int(v.t - t0) % 10 < 2:
                log("bringing up", buckets=buckets, running=len(v.running), seconds=round(v.t - t0))
            if time.time() - t0 > args.bring_up_timeout:
                raise TimeoutError(f"bucket count {buckets}: not every member engaged after "
                                   f"{args.bring_up_timeout}s ({len(v.running)} of {n} running)")
        out["bring_up_s"] = v.t - t0
        out["bring_up_polls_with_a_double"] = double_polls
        out["members_per_replica"] = {r: sum(1 for u in v.running.values() if u == [r]) for r in v.docs}
        out["buckets_per_replica"] = {r: sum(1 for b in (d or {}).get("buckets", []) if b["state"] == "running")
                                      for r, d in v.docs.items()}
        log("all engaged exactly once", buckets=buckets, seconds=round(out["bring_up_s"], 1),
            members=out["members_per_replica"])

        # 2. steady state, nothing polled
        await asyncio.sleep(10.0)
        req0 = await api_m.requests(http)
        cpu0 = {r.identity: r.cpu() for r in reps}
        planes0 = {name: cpu_of(pids) for name, pids in planes.items()}
        t1 = time.monotonic()
        await asyncio.sleep(args.idle)
        window = time.monotonic() - t1
        req1 = await api_m.requests(http)
        cpu1 = {r.identity: r.cpu() for r in reps}
        planes1 = {name: cpu_of(pids) for name, pids in planes.items()}
        d = delta(req0, req1)
        leases = {verb: c / window for (res, verb), c in d.items() if res == "leases"}
        out["idle_window_s"] = window
        out["lease_requests_per_s"] = leases
        out["lease_writes_per_s"] = sum(c for verb, c in leases.items() if verb in ("PUT", "POST", "DELETE", "PATCH"))
        out["other_mgmt_requests_per_s"] = {f"{res} {verb}": c / window for (res, verb), c in d.items()
                                            if res != "leases"}
        out["replica_cpu_pct"] = {i: 100 * (cpu1[i] - cpu0[i]) / window for i in cpu0}
        out["replica_rss_mib"] = {r.identity: rss_mib(r.proc.pid) for r in reps if r.proc is not None}
        out["plane_cpu_pct"] = {name: 100 * (planes1[name] - planes0[name]) / window for name in planes}
        log("steady", buckets=buckets, lease_writes_per_s=round(out["lease_writes_per_s"], 2),
            cpu=out["replica_cpu_pct"], planes=out["plane_cpu_pct"])

        # 3. SIGKILL r1
        victim = reps[1]
        theirs = {u for u, r in v.running.items() if r == [victim.identity]}
        assert victim.proc is not None
        victim.proc.kill()
        t_kill = time.time()
        victim.proc.wait()
        victim.terminated = True
        live = [r for r in reps if r is not victim]
        first_elsewhere: dict[str, float] = {}
        double_after = 0
        while True:
            v = View(time.time(), await shard_status(http, live))
            double_after += doubles(v)
            for u in theirs - set(first_elsewhere):
                if v.running.get(u):
                    first_elsewhere[u] = v.t - t_kill
            if exactly_once(v, n):
                break
            if time.time() - t_kill > args.bring_up_timeout:
                raise TimeoutError(f"bucket count {buckets}: not every member engaged after the SIGKILL")
            await asyncio.sleep(0.5)
        gaps = sorted(first_elsewhere.values())
        out["sigkill"] = {"members_of_victim": len(theirs), "all_exactly_once_s": v.t - t_kill,
                          "first_elsewhere_max_s": gaps[-1] if gaps else None,
                          "first_elsewhere_median_s": statistics.median(gaps) if gaps else None,
                          "first_elsewhere_min_s": gaps[0] if gaps else None,
                          "member_polls_on_two_replicas": double_after}
        log("sigkill", buckets=buckets, **out["sigkill"])
        return out
    finally:
        for r in reps:
            r.terminate()
        await asyncio.gather(*(r.wait_exit(60) for r in reps if r.proc is not None))


async def harness(args: argparse.Namespace) -> dict[str, Any]:
    from syncer.testing import ControlPlane

    OUT.mkdir(exist_ok=True)
    raise_fd_limit()
    mgmt_cp = ControlPlane(name="fleetsh-mgmt", extra_apiserver_flags=APISERVER_FLAGS)
    work_cps = [ControlPlane(name=f"fleetsh-work{i}", extra_apiserver_flags=APISERVER_FLAGS)
                for i in range(args.apiservers)]
    results: dict[str, Any] = {"args": vars(args), "runs": []}
    try:
        for cp in (mgmt_cp, *work_cps):
            cp.start()
        planes = {"mgmt": mgmt_cp.pids, **{f"work{i}": cp.pids for i, cp in enumerate(work_cps)}}
        async with ApiClient.from_kubeconfig(str(mgmt_cp.kubeconfig)) as mgmt, aiohttp.ClientSession() as http:
            works = [ApiClient.from_kubeconfig(str(cp.kubeconfig)) for cp in work_cps]
            try:
                await setup(mgmt, works, [cp.member_kubeconfig() for cp in work_cps], args.members)
            finally:
                for w in works:
                    await w.close()
            api_m = Apiserver(mgmt_cp)
            for buckets in (int(b) for b in args.buckets.split(",")):
                results["runs"].append(await one_config(http, mgmt_cp, planes, api_m, args, buckets))
                Path(args.json).write_text(json.dumps(results, indent=1))
        return results
    finally:
        kill_everything()
        for cp in (mgmt_cp, *work_cps):
            cp.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--members", type=int, default=2000)
    ap.add_argument("--replicas", type=int, default=4)
    ap.add_argument("--apiservers", type=int, default=2)
    ap.add_argument("--buckets", default="60,0", help="bucket counts to run, in order (0: a Lease per member)")
    ap.add_argument("--idle", type=float, default=60.0)
    ap.add_argument("--bring-up-timeout", type=float, default=600.0)
    ap.add_argument("--json", default=str(OUT / "fleet-sharded.json"))
    args = ap.parse_args()
    results = asyncio.run(harness(args))
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
