"""Relist storm: one API server behind N members restarts; how soon is every member back, and at what cost?
Ours against the client-go peer, one contender at a time on the same planes, in one run.

    .venv/bin/python bench/storm_bench.py [--members 100] [--outage 10] [--rounds 1]
        [--contenders both|ours|client-go] [--profile] [--by-kind] [--peer-bin bench/out/clientgo_multicluster]
        [--json bench/out/storm.json]

Two local control planes, as bench/multicluster_bench.py: a management one holds ``--members`` kubeconfig
Secrets, all pointing at the workload plane (ConfigMaps, Secrets, Widgets; namespace ``bench`` holds a few of
each). Each contender runs as in that bench (ours: ClusterRegistry + ClusterControllers with default settings;
client-go: a DynamicSharedInformerFactory per member, one transport each), plus a "seen" event for objects named
``probe-*`` and a stdin protocol for request counts and cache digests.

Per round and contender: a fresh process, the members created and synced, 5 s settle (steady RSS, request counts,
CPU); then the workload apiserver is stopped for ``--outage`` seconds and started again. "Answers again" is the
first 200 from its /readyz, polled every 50 ms by the harness. At that moment the harness creates one ``probe-``
object of each of the three GVRs; a member has **recovered** when it has seen all three (its informers watch or
have relisted). Then 5 s settle and:

- recovery per member (p50/p90/max) from "answers again";
- requests per member from the outage's start to the end of the settle (every request its client sent, and those
  that got an answer), and per informer the LISTs (watch-list streams count as lists);
- RSS: the peak during the storm (sampled every 100 ms) over the steady RSS before it;
- CPU of the process from the outage's start to the end of the settle;
- convergence: each member's cache digest (sorted ``namespace/name=resourceVersion``) per GVR against the server's;
- a CPU timeline: the process's CPU seconds in each second, from 2 s before the outage to the end (``t`` from
  "answers again").

``--by-kind`` counts our requests per member by resource, verb and answer (a wrapper around the client's counting
in our runner; it costs CPU, so not for the figures). ``--profile`` records our process with py-spy from the outage's start to the end of the settle (collapsed stacks in
``bench/out/storm-profile-<round>.txt``, the top functions, inclusive and self, in the report).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
from collections import Counter
import time
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from informers import GVR, ApiClient  # noqa: E402

from multicluster_bench import (  # noqa: E402
    CONFIGMAPS, OUT, SECRETS, WIDGETS, Proc, build_peer, emit, put_secret, q, runner_main, setup_workload,
)

PROBE = "probe-"
GVRS = (CONFIGMAPS, SECRETS, WIDGETS)


def digest(objs: list[dict[str, Any]]) -> tuple[int, str]:
    """The client-go peer's digest: sha256 of the sorted ``namespace/name=resourceVersion`` lines."""
    lines = sorted(f"{(o.get('metadata') or {}).get('namespace', '')}/{o['metadata']['name']}="
                   f"{o['metadata'].get('resourceVersion', '')}" for o in objs)
    return len(lines), hashlib.sha256("\n".join(lines).encode()).hexdigest()


# -- ours: the runner's additions (a cluster handler and the stdin commands) -----------------------------------
class Probes:
    """Notes each member's cluster, and emits ``seen`` when one of its informers gets a ``probe-`` object."""

    def __init__(self) -> None:
        self.clusters: dict[str, Any] = {}

    def add_cluster(self, ctx: Any, name: str, cluster: Any) -> None:
        from informers import FuncHandler

        self.clusters[name] = cluster
        for gvr in GVRS:
            def seen(obj: dict[str, Any], *_: Any, resource: str = gvr.resource) -> None:
                if obj["metadata"]["name"].startswith(PROBE):
                    emit("seen", cluster=name, gvr=resource, name=obj["metadata"]["name"], t=time.time())

            cluster.factory.for_resource(gvr)[0].add_event_handler(
                FuncHandler(on_add=seen, on_update=lambda old, new, f=seen: f(new)), name="storm probe")

    def remove_cluster(self, name: str) -> None:
        self.clusters.pop(name, None)


def request_kind(method: str, path: str, params: Any) -> str:
    """A request as ``resource verb``: ``configmaps watch-list``, ``/readyz GET``; API groups and versions dropped."""
    params = params or {}
    parts = path.strip("/").split("/")
    if parts[0] in ("api", "apis") and len(parts) > (2 if parts[0] == "api" else 3):
        verb = "watch-list" if params.get("sendInitialEvents") else "watch" if params.get("watch") else method
        return f"{parts[-1]} {verb}"
    return f"{path} {method}"


def count_by_kind(tally: Counter[tuple[str, str]]) -> None:
    """Count every request of every ApiClient in ``tally`` by (``request_kind``, status or "no answer")."""
    from informers.client import CONNECTION_ERRORS, ApiClient

    counted = ApiClient._counted

    @asynccontextmanager
    async def tallied(self: Any, method: str, path: str, headers: Any, guard: Any, kwargs: Any) -> Any:
        kind = request_kind(method, path, kwargs.get("params"))
        try:
            async with counted(self, method, path, headers, guard, kwargs) as resp:
                tally[(kind, str(resp.status))] += 1
                yield resp
        except CONNECTION_ERRORS:
            tally[(kind, "no answer")] += 1
            raise

    ApiClient._counted = tallied  # type: ignore[method-assign]


def ours_runner(kubeconfig: str, namespace: str, by_kind: bool) -> None:
    probes = Probes()
    tally: Counter[tuple[str, str]] = Counter()
    if by_kind:
        count_by_kind(tally)

    async def serve(registry: Any, metrics: Any) -> None:
        from informers.request_metrics import NO_ANSWER

        reader = asyncio.StreamReader()
        await asyncio.get_running_loop().connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        async for line in reader:
            command = line.decode().strip()
            samples: dict[tuple[str, str, str, str], float] = {}
            if command == "stats":  # one collection: get_sample_value would collect the whole registry per call
                for family in metrics.collect():
                    for s in family.samples:
                        if s.name in ("informer_lists_total", "informer_watches_total"):
                            key = (s.name, s.labels.get("cluster", ""), s.labels.get("gvr", ""),
                                   s.labels.get("mode", ""))
                            samples[key] = s.value
            for name, cluster in list(probes.clusters.items()):
                if command == "stats":
                    codes = cluster.client.request_counts.codes
                    lists = {g.resource: samples.get(("informer_lists_total", name, str(g), ""), 0.0) +
                             samples.get(("informer_watches_total", name, str(g), "watch_list"), 0.0) for g in GVRS}
                    emit("stats", cluster=name, requests=sum(codes.values()),
                         answered=sum(n for (code, _), n in codes.items() if code != NO_ANSWER), lists=lists,
                         watches=sum(samples.get(("informer_watches_total", name, str(g), "watch"), 0.0)
                                     for g in GVRS))
                elif command == "dump":
                    for g in GVRS:
                        n, d = digest(cluster.factory.for_resource(g)[0].store.list())
                        emit("dump", cluster=name, gvr=g.resource, n=n, digest=d)
            if command == "kinds":
                for (kind, code), n in sorted(tally.items()):
                    emit("kinds", kind=kind, code=code, n=n)
            if command == "status":
                rows = registry.status()["clusters"]
                emit("status", ready=sum(1 for r in rows if r.get("ready")), members=len(rows))
            emit(f"{command}-done")
        await asyncio.Future()

    runner_main(kubeconfig, namespace, extra=probes, serve=serve)


# -- the harness ----------------------------------------------------------------------------------------------
class StormProc(Proc):
    """A contender with a stdin command channel."""

    async def start(self) -> None:
        import psutil

        self.proc = await asyncio.create_subprocess_exec(*self.argv, stdin=asyncio.subprocess.PIPE,
                                                         stdout=asyncio.subprocess.PIPE, stderr=self.log.open("ab"),
                                                         cwd=ROOT)
        self.ps = psutil.Process(self.proc.pid)
        self._reader = asyncio.create_task(self._read())
        await self.wait(lambda e: e["event"] == "started", 1, 120)

    async def command(self, command: str, timeout: float = 60) -> list[dict[str, Any]]:
        assert self.proc is not None and self.proc.stdin is not None
        start = len(self.events)
        done = f"{command}-done"
        count = sum(1 for e in self.events if e["event"] == done)
        self.proc.stdin.write(f"{command}\n".encode())
        await self.proc.stdin.drain()
        await self.wait(lambda e: e["event"] == done, count + 1, timeout)
        end = max(i for i, e in enumerate(self.events) if e["event"] == done)
        return [e for e in self.events[start:end] if e["event"] == command]


async def answers(url_client: ApiClient, until: float) -> float:
    """The time of the first 200 from /readyz, polled every 50 ms."""
    while time.time() < until:
        try:
            await url_client.request_bytes("GET", "/readyz", timeout=1.0)
            return time.time()
        except Exception:
            await asyncio.sleep(0.05)
    raise TimeoutError("the apiserver did not become ready")


async def put_probes(work: ApiClient, tag: str) -> float:
    async def one(gvr: GVR, body: dict[str, Any]) -> None:
        for attempt in range(600):
            try:
                await work.request("POST", gvr.path("bench"), body=body)
                return
            except Exception:
                await asyncio.sleep(0.05)
        raise RuntimeError(f"could not create the probe {gvr}")

    name = f"{PROBE}{tag}"
    await asyncio.gather(
        one(CONFIGMAPS, {"metadata": {"name": name}, "data": {"k": "v"}}),
        one(SECRETS, {"metadata": {"name": name}, "stringData": {"k": "v"}}),
        one(WIDGETS, {"apiVersion": "examples.kube-syncer.io/v1", "kind": "Widget", "metadata": {"name": name},
                      "spec": {"size": 1}}))
    return time.time()


async def server_digests(work: ApiClient) -> dict[str, tuple[int, str]]:
    out = {}
    for g in GVRS:
        page = await work.request("GET", g.path())
        out[g.resource] = digest(page.get("items") or [])
    return out


class CpuTimeline:
    """The process's CPU seconds in each second, sampled in the background."""

    def __init__(self, p: StormProc) -> None:
        self.p = p
        self.samples: list[tuple[float, float]] = []
        self._task = asyncio.create_task(self._sample())

    async def _sample(self) -> None:
        while True:
            self.samples.append((time.time(), self.p.cpu()))
            await asyncio.sleep(1.0)

    async def stop(self, origin: float) -> list[list[float]]:
        """``[t, cpu]`` rows, ``t`` (the start of each second) from ``origin``."""
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        s = self.samples
        return [[round(s[i][0] - origin, 1), round(s[i + 1][1] - s[i][1], 3)] for i in range(len(s) - 1)]


def start_profile(pid: int, out: Path) -> subprocess.Popen[bytes]:
    """py-spy (from this venv) recording ``pid`` until ``stop_profile``."""
    spy = Path(sys.executable).with_name("py-spy")
    return subprocess.Popen([str(spy), "record", "--pid", str(pid), "--rate", "100", "--format", "raw",
                             "--output", str(out), "--nonblocking"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def stop_profile(spy: subprocess.Popen[bytes], out: Path, top: int = 25) -> dict[str, Any]:
    """Stop py-spy (it writes its file on SIGINT) and summarise: samples, and the top functions by inclusive and
    self share of the samples."""
    spy.send_signal(signal.SIGINT)
    spy.wait(60)
    inclusive: Counter[str] = Counter()
    self_: Counter[str] = Counter()
    total = 0
    for line in out.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        for frame in set(frames):
            inclusive[frame] += n
        self_[frames[-1]] += n

    def rows(c: Counter[str]) -> list[list[Any]]:
        return [[round(100 * n / max(total, 1), 1), frame] for frame, n in c.most_common(top)]

    return {"file": str(out), "samples": total, "inclusive_pct": rows(inclusive), "self_pct": rows(self_)}


async def storm_round(mgmt: ApiClient, work: ApiClient, work_cp: Any, p: StormProc, namespace: str, data: bytes,
                      members: int, outage: float, tag: str, profile: Path | None) -> dict[str, Any]:
    await mgmt.request("POST", "/api/v1/namespaces", body={"metadata": {"name": namespace}})
    await p.start()
    sem = asyncio.Semaphore(50)

    async def put(i: int) -> None:
        async with sem:
            await put_secret(mgmt, namespace, f"m{i:03d}", data)

    await asyncio.gather(*(put(i) for i in range(members)))
    await p.wait(lambda e: e["event"] == "synced", members, 900)
    await asyncio.sleep(5)
    steady = statistics.median([p.rss() for _ in range(10) if not await asyncio.sleep(0.2)])
    before = {e["cluster"]: e for e in await p.command("stats")}
    kinds0 = await p.command("kinds") if p.name == "ours" else []
    peak = steady
    sampling = True

    async def sample() -> None:
        nonlocal peak
        while sampling:
            peak = max(peak, p.rss())
            await asyncio.sleep(0.1)

    sampler = asyncio.create_task(sample())
    timeline = CpuTimeline(p)
    await asyncio.sleep(2)
    spy = start_profile(p.ps.pid, profile) if profile is not None else None
    cpu0, t_stop = p.cpu(), time.time()
    await asyncio.to_thread(work_cp.stop_apiserver)
    await asyncio.sleep(max(0.0, t_stop + outage - time.time()))
    starting = asyncio.ensure_future(asyncio.to_thread(work_cp.start_apiserver))
    t_ready = await answers(work, time.time() + 120)
    t_probes = await put_probes(work, tag)
    await starting
    seen = await p.wait(lambda e: e["event"] == "seen" and e["name"] == f"{PROBE}{tag}", 3 * members, 300)
    last: dict[str, float] = {}
    for e in seen:
        last[e["cluster"]] = max(last.get(e["cluster"], 0.0), e["t"])
    await asyncio.sleep(5)
    sampling = False
    await sampler
    cpu = p.cpu() - cpu0
    cpu_timeline = await timeline.stop(t_ready)
    profiled = await asyncio.to_thread(stop_profile, spy, profile) if spy is not None and profile else None
    after = {e["cluster"]: e for e in await p.command("stats")}
    kinds = Counter({(e["kind"], e["code"]): e["n"] for e in await p.command("kinds")} if p.name == "ours" else {})
    kinds.subtract({(e["kind"], e["code"]): e["n"] for e in kinds0})
    want = await server_digests(work)
    divergent: set[str] = set()
    for attempt in range(3):
        divergent = {e["cluster"] for e in await p.command("dump") if (e["n"], e["digest"]) != want[e["gvr"]]}
        if not divergent:
            break
        await asyncio.sleep(3)
        want = await server_digests(work)
    ready = None
    if p.name == "ours":
        ready = (await p.command("status"))[0]["ready"]
    await p.stop()
    await mgmt.request("DELETE", f"/api/v1/namespaces/{namespace}")
    recovery = sorted(t - t_ready for t in last.values())
    requests = [after[c]["requests"] - before[c]["requests"] for c in after]
    answered = [after[c]["answered"] - before[c]["answered"] for c in after]
    lists = [after[c]["lists"].get(k, 0) - before[c]["lists"].get(k, 0) for c in after for k in after[c]["lists"]]
    return {
        "members": members, "recovered": len(last), "probes_created_after_ready_s": t_probes - t_ready,
        "outage_to_ready_s": t_ready - t_stop,
        "recovery_p50_s": statistics.median(recovery), "recovery_p90_s": q(recovery, 0.9),
        "recovery_max_s": recovery[-1], "requests_per_member": statistics.mean(requests),
        "answered_per_member": statistics.mean(answered), "lists_per_informer_mean": statistics.mean(lists),
        "lists_per_informer_max": max(lists), "informers": len(lists),
        "steady_rss_mib": steady / 2**20, "peak_rss_mib": peak / 2**20, "rss_peak_over_steady": peak / steady,
        "cpu_s": cpu, "divergent_members": len(divergent), "ready_members": ready, "cpu_timeline": cpu_timeline,
        "profile": profiled,
        "requests_per_member_by_kind": {f"{k} {c}": round(n / members, 2) for (k, c), n in sorted(kinds.items()) if n},
    }


def report(r: int, name: str, res: dict[str, Any]) -> None:
    """One round's figures on stderr: a JSON line, then the CPU timeline and the profile's top, readable."""
    brief = {k: round(v, 3) if isinstance(v, float) else v for k, v in res.items()
             if k not in ("cpu_timeline", "profile", "requests_per_member_by_kind")}
    print(json.dumps({"round": r, "contender": name, **brief}), file=sys.stderr, flush=True)
    print(f"  {name} CPU s per second (t from 'answers again'): " +
          " ".join(f"{t:+.0f}:{c:.2f}" for t, c in res["cpu_timeline"]), file=sys.stderr)
    if res["requests_per_member_by_kind"]:
        print(f"  {name} requests per member by kind and answer:", file=sys.stderr)
        for kind, n in res["requests_per_member_by_kind"].items():
            print(f"    {n:6.2f}  {kind}", file=sys.stderr)
    if res["profile"]:
        prof = res["profile"]
        print(f"  profile {prof['file']}: {prof['samples']} samples", file=sys.stderr)
        for kind in ("inclusive_pct", "self_pct"):
            print(f"  top {kind}:", file=sys.stderr)
            for pct, frame in prof[kind]:
                print(f"    {pct:5.1f}  {frame}", file=sys.stderr)
    sys.stderr.flush()


async def harness(args: argparse.Namespace) -> dict[str, Any]:
    from syncer.testing import ControlPlane

    peer_bin = Path(args.peer_bin) if args.peer_bin else build_peer() if args.contenders != "ours" else Path()
    OUT.mkdir(exist_ok=True)
    gvrs = ",".join(f"{g.group}/{g.version}/{g.resource}" for g in GVRS)
    mgmt_cp, work_cp = ControlPlane(name="storm-mgmt"), ControlPlane(name="storm-work")
    procs: list[StormProc] = []
    try:
        mgmt_cp.start()
        work_cp.start()
        kubeconfig = str(mgmt_cp.kubeconfig)
        data = work_cp.member_kubeconfig()
        async with ApiClient.from_kubeconfig(kubeconfig) as mgmt, \
                ApiClient.from_kubeconfig(str(work_cp.kubeconfig)) as work:
            await setup_workload(work)
            results: dict[str, Any] = {"args": vars(args), "rounds": {"ours": [], "client-go": []}}
            contenders = ("ours", "client-go") if args.contenders == "both" else (args.contenders,)
            for r in range(args.rounds):
                for name in (contenders if r % 2 == 0 else contenders[::-1]):
                    ns = f"storm-{name.replace('-', '')}-{r}"
                    log = OUT / f"storm-{name}-{r}.log"
                    log.write_bytes(b"")
                    if name == "ours":
                        argv = [sys.executable, str(Path(__file__).resolve()), "--runner", "--kubeconfig",
                                kubeconfig, "--namespace", ns] + (["--by-kind"] if args.by_kind else [])
                    else:
                        argv = [str(peer_bin), "-kubeconfig", kubeconfig, "-namespace", ns, "-gvrs", gvrs,
                                "-workers", "2", "-probe-prefix", PROBE, "-commands"]
                    p = StormProc(name, argv, log)
                    procs.append(p)
                    profile = OUT / f"storm-profile-{r}.txt" if args.profile and name == "ours" else None
                    res = await storm_round(mgmt, work, work_cp, p, ns, data, args.members, args.outage,
                                            f"{r}-{name.replace('-', '')}", profile)
                    results["rounds"][name].append(res)
                    report(r, name, res)
            return results
    finally:
        for p in procs:
            await p.stop()
        mgmt_cp.stop()
        work_cp.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runner", action="store_true", help="(internal) run ours as a contender")
    p.add_argument("--kubeconfig")
    p.add_argument("--namespace")
    p.add_argument("--members", type=int, default=100)
    p.add_argument("--outage", type=float, default=10.0, help="seconds the apiserver is down")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--contenders", choices=("both", "ours", "client-go"), default="both")
    p.add_argument("--profile", action="store_true", help="py-spy our process during the storm")
    p.add_argument("--by-kind", action="store_true",
                   help="count our requests by resource, verb and answer (a wrapper in our runner)")
    p.add_argument("--peer-bin", help="a built bench/clientgo_multicluster (default: go build it)")
    p.add_argument("--json", default=str(OUT / "storm.json"))
    args = p.parse_args()
    if args.runner:
        ours_runner(args.kubeconfig, args.namespace, args.by_kind)
        return
    results = asyncio.run(harness(args))
    results["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()}
    Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
