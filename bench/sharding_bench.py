"""Sharding (scale-out) costs of ours: cold start to full ownership, handover time, coordination requests at
steady state, and reconcile throughput with 1, 2 and 3 replicas (issue 15's benchmark list).

    .venv/bin/python bench/sharding_bench.py [--rounds 3] [--clusters 50] [--idle 60] [--idle-rounds 2]
        [--busy-clusters 30] [--busy-window 30] [--busy-rounds 2] [--work-ms 5] [--skip ...]

One local control plane (``syncer.testing.ControlPlane``) is both the management plane and every member cluster:
``--clusters`` Secrets (namespace ``secrets``, label ``kube-syncer.io/kubeconfig=true``) hold a kubeconfig that
points back at it with the admin token. Every replica is a real ``python -m syncer run --settings F --identity rN``
process (``.venv/bin/python``, cwd the repository), in clusters mode with ``[sharding] enabled``, namespace
``probe``, ``watch = "required"`` and the bench plugin ``bench/plugins_sharding_busy.py`` (one per-cluster
controller on the ConfigMap ``probe/tick``). Sharding timings are the production-like 15 s / 10 s / 2 s
(lease_duration / renew_deadline / retry_period) unless said otherwise; ``min_hold = 0s`` except in the one
cold-start round run with the default ``min_hold`` (30 s). Every phase uses a shard group of its own (fresh Leases).
Everything is observed from outside: each replica's ``/status`` (``sharding``) and ``/metrics``, the apiserver's
``/metrics``, and ``/proc/<pid>/stat`` for CPU.

Phases:

1. cold start (``--rounds`` rounds): the 3 processes are started together; ``/status`` of all three is polled every
   100 ms until every unit is ``running`` on exactly one replica (and owned nowhere else): "full ownership";
   "all owned" is the first poll where every unit is starting/running/failed somewhere (its Lease taken);
   "balanced" adds that every unit runs on the member all replicas assign it to, all seeing 3 members.
2. handover, same rounds, after the cold start balanced: a 4th replica is started (scale-up 3 -> 4), then (once
   balanced over 4) the oldest replica gets SIGTERM (scale-down 4 -> 3). ``/status`` is polled every 50 ms; per moved
   unit the gap is the time between the first poll where its old owner no longer runs it and the first poll where
   the new one does (+-1 poll). ``syncer_shard_handover_seconds`` (_sum/_count) is scraped from every replica before
   and after (the stopping replica's ``/metrics`` is scraped every 100 ms until it exits; its last scrape is kept).
3. steady state: 3 replicas x ``--clusters`` units, balanced, 5 s settle, then ``--idle`` seconds untouched:
   ``apiserver_request_total{resource="leases"}`` delta (by verb), minus a baseline of the apiserver alone, and each
   replica's CPU (utime+stime from /proc). retry_period 2 s and 1 s interleaved (2, 1, 2, ...).
4. throughput: ``--busy-clusters`` clusters (namespace ``secrets-busy``), the plugin burning ~``--work-ms`` of
   pure-Python CPU per reconcile and requeueing at once (``Result(requeue_after=0)``); with 1, 2, 3 replicas (order
   reversed every other round): balanced, 3 s settle, then reconciles counted over ``--busy-window`` seconds from
   each replica's ``bench_busy_reconciles_total``.

Raw results: bench/out/sharding.json (git-ignored); replica logs: bench/out/sharding-*.log.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import ctypes
import json
import os
import platform
import signal
import ssl
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import aiohttp  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from informers import ApiClient  # noqa: E402

OUT = ROOT / "bench" / "out"
PLUGIN = ROOT / "bench" / "plugins_sharding_busy.py"
LABELS = {"kube-syncer.io/kubeconfig": "true"}
OWNED = {"starting", "running", "failed"}
PYTHON = ROOT / ".venv" / "bin" / "python" if (ROOT / ".venv").exists() else Path(sys.executable)
CLK = os.sysconf("SC_CLK_TCK")


def log(msg: str, **fields: Any) -> None:
    print(json.dumps({"t": round(time.time(), 3), "msg": msg, **fields}), file=sys.stderr, flush=True)


def _pdeathsig() -> None:
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the bench


# -- replicas ----------------------------------------------------------------------------------------------------
_PORT = [19400]


def _port() -> int:
    import socket
    while True:
        _PORT[0] += 1
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", _PORT[0]))
                return _PORT[0]
            except OSError:
                continue


class Replica:
    """One ``syncer run`` process."""

    all: list["Replica"] = []

    def __init__(self, identity: str, cp: Any, tag: str, group: str, secrets_ns: str, *, retry: float = 2.0,
                 min_hold: float = 0.0, iterations: int = 0, requeue: bool = False,
                 plugin: dict[str, Any] | None = None, buckets: int | None = None) -> None:
        self.identity = identity
        self.port = _port()
        self.settings = OUT / f"sharding-{tag}-{identity}.toml"
        self.log = OUT / f"sharding-{tag}-{identity}.log"
        self.settings.write_text(f"""kubeconfig = "{cp.kubeconfig}"
plugins = ["{PLUGIN}"]
namespace = "probe"
watch = "required"
http_bind = "127.0.0.1:{self.port}"
shutdown_timeout = "10s"
entry_point_plugins = false
[clusters]
enabled = true
namespaces = ["{secrets_ns}"]
[sharding]
enabled = true
group = "{group}"
lease_duration = "15s"
renew_deadline = "10s"
retry_period = "{retry:g}s"
min_hold = "{min_hold:g}s"
{"" if buckets is None else f"buckets = {buckets}"}
[plugin_settings.plugins_sharding_busy]
""" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in {"iterations": iterations, "requeue": requeue,
                                                       **(plugin or {})}.items()))
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0.0
        self.exited: float | None = None
        self.terminated = False
        Replica.all.append(self)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.started = time.time()
        self.proc = subprocess.Popen([str(PYTHON), "-m", "syncer", "run", "--settings", str(self.settings),
                                      "--identity", self.identity], cwd=ROOT, stdin=subprocess.DEVNULL,
                                     stdout=self.log.open("wb"), stderr=subprocess.STDOUT, preexec_fn=_pdeathsig)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def cpu(self) -> float:
        """utime + stime, seconds (from /proc/<pid>/stat)."""
        assert self.proc is not None
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLK

    def terminate(self) -> None:
        self.terminated = True
        if self.alive():
            assert self.proc is not None
            self.proc.send_signal(signal.SIGTERM)

    async def wait_exit(self, timeout: float = 30.0) -> float:
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:
            if time.monotonic() > deadline:
                self.proc.kill()
                self.proc.wait()
                log("killed after timeout", replica=self.identity)
                break
            await asyncio.sleep(0.02)
        self.exited = self.exited or time.time()
        return self.exited

    async def stop(self) -> None:
        self.terminate()
        if self.proc is not None:
            await self.wait_exit()


async def stop_all(replicas: list[Replica]) -> None:
    for r in replicas:
        r.terminate()
    await asyncio.gather(*(r.wait_exit() for r in replicas if r.proc is not None))


def kill_everything() -> None:
    for r in Replica.all:
        if r.alive():
            assert r.proc is not None
            r.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 20
    for r in Replica.all:
        if r.proc is None:
            continue
        try:
            r.proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            r.proc.kill()
            r.proc.wait()


# -- observing ---------------------------------------------------------------------------------------------------
async def get_json(http: aiohttp.ClientSession, url: str) -> Any:
    try:
        async with http.get(url, timeout=aiohttp.ClientTimeout(total=3)) as resp:
            if resp.status != 200:
                return None
            return await resp.json(content_type=None)
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError):
        return None


async def get_text(http: aiohttp.ClientSession, url: str, **kw: Any) -> str | None:
    try:
        async with http.get(url, timeout=aiohttp.ClientTimeout(total=5), **kw) as resp:
            return await resp.text() if resp.status == 200 else None
    except (aiohttp.ClientError, asyncio.TimeoutError):
        return None


def samples(text: str | None, name: str) -> list[tuple[str, dict[str, str], float]]:
    if not text:
        return []
    return [(s.name, s.labels, s.value) for fam in text_string_to_metric_families(text) for s in fam.samples
            if s.name.startswith(name)]


async def shard_status(http: aiohttp.ClientSession, replicas: list[Replica]) -> dict[str, Any]:
    docs = await asyncio.gather(*(get_json(http, r.url + "/status") for r in replicas))
    return {r.identity: (d or {}).get("sharding") if d else None for r, d in zip(replicas, docs)}


class View:
    """One poll of every replica's ``/status`` sharding part."""

    def __init__(self, t: float, docs: dict[str, Any]) -> None:
        self.t, self.docs = t, docs
        self.running: dict[str, list[str]] = defaultdict(list)
        self.owned: dict[str, list[str]] = defaultdict(list)
        self.assigned: dict[str, set[str]] = defaultdict(set)
        self.units: set[str] = set()
        self.members: dict[str, int] = {}
        for ident, doc in docs.items():
            if not doc:
                continue
            self.members[ident] = len(doc["members"])
            for u in doc["units"]:
                self.units.add(u["unit"])
                if u["state"] == "running":
                    self.running[u["unit"]].append(ident)
                if u["state"] in OWNED:
                    self.owned[u["unit"]].append(ident)
                self.assigned[u["unit"]].add(u["assigned"])

    def all_owned(self, n: int) -> bool:
        return len(self.units) == n and all(self.owned.get(u) for u in self.units)

    def full(self, n: int) -> bool:
        return len(self.units) == n and all(len(self.running.get(u, ())) == 1 and self.owned[u] == self.running[u]
                                            for u in self.units)

    def balanced(self, n: int, live: list[str]) -> bool:
        if not self.full(n) or any(self.members.get(i) != len(live) for i in live):
            return False
        return all(self.running[u][0] in live and self.assigned[u] == {self.running[u][0]} for u in self.units)

    def runner(self, unit: str) -> str | None:
        r = self.running.get(unit)
        return r[0] if r and len(r) == 1 else None


async def poll_until(http: aiohttp.ClientSession, replicas: list[Replica], done: Callable[[View], bool],
                     interval: float, timeout: float, views: list[View] | None = None) -> View:
    deadline = time.monotonic() + timeout
    while True:
        t = time.time()
        v = View(t, await shard_status(http, replicas))
        if views is not None:
            views.append(v)
        if done(v):
            return v
        dead = [r.identity for r in replicas if r.proc is not None and not r.terminated and not r.alive()]
        if dead:
            raise RuntimeError(f"replica(s) {dead} exited (see bench/out/sharding-*.log)")
        if time.monotonic() > deadline:
            raise TimeoutError(f"not converged after {timeout}s: members {v.members}, "
                               f"owned {sum(1 for u in v.units if v.owned.get(u))}/{len(v.units)}, "
                               f"running {sum(1 for u in v.units if v.running.get(u))}")
        await asyncio.sleep(max(0.0, interval - (time.time() - t)))


def hist(text: str | None) -> dict[str, Any]:
    """syncer_shard_handover_seconds _sum/_count/buckets, and the handover/lost counters, of one scrape."""
    out: dict[str, Any] = {"sum": 0.0, "count": 0.0, "buckets": {}, "out": 0.0, "in": 0.0, "lost": 0.0}
    for name, labels, value in samples(text, "syncer_shard_"):
        if name == "syncer_shard_handover_seconds_sum":
            out["sum"] = value
        elif name == "syncer_shard_handover_seconds_count":
            out["count"] = value
        elif name == "syncer_shard_handover_seconds_bucket":
            out["buckets"][labels["le"]] = value
        elif name == "syncer_shard_handovers_total":
            out[labels["direction"]] = value
        elif name == "syncer_shard_units_lost_total":
            out["lost"] = value
    return out


def hist_delta(after: dict[str, Any], before: dict[str, Any]) -> dict[str, Any]:
    return {"sum": after["sum"] - before["sum"], "count": after["count"] - before["count"],
            "out": after["out"] - before["out"], "in": after["in"] - before["in"],
            "lost": after["lost"] - before["lost"],
            "buckets": {le: after["buckets"].get(le, 0) - before["buckets"].get(le, 0) for le in after["buckets"]}}


def hist_add(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    return {"sum": a["sum"] + b["sum"], "count": a["count"] + b["count"], "out": a["out"] + b["out"],
            "in": a["in"] + b["in"], "lost": a["lost"] + b["lost"],
            "buckets": {le: a["buckets"].get(le, 0) + b["buckets"].get(le, 0)
                        for le in set(a["buckets"]) | set(b["buckets"])}}


async def scrape_hists(http: aiohttp.ClientSession, replicas: list[Replica]) -> dict[str, dict[str, Any]]:
    texts = await asyncio.gather(*(get_text(http, r.url + "/metrics") for r in replicas))
    return {r.identity: hist(t) for r, t in zip(replicas, texts)}


def gaps(views: list[View], before: View, after: View, t_event: float) -> dict[str, Any]:
    """Per unit whose runner changed between ``before`` and ``after``: the time no replica ran it, as polled."""
    moved = [u for u in after.units if before.runner(u) != after.runner(u)]
    result: list[float] = []
    for u in moved:
        old, new = before.runner(u), after.runner(u)
        t_off = t_on = None
        for v in views:
            if v.t < t_event:
                continue
            if t_off is None and v.runner(u) != old:
                t_off = v.t
            if t_off is not None and v.runner(u) == new:
                t_on = v.t
                break
        if t_off is not None and t_on is not None:
            result.append(t_on - t_off)
    return {"moved": len(moved), "gaps": result}


def q(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, int(round(p * len(s) + 0.5)) - 1))] if s else float("nan")


# -- the apiserver -----------------------------------------------------------------------------------------------
class Apiserver:
    def __init__(self, cp: Any) -> None:
        self.url = cp.url + "/metrics"
        self.headers = {"Authorization": f"Bearer {cp.admin_token}"}
        self.ssl = ssl.create_default_context(cafile=str(cp.ca_file))

    async def requests(self, http: aiohttp.ClientSession) -> dict[tuple[str, str], float]:
        """apiserver_request_total summed by (resource, verb)."""
        text = await get_text(http, self.url, headers=self.headers, ssl=self.ssl)
        assert text, "cannot scrape the apiserver's /metrics"
        out: dict[tuple[str, str], float] = defaultdict(float)
        for name, labels, value in samples(text, "apiserver_request_total"):
            if name == "apiserver_request_total":
                out[labels.get("resource", ""), labels.get("verb", "")] += value
        return out


def delta(a: dict[tuple[str, str], float], b: dict[tuple[str, str], float]) -> dict[tuple[str, str], float]:
    return {k: b.get(k, 0) - a.get(k, 0) for k in set(a) | set(b) if b.get(k, 0) - a.get(k, 0)}


# -- setup -------------------------------------------------------------------------------------------------------


async def setup(api: ApiClient, cp: Any, clusters: int, busy_clusters: int) -> None:
    for ns in ("secrets", "secrets-busy", "secrets-stall", "probe"):
        await api.request("POST", "/api/v1/namespaces", body={"metadata": {"name": ns}})
    await api.request("POST", "/api/v1/namespaces/probe/configmaps", body={"metadata": {"name": "tick"},
                                                                          "data": {"k": "v"}})
    data = base64.b64encode(cp.member_kubeconfig()).decode()
    for ns, n in (("secrets", clusters), ("secrets-busy", busy_clusters), ("secrets-stall", 4)):
        await asyncio.gather(*(api.request("POST", f"/api/v1/namespaces/{ns}/secrets", body={
            "metadata": {"name": f"c{i:03d}", "labels": LABELS}, "data": {"kubeconfig": data}}) for i in range(n)))


def calibrate(work_ms: float) -> tuple[int, float]:
    """Loop iterations of ``burn`` that take ``work_ms`` of CPU here (best of 7), and that best time per 1e5."""
    from plugins_sharding_busy import burn

    n = 100_000
    best = min(_timed(burn, n) for _ in range(7))
    return max(1, int(n * work_ms / 1000 / best)), best


def _timed(fn: Callable[[int], Any], n: int) -> float:
    t0 = time.thread_time()
    fn(n)
    return time.thread_time() - t0


# -- phases ------------------------------------------------------------------------------------------------------
async def cold_and_handover(http: aiohttp.ClientSession, cp: Any, n_units: int, rnd: int, min_hold: float,
                            handover: bool) -> dict[str, Any]:
    tag = f"cold{rnd}" + ("-hold" if min_hold else "")
    group = f"cold{rnd}{'h' if min_hold else ''}"
    reps = [Replica(f"r{i}", cp, tag, group, "secrets", min_hold=min_hold) for i in range(3)]
    res: dict[str, Any] = {"round": rnd, "min_hold": min_hold}
    try:
        views: list[View] = []
        t0 = time.time()
        for r in reps:
            r.start()
        names = [r.identity for r in reps]
        await poll_until(http, reps, lambda v: len(v.units) == n_units and len(v.docs) == 3 and
                         all(v.docs.values()), 0.1, 120, views)
        res["status_up_s"] = min(v.t for v in views if all(v.docs.values())) - t0
        first_member = [v.t for v in views if any(v.docs.values())]
        res["first_status_s"] = (first_member[0] - t0) if first_member else None
        v_full = await poll_until(http, reps, lambda v: v.full(n_units), 0.1, 120, views)
        res["all_owned_s"] = next(v.t for v in views if v.all_owned(n_units)) - t0
        res["full_s"] = v_full.t - t0
        v_bal = await poll_until(http, reps, lambda v: v.balanced(n_units, names), 0.1, 120, views)
        res["balanced_s"] = v_bal.t - t0
        res["loads"] = sorted(len([u for u in v_bal.units if v_bal.runner(u) == i]) for i in names)
        cold = await scrape_hists(http, reps)
        res["cold_handovers"] = sum(h["out"] for h in cold.values())
        log("cold start", **{k: v for k, v in res.items() if k != "round"})
        if not handover:
            return res

        # scale-up 3 -> 4
        await asyncio.sleep(2)
        before_v = View(time.time(), await shard_status(http, reps))
        h0 = await scrape_hists(http, reps)
        r3 = Replica("r3", cp, tag, group, "secrets", min_hold=min_hold)
        reps.append(r3)
        names4 = names + ["r3"]
        views = []
        t_ev = time.time()
        r3.start()
        after = await poll_until(http, reps, lambda v: v.balanced(n_units, names4), 0.05, 120, views)
        joined = next((v.t for v in views if v.docs.get("r3") and v.members.get("r3") == 4), after.t)
        h1 = await scrape_hists(http, reps)
        g = gaps(views, before_v, after, t_ev)
        d = {i: hist_delta(h1[i], h0.get(i, hist(None))) for i in names4}
        tot = hist_add(hist_add(d["r0"], d["r1"]), hist_add(d["r2"], d["r3"]))
        res["up"] = {"moved": g["moved"], "gaps": g["gaps"], "start_to_balanced_s": after.t - t_ev,
                     "start_to_joined_s": joined - t_ev, "balanced_after_join_s": after.t - joined,
                     "hist": tot, "loads": sorted(len([u for u in after.units if after.runner(u) == i])
                                                  for i in names4)}
        log("scale-up", moved=g["moved"], gap_p50=statistics.median(g["gaps"]) if g["gaps"] else None,
            gap_max=max(g["gaps"], default=None), hist_mean=tot["sum"] / tot["count"] if tot["count"] else None,
            count=tot["count"], to_balanced=after.t - t_ev)

        # scale-down 4 -> 3: SIGTERM the oldest
        await asyncio.sleep(2)
        victim = reps[0]
        live = names4[1:]
        before_v = View(time.time(), await shard_status(http, reps))
        h0 = await scrape_hists(http, reps)
        last_victim: list[dict[str, Any]] = [h0[victim.identity]]
        stop_scrape = asyncio.Event()

        async def scrape_victim() -> None:
            while not stop_scrape.is_set() and victim.alive():
                text = await get_text(http, victim.url + "/metrics")
                if text:
                    last_victim.append(hist(text))
                await asyncio.sleep(0.01)

        scraper = asyncio.create_task(scrape_victim())
        views = []
        t_ev = time.time()
        victim.terminate()
        after = await poll_until(http, reps, lambda v: v.balanced(n_units, live) and
                                 not any(victim.identity in o for o in v.owned.values()), 0.05, 120, views)
        exited = await victim.wait_exit(30)
        stop_scrape.set()
        await scraper
        h1 = await scrape_hists(http, reps[1:])
        g = gaps(views, before_v, after, t_ev)
        d = {i: hist_delta(h1[i], h0[i]) for i in live}
        dv = hist_delta(last_victim[-1], h0[victim.identity])
        res["down"] = {"moved": g["moved"], "gaps": g["gaps"], "sigterm_to_balanced_s": after.t - t_ev,
                       "sigterm_to_exit_s": exited - t_ev, "victim_hist": dv,
                       "others_hist": hist_add(hist_add(d[live[0]], d[live[1]]), d[live[2]]),
                       "loads": sorted(len([u for u in after.units if after.runner(u) == i]) for i in live)}
        log("scale-down", moved=g["moved"], gap_p50=statistics.median(g["gaps"]) if g["gaps"] else None,
            gap_max=max(g["gaps"], default=None), victim_mean=dv["sum"] / dv["count"] if dv["count"] else None,
            count=dv["count"], to_balanced=after.t - t_ev, to_exit=exited - t_ev)
        return res
    finally:
        t = time.time()
        await stop_all(reps)
        res["stop_all_s"] = time.time() - t


async def steady(http: aiohttp.ClientSession, cp: Any, api_m: Apiserver, n_units: int, rnd: int, retry: float,
                 idle: float) -> dict[str, Any]:
    tag = f"idle{rnd}-{retry:g}s"
    reps = [Replica(f"r{i}", cp, tag, f"idle{rnd}", "secrets", retry=retry) for i in range(3)]
    names = [r.identity for r in reps]
    try:
        for r in reps:
            r.start()
        await poll_until(http, reps, lambda v: v.balanced(n_units, names), 0.2, 180)
        await asyncio.sleep(5)
        c0 = {r.identity: r.cpu() for r in reps}
        a0 = await api_m.requests(http)
        w0 = time.monotonic()
        await asyncio.sleep(idle)
        a1 = await api_m.requests(http)
        w1 = time.monotonic()
        c1 = {r.identity: r.cpu() for r in reps}
        v = View(time.time(), await shard_status(http, reps))
        wall = w1 - w0
        d = delta(a0, a1)
        leases = {verb: n / wall for (res, verb), n in d.items() if res == "leases"}
        other = {f"{res or '-'}:{verb}": n / wall for (res, verb), n in d.items() if res != "leases"}
        hs = await scrape_hists(http, reps)
        out = {"round": rnd, "retry": retry, "wall": wall, "leases_per_s": leases,
               "leases_total_per_s": sum(leases.values()), "other_per_s": other,
               "cpu_pct": {i: (c1[i] - c0[i]) / wall * 100 for i in names},
               "still_balanced": v.balanced(n_units, names),
               "lost": sum(h["lost"] for h in hs.values()), "expected": (n_units + 3) / retry,
               "loadavg": Path("/proc/loadavg").read_text().split()[:3]}
        log("steady", **{k: v for k, v in out.items() if k != "other_per_s"})
        return out
    finally:
        await stop_all(reps)


async def baseline(http: aiohttp.ClientSession, api_m: Apiserver, seconds: float) -> dict[str, Any]:
    a0 = await api_m.requests(http)
    w0 = time.monotonic()
    await asyncio.sleep(seconds)
    a1 = await api_m.requests(http)
    wall = time.monotonic() - w0
    d = delta(a0, a1)
    leases = sum(n for (res, _), n in d.items() if res == "leases") / wall
    return {"wall": wall, "leases_per_s": leases,
            "all_per_s": {f"{res or '-'}:{verb}": n / wall for (res, verb), n in d.items()}}


async def busy(http: aiohttp.ClientSession, cp: Any, n_units: int, rnd: int, n: int, iterations: int,
               window: float) -> dict[str, Any]:
    tag = f"busy{rnd}-{n}"
    reps = [Replica(f"r{i}", cp, tag, f"busy{rnd}x{n}", "secrets-busy", iterations=iterations, requeue=True)
            for i in range(n)]
    names = [r.identity for r in reps]
    try:
        for r in reps:
            r.start()
        await poll_until(http, reps, lambda v: v.balanced(n_units, names), 0.25, 180)
        await asyncio.sleep(3)

        async def counts() -> dict[str, dict[str, float]]:
            texts = await asyncio.gather(*(get_text(http, r.url + "/metrics") for r in reps))
            out = {}
            for r, t in zip(reps, texts):
                got = {name: value for name, _, value in samples(t, "bench_busy_")}
                out[r.identity] = {"reconciles": got.get("bench_busy_reconciles_total", 0.0),
                                   "work": got.get("bench_busy_work_seconds_total", 0.0), **hist(t)}
            return out

        k0, c0, w0 = await counts(), {r.identity: r.cpu() for r in reps}, time.monotonic()
        await asyncio.sleep(window)
        k1, c1, w1 = await counts(), {r.identity: r.cpu() for r in reps}, time.monotonic()
        v = View(time.time(), await shard_status(http, reps))
        wall = w1 - w0
        per = {i: (k1[i]["reconciles"] - k0[i]["reconciles"]) / wall for i in names}
        out = {"round": rnd, "replicas": n, "wall": wall, "per_replica_per_s": per, "total_per_s": sum(per.values()),
               "cpu_pct": {i: (c1[i] - c0[i]) / wall * 100 for i in names},
               "work_pct": {i: (k1[i]["work"] - k0[i]["work"]) / wall * 100 for i in names},
               "lost": sum(k1[i]["lost"] for i in names), "still_balanced": v.balanced(n_units, names),
               "loads": sorted(len([u for u in v.units if v.runner(u) == i]) for i in names),
               "loadavg": Path("/proc/loadavg").read_text().split()[:3]}
        log("busy", **out)
        return out
    finally:
        await stop_all(reps)


async def stall(http: aiohttp.ClientSession, cp: Any, n_units: int, stall_s: float) -> dict[str, Any]:
    """1 replica, ``n_units`` clusters reconciling every 0.5 s; its first reconcile blocks the loop ``stall_s``
    (more than renew_deadline, less than lease_duration): do the units' controllers come back afterwards?"""
    r = Replica("r0", cp, "stall", "stall", "secrets-stall",
                plugin={"requeue": True, "requeue_after": 0.5, "stall_s": stall_s})
    try:
        r.start()
        await poll_until(http, [r], lambda v: v.full(n_units), 0.2, 120)
        t_full = time.time()
        await asyncio.sleep(stall_s + 5)

        async def per_cluster() -> tuple[dict[str, float], dict[str, Any]]:
            text = await get_text(http, r.url + "/metrics")
            return ({labels["cluster"]: v for name, labels, v in samples(text, "bench_busy_cluster_reconciles_total")
                     if name == "bench_busy_cluster_reconciles_total"}, hist(text))

        k0, _ = await per_cluster()
        await asyncio.sleep(10)
        k1, h = await per_cluster()
        v = View(time.time(), await shard_status(http, [r]))
        running = sorted(u for u in v.units if v.runner(u) == "r0")
        reconciling = sorted(c for c in k1 if k1[c] > k0.get(c, 0))
        text = r.log.read_text()
        health = await get_text(http, r.url + "/healthz")
        out = {"healthz": json.loads(health) if health else None,
               "stall_s": stall_s, "units": n_units, "running_per_status": len(running),
               "reconciling_in_10s": len(reconciling), "lost_total": h["lost"],
               "parked_log_lines": text.count("leadership term ended; not starting"),
               "stopping_unit_log_lines": text.count("stopping unit"), "t_full": t_full}
        log("stall", **out)
        return out
    finally:
        await r.stop()


async def no_yield(http: aiohttp.ClientSession, cp: Any, n_units: int, iterations: int,
                   seconds: float = 40.0) -> dict[str, Any]:
    """1 replica, ``n_units`` clusters, a CPU-only reconcile that never awaits, requeued at once (``yield = false``):
    for ``seconds``, how often does ``/status`` answer (3 s timeout), and what happens to the units (log)?"""
    r = Replica("r0", cp, "noyield", "noyield", "secrets-stall",
                plugin={"iterations": iterations, "requeue": True, "yield": False})
    try:
        t0 = time.time()
        r.start()
        polls = answered = 0
        while time.time() - t0 < seconds:
            t = time.time()
            polls += 1
            answered += await get_json(http, r.url + "/status") is not None
            await asyncio.sleep(max(0.0, 0.5 - (time.time() - t)))
        stamps = []
        for line in r.log.read_text().splitlines():
            try:
                stamps.append(time.mktime(time.strptime(line[:19], "%Y-%m-%d %H:%M:%S")) + float(line[19:23]))
            except ValueError:
                continue
        text = r.log.read_text()
        out = {"units": n_units, "seconds": seconds, "status_polls": polls, "status_answered": answered,
               "max_log_gap_s": max((b - a for a, b in zip(stamps, stamps[1:])), default=None),
               "took_unit_log_lines": text.count("took unit"),
               "parked_log_lines": text.count("leadership term ended; not starting"),
               "stopping_unit_log_lines": text.count("stopping unit")}
        log("no-yield", **out)
        return out
    finally:
        await r.stop()


async def harness(args: argparse.Namespace) -> dict[str, Any]:
    from syncer.testing import ControlPlane

    OUT.mkdir(exist_ok=True)
    results: dict[str, Any] = {"args": vars(args)}
    iterations, per_1e5 = calibrate(args.work_ms)
    results["calibration"] = {"iterations": iterations, "cpu_s_per_1e5": per_1e5}
    log("calibrated", iterations=iterations, cpu_s_per_1e5=per_1e5)
    cp = ControlPlane(name="shard-bench")
    try:
        cp.start()
        async with ApiClient.from_kubeconfig(str(cp.kubeconfig)) as api, aiohttp.ClientSession() as http:
            await setup(api, cp, args.clusters, args.busy_clusters)
            api_m = Apiserver(cp)
            skip = set(args.skip)
            if "idle" not in skip:
                results["baseline"] = await baseline(http, api_m, 20)
                log("baseline", leases_per_s=results["baseline"]["leases_per_s"])
            if "cold" not in skip:
                results["cold"] = []
                for rnd in range(args.rounds):
                    results["cold"].append(await cold_and_handover(http, cp, args.clusters, rnd, 0.0, True))
                if args.hold_round:
                    results["cold_hold"] = await cold_and_handover(http, cp, args.clusters, 0, 30.0, False)
            if "idle" not in skip:
                results["steady"] = []
                retries = ([float(x) for x in args.idle_retries.split(",")] if args.idle_retries else
                           [2.0 if i % 2 == 0 else 1.0 for i in range(args.idle_rounds * 2 - 1)])
                for rnd, retry in enumerate(retries):
                    results["steady"].append(await steady(http, cp, api_m, args.clusters, rnd, retry, args.idle))
            if "stall" not in skip:
                results["stall"] = await stall(http, cp, 4, 11.0)
            if "noyield" not in skip:
                results["no_yield"] = await no_yield(http, cp, 4, iterations)
            if "busy" not in skip:
                results["busy"] = []
                for rnd in range(args.busy_rounds):
                    for n in ((1, 2, 3) if rnd % 2 == 0 else (3, 2, 1)):
                        results["busy"].append(await busy(http, cp, args.busy_clusters, rnd, n, iterations,
                                                          args.busy_window))
        return results
    finally:
        kill_everything()
        cp.stop()


def summary(r: dict[str, Any]) -> dict[str, Any]:
    s: dict[str, Any] = {}

    def mmm(xs: list[float]) -> dict[str, float]:
        return {"median": round(statistics.median(xs), 3), "min": round(min(xs), 3), "max": round(max(xs), 3),
                "n": len(xs)}

    if r.get("cold"):
        c = r["cold"]
        for k in ("first_status_s", "status_up_s", "all_owned_s", "full_s", "balanced_s", "cold_handovers",
                  "stop_all_s"):
            s[f"cold.{k}"] = mmm([x[k] for x in c])
        for phase in ("up", "down"):
            gs = [g for x in c for g in x[phase]["gaps"]]
            s[f"{phase}.gap"] = {"p50": round(statistics.median(gs), 3), "max": round(max(gs), 3), "n": len(gs)}
            s[f"{phase}.moved"] = [x[phase]["moved"] for x in c]
            hk = "hist" if phase == "up" else "victim_hist"
            hsum, hcount = sum(x[phase][hk]["sum"] for x in c), sum(x[phase][hk]["count"] for x in c)
            s[f"{phase}.hist_mean"] = round(hsum / hcount, 4) if hcount else None
            s[f"{phase}.hist_count"] = hcount
            key = "start_to_balanced_s" if phase == "up" else "sigterm_to_balanced_s"
            s[f"{phase}.{key}"] = mmm([x[phase][key] for x in c])
    if r.get("cold_hold"):
        s["cold_hold"] = {k: round(v, 3) for k, v in r["cold_hold"].items() if isinstance(v, float)}
    if r.get("steady"):
        base = r.get("baseline", {}).get("leases_per_s", 0.0)
        for retry in sorted({x["retry"] for x in r["steady"]}, reverse=True):
            xs = [x for x in r["steady"] if x["retry"] == retry]
            s[f"steady.{retry:g}s.leases_per_s"] = mmm([x["leases_total_per_s"] - base for x in xs])
            s[f"steady.{retry:g}s.cpu_pct"] = mmm([c for x in xs for c in x["cpu_pct"].values()])
    if r.get("stall"):
        s["stall"] = r["stall"]
    if r.get("no_yield"):
        s["no_yield"] = r["no_yield"]
    if r.get("busy"):
        for n in (1, 2, 3):
            xs = [x["total_per_s"] for x in r["busy"] if x["replicas"] == n]
            if xs:
                s[f"busy.{n}.per_s"] = mmm(xs)
    return s


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3, help="cold start + handover rounds")
    p.add_argument("--clusters", type=int, default=50)
    p.add_argument("--hold-round", action=argparse.BooleanOptionalAction, default=True,
                   help="one more cold start with the default min_hold (30 s)")
    p.add_argument("--idle", type=float, default=60.0, help="steady-state window, seconds")
    p.add_argument("--idle-rounds", type=int, default=2, help="rounds at retry_period 2 s (1 s: one fewer)")
    p.add_argument("--idle-retries", help="retry periods of the steady-state rounds, e.g. 2,1,2 (overrides "
                   "--idle-rounds)")
    p.add_argument("--busy-clusters", type=int, default=30)
    p.add_argument("--busy-window", type=float, default=30.0)
    p.add_argument("--busy-rounds", type=int, default=2)
    p.add_argument("--work-ms", type=float, default=5.0, help="CPU per busy reconcile")
    p.add_argument("--skip", nargs="*", default=[], choices=["cold", "idle", "busy", "stall", "noyield"])
    p.add_argument("--json", default=str(OUT / "sharding.json"))
    args = p.parse_args()
    results = asyncio.run(harness(args))
    results["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version(),
                          "platform": platform.platform(), "loadavg_end": Path("/proc/loadavg").read_text().strip()}
    results["summary"] = summary(results)
    Path(args.json).write_text(json.dumps(results, indent=1, default=str))
    print(json.dumps(results["summary"], indent=1))


if __name__ == "__main__":
    main()
