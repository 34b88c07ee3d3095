"""Benchmark of the sidecar process (``python -m syncer run``) against a real local control plane.

Usage (cwd /work/main):  .venv/bin/python bench/sidecar_bench.py [--runs 5] [--idle 20] [--rss-runs 5]
                             [--json OUT.json]

One control plane for all runs, with examples/crds/widget.json applied (Established) first, so both example
controllers (configmap_mirror and widget_status) run. Each run starts

    .venv/bin/python -m syncer run --settings S        (cwd /work/main)

with S a temporary TOML: the control plane's kubeconfig, plugins examples.plugins.configmap_mirror and
examples.plugins.widget_status, include core/configmaps, core/namespaces, examples.kube-syncer.io/*, and
http_bind on a free loopback port. It polls GET /readyz every 10 ms from the moment the process is spawned:
"http up" is the first answer of any status, "ready" the first 200. Then it waits until /status lists both
controllers as running; in the first ``--rss-runs`` runs it stays idle ``--idle`` s after ready and reads the
process's RSS and the CPU it used while idle. Then SIGTERM: exit code and time until the process has exited.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import disc_common as dc  # noqa: E402

import psutil  # noqa: E402
from syncer.testing import ControlPlane  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(url: str, timeout: float = 1.0) -> tuple[int, bytes] | None:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (urllib.error.URLError, ConnectionError, OSError):
        return None


def kubectl_apply_widget(cp: ControlPlane) -> float:
    """Create the example CRD and wait until it is Established (through kubectl, as a user would)."""
    kubectl = [str(cp.assets.kubectl), "--kubeconfig", str(cp.kubeconfig)]
    t = time.monotonic()
    subprocess.run([*kubectl, "apply", "-f", str(dc.ROOT / "examples/crds/widget.json")], check=True,
                   capture_output=True)
    subprocess.run([*kubectl, "wait", "--for=condition=Established", "--timeout=60s",
                    "crd/widgets.examples.kube-syncer.io"], check=True, capture_output=True)
    return time.monotonic() - t


def one_run(i: int, args: argparse.Namespace, cp: ControlPlane, workdir: Path) -> dict[str, Any]:
    port = free_port()
    settings = workdir / f"settings-{i}.toml"
    settings.write_text(
        f'kubeconfig = "{cp.kubeconfig}"\n'
        'plugins = ["examples.plugins.configmap_mirror", "examples.plugins.widget_status"]\n'
        'include = ["core/configmaps", "core/namespaces", "examples.kube-syncer.io/*"]\n'
        f'http_bind = "127.0.0.1:{port}"\n')
    log = workdir / f"sidecar-{i}.log"
    base = f"http://127.0.0.1:{port}"
    row: dict[str, Any] = {"run": i, "port": port, "log": str(log)}
    with open(log, "wb") as logf:
        t0 = time.monotonic()
        proc = subprocess.Popen([dc.PY, "-m", "syncer", "run", "--settings", str(settings)], cwd=dc.ROOT,
                                stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        ps = psutil.Process(proc.pid)
        deadline = t0 + args.timeout
        while time.monotonic() < deadline and proc.poll() is None:
            r = http_get(f"{base}/readyz", 0.5)
            now = time.monotonic()
            if r is not None and "http_up" not in row:
                row["http_up"] = now - t0
            if r is not None and r[0] == 200:
                row["ready"] = now - t0
                break
            time.sleep(0.01)
        if "ready" not in row:
            row["error"] = f"not ready within {args.timeout}s (exit code {proc.poll()})"
            return row
        t_ready = time.monotonic()
        row["rss_at_ready"] = ps.memory_info().rss
        running: list[str] = []
        while time.monotonic() < t_ready + 30:
            r = http_get(f"{base}/status")
            if r and r[0] == 200:
                status = json.loads(r[1])
                running = [c["name"] for c in status["controllers"] if c.get("state") == "running"]
                if len(running) >= 2:
                    row["controllers_running_after_ready"] = time.monotonic() - t_ready
                    row["gvrs"] = {g["gvr"]: g["state"] for g in status["gvrs"] if g["state"] != "excluded"}
                    break
            time.sleep(0.05)
        row["controllers_running"] = running
        if i < args.rss_runs:
            cpu0, w0 = sum(ps.cpu_times()[:2]), time.monotonic()
            time.sleep(max(0.0, t_ready + args.idle - time.monotonic()))
            cpu1, w1 = sum(ps.cpu_times()[:2]), time.monotonic()
            mem = ps.memory_full_info()
            row.update(rss_idle=mem.rss, uss_idle=mem.uss, idle_after_ready_s=w1 - t_ready,
                       idle_cpu_pct=100 * (cpu1 - cpu0) / (w1 - w0), idle_cpu_window_s=w1 - w0,
                       threads=ps.num_threads(), tcp_to_apiserver=dc.tcp_connections_to(cp.port, proc.pid))
            h = http_get(f"{base}/healthz")
            row["healthz"] = h[0] if h else None
        t_term = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            row["exit_code"] = proc.wait(args.timeout)
        except subprocess.TimeoutExpired:
            row["exit_code"] = "did not exit"
        row["shutdown"] = time.monotonic() - t_term
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text(errors="replace")
    row["log_errors"] = [ln for ln in text.splitlines() if " ERROR " in ln or "Traceback" in ln][:5]
    row["log_warnings"] = [ln for ln in text.splitlines() if " WARNING " in ln][:5]
    return row


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--idle", type=float, default=20.0)
    p.add_argument("--rss-runs", type=int, default=5, help="runs that also stay idle --idle s and read RSS")
    p.add_argument("--timeout", type=float, default=60.0)
    p.add_argument("--wait-quiet", type=float, default=0.0)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    note = dc.wait_for_quiet_machine(args.wait_quiet) if args.wait_quiet else "no wait for other benchmarks"
    result: dict[str, Any] = {"env": dc.environment(), "argv": sys.argv, "args": vars(args)}
    workdir = Path(tempfile.mkdtemp(prefix="sidecar-bench-"))
    result["workdir"] = str(workdir)
    t0 = time.monotonic()
    cp = ControlPlane().start()
    try:
        result["widget_crd_apply_s"] = kubectl_apply_widget(cp)
        rows = []
        for i in range(args.runs):
            row = one_run(i, args, cp, workdir)
            rows.append(row)
            print(f"[run {i}] " + json.dumps({k: v for k, v in row.items() if k not in ("gvrs", "log")}),
                  file=sys.stderr, flush=True)
        result["rows"] = rows
    finally:
        cp.stop()
    ok = [r for r in rows if "ready" in r]
    idle = [r for r in ok if "rss_idle" in r]

    def med(key: str, rs: list[dict[str, Any]]) -> float | None:
        vals = [r[key] for r in rs if isinstance(r.get(key), (int, float))]
        return statistics.median(vals) if vals else None

    result["summary"] = {
        "runs": len(rows), "ready_runs": len(ok),
        "ready_s": {"median": med("ready", ok), "min": min((r["ready"] for r in ok), default=None),
                    "max": max((r["ready"] for r in ok), default=None), "all": [r["ready"] for r in ok]},
        "http_up_s_median": med("http_up", ok),
        "controllers_running_after_ready_s_median": med("controllers_running_after_ready", ok),
        "rss_idle_mib": {"median": (med("rss_idle", idle) or 0) / 2**20,
                         "all": [r["rss_idle"] / 2**20 for r in idle]},
        "uss_idle_mib_median": (med("uss_idle", idle) or 0) / 2**20,
        "rss_at_ready_mib_median": (med("rss_at_ready", ok) or 0) / 2**20,
        "idle_cpu_pct_median": med("idle_cpu_pct", idle),
        "tcp_to_apiserver": [r.get("tcp_to_apiserver") for r in idle],
        "exit_codes": [r.get("exit_code") for r in ok],
        "shutdown_s": {"median": med("shutdown", ok), "max": max((r["shutdown"] for r in ok if "shutdown" in r),
                                                                  default=None)},
        "log_errors": [e for r in rows for e in r.get("log_errors", [])][:10],
        "log_warnings": [e for r in rows for e in r.get("log_warnings", [])][:10],
    }
    result["wall_seconds"] = time.monotonic() - t0
    result["machine_note"] = dc.note_concurrent(note)
    dc.write_json(args.json, result)
    print(json.dumps({"machine_note": result["machine_note"], "wall_seconds": result["wall_seconds"],
                      **result["summary"]}, indent=2))
    return 0 if len(ok) == len(rows) else 1


if __name__ == "__main__":
    os.chdir(dc.ROOT)
    sys.exit(main())
