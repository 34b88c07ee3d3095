"""Failover with a warm vs a cold standby (issue 31): time from the new leader acquiring the Lease to its first
reconcile, and how many full lists it makes meanwhile.

    .venv/bin/python bench/failover_bench.py [--objects 10000] [--rounds 3] [--fleet MEMBERS]

One local control plane (``syncer.testing.ControlPlane``) with ``--objects`` ConfigMaps in namespace ``bench``
(each with 256 bytes of data). Each replica is a real ``python -m syncer run --settings F --identity N`` process
(this interpreter, cwd the repository) with ``namespace = "bench"``, ``watch = "required"`` (the fleets' default,
where a cold standby watches nothing), the bench plugin ``bench/plugins_failover.py`` (one controller over
ConfigMaps, no work per reconcile) and leader election at 4 s / 3 s / 0.5 s (lease_duration / renew_deadline /
retry_period: only how long the standby waits before it may take over, which is not measured).

A round, for each mode (``warm_standby`` true, then false; the order alternates by round): replica
``a`` is started and leads; once it has reconciled every object, replica ``b`` is started; once ``b`` is ready
(warm: its ConfigMap informer synced; its RSS is read then), ``a`` is SIGKILLed. ``b`` takes the Lease once it
has not been renewed for lease_duration. Measured on ``b``:

- acquire -> first reconcile: ``bench_failover_first_reconcile_time_seconds`` (set by the plugin) minus the
  Lease's ``spec.acquireTime`` (written by ``b`` when it takes it; same host, same clock);
- acquire -> all reconciled: the first 20 ms poll of ``/metrics`` where ``bench_failover_reconciles_total``
  reaches ``--objects`` (+-20 ms);
- full lists after the kill: ``informer_lists_total`` + ``informer_watches_total{mode="watch_list"}`` of
  ConfigMaps, after minus before the kill.

With ``--fleet N`` (multi-cluster mode): N more control planes are member clusters, each with ``--objects / N``
ConfigMaps in ``bench``, given by kubeconfig Secrets in the management plane's ``bench`` namespace (``[clusters]
enabled``, the Secrets provider); the management plane holds no ConfigMaps of the bench. The plugin's controller
runs in every member; a warm standby is ready once ``/status`` shows every member ``ready`` (connected, discovered,
informers synced). "First reconcile" is then the *last* member's first reconcile (every member has reconciled at
least once); full lists are those of the members' ConfigMap informers.

Raw results: bench/out/failover.json (failover-fleet.json with ``--fleet``; git-ignored); replica logs:
bench/out/failover-*.log.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime
import json
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import aiohttp  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

import _record  # noqa: E402
from informers import ApiClient, ApiError  # noqa: E402

OUT = ROOT / "bench" / "out"
PLUGIN = ROOT / "bench" / "plugins_failover.py"
NAMESPACE = "bench"
LEASE = "failover-bench"


def log(msg: str, **fields: Any) -> None:
    print(json.dumps({"t": round(time.time(), 3), "msg": msg, **fields}), file=sys.stderr, flush=True)


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Replica:
    """One ``syncer run`` process."""

    def __init__(self, identity: str, kubeconfig: str, tag: str, warm: bool, fleet: bool) -> None:
        self.identity = identity
        self.port = free_port()
        self.log = OUT / f"failover-{tag}-{identity}.log"
        settings = OUT / f"failover-{tag}-{identity}.toml"
        settings.write_text(f"""kubeconfig = "{kubeconfig}"
plugins = ["{PLUGIN}"]
entry_point_plugins = false
namespace = "{NAMESPACE}"
include = ["core/configmaps"]
watch = "required"
warm_standby = {str(warm).lower()}
http_bind = "127.0.0.1:{self.port}"
shutdown_timeout = "10s"
[leader_election]
enabled = true
lease_name = "{LEASE}"
lease_duration = "4s"
renew_deadline = "3s"
retry_period = "0.5s"
""" + (f"""[clusters]
enabled = true
namespaces = ["{NAMESPACE}"]
sync_timeout = "120s"
""" if fleet else ""))
        self.proc = subprocess.Popen([sys.executable, "-m", "syncer", "run", "--settings", str(settings),
                                      "--identity", identity], cwd=ROOT, stdin=subprocess.DEVNULL,
                                     stdout=self.log.open("wb"), stderr=subprocess.STDOUT)

    async def get(self, http: aiohttp.ClientSession, path: str) -> str:
        async with http.get(f"http://127.0.0.1:{self.port}{path}", timeout=aiohttp.ClientTimeout(total=5)) as r:
            return await r.text()

    async def status(self, http: aiohttp.ClientSession) -> dict[str, Any]:
        try:
            return json.loads(await self.get(http, "/status"))
        except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
            return {}

    async def metrics(self, http: aiohttp.ClientSession) -> dict[str, Any]:
        """The samples of interest: reconciles, first reconcile time by cluster, ConfigMap full lists (every
        cluster's)."""
        out: dict[str, Any] = {"reconciles": 0.0, "first": {}, "lists": 0.0}
        try:
            text = await self.get(http, "/metrics")
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return out
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == "bench_failover_reconciles_total":
                    out["reconciles"] += s.value
                elif s.name == "bench_failover_first_reconcile_time_seconds":
                    out["first"][s.labels["cluster"]] = s.value
                elif s.labels.get("gvr") == "configmaps.v1" and (
                        s.name == "informer_lists_total" or
                        (s.name == "informer_watches_total" and s.labels.get("mode") == "watch_list")):
                    out["lists"] += s.value
        return out

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


async def until(check: Any, what: str, timeout: float, period: float = 0.1) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out waiting for {what}")
        await asyncio.sleep(period)


async def populate(api: ApiClient, n: int) -> None:
    """Namespace ``bench`` with ``n`` ConfigMaps."""
    try:
        await api.request("POST", "/api/v1/namespaces", body={"metadata": {"name": NAMESPACE}})
    except ApiError as e:
        if e.status != 409:
            raise
    sem = asyncio.Semaphore(32)

    async def one(i: int) -> None:
        async with sem:
            await api.request("POST", f"/api/v1/namespaces/{NAMESPACE}/configmaps",
                              body={"metadata": {"name": f"cm-{i:05d}"}, "data": {"v": "x" * 256}})
    await asyncio.gather(*(one(i) for i in range(n)))


async def failover(api: ApiClient, http: aiohttp.ClientSession, kubeconfig: str, objects: int, rnd: int,
                   warm: bool, members: list[str]) -> dict[str, Any]:
    """One failover; ``members``: the member clusters' names (``[""]``: single-cluster mode)."""
    fleet = members != [""]
    tag = f"{'fleet-' if fleet else ''}{'warm' if warm else 'cold'}-{rnd}"
    try:  # a fresh Lease: the first replica takes it at once
        await api.request("DELETE", f"/apis/coordination.k8s.io/v1/namespaces/default/leases/{LEASE}")
    except ApiError as e:
        if e.status != 404:
            raise
    a = Replica("a", kubeconfig, tag, warm, fleet)
    b: Replica | None = None
    try:
        async def a_done() -> bool:
            return (await a.metrics(http))["reconciles"] >= objects
        await until(a_done, "a reconciling everything", 180)
        b = Replica("b", kubeconfig, tag, warm, fleet)
        standby = b

        async def b_ready() -> bool:
            st = await standby.status(http)
            if st.get("ready") is not True or not warm:
                return st.get("ready") is True
            if fleet:
                rows = (st.get("clusters") or {}).get("clusters") or []
                return sorted(r["name"] for r in rows if r["state"] == "ready") == sorted(members)
            states = {g["gvr"]: g["state"] for g in st.get("gvrs", [])}
            return states.get("configmaps.v1") == "synced"
        await until(b_ready, "b standing by", 180)
        await asyncio.sleep(1.0)  # let it settle (a warm standby's cache just filled)
        rss = standby.rss_mib()
        before = await standby.metrics(http)
        a.proc.kill()
        a.proc.wait()
        killed = time.time()

        async def b_all() -> bool:
            return (await standby.metrics(http))["reconciles"] >= objects
        await until(b_all, "b reconciling everything", 120, period=0.02)
        done = time.time()
        after = await standby.metrics(http)
        lease = await api.request("GET", f"/apis/coordination.k8s.io/v1/namespaces/default/leases/{LEASE}")
        assert lease["spec"]["holderIdentity"] == "b", lease["spec"]
        acquired = datetime.datetime.strptime(lease["spec"]["acquireTime"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(
            tzinfo=datetime.timezone.utc).timestamp()
        assert sorted(after["first"]) == sorted(members), after["first"]
        firsts = [after["first"][m] - acquired for m in members]
        out = {"mode": "warm" if warm else "cold", "round": rnd, "kill_to_acquire_s": acquired - killed,
               "acquire_to_first_reconcile_s": max(firsts), "acquire_to_first_member_s": min(firsts),
               "acquire_to_all_s": done - acquired,
               "lists_after_kill": after["lists"] - before["lists"], "standby_lists": before["lists"],
               "standby_rss_mib": rss}
        log("failover", **out)
        return out
    finally:
        a.stop()
        if b is not None:
            b.stop()


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for mode in ("warm", "cold"):
        rows = [r for r in runs if r["mode"] == mode]
        out[mode] = {k: statistics.median(r[k] for r in rows) for k in
                     ("acquire_to_first_reconcile_s", "acquire_to_first_member_s", "acquire_to_all_s", "lists_after_kill",
                      "standby_rss_mib")}
    out["ratio_first_reconcile_cold_over_warm"] = (out["cold"]["acquire_to_first_reconcile_s"] /
                                                   out["warm"]["acquire_to_first_reconcile_s"])
    return out


async def main(args: argparse.Namespace) -> None:
    from syncer.testing import ControlPlane

    OUT.mkdir(exist_ok=True)
    record = _record.start("failover_bench.py", args)
    cp = ControlPlane(name="failover-bench")
    planes = [cp] + [ControlPlane(name=f"failover-bench-m{i}") for i in range(args.fleet)]
    try:
        for plane in planes:
            plane.start()
        async with ApiClient.from_kubeconfig(str(cp.kubeconfig)) as api, aiohttp.ClientSession() as http:
            t0 = time.monotonic()
            members = [""]
            objects = args.objects
            if args.fleet:
                members = [f"m{i}" for i in range(args.fleet)]
                objects = args.objects // args.fleet * args.fleet
                await populate(api, 0)
                for name, plane in zip(members, planes[1:]):
                    async with ApiClient.from_kubeconfig(str(plane.kubeconfig)) as member:
                        await populate(member, objects // args.fleet)
                    await put_member(api, name, plane.member_kubeconfig())
            else:
                await populate(api, objects)
            log("populated", objects=objects, members=members, seconds=round(time.monotonic() - t0, 1))
            runs = []
            for rnd in range(args.rounds):
                for warm in ((True, False) if rnd % 2 == 0 else (False, True)):
                    runs.append(await failover(api, http, str(cp.kubeconfig), objects, rnd, warm, members))
        record["runs"] = runs
        record["summary"] = summary(runs)
        print(json.dumps(record["summary"], indent=1))
    finally:
        for plane in planes:
            plane.stop()
        _record.write(record, str(OUT / ("failover-fleet.json" if args.fleet else "failover.json")))


async def put_member(api: ApiClient, name: str, kubeconfig: bytes) -> None:
    """Member ``name``: a kubeconfig Secret in ``bench`` as the Secrets provider selects them by default."""
    await api.request("POST", f"/api/v1/namespaces/{NAMESPACE}/secrets", body={
        "metadata": {"name": name, "labels": {"kube-syncer.io/kubeconfig": "true"}},
        "data": {"kubeconfig": base64.b64encode(kubeconfig).decode()}})


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=10000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fleet", type=int, default=0, metavar="MEMBERS",
                        help="multi-cluster mode with this many member clusters (0: single-cluster)")
    asyncio.run(main(parser.parse_args()))
