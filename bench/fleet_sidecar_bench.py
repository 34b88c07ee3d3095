"""Fleet bring-up on the real sidecar: ``python -m syncer run`` in multi-cluster mode (discovery, the HTTP server,
one per-cluster ConfigMap controller) against the client-go peer, N members, one after the other in one run.

    .venv/bin/python bench/fleet_sidecar_bench.py [--clusters 200] [--objects 20] [--rounds 2] \
        [--peer-bin bench/out/clientgo_multicluster] [--profile bench/out/bringup.svg] [--profile-rate 200] \
        [--native] [--extra-settings 'uvloop = false\\n'] [--json OUT] \
        [--old-tree /tmp/old-tree]

Two local control planes: management (the members' kubeconfig Secrets) and workload (every member's kubeconfig
points at it, admin token; namespace ``bench`` holds ``--objects`` ConfigMaps). Contenders, a fresh process each
per round, order alternating by round:

- ``sidecar``: ``syncer run`` with ``[clusters] enabled`` over the round's Secret namespace, default settings
  otherwise (uvloop, HTTP/2, ``watch = "required"``), the plugin bench/plugins_fleet_probe.py (prints each
  member's first reconcile on stdout), INFO logs to bench/out/.
- ``client-go``: bench/clientgo_multicluster with ConfigMaps only (``-gvrs /v1/configmaps``), 2 workers.
- ``sidecar-old`` (with ``--old-tree``): the sidecar of another checkout of this repository (its cwd and
  ``PYTHONPATH``), same settings and plugin: before/after in the same run.

Per round: the process started and idle 3 s (start-up RSS), N Secrets created at once, every member's first
reconcile awaited: time from the first POST to the last first-reconcile (and to the last POST's answer: the
management server's share, slowed by what the contender takes of the cores), the process's CPU over that and
its busiest thread's (ours: the event loop; the rest is handshakes on the executor); 5 s later RSS; RSS per
member = (RSS - start-up RSS) / N. Then 20 s idle: CPU %. With ``--profile``, py-spy records the sidecar from
the first POST to the last reconcile of the first round (a flame graph SVG, or collapsed stacks when the path
ends in ``.txt``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(BENCH))

from informers import ApiClient  # noqa: E402
from multicluster_bench import CONFIGMAPS, OUT, SECRETS, Proc, build_peer, put_secret  # noqa: E402


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Sidecar(Proc):
    """``syncer run``: started once ``/readyz`` answers 200."""

    def __init__(self, name: str, argv: list[str], log: Path, port: int, tree: Path = ROOT) -> None:
        super().__init__(name, argv, log)
        self.port, self.tree = port, tree

    async def start(self) -> None:
        import psutil

        env = {**os.environ, "PYTHONPATH": str(self.tree)}
        self.proc = await asyncio.create_subprocess_exec(*self.argv, stdout=asyncio.subprocess.PIPE,
                                                         stderr=self.log.open("ab"), cwd=self.tree, env=env)
        self.ps = psutil.Process(self.proc.pid)
        self._reader = asyncio.create_task(self._read())
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline or self.proc.returncode is not None:
                raise RuntimeError(f"sidecar not ready (see {self.log})")
            await asyncio.sleep(0.05)


async def bring_up(mgmt: ApiClient, p: Proc, namespace: str, data: bytes, clusters: int,
                   profile: str | None, profile_rate: int = 200, native: bool = False) -> dict[str, float]:
    await mgmt.request("POST", "/api/v1/namespaces", body={"metadata": {"name": namespace}})
    await p.start()
    await asyncio.sleep(3)
    base_rss = p.rss()
    cpu0 = p.cpu()
    threads0 = {t.id: t.user_time + t.system_time for t in p.ps.threads()}
    spy = None
    if profile:
        spy = subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "-p", str(p.proc.pid),  # type: ignore[union-attr]
                                "-o", profile, "--rate", str(profile_rate),
                                *(["--native"] if native else ["--nonblocking"]),  # native stacks need the process paused
                                *(["--format", "raw"] if profile.endswith(".txt") else [])],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        await asyncio.sleep(1)
    t0 = time.time()
    await asyncio.gather(*(put_secret(mgmt, namespace, f"c{i:04d}", data) for i in range(clusters)))
    t_posted = time.time() - t0
    rec = await p.wait(lambda e: e["event"] == "reconciled", clusters, 900)
    t_rec = max(e["t"] for e in rec) - t0
    cpu = p.cpu() - cpu0
    busiest = max(t.user_time + t.system_time - threads0.get(t.id, 0.0) for t in p.ps.threads())
    if spy is not None:
        spy.send_signal(2)
        spy.wait(60)
    await asyncio.sleep(5)
    rss = p.rss()
    c0, w0 = p.cpu(), time.monotonic()
    await asyncio.sleep(20)
    idle = (p.cpu() - c0) / (time.monotonic() - w0) * 100
    await p.stop()
    await mgmt.request("DELETE", f"/api/v1/namespaces/{namespace}")
    return {"all_reconciled_s": t_rec, "secrets_posted_s": t_posted, "bringup_cpu_s": cpu,
            "busiest_thread_cpu_s": busiest, "start_rss_mib": base_rss / 2**20, "rss_mib": rss / 2**20,
            "rss_per_member_kib": (rss - base_rss) / clusters / 1024, "idle_cpu_pct": idle}


async def harness(args: argparse.Namespace) -> dict[str, Any]:
    from syncer.testing import ControlPlane

    peer_bin = Path(args.peer_bin) if args.peer_bin else build_peer()
    OUT.mkdir(exist_ok=True)
    mgmt_cp, work_cp = ControlPlane(name="fsb-mgmt"), ControlPlane(name="fsb-work")
    procs: list[Proc] = []
    try:
        mgmt_cp.start()
        work_cp.start()
        kubeconfig = str(mgmt_cp.kubeconfig)
        data = work_cp.member_kubeconfig()
        async with ApiClient.from_kubeconfig(kubeconfig) as mgmt, \
                ApiClient.from_kubeconfig(str(work_cp.kubeconfig)) as work:
            await work.request("POST", "/api/v1/namespaces", body={"metadata": {"name": "bench"}})
            for i in range(args.objects):
                await work.request("POST", CONFIGMAPS.path("bench"), body={"metadata": {"name": f"cm-{i}"},
                                                                           "data": {"k": "v" * 100}})

            def make(name: str, ns: str, tag: str) -> Proc:
                log = OUT / f"fleet-sidecar-{name}-{tag}.log"
                log.write_bytes(b"")
                if name == "client-go":
                    p: Proc = Proc(name, [str(peer_bin), "-kubeconfig", kubeconfig, "-namespace", ns, "-gvrs",
                                          "/v1/configmaps", "-workers", "2"], log)
                else:
                    port = free_port()
                    settings = OUT / f"fleet-sidecar-{tag}.toml"
                    settings.write_text(
                        f'kubeconfig = "{kubeconfig}"\nplugins = ["{BENCH / "plugins_fleet_probe.py"}"]\n'
                        f'http_bind = "127.0.0.1:{port}"\n{args.extra_settings}[clusters]\nenabled = true\nnamespaces = ["{ns}"]\n')
                    tree = Path(args.old_tree) if name == "sidecar-old" else ROOT
                    p = Sidecar(name, [sys.executable, "-m", "syncer", "run", "--settings", str(settings)], log, port,
                                tree)
                procs.append(p)
                return p

            contenders = ("sidecar", "client-go", *(("sidecar-old",) if args.old_tree else ()))
            rounds: dict[str, list[dict[str, float]]] = {n: [] for n in contenders}
            for r in range(args.rounds):
                for n in (contenders if r % 2 == 0 else contenders[::-1]):  # A B C, then C B A
                    ns = f"fsb-{n.replace('-', '')}-{r}"
                    profile = args.profile if (args.profile and n == "sidecar" and not rounds[n]) else None
                    res = await bring_up(mgmt, make(n, ns, f"r{r}"), ns, data, args.clusters, profile,
                                         args.profile_rate, args.native)
                    rounds[n].append(res)
                    print(json.dumps({"round": r, "contender": n, **{k: round(v, 3) for k, v in res.items()}}),
                          file=sys.stderr, flush=True)
            medians = {n: {k: statistics.median(x[k] for x in rs) for k in rs[0]} for n, rs in rounds.items()}
            ratios = {other: {k: [a[k] / b[k] if b[k] else float("nan") for a, b in zip(rounds[other],
                                                                                        rounds["client-go"])]
                              for k in rounds["sidecar"][0]} for other in contenders if other != "client-go"}
            return {"args": vars(args), "rounds": rounds, "medians": medians, "ratios": ratios}
    finally:
        for p in procs:
            await p.stop()
        mgmt_cp.stop()
        work_cp.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    p.add_argument("--clusters", type=int, default=200)
    p.add_argument("--objects", type=int, default=20, help="ConfigMaps every member lists")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--peer-bin", help="a built bench/clientgo_multicluster (default: go build it)")
    p.add_argument("--profile", help="py-spy flame graph of the sidecar's first bring-up (SVG path)")
    p.add_argument("--profile-rate", type=int, default=200, help="py-spy samples per second")
    p.add_argument("--native", action="store_true", help="py-spy --native: C frames too (OpenSSL, orjson, ...)")
    p.add_argument("--extra-settings", default="", type=lambda s: s.replace("\\n", "\n"),
                   help="top-level TOML lines for the sidecars (\\n for a newline), e.g. uvloop = false")
    p.add_argument("--json", default=str(OUT / "fleet-sidecar.json"))
    p.add_argument("--old-tree", help="another checkout whose sidecar runs too (contender sidecar-old)")
    args = p.parse_args()
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    result = asyncio.run(harness(args))
    Path(args.json).write_text(json.dumps(result, indent=1))
    names = list(result["medians"])
    print("| figure | " + " | ".join(names) + " | " + " | ".join(f"{n} / client-go (per round)" for n in result["ratios"])
          + " |\n|---|" + "---:|" * len(names) + "---|" * len(result["ratios"]))
    for k in result["medians"]["sidecar"]:
        print(f"| {k} | " + " | ".join(f"{result['medians'][n][k]:.3f}" for n in names) + " | " +
              " | ".join(", ".join(f"{r:.2f}" for r in result["ratios"][n][k]) for n in result["ratios"]) + " |")


if __name__ == "__main__":
    main()
