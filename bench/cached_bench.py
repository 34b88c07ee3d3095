"""Cached resource replication (issue 14): initial replication of N ConfigMaps into CachedObject wrappers (wall
time, API writes to the cache), replication lag under a steady write rate, and memory per replicated object; ours
(syncer.builtin.cached_resources.Replication) against a client-go peer (bench/clientgo_cached), measured alike.

    .venv/bin/python bench/cached_bench.py [--objects 10000] [--rounds 2] [--rate 100] [--lag-seconds 30] \
        [--small 50] [--big 2048] [--big-rounds 1] [--workers 4] [--peer-bin bench/out/clientgo_cached]

Two local control planes (syncer.testing.ControlPlane): a SOURCE plane holding ``--objects`` ConfigMaps in
namespace ``bench`` (label ``bench=cached``, data ``x`` of ``--small`` bytes and a ``ts`` stamp of fixed width), and
a CACHE plane (the management plane) with the CachedObject CRD (``install_crds``) and the kubeconfig Secret that
registers the source as member cluster ``src``.

Contenders, each a child process of this script, measured from outside with psutil (RSS; CPU = user+sys of all
threads):

- ``ours``: this file with ``--runner``: ``ClusterRegistry`` on the cache plane (default member factory, which
  watches only required GVRs), then, on "go", a ``Replication("bench", configmaps, bench=cached, ...)`` registered
  as its cluster handler, writing into the cache plane: a full source informer (metadata-only informers are not
  implemented) plus the cache informer filtered by the schema label. Loop as ``syncer run`` picks it
  (``syncer.cli.event_loop``: uvloop when importable) with ``small_tls_read_buffers()``.
- ``client-go``: bench/clientgo_cached (client-go v0.36.3): dynamic informers on the source ConfigMaps and on the
  cache's CachedObjects filtered by the same schema label, a rate-limited work queue, the same reconcile, names,
  labels and annotations through the dynamic client. Client-side rate limit off (QPS -1; ours has none).

Both get the same ``--workers``. Per round (rounds alternate which contender goes first; a fresh process each):
start the contender, wait for "ready" (ours: the member cluster is up; client-go: clients built), 2 s, baseline
RSS/CPU; write "go"; the wall time runs from "go" until this script's own watch of the cache (an informer on the
schema's wrappers) holds all N wrappers. Then wait until the cache apiserver's write counters for cachedobjects
(``apiserver_request_total``, POST/PUT/PATCH/DELETE) stop moving (3 s), 5 s settle, RSS: (RSS - baseline) / N is
the memory per replicated object (source object in the source informer + wrapper in the cache informer). Then the
lag phase: ``--rate`` merge PATCHes per second for ``--lag-seconds`` to the source ConfigMaps in turn, each
stamping ``data.ts`` with its send time; lag = when this script's cache watch sees that stamp in a wrapper's
``spec.raw`` minus the stamp. Then the contender is stopped and the wrappers deleted (deletecollection).

The body-size phase (``--big``): every source ConfigMap's ``x`` is made ``--big`` bytes, and ``--big-rounds`` more
initial replications run per contender (no lag phase); comparing the memory per object at the two sizes gives the
cost per body byte and so the share of the small objects' cost that is body rather than metadata.
"""

from __future__ import annotations

import argparse
import asyncio
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
SELECTOR = "bench=cached"
NAMESPACE = "bench"
SECRETS_NS = "clusters"
CLUSTER = "src"
PEER_DIR = ROOT / "bench" / "clientgo_cached"
OUT = ROOT / "bench" / "out"
WRITE_VERBS = ("POST", "PUT", "PATCH", "DELETE")
TS_ZERO = f"{0:017.6f}"  # the stamp's fixed width, so stamping does not change the body size


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


# -- the runner of ours (a subprocess) ------------------------------------------------------------------------
def runner_main(args: argparse.Namespace) -> None:
    from syncer.cli import event_loop
    from syncer.settings import Settings

    settings = Settings()
    loop_factory, note = event_loop(settings)
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(_runner(args, settings, note))


async def _runner(args: argparse.Namespace, settings: Any, loop_note: str) -> None:
    from controllers.cluster_registry import ClusterRegistry
    from controllers.providers.secrets import SecretOptions, SecretProvider
    from informers import LabelSelector
    from syncer.builtin.cached_resources.replication import Replication
    from syncer.logs import setup_logging
    from syncer.runtime import small_tls_read_buffers

    setup_logging(settings.log_level, settings.log_format)
    small_tls_read_buffers()
    api = ApiClient.from_kubeconfig(args.kubeconfig)
    registry = ClusterRegistry(api, [SecretProvider(api, SecretOptions(namespaces=(SECRETS_NS,)))])
    await registry.start()
    while registry.list_clusters() != [CLUSTER]:
        await asyncio.sleep(0.05)
    emit("ready", loop=loop_note)
    line = (await asyncio.to_thread(sys.stdin.readline)).strip()
    if line != "go":
        emit("error", error=f"expected go, got {line!r}")
        return
    emit("begin", t=time.time())
    replication = Replication("bench", CONFIGMAPS, LabelSelector.parse(SELECTOR), "bench", api, registry.clients,
                              workers=args.workers)
    task = asyncio.create_task(replication.run())
    await registry.register_cluster_handler(replication)
    while not replication.synced():
        await asyncio.sleep(0.01)
    emit("synced", t=time.time())
    try:
        await task
    finally:
        await replication.close()
        await registry.stop()
        await api.close()


# -- the harness ----------------------------------------------------------------------------------------------
class Proc:
    """A contender's process: its stdout events, stdin, and psutil probes."""

    def __init__(self, name: str, argv: list[str], log: Path) -> None:
        self.name, self.argv, self.log = name, argv, log
        self.events: list[dict[str, Any]] = []
        self.changed = asyncio.Condition()
        self.proc: asyncio.subprocess.Process | None = None
        self.ps: Any = None
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        import psutil

        self.proc = await asyncio.create_subprocess_exec(
            *self.argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=self.log.open("ab"),
            cwd=ROOT)
        self.ps = psutil.Process(self.proc.pid)
        self._reader = asyncio.create_task(self._read())
        await self.wait("ready", 120)

    async def go(self) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(b"go\n")
        await self.proc.stdin.drain()

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

    async def wait(self, name: str, timeout: float) -> dict[str, Any]:
        def found() -> dict[str, Any] | None:
            bad = [e for e in self.events if e["event"] in ("exit", "error")]
            if bad:
                raise RuntimeError(f"{self.name}: {bad} (see {self.log})")
            return next((e for e in self.events if e["event"] == name), None)

        async with asyncio.timeout(timeout):
            async with self.changed:
                await self.changed.wait_for(lambda: found() is not None)
        got = found()
        assert got is not None
        return got

    def check(self) -> None:
        bad = [e for e in self.events if e["event"] in ("exit", "error")]
        if bad:
            raise RuntimeError(f"{self.name}: {bad} (see {self.log})")

    def rss(self) -> int:
        return int(self.ps.memory_info().rss)

    def cpu(self) -> float:
        t = self.ps.cpu_times()
        return float(t.user + t.system + t.children_user + t.children_system)

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


class Watch:
    """This script's own view of the cache: an informer on the schema's wrappers; notes when the count reaches a
    target and when a stamped ``ts`` shows up in a wrapper's ``spec.raw``."""

    def __init__(self, cache: ApiClient) -> None:
        from informers import FuncHandler, SharedIndexInformer
        from syncer.builtin.cached_resources.naming import CACHED_OBJECTS, schema_selector

        self.informer = SharedIndexInformer(cache, CACHED_OBJECTS, label_selector=schema_selector(CONFIGMAPS))
        self.informer.add_event_handler(FuncHandler(self._add, self._update, self._delete))
        self.names: set[str] = set()
        self.target = -1
        self.reached: asyncio.Event = asyncio.Event()
        self.reached_at = 0.0
        self.pending: set[str] = set()  # stamps written, not yet seen
        self.lags: list[float] = []

    def expect(self, count: int) -> None:
        self.target, self.reached_at = count, 0.0
        self.reached.clear()
        self._check()

    def _check(self) -> None:
        if len(self.names) == self.target and not self.reached.is_set():
            self.reached_at = time.time()
            self.reached.set()

    def _add(self, obj: Any, _initial: bool = False) -> None:
        self.names.add(obj["metadata"]["name"])
        self._check()
        self._stamp(obj)

    def _update(self, _old: Any, new: Any) -> None:
        self._stamp(new)

    def _delete(self, obj: Any) -> None:
        obj = getattr(obj, "obj", obj)
        self.names.discard(obj["metadata"]["name"])
        self._check()

    def _stamp(self, obj: Any) -> None:
        ts = ((obj.get("spec") or {}).get("raw") or {}).get("data", {}).get("ts")
        if ts in self.pending:
            self.pending.discard(ts)
            self.lags.append(time.time() - float(ts))


async def cache_writes(cache: ApiClient) -> dict[str, float]:
    text = await cache.request_text("/metrics")
    counts = {v: 0.0 for v in (*WRITE_VERBS, "GET")}
    for line in text.splitlines():
        if line.startswith("apiserver_request_total{") and 'resource="cachedobjects"' in line:
            for verb in counts:
                if f'verb="{verb}"' in line:
                    counts[verb] += float(line.rsplit(" ", 1)[1])
    return counts


async def settle_writes(cache: ApiClient, quiet: float = 3.0, timeout: float = 120.0) -> dict[str, float]:
    """Poll the cache's write counters until they have not moved for ``quiet`` seconds."""
    last, since, deadline = await cache_writes(cache), time.monotonic(), time.monotonic() + timeout
    while time.monotonic() - since < quiet and time.monotonic() < deadline:
        await asyncio.sleep(0.5)
        now = await cache_writes(cache)
        if now != last:
            last, since = now, time.monotonic()
    return last


async def fill_source(src: ApiClient, n: int, size: int, create: bool) -> float:
    """Create (or, ``create=False``, resize) the N ConfigMaps; returns seconds taken."""
    sem = asyncio.Semaphore(32)
    t0 = time.monotonic()

    async def one(i: int) -> None:
        async with sem:
            if create:
                await src.request("POST", CONFIGMAPS.path(NAMESPACE), body={
                    "metadata": {"name": f"cm-{i}", "labels": {"bench": "cached"}},
                    "data": {"x": "y" * size, "ts": TS_ZERO}})
            else:
                await src.request("PATCH", CONFIGMAPS.path(NAMESPACE, f"cm-{i}"), body={"data": {"x": "z" * size}},
                                  headers={"Content-Type": "application/merge-patch+json"})

    await asyncio.gather(*(one(i) for i in range(n)))
    return time.monotonic() - t0


def q(values: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(p * len(s) + 0.5)) - 1))] if s else float("nan")


async def lag_phase(src: ApiClient, watch: Watch, n: int, rate: float, seconds: float, offset: int
                    ) -> dict[str, Any]:
    watch.lags, watch.pending = [], set()
    sem = asyncio.Semaphore(50)
    tasks: list[asyncio.Task[None]] = []
    total = int(rate * seconds)
    late = 0

    async def write(i: int) -> None:
        async with sem:
            ts = f"{time.time():017.6f}"
            watch.pending.add(ts)
            await src.request("PATCH", CONFIGMAPS.path(NAMESPACE, f"cm-{(offset + i) % n}"), body={"data": {"ts": ts}},
                              headers={"Content-Type": "application/merge-patch+json"})

    start = time.monotonic()
    for i in range(total):
        delay = start + i / rate - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        elif delay < -0.05:
            late += 1
        tasks.append(asyncio.create_task(write(i)))
    await asyncio.gather(*tasks)
    sent_in = time.monotonic() - start
    deadline = time.monotonic() + 30
    while watch.pending and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    lags = watch.lags
    return {"writes": total, "sent_in_s": sent_in, "late_sends": late, "seen": len(lags), "missing": len(watch.pending),
            "p50_ms": q(lags, 0.5) * 1000, "p99_ms": q(lags, 0.99) * 1000, "max_ms": max(lags, default=0) * 1000,
            "mean_ms": statistics.fmean(lags) * 1000 if lags else float("nan")}


async def round_(name: str, proc: Proc, cache: ApiClient, src: ApiClient, watch: Watch, n: int,
                 lag: tuple[float, float] | None, offset: int) -> dict[str, Any]:
    await proc.start()
    await asyncio.sleep(2)
    rss0, cpu0 = proc.rss(), proc.cpu()
    w0 = await cache_writes(cache)
    watch.expect(n)
    t0 = time.time()
    await proc.go()
    async with asyncio.timeout(900):
        while not watch.reached.is_set():
            proc.check()
            try:
                await asyncio.wait_for(watch.reached.wait(), 1)
            except TimeoutError:
                pass
    wall = watch.reached_at - t0
    cpu_to_all = proc.cpu() - cpu0
    w1 = await settle_writes(cache)
    cpu_initial = proc.cpu() - cpu0
    await asyncio.sleep(5)
    rss1 = proc.rss()
    res: dict[str, Any] = {
        "wall_s": wall, "synced_after_s": proc.events and next(
            (e["t"] - t0 for e in proc.events if e["event"] == "synced"), None),
        "cpu_to_all_s": cpu_to_all, "cpu_initial_s": cpu_initial,
        "writes": {v: w1[v] - w0[v] for v in w1}, "rss_base_mib": rss0 / 2**20, "rss_mib": rss1 / 2**20,
        "rss_per_obj_b": (rss1 - rss0) / n,
    }
    res["writes_total"] = sum(res["writes"][v] for v in WRITE_VERBS)
    if lag is not None:
        c0, m0 = proc.cpu(), time.monotonic()
        lw0 = await cache_writes(cache)
        res["lag"] = await lag_phase(src, watch, n, lag[0], lag[1], offset)
        res["lag"]["cpu_pct"] = (proc.cpu() - c0) / (time.monotonic() - m0) * 100
        lw1 = await settle_writes(cache)
        res["lag"]["cache_writes"] = {v: lw1[v] - lw0[v] for v in lw1}
        res["rss_after_lag_mib"] = proc.rss() / 2**20
    await proc.stop()
    # Purge for the next round (not counted).
    from syncer.builtin.cached_resources.naming import CACHED_OBJECTS, schema_selector

    watch.expect(0)
    await cache.request("DELETE", CACHED_OBJECTS.path(), {"labelSelector": schema_selector(CONFIGMAPS)})
    async with asyncio.timeout(300):
        await watch.reached.wait()
    print(json.dumps({"contender": name, **{k: (round(v, 4) if isinstance(v, float) else v)
                                            for k, v in res.items()}}), file=sys.stderr, flush=True)
    return res


def build_peer() -> Path:
    binary = OUT / "clientgo_cached"
    OUT.mkdir(exist_ok=True)
    subprocess.run(["go", "build", "-o", str(binary), "."], cwd=PEER_DIR, check=True)
    return binary


def med(rs: list[dict[str, Any]], path: str) -> float:
    vals = []
    for r in rs:
        x: Any = r
        for k in path.split("."):
            x = x[k]
        vals.append(float(x))
    return statistics.median(vals)


async def harness(args: argparse.Namespace) -> dict[str, Any]:
    from syncer.builtin.cached_resources.root import install_crds
    from syncer.testing import ControlPlane

    peer_bin = Path(args.peer_bin) if args.peer_bin else build_peer()
    OUT.mkdir(exist_ok=True)
    cache_cp, src_cp = ControlPlane(name="cached-bench-cache"), ControlPlane(name="cached-bench-src")
    procs: list[Proc] = []
    results: dict[str, Any] = {"args": vars(args)}
    try:
        cache_cp.start()
        src_cp.start()
        src_kc = src_cp.dir / "bench-source.kubeconfig"
        src_kc.write_bytes(src_cp.member_kubeconfig())
        async with ApiClient.from_kubeconfig(str(cache_cp.kubeconfig)) as cache, \
                ApiClient.from_kubeconfig(str(src_cp.kubeconfig)) as src:
            await install_crds(cache)
            for _ in range(300):  # until CachedObjects are served
                try:
                    await cache.request("GET", "/apis/cache.kcp.io/v1alpha1/cachedobjects", {"limit": "1"})
                    break
                except Exception:
                    await asyncio.sleep(0.1)
            import base64

            await cache.request("POST", "/api/v1/namespaces", body={"metadata": {"name": SECRETS_NS}})
            await cache.request("POST", SECRETS.path(SECRETS_NS), body={
                "metadata": {"name": CLUSTER, "labels": {"kube-syncer.io/kubeconfig": "true"}},
                "data": {"kubeconfig": base64.b64encode(src_cp.member_kubeconfig()).decode()}})
            await src.request("POST", "/api/v1/namespaces", body={"metadata": {"name": NAMESPACE}})
            results["fill_s"] = await fill_source(src, args.objects, args.small, create=True)
            print(f"source filled: {args.objects} in {results['fill_s']:.1f}s", file=sys.stderr, flush=True)
            watch = Watch(cache)
            watch.informer.start()
            await watch.informer.wait_for_sync()

            def make(name: str, tag: str) -> Proc:
                log = OUT / f"cached-{name}-{tag}.log"
                log.write_bytes(b"")
                if name == "ours":
                    argv = [sys.executable, str(Path(__file__).resolve()), "--runner", "--kubeconfig",
                            str(cache_cp.kubeconfig), "--workers", str(args.workers)]
                else:
                    argv = [str(peer_bin), "-source-kubeconfig", str(src_kc), "-cache-kubeconfig",
                            str(cache_cp.kubeconfig), "-cluster", CLUSTER, "-selector", SELECTOR, "-identity", "bench",
                            "-workers", str(args.workers)]
                p = Proc(name, argv, log)
                procs.append(p)
                return p

            contenders = ("ours", "client-go")
            small: dict[str, list[dict[str, Any]]] = {n: [] for n in contenders}
            offset = 0
            for r in range(args.rounds):
                for n in (contenders if r % 2 == 0 else contenders[::-1]):
                    small[n].append(await round_(n, make(n, f"small{r}"), cache, src, watch, args.objects,
                                                 (args.rate, args.lag_seconds) if args.lag_seconds else None, offset))
                    offset += int(args.rate * args.lag_seconds)
            results["small"] = small
            big: dict[str, list[dict[str, Any]]] = {n: [] for n in contenders}
            if args.big_rounds:
                results["resize_s"] = await fill_source(src, args.objects, args.big, create=False)
                for r in range(args.big_rounds):
                    for n in (contenders[::-1] if r % 2 == 0 else contenders):
                        big[n].append(await round_(n, make(n, f"big{r}"), cache, src, watch, args.objects, None, 0))
            results["big"] = big
            await watch.informer.stop()
            keys = ["wall_s", "writes_total", "writes.POST", "writes.PUT", "writes.GET", "cpu_to_all_s",
                    "cpu_initial_s", "rss_base_mib", "rss_mib", "rss_per_obj_b"]
            lag_keys = ["lag.p50_ms", "lag.p99_ms", "lag.max_ms", "lag.cpu_pct", "lag.seen", "lag.missing",
                        "lag.cache_writes.PUT", "rss_after_lag_mib"]
            results["medians"] = {
                phase: {n: {k: med(rs, k) for k in keys + (lag_keys if phase == "small" and args.lag_seconds else [])}
                        for n, rs in data.items() if rs}
                for phase, data in (("small", small), ("big", big))}
            return results
    finally:
        for p in procs:
            await p.stop()
        src_cp.stop()
        cache_cp.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runner", action="store_true", help="(internal) run ours as a contender")
    p.add_argument("--kubeconfig")
    p.add_argument("--objects", type=int, default=10000)
    p.add_argument("--rounds", type=int, default=2, help="rounds per contender with small bodies")
    p.add_argument("--rate", type=float, default=100.0, help="source writes per second in the lag phase")
    p.add_argument("--lag-seconds", type=float, default=30.0, help="length of the lag phase (0: skip)")
    p.add_argument("--small", type=int, default=50, help="bytes of data.x in the small objects")
    p.add_argument("--big", type=int, default=2048, help="bytes of data.x in the body-size phase")
    p.add_argument("--big-rounds", type=int, default=1, help="rounds per contender with big bodies (0: skip)")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--peer-bin", help="a built bench/clientgo_cached (default: go build it)")
    p.add_argument("--json", default=str(OUT / "cached.json"))
    args = p.parse_args()
    if args.runner:
        runner_main(args)
        return
    results = asyncio.run(harness(args))
    results["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()}
    Path(args.json).write_text(json.dumps(results, indent=1))
    print(json.dumps(results["medians"], indent=1))


if __name__ == "__main__":
    main()
