"""What every Python runner of informer_bench.py shares: arguments, the stdout line protocol, RSS/CPU probes.

A runner is one contender in its own process. It prints JSON lines on stdout (the Go runner prints the same):

    {"event": "baseline", "rss": ..., "cpu": ...}   imports and client set up, informer not started yet
    {"event": "synced", "wall": ..., "rss": ..., ...} the handler has been given every object
    {"event": "started"}                              --mode updates: after reading "go" on stdin
    {"event": "done", "events": ..., "cpu": ..., "lat_p50": ...}  --mode updates: after --updates events

RSS is VmRSS from /proc (what the Go runner reads too); CPU is getrusage(RUSAGE_SELF), i.e. all threads.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import resource
import sys
import time
from typing import Any, Callable


def parse_args(description: str, extra: Callable[[argparse.ArgumentParser], None] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description)
    if extra is not None:
        extra(p)
    p.add_argument("--kubeconfig", required=True)
    p.add_argument("--namespace", required=True)
    p.add_argument("--mode", choices=("sync", "updates"), default="sync")
    p.add_argument("--expect", type=int, required=True, help="objects in the namespace")
    p.add_argument("--updates", type=int, default=0, help="update events to wait for in --mode updates")
    p.add_argument("--timeout", type=float, default=600.0, help="give up on a phase after this many seconds")
    return p.parse_args()


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1]) * 1024
    return -1


def rss_bytes() -> int:
    return _status_kib("VmRSS:")


def max_rss_bytes() -> int:
    # VmHWM, not getrusage's ru_maxrss: the latter keeps the parent's RSS at fork time across exec.
    return _status_kib("VmHWM:")


def cpu_seconds() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def emit(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def baseline() -> dict[str, float]:
    """Collect start-up garbage, then report and return the baseline RSS/CPU."""
    gc.collect()
    b = {"rss": rss_bytes(), "cpu": cpu_seconds(), "t": time.monotonic()}
    emit("baseline", rss=b["rss"], cpu=b["cpu"])
    return b


def synced(base: dict[str, float], objects: int, adds: int, expect: int, ok: bool = True, **extra: Any) -> None:
    """Report the end of the initial sync: wall time since the baseline, RSS now and after a full collection."""
    wall = time.monotonic() - base["t"]
    rss, cpu = rss_bytes(), cpu_seconds()
    gc.collect()
    emit("synced", ok=ok, wall=wall, rss=rss, cpu=cpu, objects=objects, adds=adds, expect=expect,
         rss_settled=rss_bytes(), maxrss=max_rss_bytes(), **extra)


def percentile(sorted_values: list[float], p: float) -> float:
    # Same nearest-rank-below rule as the Go runner, so the figures are comparable.
    if not sorted_values:
        return -1.0
    return sorted_values[int(p * (len(sorted_values) - 1))]


def wait_for_go() -> float:
    """Block until the driver writes "go"; return the CPU counter at that moment."""
    line = sys.stdin.readline().strip()
    if line != "go":
        emit("error", error=f"expected 'go' on stdin, got {line!r}")
        sys.exit(1)
    cpu = cpu_seconds()
    emit("started")
    return cpu


def done(cpu0: float, t0: float, latencies: list[float], timed_out: bool) -> None:
    cpu = cpu_seconds() - cpu0
    lat = sorted(latencies)
    emit("done", timed_out=timed_out, events=len(latencies), cpu=cpu, elapsed=time.monotonic() - t0,
         lat_p50=percentile(lat, 0.50), lat_p99=percentile(lat, 0.99), lat_max=percentile(lat, 1.0),
         rss=rss_bytes())


async def measure_updates(all_updates: asyncio.Event, latencies: list[float], timeout: float) -> None:
    """--mode updates: wait for "go" (off the loop, so watching goes on), then for every update; report."""
    cpu0 = await asyncio.to_thread(wait_for_go)
    t0 = time.monotonic()
    try:
        await asyncio.wait_for(all_updates.wait(), timeout)
        timed_out = False
    except TimeoutError:
        timed_out = True
    done(cpu0, t0, latencies, timed_out)


def latency_of(data: dict[str, str] | None) -> float | None:
    """Seconds since the writer stamped the object (``data.ts`` = its time.time()), or None if unstamped."""
    if not data:
        return None
    ts = data.get("ts")
    return None if ts is None else time.time() - float(ts)
