"""Informer benchmarks (issue 3): ours vs the official client's SharedInformer vs kopf vs client-go.

Usage: .venv/bin/python bench/informer_bench.py [--sizes 10000,50000] [--reps 3] [--reps-large 2] [--updates 20000] [--update-reps 2] [--rate 350]
       [--contenders ours,ours-list,official,kopf,client-go,client-go-nomf,watch-floor] [--cap 600] [--out bench/out]

``--contenders ours,ours-mutable`` compares ours with its read-only cache turned off (issue 10); ours-mutable runs
only when named.

One run starts one local control plane (etcd + kube-apiserver), creates the ConfigMaps once per size, then
runs every contender against the same namespaces, one after another, each in its own process (so RSS and CPU
are its own). The machine is small and shared, so only the ratios between contenders of the same run mean
much. Raw results go to <out>/informer-<timestamp>.json, the tables to <out>/informer-<timestamp>.md.

1. Initial sync of N ConfigMaps (~1 KiB each): wall time from informer start to "handler has every object",
   and RSS growth per object ((RSS at sync - RSS just before the start, after imports and client setup) / N).
2. Sustained updates: a writer process (4 coroutines, --rate patches/s in all) patches the objects of the
   first size's namespace --updates times; each contender reports its CPU seconds (user+sys) per 10,000
   update events delivered to a no-op handler and the write-to-handler latency p50/p99.
3. Lister reads (ours and its variants), after each sync: get of every object, get plus a few field reads, list() of the
   whole cache, of the namespace and with a label selector, orjson.dumps and deep_copy of every object.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import hashlib
import json
import os
import platform
import queue
import shutil
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from informers import ApiClient, ApiError
from syncer.testing import ControlPlane

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
PYTHON = sys.executable
GO_BINARY = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "kube-syncer" / "bench" / "clientgo-informer"

# name -> argv prefix; every runner takes the same flags (Go's flag package accepts --flag too).
CONTENDERS: dict[str, list[str]] = {
    "ours": [PYTHON, str(BENCH / "runner_ours.py")],
    # Ours with watch-list streaming turned off (paged LIST + WATCH): not a contender, a what-if.
    "ours-list": [PYTHON, str(BENCH / "runner_ours.py"), "--list-watch"],
    # Ours with the read-only cache turned off (KUBE_SYNCER_READONLY_CACHE=0): the cost of freezing objects.
    "ours-mutable": [PYTHON, str(BENCH / "runner_ours.py"), "--mutable-cache"],
    "official": [PYTHON, str(BENCH / "runner_official.py")],
    "kopf": [PYTHON, str(BENCH / "runner_kopf.py")],
    "client-go": [str(GO_BINARY)],
    # client-go with a transform dropping managedFields, i.e. caching what ours caches by default.
    "client-go-nomf": [str(GO_BINARY), "--drop-managed-fields"],
    # Updates only: a bare ApiClient.stream watch, the transport floor under "ours" (see runner_floor.py).
    "watch-floor": [PYTHON, str(BENCH / "runner_floor.py")],
}
UPDATES_ONLY = {"watch-floor"}
SYNC_ONLY = {"ours-list"}  # after the sync it runs the very same watch code as "ours"
OPT_IN = {"ours-mutable"}  # not in the default --contenders
LISTER_READS = {"ours", "ours-list", "ours-mutable"}  # runners that time lister reads after a sync
REFERENCE = "client-go"  # the targets are stated against client-go's defaults


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# -- setup -------------------------------------------------------------------------------------------------
# Python subprocesses import the informers package from a snapshot taken when the run starts (see
# snapshot_informers): other people edit informers/ while benchmarks run, and one run must measure one version.
CHILD_ENV: dict[str, str] = dict(os.environ)


def _tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for f in sorted(root.rglob("*.py")):
        h.update(str(f.relative_to(root)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def _git(*args: str) -> str:
    # Read-only git queries, to record which version was measured.
    r = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True)
    return r.stdout.strip() if r.returncode == 0 else f"(git {' '.join(args)} failed)"


def snapshot_informers(dest: Path) -> dict[str, Any]:
    """Copy informers/ to dest and make every Python runner import it from there (PYTHONPATH beats the editable
    install's finder); return what was snapshotted."""
    shutil.copytree(REPO / "informers", dest / "informers", ignore=shutil.ignore_patterns("__pycache__"))
    CHILD_ENV["PYTHONPATH"] = os.pathsep.join(filter(None, [str(dest), os.environ.get("PYTHONPATH")]))
    return {"path": str(dest), "commit": _git("rev-parse", "--short", "HEAD"),
            "uncommitted_changes": _git("status", "--porcelain", "--", "informers") or None,
            "digest": _tree_digest(dest / "informers")}


def build_clientgo() -> None:
    """Build the Go runner into the cache (Go's build cache makes this a no-op when nothing changed)."""
    GO_BINARY.parent.mkdir(parents=True, exist_ok=True)
    if shutil.which("go") is None:
        raise SystemExit("go is not on PATH: needed to build bench/clientgo")
    subprocess.run(["go", "build", "-o", str(GO_BINARY), "."], cwd=BENCH / "clientgo", check=True)


def configmap(i: int) -> dict[str, Any]:
    # Four 200-character values: with the server's metadata the stored object is ~1 KiB of JSON
    # (plus managedFields). Hex digests keep values distinct per object, like real data.
    seed = hashlib.sha256(str(i).encode()).hexdigest()
    data = {f"key{k}": (seed * 4)[k * 7: k * 7 + 200] for k in range(4)}
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": f"cm-{i:05d}", "labels": {"app": "informer-bench", "shard": str(i % 16)}},
        "data": data,
    }


async def create_objects(kubeconfig: str, namespace: str, n: int, concurrency: int = 32) -> float:
    """Create the namespace and n ConfigMaps with our client, ``concurrency`` requests in flight."""
    client = ApiClient.from_kubeconfig(kubeconfig)
    try:
        await client.request("POST", "/api/v1/namespaces", body={"metadata": {"name": namespace}})
        path = f"/api/v1/namespaces/{namespace}/configmaps"
        next_i = 0
        start = time.monotonic()

        async def worker() -> None:
            nonlocal next_i
            while next_i < n:
                i = next_i
                next_i += 1
                for attempt in range(5):
                    try:
                        await client.request("POST", path, body=configmap(i))
                        break
                    except ApiError as e:
                        if e.status == 409:
                            break
                        if attempt == 4:
                            raise
                        await asyncio.sleep(0.5 * (attempt + 1))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.monotonic() - start
        sample = await client.request("GET", f"{path}/cm-00000")
        size = len(json.dumps(sample, separators=(",", ":")))
        sample["metadata"].pop("managedFields", None)
        size_nomf = len(json.dumps(sample, separators=(",", ":")))
        log(f"created {n} ConfigMaps in {namespace} in {elapsed:.1f}s ({n / elapsed:.0f}/s); "
            f"one object is {size} bytes of JSON ({size_nomf} without managedFields)")
        return elapsed
    finally:
        await client.close()


# -- runner processes --------------------------------------------------------------------------------------
class Runner:
    """One contender process; reads its JSON lines on a thread so the driver can wait with timeouts."""

    def __init__(self, name: str, argv: list[str], log_path: Path) -> None:
        self.name = name
        self._stderr = open(log_path, "w")
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                                     text=True, cwd=REPO, env=CHILD_ENV)
        self.lines: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.notes: list[dict[str, Any]] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self.lines.put(json.loads(line))
            except json.JSONDecodeError:
                self.lines.put({"event": "junk", "line": line.rstrip()})
        self.lines.put(None)

    def expect(self, event: str, timeout: float) -> dict[str, Any] | None:
        """The next line with this event; None on timeout or if the process ended first."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                msg = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                return None
            if msg is None:
                return None
            if msg["event"] == event:
                return msg
            self.notes.append(msg)
            if msg["event"] == "error":
                return None

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def finish(self, timeout: float = 60.0) -> None:
        """Let the process exit (collecting trailing lines such as "shutdown"), kill it if it does not."""
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.notes.append({"event": "note", "note": f"killed after {timeout:.0f}s at exit"})
            self.proc.kill()
            self.proc.wait()
        while True:
            try:
                msg = self.lines.get(timeout=1)
            except queue.Empty:
                break
            if msg is None:
                break
            self.notes.append(msg)
        self._stderr.close()


def apiserver_cpu(cp: ControlPlane) -> float:
    """CPU seconds used so far by the apiserver and etcd together (the server side of each phase)."""
    total = 0.0
    for pid in cp.pids:
        t = psutil.Process(pid).cpu_times()
        total += t.user + t.system
    return total


def run_sync(cp: ControlPlane, name: str, namespace: str, n: int, cap: float, logs: Path) -> dict[str, Any]:
    argv = CONTENDERS[name] + ["--kubeconfig", str(cp.kubeconfig), "--namespace", namespace, "--expect", str(n),
                               "--timeout", str(cap)]
    r = Runner(name, argv, logs / f"sync-{n}-{name}-{time.strftime('%H%M%S')}.log")
    res: dict[str, Any] = {"contender": name, "n": n}
    base = r.expect("baseline", 120)
    if base is None:
        r.proc.kill()
        r.finish()
        return {**res, "error": "no baseline", "notes": r.notes}
    server0 = apiserver_cpu(cp)
    synced = r.expect("synced", cap + 60)
    server1 = apiserver_cpu(cp)
    if synced is None or not synced.get("ok"):
        r.proc.kill()
        r.finish()
        return {**res, "capped": True, "cap": cap, "synced": synced, "notes": r.notes}
    reads = r.expect("reads", 120) if name in LISTER_READS else None
    r.finish()
    return {
        **res, "wall": synced["wall"], "objects": synced["objects"], "adds": synced["adds"],
        "rss_base": base["rss"], "rss_synced": synced["rss"], "rss_settled": synced["rss_settled"],
        "maxrss": synced["maxrss"],
        "rss_per_obj": (synced["rss"] - base["rss"]) / n,
        "rss_settled_per_obj": (synced["rss_settled"] - base["rss"]) / n,
        "cpu_sync": synced["cpu"] - base["cpu"], "server_cpu": server1 - server0,
        "watch_list": synced.get("watch_list"), "module": synced.get("module"), "reads": reads, "notes": r.notes,
    }


def run_updates(cp: ControlPlane, name: str, namespace: str, n: int, updates: int, rate: float, cap: float,
                logs: Path) -> dict[str, Any]:
    argv = CONTENDERS[name] + ["--kubeconfig", str(cp.kubeconfig), "--namespace", namespace, "--expect", str(n),
                               "--mode", "updates", "--updates", str(updates), "--timeout", str(cap)]
    r = Runner(name, argv, logs / f"updates-{name}-{time.strftime('%H%M%S')}.log")
    res: dict[str, Any] = {"contender": name, "n": n, "updates": updates}
    synced = r.expect("synced", cap + 120)
    if synced is None or not synced.get("ok"):
        r.proc.kill()
        r.finish()
        return {**res, "error": "did not sync", "notes": r.notes}
    r.send("go")
    if r.expect("started", 30) is None:
        r.proc.kill()
        r.finish()
        return {**res, "error": "did not start", "notes": r.notes}
    server0 = apiserver_cpu(cp)
    w = subprocess.run(
        [PYTHON, str(BENCH / "writer.py"), "--kubeconfig", str(cp.kubeconfig), "--namespace", namespace,
         "--objects", str(n), "--updates", str(updates), "--writers", "4", "--rate", str(rate)],
        capture_output=True, text=True, cwd=REPO, timeout=cap, env=CHILD_ENV,
    )
    writer = json.loads(w.stdout.strip().splitlines()[-1]) if w.returncode == 0 else {"error": w.stderr[-2000:]}
    done = r.expect("done", cap + 60)
    server1 = apiserver_cpu(cp)
    if done is None:
        r.proc.kill()
        r.finish()
        return {**res, "error": "no result", "writer": writer, "notes": r.notes}
    r.finish()
    events = done["events"]
    return {
        **res, "writer": writer, "events": events, "timed_out": done["timed_out"], "cpu": done["cpu"],
        "cpu_per_10k": done["cpu"] / events * 10_000 if events else None, "elapsed": done["elapsed"],
        "lat_p50": done["lat_p50"], "lat_p99": done["lat_p99"], "lat_max": done["lat_max"],
        "server_cpu": server1 - server0, "notes": r.notes,
    }


# -- report ------------------------------------------------------------------------------------------------
def median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def fmt(v: float | None, spec: str) -> str:
    return "n/a" if v is None else format(v, spec)


READS_COLUMNS = [("get_us", ".3f"), ("get_read_us", ".3f"), ("dumps_us", ".2f"), ("deep_copy_us", ".2f"),
                 ("list_ms", ".2f"), ("list_ns_ms", ".2f"), ("list_selector_ms", ".2f")]


def read_only_cost(sizes: list[int], sync_med: dict[tuple[int, str], dict[str, float | None]],
                   reads_med: dict[tuple[int, str], dict[str, float | None]],
                   upd: dict[str, dict[str, float | None]]) -> str:
    """The table of issue 10: ours (read-only cache) against ours-mutable (the same code with it turned off)."""
    rows = ["\n#### Read-only cache: ours / ours-mutable (budget: at most 1.10 for sync, CPU/event and memory)\n",
            "| measure | ours | ours-mutable | ratio |", "|---|---:|---:|---:|"]

    def row(label: str, a: float | None, b: float | None, spec: str) -> None:
        ratio = fmt(a / b if a is not None and b else None, ".3f")
        rows.append(f"| {label} | {fmt(a, spec)} | {fmt(b, spec)} | {ratio} |")

    for n in sizes:
        ours, mut = sync_med.get((n, "ours"), {}), sync_med.get((n, "ours-mutable"), {})
        row(f"{n:,}: sync wall s", ours.get("wall"), mut.get("wall"), ".3f")
        row(f"{n:,}: sync client CPU s", ours.get("cpu_sync"), mut.get("cpu_sync"), ".3f")
        row(f"{n:,}: RSS growth B/object", ours.get("rss_per_obj"), mut.get("rss_per_obj"), ",.0f")
        row(f"{n:,}: peak RSS MiB", ours.get("maxrss") and ours["maxrss"] / 2**20,
            mut.get("maxrss") and mut["maxrss"] / 2**20, ",.1f")
        r_ours, r_mut = reads_med.get((n, "ours"), {}), reads_med.get((n, "ours-mutable"), {})
        for key, label in (("get_us", "lister get µs"), ("get_read_us", "lister get + 3 reads µs"),
                           ("list_ms", "lister list() ms"), ("dumps_us", "orjson.dumps µs/object")):
            row(f"{n:,}: {label}", r_ours.get(key), r_mut.get(key), ".3f")
    if upd:
        u_ours, u_mut = upd.get("ours", {}), upd.get("ours-mutable", {})
        row("updates: CPU s / 10k events", u_ours.get("cpu_per_10k"), u_mut.get("cpu_per_10k"), ".3f")
        row("updates: latency p50 ms", u_ours.get("lat_p50") and u_ours["lat_p50"] * 1e3,
            u_mut.get("lat_p50") and u_mut["lat_p50"] * 1e3, ".2f")
    return "\n".join(rows)


def summarize(results: dict[str, Any], contenders: list[str]) -> str:
    out: list[str] = []
    snap = results["informers"]
    out.append(f"informers/ measured: commit {snap['commit']}, tree digest {snap['digest']}"
               f"{' (with uncommitted changes)' if snap['uncommitted_changes'] else ''}; "
               f"run took {results['total_seconds'] / 60:.1f} min")
    sizes = sorted({r["n"] for r in results["sync"]})
    sync_med: dict[tuple[int, str], dict[str, float | None]] = {}
    for n in sizes:
        out.append(f"\n#### Initial sync, {n:,} ConfigMaps (median of {results['args']['reps'] if n == sizes[0] else results['args']['reps_large']} run(s))\n")
        out.append("| contender | wall s | RSS growth B/object | same after gc B/object | peak RSS MiB | client CPU s | apiserver+etcd CPU s | runs |")
        out.append("|---|---:|---:|---:|---:|---:|---:|---|")
        for name in contenders:
            if name in UPDATES_ONLY:
                continue
            runs = [r for r in results["sync"] if r["n"] == n and r["contender"] == name]
            if not runs:
                out.append(f"| {name} | not run at this size | | | | | | |")
                continue
            ok = [r for r in runs if "wall" in r]
            med = {k: median([r[k] for r in ok]) for k in ("wall", "rss_per_obj", "rss_settled_per_obj", "maxrss",
                                                           "cpu_sync", "server_cpu")}
            sync_med[(n, name)] = med
            capped = [r for r in runs if r.get("capped") or r.get("error")]
            runs_txt = ", ".join(f"{r['wall']:.2f}" for r in ok) or "-"
            if capped:
                runs_txt += f"; {len(capped)} capped/failed (cap {results['args']['cap']:.0f}s)"
            out.append(f"| {name} | {fmt(med['wall'], '.2f')} | {fmt(med['rss_per_obj'], ',.0f')} | "
                       f"{fmt(med['rss_settled_per_obj'], ',.0f')} | "
                       f"{fmt(med['maxrss'] and med['maxrss'] / 2**20, ',.0f')} | {fmt(med['cpu_sync'], '.2f')} | "
                       f"{fmt(med['server_cpu'], '.2f')} | {runs_txt} |")
    reads_med: dict[tuple[int, str], dict[str, float | None]] = {}
    for n in sizes:
        rows = []
        for name in contenders:
            runs = [r["reads"] for r in results["sync"] if r["n"] == n and r["contender"] == name and r.get("reads")]
            if runs:
                med = reads_med[(n, name)] = {k: median([r[k] for r in runs]) for k, _ in READS_COLUMNS}
                frozen = {r["read_only"] for r in runs}
                rows.append(f"| {name} | {'yes' if frozen == {True} else 'no' if frozen == {False} else 'mixed'} | "
                            + " | ".join(fmt(med[k], spec) for k, spec in READS_COLUMNS) + " |")
        if rows:
            out.append(f"\n#### Lister reads after the sync, {n:,} objects in the cache "
                       "(median of the runs' best of 5)\n")
            out.append("| contender | read-only | get µs | get + 3 reads µs | orjson.dumps µs/object "
                       "| deep_copy µs/object | list() ms | list(namespace) ms | list(namespace, selector) ms |")
            out.append("|---|---|---:|---:|---:|---:|---:|---:|---:|")
            out.extend(rows)
    upd: dict[str, dict[str, float | None]] = {}
    if results["updates"]:
        a = results["args"]
        out.append(f"\n#### Sustained updates: {a['updates']:,} patches at {a['rate']:.0f}/s by 4 writers on "
                   f"{sizes[0]:,} ConfigMaps (median of {a['update_reps']} run(s))\n")
        out.append("| contender | events seen | client CPU s | CPU s / 10k events | latency p50 ms | p99 ms | max ms | "
                   "writer rate /s | apiserver+etcd CPU s | CPU s / 10k, each run |")
        out.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|")
        for name in contenders:
            runs = [r for r in results["updates"] if r["contender"] == name]
            if not runs:
                continue
            ok = [r for r in runs if "events" in r]
            failed = [r.get("error") for r in runs if "events" not in r]
            if not ok:
                out.append(f"| {name} | failed: {'; '.join(map(str, failed))} | | | | | | | | |")
                continue
            med = {k: median([r[k] for r in ok if r[k] is not None]) for k in
                   ("events", "cpu", "cpu_per_10k", "lat_p50", "lat_p99", "lat_max", "server_cpu")}
            med["rate"] = median([r["writer"]["rate"] for r in ok if "rate" in r["writer"]])
            upd[name] = med
            seen = f"{med['events']:,.0f}" + (" (a run timed out)" if any(r["timed_out"] for r in ok) else "")
            each = ", ".join(fmt(r["cpu_per_10k"], ".2f") for r in ok) + (f"; {len(failed)} failed" if failed else "")
            ms = lambda v: fmt(v and v * 1e3, ".1f")  # noqa: E731
            out.append(f"| {name} | {seen} | {fmt(med['cpu'], '.2f')} | {fmt(med['cpu_per_10k'], '.2f')} | "
                       f"{ms(med['lat_p50'])} | {ms(med['lat_p99'])} | {ms(med['lat_max'])} | "
                       f"{fmt(med['rate'], '.0f')} | {fmt(med['server_cpu'], '.2f')} | {each} |")

    if "ours" in contenders and "ours-mutable" in contenders:
        out.append(read_only_cost(sizes, sync_med, reads_med, upd))
    if not {REFERENCE, "official", "kopf"} & set(contenders):
        return "\n".join(out)
    # Targets, all stated for "ours" against the others.
    out.append("\n#### Targets\n")
    out.append("| target | measured | met? |")
    out.append("|---|---|---|")

    def ratio_line(label: str, mine: float | None, other: float | None, limit: float, better_low: bool,
                   how: str) -> None:
        if mine is None or other is None or other == 0 or mine == 0:
            out.append(f"| {label} | n/a | n/a |")
            return
        ratio = mine / other if better_low else other / mine
        met = ratio <= limit if better_low else ratio >= limit
        out.append(f"| {label} | {how.format(ratio=ratio)} | {'yes' if met else 'NO'} |")

    for n in sizes:
        ours = sync_med.get((n, "ours"), {})
        ref = sync_med.get((n, REFERENCE), {})
        ratio_line(f"{n:,}: sync wall <= 1.5x client-go", ours.get("wall"), ref.get("wall"), 1.5, True,
                   "{ratio:.2f}x client-go")
        for other in ("official", "kopf"):
            o = sync_med.get((n, other), {})
            capped = o.get("wall") is None and any(r["n"] == n and r["contender"] == other and r.get("capped")
                                                   for r in results["sync"])
            if capped and ours.get("wall"):
                ratio = results["args"]["cap"] / ours["wall"]
                out.append(f"| {n:,}: sync >= 3x faster than {other} | > {ratio:.1f}x ({other} capped at "
                           f"{results['args']['cap']:.0f}s) | yes |")
            else:
                ratio_line(f"{n:,}: sync >= 3x faster than {other}", ours.get("wall"), o.get("wall"), 3.0, False,
                           "{ratio:.1f}x faster")
        ratio_line(f"{n:,}: RSS/object <= 1.5x client-go", ours.get("rss_per_obj"), ref.get("rss_per_obj"), 1.5,
                   True, "{ratio:.2f}x client-go")
        # Not a target: the same comparison against client-go caching what ours caches (no managedFields).
        nomf = sync_med.get((n, "client-go-nomf"), {})
        ratio_line(f"{n:,}: (info) RSS/object <= 1.5x client-go-nomf", ours.get("rss_per_obj"),
                   nomf.get("rss_per_obj"), 1.5, True, "{ratio:.2f}x client-go-nomf")
    if upd:
        mine = upd.get("ours", {}).get("cpu_per_10k")
        ratio_line("updates: CPU/event <= 2x client-go", mine, upd.get(REFERENCE, {}).get("cpu_per_10k"), 2.0, True,
                   "{ratio:.2f}x client-go")
        for other in ("official", "kopf"):
            ratio_line(f"updates: CPU/event <= 1/3 of {other}", mine, upd.get(other, {}).get("cpu_per_10k"),
                       1 / 3, True, "{ratio:.2f}x " + other)
    return "\n".join(out)


# -- main --------------------------------------------------------------------------------------------------
def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="10000,50000")
    p.add_argument("--reps", type=int, default=3, help="sync runs per contender for the first size")
    p.add_argument("--reps-large", type=int, default=2, help="sync runs per contender for the other sizes")
    p.add_argument("--large-contenders", default="", help="contenders for sizes after the first (default: all)")
    p.add_argument("--updates", type=int, default=20000)
    p.add_argument("--update-reps", type=int, default=2, help="updates runs per contender")
    # ~380/s is all this apiserver sustains on 2 cores; 350/s leaves every contender the same offered load.
    p.add_argument("--rate", type=float, default=350.0, help="patches per second in all, 0 = unthrottled")
    p.add_argument("--contenders", default=",".join(c for c in CONTENDERS if c not in OPT_IN))
    p.add_argument("--cap", type=float, default=600.0, help="seconds before a contender's phase is given up")
    p.add_argument("--out", default=str(BENCH / "out"))
    args = p.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    contenders = [c for c in args.contenders.split(",") if c]
    large = [c for c in args.large_contenders.split(",") if c] or contenders
    for c in contenders + large:
        if c not in CONTENDERS:
            raise SystemExit(f"unknown contender {c!r} (have {', '.join(CONTENDERS)})")
    out = Path(args.out)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    logs = out / f"logs-{stamp}"
    logs.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    snapshot = snapshot_informers(out / f"snapshot-{stamp}")
    log(f"measuring informers/ as of {snapshot['commit']} (digest {snapshot['digest']}"
        f"{', with uncommitted changes' if snapshot['uncommitted_changes'] else ''}), copied to {snapshot['path']}")

    if any(c.startswith("client-go") for c in contenders):
        log("building the client-go runner")
        build_clientgo()
    log("starting the control plane")
    cp = ControlPlane().start()  # main thread: its processes die with this thread
    results: dict[str, Any] = {
        "args": vars(args), "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
                    "load_at_start": os.getloadavg()},
        "create": {}, "sync": [], "updates": [], "informers": snapshot,
    }
    try:
        for n in sizes:
            ns = f"bench-{n}"
            results["create"][n] = asyncio.run(create_objects(str(cp.kubeconfig), ns, n))
            reps = args.reps if n == sizes[0] else args.reps_large
            who = [c for c in (contenders if n == sizes[0] else large) if c not in UPDATES_ONLY]
            for rep in range(reps):
                # Rotate the order each repetition so no contender always runs right after another one.
                order = who[rep % len(who):] + who[:rep % len(who)]
                for name in order:
                    r = run_sync(cp, name, ns, n, args.cap, logs)
                    results["sync"].append(r)
                    if "wall" in r:
                        log(f"sync {n:>6} {name:15} {r['wall']:7.2f}s  {r['rss_per_obj']:8,.0f} B/obj  "
                            f"cpu {r['cpu_sync']:6.2f}s  server cpu {r['server_cpu']:6.2f}s")
                    else:
                        log(f"sync {n:>6} {name:15} FAILED/CAPPED: {r.get('error') or r.get('synced')}")
        if args.updates:
            n = sizes[0]
            who = [c for c in contenders if c not in SYNC_ONLY]
            for rep in range(args.update_reps):
                order = who[rep % len(who):] + who[:rep % len(who)]
                for name in order:
                    r = run_updates(cp, name, f"bench-{n}", n, args.updates, args.rate, args.cap, logs)
                    results["updates"].append(r)
                    if "events" in r:
                        log(f"updates {name:15} {r['events']} events  cpu {r['cpu']:.2f}s  "
                            f"({fmt(r['cpu_per_10k'], '.2f')} s/10k)  p50 {r['lat_p50'] * 1e3:.1f} ms  "
                            f"p99 {r['lat_p99'] * 1e3:.1f} ms  writer {r['writer'].get('rate', 0):.0f}/s")
                    else:
                        log(f"updates {name:15} FAILED: {r.get('error')}")
    finally:
        results["total_seconds"] = time.monotonic() - started
        live = _tree_digest(REPO / "informers")
        if live != snapshot["digest"]:
            results["informers"]["changed_during_run"] = f"live tree now {_git('rev-parse', '--short', 'HEAD')}"
            log("note: informers/ changed in the work tree during the run; the snapshot was measured")
        results["machine"]["load_at_end"] = os.getloadavg()
        (out / f"informer-{stamp}.json").write_text(json.dumps(results, indent=1, default=str))
        cp.stop()
    table = summarize(results, contenders)
    (out / f"informer-{stamp}.md").write_text(table + "\n")
    print(table)
    log(f"total {results['total_seconds'] / 60:.1f} min; raw results in {out / f'informer-{stamp}.json'}")


if __name__ == "__main__":
    main()
