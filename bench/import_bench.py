"""Start-up cost: each import's time and RSS, and the start-up RSS of the fleet process and of ``syncer run``.

    .venv/bin/python bench/import_bench.py [--repeat 3] [--budget 35] [--json bench/out/imports.json]

1. Imports. Each module is imported alone in a fresh interpreter (``python -X importtime -c "import m"``), which
   prints its RSS (``VmRSS`` of ``/proc/self/status``) once the import is done; the time is the module's cumulative
   line of ``-X importtime``. Bare ``python`` is the floor. Also listed: which heavy packages each of our modules
   pulled in (``kubernetes``, ``aiohttp``, ``aiohttp.web``, ``cryptography``, ``dynaconf``, ``tenacity``,
   ``importlib.metadata``, our webhooks and sharding).
2. Processes, against one local control plane (``syncer.testing.ControlPlane``):
   (a) ``fleet``: this file with ``--fleet-child``: an ApiClient from the plane's kubeconfig, a ClusterRegistry
       with 0 members and ClusterControllers for one per-cluster controller, set up as
       ``syncer.workloads.fleet.Fleet.start`` sets them up with default settings (``syncer.cli.event_loop``'s loop,
       ``small_tls_read_buffers()``, logging as ``syncer run``), run until the registry has synced; its RSS is read
       1 s later. The budget applies to it.
   (b) ``syncer run``: ``python -m syncer run --kubeconfig <plane>`` with default settings (no plugins, election
       off, ``watch = "all"``: an informer on every served GVR; the HTTP server on a free port); its RSS is read
       from outside 1 s after ``/readyz`` answers 200.
   (c) the same with ``watch = "required"`` (no plugin requires anything: no informers), the start-up alone.
   Medians over ``--repeat`` fresh processes.

The script exits with 1 when (a) is over ``--budget`` MiB.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable
PACKAGES = ["asyncio", "ssl", "aiohttp", "aiohttp.web", "kubernetes", "kubernetes.config", "kubernetes.client",
            "prometheus_client", "loguru", "uvloop", "orjson", "yaml", "cryptography.x509", "tenacity", "dynaconf",
            "sortedcontainers"]
OURS = ["informers.client", "informers.untrusted_kubeconfig", "informers", "controllers",
        "controllers.cluster_registry", "syncer.settings", "syncer.plugins", "syncer.http", "syncer.leader",
        "syncer.sharding.coordinator", "syncer.webhook.service", "syncer.builtin.cached_resources", "syncer.runtime", "syncer.cli"]
# Imported or not, after a module (see _PROBE); our own lazy parts by their package.
WATCHED = ["kubernetes", "aiohttp", "aiohttp.web", "cryptography", "dynaconf", "tenacity", "importlib.metadata",
           "syncer.webhook", "syncer.webhook.service",
           "syncer.sharding.coordinator", "syncer.leader", "syncer.debug", "syncer.builtin.cached_resources"]
_PROBE = f"""
import sys
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")
print("RESULT", rss(), ",".join(m for m in {WATCHED!r} if m in sys.modules), flush=True)
"""


def rss_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f}"


# -- 1. imports ---------------------------------------------------------------------------------------------------
def _importtime(module: str) -> tuple[int, dict[str, int]]:
    """RSS after importing ``module`` in a fresh interpreter, and ``-X importtime``'s top-level cumulative lines."""
    code = (f"import {module}\n" if module else "") + _PROBE
    out = subprocess.run([PY, "-X", "importtime", "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    line = next(x for x in out.stdout.splitlines() if x.startswith("RESULT"))
    _, rss, pulled = (line.split(" ") + [""])[:3]
    top = {}
    for row in out.stderr.splitlines():
        m = re.match(r"import time:\s+\d+ \|\s+(\d+) \| (\S+)$", row)  # depth 0: no indent before the name
        if m:
            top[m.group(2)] = int(m.group(1))
    return int(rss), {"pulled": pulled, **top}  # type: ignore[dict-item]


def measure_import(module: str, startup: set[str]) -> dict[str, Any]:
    """One fresh interpreter importing ``module``: RSS, import time (the top-level imports the interpreter's own
    start-up does not make), the watched packages it pulled in."""
    rss, top = _importtime(module)
    pulled = str(top.pop("pulled"))
    micros = sum(v for k, v in top.items() if k not in startup)
    return {"rss": rss, "ms": micros / 1000, "pulled": [p for p in pulled.split(",") if p]}


def imports(repeat: int) -> list[dict[str, Any]]:
    rows = []
    startup = set(_importtime("")[1]) - {"pulled"}
    for module in ["", *PACKAGES, *OURS]:
        runs = [measure_import(module, startup) for _ in range(repeat)]
        rows.append({"module": module or "(bare python)", "ours": module in OURS,
                     "rss": statistics.median(r["rss"] for r in runs),
                     "ms": statistics.median(r["ms"] for r in runs), "pulled": runs[0]["pulled"]})
        print(f"  {rows[-1]['module']:36} {_mib(rows[-1]['rss']):>6} MiB {rows[-1]['ms']:7.1f} ms  "
              f"{' '.join(rows[-1]['pulled'])}", flush=True)
    return rows


# -- 2a. the fleet process ----------------------------------------------------------------------------------------
def fleet_child(kubeconfig: str) -> None:
    sys.path.insert(0, str(ROOT))
    from syncer.cli import event_loop
    from syncer.settings import Settings

    settings = Settings()
    loop_factory, _ = event_loop(settings)
    with asyncio.Runner(loop_factory=loop_factory) as runner:  # as cmd_run does
        runner.run(_fleet(kubeconfig, settings))


async def _fleet(kubeconfig: str, s: Any) -> None:
    from controllers import Controller, ManagedController
    from controllers.cluster_controllers import ClusterControllers
    from controllers.cluster_registry import ClusterRegistry
    from informers import GVR, ApiClient
    from syncer.logs import setup_logging
    from syncer.runtime import small_tls_read_buffers
    from syncer.wiring import cluster_providers, member_factory, member_options

    setup_logging("WARNING", s.log_format)
    small_tls_read_buffers()
    configmaps = GVR("", "v1", "configmaps")

    def create(ctx: Any) -> Any:
        async def reconcile(req: Any) -> None:
            return None
        return Controller("bench", reconcile, workers=ctx.workers).for_(configmaps).run

    controllers = {"bench": ManagedController([configmaps], create)}
    api = ApiClient.from_kubeconfig(kubeconfig)
    # As workloads.fleet.Fleet.start sets them up (without the management plane's own discovering factory).
    registry = ClusterRegistry(api, cluster_providers(s, api), member_options(s), required={configmaps},
                               make_factory=lambda client, name: member_factory(s, client, name))
    per_cluster = ClusterControllers(controllers, name="bench", workers=s.workers, resync_period=s.resync or None,
                                     start_timeout=s.start_timeout)
    await registry.register_cluster_handler(per_cluster)
    await registry.start()
    while not registry.synced():
        await asyncio.sleep(0.01)
    await asyncio.sleep(1.0)
    print("RESULT", rss_of(os.getpid()), ",".join(m for m in WATCHED if m in sys.modules), flush=True)
    await per_cluster.stop()
    await registry.stop()
    await api.close()


def run_fleet(kubeconfig: str) -> dict[str, Any]:
    out = subprocess.run([PY, __file__, "--fleet-child", kubeconfig], cwd=ROOT, capture_output=True, text=True,
                         timeout=120)
    line = next((x for x in out.stdout.splitlines() if x.startswith("RESULT")), None)
    if line is None:
        raise RuntimeError(f"the fleet child failed:\n{out.stderr[-3000:]}")
    _, rss, pulled = (line.split(" ") + [""])[:3]
    return {"rss": int(rss), "pulled": [p for p in pulled.split(",") if p]}


# -- 2b. syncer run -----------------------------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_syncer(kubeconfig: str, **settings: str) -> dict[str, Any]:
    port = _free_port()
    with tempfile.TemporaryDirectory() as empty:  # no settings file and no plugins: every default
        proc = subprocess.Popen([PY, "-m", "syncer", "run", "--kubeconfig", kubeconfig], cwd=empty,
                                env={**os.environ, "PYTHONPATH": str(ROOT), "SYNCER_HTTP_BIND": f"127.0.0.1:{port}",
                                     **{f"SYNCER_{k.upper()}": v for k, v in settings.items()}},
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            deadline = time.monotonic() + 60
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"syncer run exited: {proc.stderr.read().decode()[-3000:]}")  # type: ignore
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise RuntimeError("syncer run did not become ready within 60 s")
                time.sleep(0.05)
            time.sleep(1.0)
            return {"rss": rss_of(proc.pid)}
        finally:
            proc.terminate()
            proc.wait(30)


# -- report -------------------------------------------------------------------------------------------------------
def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--fleet-child":
        fleet_child(sys.argv[2])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--budget", type=float, default=35.0, help="MiB for the fleet process with 0 members")
    parser.add_argument("--json", type=Path, default=ROOT / "bench" / "out" / "imports.json")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from syncer.testing import ControlPlane

    print(f"python {platform.python_version()} ({PY}), {os.cpu_count()} CPUs", flush=True)
    print("imports (median RSS after the import, cumulative -X importtime; pulled in):", flush=True)
    rows = imports(args.repeat)
    with ControlPlane(name="imports") as cp:
        kubeconfig = str(cp.kubeconfig)
        fleet = [run_fleet(kubeconfig) for _ in range(args.repeat)]
        sidecar = [run_syncer(kubeconfig) for _ in range(args.repeat)]
        bare = [run_syncer(kubeconfig, watch="required") for _ in range(args.repeat)]
    fleet_rss = statistics.median(r["rss"] for r in fleet)
    syncer_rss = statistics.median(r["rss"] for r in sidecar)
    bare_rss = statistics.median(r["rss"] for r in bare)
    within = fleet_rss <= args.budget * 2**20
    print(f"(a) fleet process, 0 members: {_mib(fleet_rss)} MiB (runs: {', '.join(_mib(r['rss']) for r in fleet)}); "
          f"imported: {' '.join(fleet[0]['pulled']) or 'none of the watched'}")
    print(f"(b) syncer run, defaults:     {_mib(syncer_rss)} MiB (runs: {', '.join(_mib(r['rss']) for r in sidecar)})")
    print(f"(c) syncer run, watch = required (no informers): {_mib(bare_rss)} MiB "
          f"(runs: {', '.join(_mib(r['rss']) for r in bare)})")
    print(f"budget (a) <= {args.budget:g} MiB: {'met' if within else 'MISSED'}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"imports": rows, "fleet": fleet, "syncer_run": sidecar, "syncer_run_bare": bare,
                                     "budget_mib": args.budget, "within": within}, indent=2))
    sys.exit(0 if within else 1)


if __name__ == "__main__":
    main()
