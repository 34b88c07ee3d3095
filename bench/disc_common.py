"""Shared by discovery_bench.py, controller_bench.py and sidecar_bench.py.

- ``Lines``: a subprocess that prints one JSON object per line on stdout, read on the event loop; callers wait
  for a line matching a predicate (``await lines.wait(lambda m: ...)``).
- ``Stamper``: the helper process ``disc_stamp.py``, which watches CRDs and reports (with ``time.monotonic()``,
  CLOCK_MONOTONIC, which every process on the machine shares) the moment a CRD turns Established, and
  optionally creates one object of it right then. It runs in its own process so that the time stamp is never
  delayed by the event loop being measured.
- statistics (nearest-rank percentiles), process probes (RSS, CPU, TCP connections) and environment notes.
"""

from __future__ import annotations

import asyncio
import ctypes
import datetime
import gc
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import psutil

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
PY = sys.executable
for p in (str(ROOT), str(BENCH)):
    if p not in sys.path:
        sys.path.insert(0, p)

CRD_PATH = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
PLURAL, KIND, OBJ_NAME, OBJ_NS = "things", "Thing", "probe", "default"


# -- statistics ------------------------------------------------------------------------------------------
def pct(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); with 50 samples p99 is the largest one."""
    if not values:
        return math.nan
    s = sorted(values)
    k = max(1, math.ceil(q / 100 * len(s)))
    return s[k - 1]


def summary_ms(values_s: Sequence[float]) -> dict[str, Any]:
    ms = [v * 1000 for v in values_s]
    if not ms:
        return {"n": 0}
    return {"n": len(ms), "min": min(ms), "p50": pct(ms, 50), "p90": pct(ms, 90), "p99": pct(ms, 99),
            "max": max(ms), "mean": sum(ms) / len(ms)}


def fmt_ms(x: float | None) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.0f}"


# -- process probes --------------------------------------------------------------------------------------
def rss_bytes(pid: int | None = None) -> int:
    return psutil.Process(pid or os.getpid()).memory_info().rss


def trim_heap() -> None:
    """gc + glibc malloc_trim, so freed memory is returned before an RSS reading."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass


def cpu_seconds(pid: int | None = None) -> float:
    t = psutil.Process(pid or os.getpid()).cpu_times()
    return t.user + t.system


def tcp_connections_to(port: int, pid: int | None = None) -> dict[str, int]:
    conns = psutil.Process(pid or os.getpid()).net_connections(kind="tcp")
    to = [c for c in conns if c.raddr and c.raddr.port == port]
    established = [c for c in to if c.status == psutil.CONN_ESTABLISHED]
    return {"to_apiserver": len(to), "established": len(established), "all_tcp": len(conns)}


# -- environment -----------------------------------------------------------------------------------------
def environment() -> dict[str, Any]:
    cpu_model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import kopf  # noqa: PLC0415

    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "cpus": os.cpu_count(), "cpu_model": cpu_model, "python": platform.python_version(),
        "kopf": getattr(kopf, "__version__", "?"), "load_avg_at_start": os.getloadavg(),
    }


def other_benchmark_running() -> bool:
    out = subprocess.run(["pgrep", "-f", "informer_bench.py"], capture_output=True, text=True).stdout.split()
    return any(int(p) != os.getpid() for p in out)


def wait_for_quiet_machine(max_wait: float, poll: float = 30.0) -> str:
    """Wait (up to ``max_wait`` s) until informer_bench.py is not running; return a note for the results."""
    started = time.monotonic()
    while other_benchmark_running():
        if time.monotonic() - started >= max_wait:
            return f"informer_bench.py was STILL RUNNING after waiting {max_wait:.0f}s: measured anyway, alongside it"
        print(f"[wait] informer_bench.py is running; checking again in {poll:.0f}s", file=sys.stderr, flush=True)
        time.sleep(poll)
    waited = time.monotonic() - started
    return f"informer_bench.py not running at the start (waited {waited:.0f}s for it)"


def note_concurrent(note: str) -> str:
    """Append a warning if the other benchmark is running now (checked at the end of a run)."""
    return note + ("; informer_bench.py WAS running at the end of this run" if other_benchmark_running() else "")


# -- CRDs ------------------------------------------------------------------------------------------------
def crd(group: str) -> dict[str, Any]:
    from tests.kube import crd_body  # noqa: PLC0415

    return crd_body(group, PLURAL, KIND)


async def create_crd(client: Any, group: str) -> float:
    """POST a CRD; returns the monotonic time the POST returned."""
    await client.request("POST", CRD_PATH, body=crd(group))
    return time.monotonic()


def obj_path(group: str, name: str | None = None) -> str:
    base = f"/apis/{group}/v1/namespaces/{OBJ_NS}/{PLURAL}"
    return f"{base}/{name}" if name else base


# -- subprocesses speaking JSON lines --------------------------------------------------------------------
class Lines:
    """A child process whose stdout is JSON lines; ``messages`` keeps them all, ``wait`` awaits one."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.proc: asyncio.subprocess.Process | None = None
        self.messages: list[dict[str, Any]] = []
        self._changed = asyncio.Condition()
        self._reader: asyncio.Task[None] | None = None
        self.stderr_path: Path | None = None

    async def start(self, argv: list[str], stderr_path: Path | None = None, **kw: Any) -> "Lines":
        self.stderr_path = stderr_path
        err = open(stderr_path, "wb") if stderr_path else subprocess.DEVNULL
        try:
            self.proc = await asyncio.create_subprocess_exec(
                *argv, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.PIPE, cwd=ROOT, **kw)
        finally:
            if stderr_path:
                err.close()  # type: ignore[union-attr]
        self._reader = asyncio.create_task(self._read())
        return self

    async def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        while True:
            line = await self.proc.stdout.readline()
            if not line:
                break
            try:
                msg = json.loads(line)
            except ValueError:
                print(f"[{self.name}] {line.decode(errors='replace').rstrip()}", file=sys.stderr)
                continue
            async with self._changed:
                self.messages.append(msg)
                self._changed.notify_all()
        async with self._changed:
            self.messages.append({"ev": "eof"})
            self._changed.notify_all()

    async def wait(self, match: Callable[[dict[str, Any]], bool], timeout: float) -> dict[str, Any] | None:
        """The first message (already received or coming) that matches; None on timeout or EOF."""
        deadline = time.monotonic() + timeout
        async with self._changed:
            while True:
                for m in self.messages:
                    if match(m):
                        return m
                if any(m.get("ev") == "eof" for m in self.messages):
                    return None
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                try:
                    await asyncio.wait_for(self._changed.wait(), left)
                except TimeoutError:
                    return None

    def send(self, text: str) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write(text.encode() + b"\n")

    async def stop(self, timeout: float = 10.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.returncode is None:
            self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), timeout)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)
        return self.proc.returncode


class Stamper(Lines):
    """``disc_stamp.py``: reports {"ev": "established", "group", "t"} and, for groups starting with
    a key of ``create``, {"ev": "created", "group", "t", "attempts", "mode"} once the object ``probe`` of the new CRD exists."""

    def __init__(self) -> None:
        super().__init__("stamper")

    async def launch(self, kubeconfig: str, prefix: str, create: dict[str, str],
                     log: Path | None = None) -> "Stamper":
        argv = [PY, str(BENCH / "disc_stamp.py"), "--kubeconfig", kubeconfig, "--prefix", prefix]
        for group_prefix, mode in create.items():
            argv += ["--create", f"{group_prefix}={mode}"]
        await self.start(argv, log)
        if await self.wait(lambda m: m.get("ev") == "ready", 60) is None:
            raise RuntimeError("disc_stamp.py did not become ready")
        return self

    async def established(self, group: str, timeout: float = 60) -> float | None:
        m = await self.wait(lambda m: m.get("ev") == "established" and m.get("group") == group, timeout)
        return m["t"] if m else None

    async def created(self, group: str, timeout: float = 60) -> dict[str, Any] | None:
        return await self.wait(lambda m: m.get("ev") in ("created", "create_failed") and m.get("group") == group,
                               timeout)


async def wait_until(changed: asyncio.Event, pred: Callable[[], bool], timeout: float) -> bool:
    """Wait until ``pred()`` holds, re-checking whenever ``changed`` is set (and at least every 0.5 s)."""
    deadline = time.monotonic() + timeout
    while True:
        changed.clear()
        if pred():
            return True
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        try:
            await asyncio.wait_for(changed.wait(), min(left, 0.5))
        except TimeoutError:
            pass


def write_json(path: str | None, data: dict[str, Any]) -> None:
    if path:
        Path(path).write_text(json.dumps(data, indent=2, default=str))
