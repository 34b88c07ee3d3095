"""Multi-cluster mode in the sidecar itself: the real ``Syncer`` with ``[clusters] enabled``, its ``/status`` and
``syncer status``, and ``syncer run --local --clusters N`` as users run it.

The management plane is the session's; members are kubeconfig Secrets in a fresh namespace of it. Two Secrets
may point at one workload apiserver under two names: two members as far as the registry is concerned, for the
price of one plane.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

import kubernetes

from controllers import ControllerContext, ManagedController
from controllers.fleet import FleetController, FleetContext
from controllers.reconcile import Request
from informers import ApiClient
from syncer.plugins import Plugins
from syncer.runtime import Syncer
from syncer.settings import Clusters, Settings
from syncer.testing import ControlPlane
from syncer.testing.pytest_plugin import kube_client

from tests.fleet import created, past
from tests.helpers import CONFIGMAPS, eventually, free_port
from tests.sidecar import wait_until

ROOT = Path(__file__).resolve().parents[2]
SECRETS = "/api/v1/namespaces/{}/secrets"


async def put_member(api: ApiClient, namespace: str, name: str, kubeconfig: bytes,
                     annotations: dict[str, str] | None = None) -> None:
    """A kubeconfig Secret as the registry selects them by default (label ``kube-syncer.io/kubeconfig=true``)."""
    await api.request("POST", SECRETS.format(namespace), body={
        "metadata": {"name": name, "labels": {"kube-syncer.io/kubeconfig": "true"}, "annotations": annotations or {}},
        "data": {"kubeconfig": base64.b64encode(kubeconfig).decode()}})


class Watchers:
    """A per-cluster controller requiring ConfigMaps: which API servers it runs against now."""

    def __init__(self) -> None:
        self.running: dict[int, str] = {}

    def spec(self) -> ManagedController:
        def create(ctx: ControllerContext) -> Any:
            async def start(ctx: ControllerContext) -> None:
                self.running[id(ctx)] = ctx.client.host
                try:
                    await asyncio.Event().wait()
                finally:
                    del self.running[id(ctx)]
            return start
        return ManagedController([CONFIGMAPS], create)


class Seen:
    """A fleet controller over ConfigMaps: what it reconciled, by cluster."""

    def __init__(self) -> None:
        self.requests: set[tuple[str, str]] = set()

    def spec(self) -> FleetController:
        seen = self

        class Reconciler:
            async def reconcile(self, cluster: str, request: Request) -> None:
                seen.requests.add((cluster, request.key))

        def create(ctx: FleetContext) -> Reconciler:
            return Reconciler()

        return FleetController(CONFIGMAPS, create)


def by_name(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in rows}


async def syncer_status(url: str) -> str:
    """The output of ``syncer status --url URL`` (which must succeed)."""
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "syncer", "status", "--url", url, cwd=ROOT,
                                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0 and not err, err.decode()
    return out.decode()


async def test_sidecar_runs_controllers_per_member_and_fleet_controllers(
        control_plane: ControlPlane, control_plane_factory: Any, api: ApiClient, namespace: str) -> None:
    workload = await asyncio.to_thread(control_plane_factory)
    data = workload.kubeconfig.read_bytes()  # inline credentials, context admin current: what run --local uses
    watchers, seen = Watchers(), Seen()
    plugins = Plugins({"cm-watch": watchers.spec()}, fleet={"cm-fleet": seen.spec()})
    port = free_port()
    settings = replace(Settings(), kubeconfig=str(control_plane.kubeconfig), include=("core/configmaps",),
                       http_bind=f"127.0.0.1:{port}", shutdown_timeout=10.0,
                       clusters=Clusters(enabled=True, namespaces=(namespace,), sync_timeout=20.0))
    syncer = Syncer(settings, ApiClient.from_kubeconfig(str(control_plane.kubeconfig)), plugins, identity="fleet")
    for name in ("one", "two"):
        await put_member(api, namespace, name, data)
    await put_member(api, namespace, "broken", b"{not: [valid")
    tasks_before = asyncio.all_tasks()
    stop = asyncio.Event()
    run = asyncio.create_task(syncer.run(stop))

    def members() -> dict[str, dict[str, Any]]:
        return by_name(syncer.status()["clusters"]["clusters"])

    def fleet() -> dict[str, Any]:
        [loop] = syncer.status()["clusters"]["fleet_controllers"]
        return loop

    def running() -> set[str]:
        return {name for name, c in by_name(syncer.status()["controllers"]).items() if c["state"] == "running"}

    try:
        await eventually(lambda: run.done() or all(members().get(n, {}).get("ready") for n in ("one", "two")), 40,
                         "both members ready")
        assert not run.done(), run
        await eventually(lambda: running() == {"cm-watch (cluster one)", "cm-watch (cluster two)"}, 20,
                         "the per-cluster controller running in both")
        assert sorted(watchers.running.values()) == [workload.url, workload.url]
        await eventually(lambda: fleet()["clusters"] == ["one", "two"], 20, "both members in the fleet controller")
        assert members()["broken"]["state"] == "refused" and not members()["broken"]["ready"]
        # Created in a later second than "one": younger, so "one" keeps the name although "dup" sorts before it.
        one_created = await created(api, namespace, "one")
        await eventually(lambda: past(one_created), 5, "a second younger than secret one")
        await put_member(api, namespace, "dup", data, annotations={"kube-syncer.io/cluster-name": "one"})
        await eventually(lambda: bool(syncer.status()["clusters"]["conflicts"]), 10, "the conflict")
        [conflict] = syncer.status()["clusters"]["conflicts"]
        assert conflict["secret"] == f"{namespace}/dup" and conflict["cluster"] == "one"

        probe = f"probe-{uuid.uuid4().hex[:8]}"
        with kube_client(workload) as k:
            await asyncio.to_thread(kubernetes.client.CoreV1Api(k).create_namespaced_config_map, "default",
                                    {"metadata": {"name": probe}, "data": {"k": "v"}})
        await eventually(lambda: {("one", f"default/{probe}"), ("two", f"default/{probe}")} <= seen.requests, 20,
                         "the fleet controller to reconcile the ConfigMap in both members")
        assert fleet()["reconciles"] >= 2 and fleet()["reconcile_errors"] == 0

        out = await syncer_status(f"http://127.0.0.1:{port}/status")
        lines = [re.sub(r"\s+", " ", line).strip() for line in out.splitlines()]
        assert "cm-watch (cluster one) running 0 0" in lines, out
        assert f"one ready yes secret {namespace}/one" in lines, out
        [broken] = [line for line in lines if line.startswith("broken ")]
        assert broken.startswith(f"broken refused no secret {namespace}/broken Connected: "), out
        assert f"{namespace}/dup cluster name 'one' is held by secret {namespace}/one, the oldest Secret naming " \
            "it" in lines, out
        [row] = [line for line in lines if line.startswith("cm-fleet ")]
        assert row.startswith("cm-fleet configmaps.v1 one,two "), out

        await api.request("DELETE", SECRETS.format(namespace) + "/two")
        await eventually(lambda: "two" not in members() and running() == {"cm-watch (cluster one)"} and
                         fleet()["clusters"] == ["one"], 20, "member two's rows to go")
        assert list(watchers.running.values()) == [workload.url]
        assert syncer.status()["clusters"]["conflicts"], "the conflict stays while 'one' is held by its Secret"
    finally:
        stop.set()
        await asyncio.wait_for(run, 30)
    assert not watchers.running
    await asyncio.sleep(0.1)  # callbacks of the last closed connections
    leaked = {t for t in asyncio.all_tasks() if not t.done()} - tasks_before - {asyncio.current_task()}
    assert not leaked, leaked


async def test_departed_members_leave_no_metric_series(control_plane: ControlPlane, api: ApiClient,
                                                      namespace: str) -> None:
    """Issue 21 item 8: after members join (their controllers started) and leave, cycle after cycle, the sidecar's
    /metrics has no series labelled with any of them (their informers' included, issue 23); a member that stays
    keeps its own."""
    cycles = 20
    data = control_plane.member_kubeconfig()
    plugins = Plugins({"cm-watch": Watchers().spec()})
    port = free_port()
    settings = replace(Settings(), kubeconfig=str(control_plane.kubeconfig), include=("core/configmaps",),
                       http_bind=f"127.0.0.1:{port}", shutdown_timeout=10.0,
                       clusters=Clusters(enabled=True, namespaces=(namespace,), sync_timeout=20.0))
    syncer = Syncer(settings, ApiClient.from_kubeconfig(str(control_plane.kubeconfig)), plugins, identity="series")
    stop = asyncio.Event()
    run = asyncio.create_task(syncer.run(stop))

    def running() -> set[str]:
        return {c["name"] for c in syncer.status()["controllers"] if c["state"] == "running"}

    def scrape() -> list[str]:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            return r.read().decode().splitlines()

    try:
        await put_member(api, namespace, "stays", data)
        await eventually(lambda: run.done() or "cm-watch (cluster stays)" in running(), 40, "the member that stays")
        assert not run.done(), run
        for i in range(cycles):
            name = f"departed-{i}"
            await put_member(api, namespace, name, data)
            await eventually(lambda: f"cm-watch (cluster {name})" in running(), 30, f"cycle {i}: {name} up")
            await api.request("DELETE", SECRETS.format(namespace) + f"/{name}")
            await eventually(lambda: name not in by_name(syncer.status()["clusters"]["clusters"]) and
                             f"cm-watch (cluster {name})" not in running(), 30, f"cycle {i}: {name} gone")
        # A member leaves /status when it is cancelled; its teardown (informers stopped, their series dropped)
        # ends just after, so the last one's series may be scraped for a moment: leaking means never gone.
        lines: list[str] = []
        departed: list[str] = []
        for _ in range(50):
            lines = await asyncio.to_thread(scrape)
            departed = [line for line in lines if '"departed-' in line or "/departed-" in line]
            if not departed:
                break
            await asyncio.sleep(0.2)
        print(f"{len(departed)} lines labelled with a departed member after {cycles} cycles, {len(lines)} in all")
        assert departed == [], departed[:10]
        assert any('series/stays"' in line for line in lines if line.startswith("controller_manager_starts_total"))
        assert any('cluster="stays"' in line for line in lines)
        # Issue 23: the member's informers report on the sidecar's registry, under its name
        assert any(line.startswith('informer_objects{cluster="stays",gvr="configmaps.v1"}') for line in lines)
    finally:
        stop.set()
        await asyncio.wait_for(run, 30)


def test_run_local_with_clusters(tmp_path: Path) -> None:
    """`syncer run --local --clusters 1`: a workload plane joins as member cluster-1, the plugin's controller runs
    in it, `syncer status` shows it ready, SIGTERM stops everything with exit 0 and removes both planes."""
    port = free_port()
    settings = tmp_path / "s.toml"
    settings.write_text('plugins = ["examples.plugins.configmap_mirror"]\n'
                        'include = ["core/configmaps", "core/namespaces"]\n'
                        f'http_bind = "127.0.0.1:{port}"\nshutdown_timeout = "10s"\n')
    log = tmp_path / "run.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SYNCER_") and k != "KUBECONFIG"}
    proc = subprocess.Popen([sys.executable, "-m", "syncer", "run", "--local", "--clusters", "1", "--settings",
                             str(settings)], cwd=ROOT, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT)

    def member() -> dict[str, Any]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=2) as r:
                return by_name(json.load(r)["clusters"]["clusters"]).get("cluster-1", {})
        except OSError:
            return {}

    try:
        wait_until(lambda: member().get("ready"), "member cluster-1 to be ready", proc, log, timeout=45)
        found = re.search(r"^workload control plane workload-1 at \S+; kubeconfig: (\S+); member cluster-1 "
                          r"\(Secret kube-syncer-clusters/cluster-1\)$", log.read_text(), re.M)
        assert found, log.read_text()
        workload = Path(found.group(1))
        status = subprocess.run([sys.executable, "-m", "syncer", "status", "--url",
                                 f"http://127.0.0.1:{port}/status"], cwd=ROOT, capture_output=True, text=True,
                                timeout=30)
        assert status.returncode == 0, status.stderr
        rows = [re.sub(r"\s+", " ", line).strip() for line in status.stdout.splitlines()]
        assert "cluster-1 ready yes secret kube-syncer-clusters/cluster-1" in rows, status.stdout
        assert "configmap-mirror (cluster cluster-1) running 0 0" in rows, status.stdout
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            metrics = r.read().decode()
        assert 'syncer_cluster_condition{cluster="cluster-1",condition="Synced"} 1.0' in metrics
        with kubernetes.config.new_client_from_config(str(workload)) as k:
            core = kubernetes.client.CoreV1Api(k)
            core.create_namespaced_config_map("default", {"metadata": {"name": "app", "labels": {
                "kube-syncer.io/mirror": "true"}}, "data": {"k": "v"}})

            def mirrored() -> bool:
                try:
                    return core.read_namespaced_config_map("default.app", "mirror").data == {"k": "v"}
                except kubernetes.client.ApiException:
                    return False

            wait_until(mirrored, "the mirror in the workload plane", proc, log, timeout=20)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log.read_text()
        assert not workload.parent.exists(), "the workload plane was not stopped"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
