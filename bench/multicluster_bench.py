"""Multi-cluster mode costs: Secret-to-first-reconcile latency, and 50 member clusters against one API server
(time to all synced, idle RSS, connections, idle CPU), ours against a client-go peer, both measured alike.

    .venv/bin/python bench/multicluster_bench.py [--clusters 50] [--samples 30] [--rounds 3] [--idle 60]

Two local control planes: a management one (the kubeconfig Secrets) and a workload one (every member cluster is
a Secret whose kubeconfig points at it, with the admin token). The workload plane serves the example GVRs:
ConfigMaps, Secrets and the Widget CRD (examples/crds/widget.json), and namespace ``bench`` holds 5 ConfigMaps,
3 Secrets and 3 Widgets.

Contenders, each in its own process, started by this script and measured from outside with psutil (RSS, CPU
time of all threads, established TCP connections):

- ``ours``: this file with ``--runner``: a ClusterRegistry on the management plane and ClusterControllers
  running one per-cluster Controller (``for_`` ConfigMaps, ``watches`` Secrets and Widgets, a reconcile that
  only notes its first call), built as ``syncer run`` builds multi-cluster mode with default settings: its loop
  (``syncer.cli.event_loop``: uvloop when importable; ``tune_gc``), ``small_tls_read_buffers()``, the member factory of
  ``Syncer._member_factory`` (watch ``required``, CRD/APIService triggers, a safety-net pass every 10 min,
  informer metrics on one registry labelled by cluster), a probe only after 5 min without a word from a member,
  2 workers, INFO logs to a file. Not included: the sidecar's HTTP server and the
  management plane's own discovering factory (the same with 1 or 50 members).
- ``client-go``: bench/clientgo_multicluster (client-go v0.36.3, as bench/clientgo): a Secret informer on the
  management plane; per member a DynamicSharedInformerFactory with the same three informers (managedFields
  dropped, as ours does), a rate-limited work queue and 2 workers started once the caches synced. One HTTP
  transport per member (see its main.go). multicluster-runtime itself is not fetchable from the module proxy
  here (403), so this is the closest peer that runs.

Phase 1, latency: both processes run side by side, each on a Secret namespace of its own; per sample one Secret
(a new name each time) is created for one contender, then for the other (their order alternating), the time
from just before the POST to the member's first reconcile (and to its informers synced) is noted, and the
Secret deleted again (waiting for the member to go). 3 warm-up samples are dropped.

Phase 2, 50 clusters: per round a fresh process of each contender (order alternating by round), one at a time:
started and idle 3 s (baseline), ``--clusters`` Secrets created at once, waited for every member's first
reconcile; 5 s settle; RSS and connections; then ``--idle`` seconds untouched: CPU time / wall time; then the
Secrets are deleted and every member's removal awaited. Medians over rounds; ratios are ours / client-go.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from informers import GVR, ApiClient  # noqa: E402

CONFIGMAPS = GVR("", "v1", "configmaps")
SECRETS = GVR("", "v1", "secrets")
WIDGETS = GVR("examples.kube-syncer.io", "v1", "widgets")
LABELS = {"kube-syncer.io/kubeconfig": "true"}
PEER_DIR = ROOT / "bench" / "clientgo_multicluster"
OUT = ROOT / "bench" / "out"


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


# -- the runner of ours (a subprocess) ------------------------------------------------------------------------
def runner_main(kubeconfig: str, namespace: str, extra: Any = None, serve: Any = None) -> None:
    """Run ours until terminated. ``extra``: one more cluster handler, registered first; ``serve(registry,
    metrics_registry)``: a coroutine run once every member is up (bench/storm_bench.py's commands)."""
    from syncer.cli import event_loop, tune_gc
    from syncer.settings import Settings

    settings = Settings()
    loop_factory, note = event_loop(settings)
    tune_gc()
    with asyncio.Runner(loop_factory=loop_factory) as runner:  # as cmd_run does
        runner.run(_runner(kubeconfig, namespace, settings, note, extra, serve))


async def _runner(kubeconfig: str, namespace: str, settings: Any, loop_note: str, extra: Any = None,
                  serve: Any = None) -> None:
    from prometheus_client import CollectorRegistry

    from controllers import Controller, ManagedController
    from controllers.cluster import display_name
    from controllers.cluster_controllers import ClusterControllers
    from controllers.cluster_registry import ClusterRegistry
    from controllers.member import MemberOptions
    from controllers.providers.secrets import SecretOptions, SecretProvider
    from informers import DiscoveringDynamicSharedInformerFactory
    from syncer.wiring import discovery_options
    from syncer.logs import setup_logging
    from syncer.runtime import small_tls_read_buffers

    setup_logging(settings.log_level, settings.log_format)
    small_tls_read_buffers()
    s = settings
    metrics = CollectorRegistry()  # the process's registry, as the sidecar's /metrics serves it
    names: dict[int, str] = {}  # id(member's API client) -> cluster name

    def member_factory(client: ApiClient, name: str) -> DiscoveringDynamicSharedInformerFactory:
        # As syncer.wiring.member_factory builds it from the settings.
        return DiscoveringDynamicSharedInformerFactory(client, discovery_options(s, watch=s.clusters.watch),
                                                       name=f"discovery {display_name(name)}",
                                                       metrics_registry=metrics, metrics_cluster=name)

    class Names:
        """Registered before the controllers: notes each member's client (so a controller knows its cluster)."""

        def add_cluster(self, ctx: Any, name: str, cluster: Any) -> None:
            names[id(cluster.client)] = name
            emit("synced", cluster=name, t=time.time())

        def remove_cluster(self, name: str) -> None:
            emit("removed", cluster=name, t=time.time())

    def create(ctx: Any) -> Any:
        cluster = names.get(id(ctx.client), "?")
        seen = False

        async def reconcile(req: Any) -> None:
            nonlocal seen
            if not seen:
                seen = True
                emit("reconciled", cluster=cluster, t=time.time())

        return (Controller("bench", reconcile, workers=ctx.workers)
                .for_(CONFIGMAPS).watches(SECRETS).watches(WIDGETS).run)

    controllers = {"bench": ManagedController([CONFIGMAPS, SECRETS, WIDGETS], create)}
    api = ApiClient.from_kubeconfig(kubeconfig)
    registry = ClusterRegistry(api, [SecretProvider(api, SecretOptions(namespaces=(namespace,)))],
                               MemberOptions(sync_timeout=s.clusters.sync_timeout,
                                             probe_interval=s.clusters.probe_interval),
                               required={g for c in controllers.values() for g in c.required_gvrs},
                               make_factory=member_factory)
    per_cluster = ClusterControllers(controllers, name="bench", workers=s.workers, resync_period=s.resync or None,
                                     start_timeout=s.start_timeout)
    if extra is not None:
        await registry.register_cluster_handler(extra)
    await registry.register_cluster_handler(Names())
    await registry.register_cluster_handler(per_cluster)
    await registry.start()
    while not registry.synced():
        await asyncio.sleep(0.01)
    emit("started", t=time.time(), loop=loop_note)
    try:
        await (serve(registry, metrics) if serve is not None else asyncio.Future())
    finally:
        await per_cluster.stop()
        await registry.stop()
        await api.close()


# -- the harness ----------------------------------------------------------------------------------------------
class Proc:
    """A contender's process: its stdout events, and psutil probes."""

    def __init__(self, name: str, argv: list[str], log: Path) -> None:
        self.name, self.argv, self.log = name, argv, log
        self.events: list[dict[str, Any]] = []
        self.changed = asyncio.Condition()
        self.proc: asyncio.subprocess.Process | None = None
        self.ps: Any = None
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        import psutil

        self.proc = await asyncio.create_subprocess_exec(*self.argv, stdout=asyncio.subprocess.PIPE,
                                                         stderr=self.log.open("ab"), cwd=ROOT)
        self.ps = psutil.Process(self.proc.pid)
        self._reader = asyncio.create_task(self._read())
        await self.wait(lambda e: e["event"] == "started", 1, 120)

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        async for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue
            async with self.changed:
                self.events.append(event)
                self.changed.notify_all()
        async with self.changed:
            self.events.append({"event": "exit"})
            self.changed.notify_all()

    async def wait(self, match: Any, count: int, timeout: float) -> list[dict[str, Any]]:
        def found() -> list[dict[str, Any]]:
            if any(e["event"] in ("exit", "error") for e in self.events):
                raise RuntimeError(f"{self.name}: {[e for e in self.events if e['event'] in ('exit', 'error')]}"
                                   f" (see {self.log})")
            return [e for e in self.events if match(e)]

        async with asyncio.timeout(timeout):
            async with self.changed:
                await self.changed.wait_for(lambda: len(found()) >= count)
        return found()

    def started(self) -> dict[str, Any]:
        return next(e for e in self.events if e["event"] == "started")

    def rss(self) -> int:
        return int(self.ps.memory_info().rss)

    def cpu(self) -> float:
        t = self.ps.cpu_times()
        return float(t.user + t.system)

    def connections(self) -> int:
        import psutil

        return sum(1 for c in self.ps.net_connections(kind="tcp") if c.status == psutil.CONN_ESTABLISHED)

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.terminate()
            try:
                async with asyncio.timeout(30):
                    await self.proc.wait()
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)


async def put_secret(api: ApiClient, namespace: str, name: str, data: bytes) -> None:
    await api.request("POST", SECRETS.path(namespace), body={
        "metadata": {"name": name, "labels": LABELS}, "data": {"kubeconfig": base64.b64encode(data).decode()}})


async def setup_workload(work: ApiClient) -> None:
    crd = json.loads((ROOT / "examples" / "crds" / "widget.json").read_text())
    await work.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", body=crd)
    for _ in range(300):
        got = await work.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/"
                                        f"{crd['metadata']['name']}")
        if any(c["type"] == "Established" and c["status"] == "True"
               for c in (got.get("status") or {}).get("conditions") or []):
            break
        await asyncio.sleep(0.1)
    await work.request("POST", "/api/v1/namespaces", body={"metadata": {"name": "bench"}})
    for i in range(5):
        await work.request("POST", CONFIGMAPS.path("bench"), body={"metadata": {"name": f"cm-{i}"},
                                                                   "data": {"k": "v" * 100}})
    for i in range(3):
        await work.request("POST", SECRETS.path("bench"), body={"metadata": {"name": f"s-{i}"},
                                                                "stringData": {"k": "v"}})
    for i in range(3):
        for attempt in range(100):  # the widgets endpoint may lag Established by a moment
            try:
                await work.request("POST", WIDGETS.path("bench"), body={
                    "apiVersion": "examples.kube-syncer.io/v1", "kind": "Widget", "metadata": {"name": f"w-{i}"},
                    "spec": {"size": i}})
                break
            except Exception:
                if attempt == 99:
                    raise
                await asyncio.sleep(0.1)


def q(values: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(p * len(s) + 0.5)) - 1))]


async def latency_phase(mgmt: ApiClient, procs: dict[str, Proc], namespaces: dict[str, str], data: bytes,
                        samples: int, warmup: int = 3) -> dict[str, dict[str, list[float]]]:
    result: dict[str, dict[str, list[float]]] = {n: {"reconciled": [], "synced": []} for n in procs}
    order = list(procs)
    for i in range(warmup + samples):
        for name in (order if i % 2 == 0 else order[::-1]):
            p, ns, cluster = procs[name], namespaces[name], f"lat-{i}"
            t0 = time.time()
            await put_secret(mgmt, ns, cluster, data)
            rec = (await p.wait(lambda e: e["event"] == "reconciled" and e.get("cluster") == cluster, 1, 60))[0]
            syn = next(e for e in p.events if e["event"] == "synced" and e.get("cluster") == cluster)
            if i >= warmup:
                result[name]["reconciled"].append(rec["t"] - t0)
                result[name]["synced"].append(syn["t"] - t0)
            await mgmt.request("DELETE", SECRETS.path(ns, cluster))
            await p.wait(lambda e: e["event"] == "removed" and e.get("cluster") == cluster, 1, 60)
            await asyncio.sleep(0.2)
    return result


async def fleet_round(mgmt: ApiClient, p: Proc, namespace: str, data: bytes, clusters: int, idle: float
                      ) -> dict[str, float]:
    await mgmt.request("POST", "/api/v1/namespaces", body={"metadata": {"name": namespace}})
    await p.start()
    await asyncio.sleep(3)
    base_rss, base_conn = p.rss(), p.connections()
    cpu0 = p.cpu()
    t0 = time.time()
    await asyncio.gather(*(put_secret(mgmt, namespace, f"c{i:03d}", data) for i in range(clusters)))
    posted = time.time() - t0
    rec = await p.wait(lambda e: e["event"] == "reconciled", clusters, 600)
    syn = [e for e in p.events if e["event"] == "synced"]
    t_synced = max(e["t"] for e in syn) - t0
    t_rec = max(e["t"] for e in rec) - t0
    sync_cpu = p.cpu() - cpu0
    await asyncio.sleep(5)
    rss, conn = p.rss(), p.connections()
    c0, w0 = p.cpu(), time.monotonic()
    await asyncio.sleep(idle)
    c1, w1 = p.cpu(), time.monotonic()
    rss_end, conn_end = p.rss(), p.connections()
    t1 = time.time()
    await asyncio.gather(*(mgmt.request("DELETE", SECRETS.path(namespace, f"c{i:03d}")) for i in range(clusters)))
    await p.wait(lambda e: e["event"] == "removed", clusters, 300)
    removed = max(e["t"] for e in p.events if e["event"] == "removed") - t1
    await asyncio.sleep(2)
    conn_after = p.connections()
    await p.stop()
    await mgmt.request("DELETE", f"/api/v1/namespaces/{namespace}")
    return {
        "posted_s": posted, "all_synced_s": t_synced, "all_reconciled_s": t_rec, "sync_cpu_s": sync_cpu,
        "base_rss_mib": base_rss / 2**20, "rss_mib": rss / 2**20, "rss_end_mib": rss_end / 2**20,
        "rss_per_cluster_kib": (rss - base_rss) / clusters / 1024,
        "base_conn": base_conn, "conn": conn, "conn_end": conn_end, "conn_per_cluster": (conn - base_conn) / clusters,
        "conn_after_removal": conn_after, "idle_cpu_pct": (c1 - c0) / (w1 - w0) * 100, "all_removed_s": removed,
    }


def build_peer() -> Path:
    binary = OUT / "clientgo_multicluster"
    OUT.mkdir(exist_ok=True)
    subprocess.run(["go", "build", "-o", str(binary), "."], cwd=PEER_DIR, check=True)
    return binary


async def harness(args: argparse.Namespace) -> dict[str, Any]:
    from syncer.testing import ControlPlane

    peer_bin = Path(args.peer_bin) if args.peer_bin else build_peer()
    OUT.mkdir(exist_ok=True)
    gvrs = ",".join(f"{g.group}/{g.version}/{g.resource}" for g in (CONFIGMAPS, SECRETS, WIDGETS))
    mgmt_cp, work_cp = ControlPlane(name="mc-bench-mgmt"), ControlPlane(name="mc-bench-work")
    procs: list[Proc] = []
    try:
        mgmt_cp.start()
        work_cp.start()
        kubeconfig = str(mgmt_cp.kubeconfig)
        data = work_cp.member_kubeconfig()
        async with ApiClient.from_kubeconfig(kubeconfig) as mgmt, \
                ApiClient.from_kubeconfig(str(work_cp.kubeconfig)) as work:
            await setup_workload(work)

            def make(name: str, ns: str, tag: str) -> Proc:
                log = OUT / f"multicluster-{name}-{tag}.log"
                log.write_bytes(b"")
                if name == "ours":
                    argv = [sys.executable, str(Path(__file__).resolve()), "--runner", "--kubeconfig", kubeconfig,
                            "--namespace", ns]
                else:
                    argv = [str(peer_bin), "-kubeconfig", kubeconfig, "-namespace", ns, "-gvrs", gvrs,
                            "-workers", "2"]
                p = Proc(name, argv, log)
                procs.append(p)
                return p

            results: dict[str, Any] = {"args": vars(args)}
            contenders = ("ours", "client-go")
            if args.samples:
                namespaces = {n: f"lat-{n.replace('-', '')}" for n in contenders}
                for ns in namespaces.values():
                    await mgmt.request("POST", "/api/v1/namespaces", body={"metadata": {"name": ns}})
                lat_procs = {n: make(n, namespaces[n], "latency") for n in contenders}
                for p in lat_procs.values():
                    await p.start()
                results["loop"] = lat_procs["ours"].started().get("loop")
                lat = await latency_phase(mgmt, lat_procs, namespaces, data, args.samples)
                for p in lat_procs.values():
                    await p.stop()
                results["latency"] = {n: {k: {"p50": statistics.median(v), "p99": q(v, 0.99), "max": max(v),
                                              "min": min(v), "n": len(v), "all": v}
                                          for k, v in d.items()} for n, d in lat.items()}
                print(json.dumps({"latency": {n: {k: {m: round(x, 4) for m, x in v.items() if m != "all"}
                                                  for k, v in d.items()} for n, d in results["latency"].items()}}),
                      file=sys.stderr, flush=True)
            rounds: dict[str, list[dict[str, float]]] = {n: [] for n in contenders}
            for r in range(args.rounds):
                for n in (contenders if r % 2 == 0 else contenders[::-1]):
                    ns = f"fleet-{n.replace('-', '')}-{r}"
                    res = await fleet_round(mgmt, make(n, ns, f"round{r}"), ns, data, args.clusters, args.idle)
                    rounds[n].append(res)
                    print(json.dumps({"round": r, "contender": n, **{k: round(v, 3) for k, v in res.items()}}),
                          file=sys.stderr, flush=True)
            results["rounds"] = rounds
            results["medians"] = {n: {k: statistics.median(x[k] for x in rs) for k in rs[0]}
                                  for n, rs in rounds.items() if rs}
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
    p.add_argument("--clusters", type=int, default=50)
    p.add_argument("--samples", type=int, default=30, help="latency samples per contender (0: skip phase 1)")
    p.add_argument("--rounds", type=int, default=3, help="50-cluster rounds per contender")
    p.add_argument("--idle", type=float, default=60.0, help="seconds of idle CPU measurement")
    p.add_argument("--peer-bin", help="a built bench/clientgo_multicluster (default: go build it)")
    p.add_argument("--json", default=str(OUT / "multicluster.json"))
    args = p.parse_args()
    if args.runner:
        runner_main(args.kubeconfig, args.namespace)
        return
    results = asyncio.run(harness(args))
    results["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()}
    Path(args.json).write_text(json.dumps(results, indent=1))
    print(json.dumps(results.get("medians"), indent=1))


if __name__ == "__main__":
    main()
