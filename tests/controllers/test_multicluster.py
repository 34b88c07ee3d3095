"""Multi-cluster against real control planes: the cluster registry (kubeconfig Secrets on the management plane),
per-cluster controllers, fleet controllers, rotation, removal in every phase, conflicts and untrusted kubeconfigs.

The management plane is the session's; two workload planes are started for this module. A "cluster" can also be
a second Secret pointing at the same apiserver, which keeps the churn test cheap.
"""

from __future__ import annotations

import asyncio
import gc
import os
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import kubernetes
import pytest
from loguru import logger

from controllers import ManagedController
from controllers.cluster import Cluster, ClusterContext
from controllers.cluster_controllers import ClusterControllers
from controllers.cluster_registry import ClusterRegistry
from controllers.member import MemberOptions
from controllers.fleet import FleetController, FleetLoop
from controllers.reconcile import Request
from informers import GVR, ApiClient, ClusterNotFound
from syncer.testing import ControlPlane
from syncer.testing.pytest_plugin import kube_client

from tests.fleet import created, delete_secret, kubeconfig, member, options, past, put_secret, secrets
from tests.helpers import CONFIGMAPS, eventually
from tests.kube import create_crd, wait_established

GADGETS = GVR("fleet.example.com", "v1", "gadgets")


@pytest.fixture(scope="module")
def workloads() -> Iterator[tuple[ControlPlane, ControlPlane]]:
    a, b = ControlPlane(name="workload-a"), ControlPlane(name="workload-b")
    try:
        a.start()
        b.start()
        yield a, b
    finally:
        a.stop()
        b.stop()


class Recorder:
    """A cluster handler that records what it is told."""

    def __init__(self) -> None:
        self.added: list[tuple[str, Cluster]] = []
        self.removed: list[str] = []
        self.cleaned: list[str] = []

    def add_cluster(self, ctx: ClusterContext, name: str, cluster: Cluster) -> None:
        self.added.append((name, cluster))

        async def cleanup() -> None:
            self.cleaned.append(name)

        ctx.add_cleanup(cleanup)

    def remove_cluster(self, name: str) -> None:
        self.removed.append(name)


class Starts:
    """A per-cluster controller requiring ``gvr``: counts its instances and notes each one's client."""

    def __init__(self, gvr: GVR) -> None:
        self.gvr = gvr
        self.running: dict[int, Any] = {}
        self.starts = 0

    def spec(self) -> ManagedController:
        async def create(ctx: Any) -> Any:
            async def start(ctx: Any) -> None:
                self.starts += 1
                key = id(ctx)
                self.running[key] = ctx
                try:
                    await asyncio.Event().wait()
                finally:
                    del self.running[key]
            return start
        return ManagedController([self.gvr], create)

    def hosts(self) -> list[str]:
        return sorted(ctx.client.host for ctx in self.running.values())


class FleetRecorder:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        self.deleted: list[tuple[str, str]] = []

    def spec(self, gvr: GVR) -> FleetController:
        recorder = self

        class Reconciler:
            async def reconcile(self, cluster: str, request: Request) -> None:
                recorder.seen.append((cluster, request.key))

            async def reconcile_deletion(self, cluster: str, request: Request) -> None:
                recorder.deleted.append((cluster, request.key))

        return FleetController(gvr, lambda ctx: Reconciler())


async def test_secret_lifecycle_rotation_and_removal(api: ApiClient, fleet_ns: str,
                                                     workloads: tuple[ControlPlane, ControlPlane]) -> None:
    a, _ = workloads
    # Two service accounts with cluster-admin: rotating from one's token to the other's, then deleting the
    # first, revokes the old credential for real.
    with kube_client(a) as k:
        core, rbac = kubernetes.client.CoreV1Api(k), kubernetes.client.RbacAuthorizationV1Api(k)
        tokens = []
        for sa in ("fleet-1", "fleet-2"):
            core.create_namespaced_service_account("default", {"metadata": {"name": sa}})
            rbac.create_cluster_role_binding({
                "metadata": {"name": f"{sa}-admin"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io",
                                                                 "kind": "ClusterRole", "name": "cluster-admin"},
                "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": "default"}]})
            tokens.append(core.create_namespaced_service_account_token(
                sa, "default", {"spec": {"expirationSeconds": 3600}}).status.token)
    log: list[str] = []
    sink = logger.add(lambda m: log.append(str(m)), level="DEBUG")
    starts = Starts(CONFIGMAPS)
    recorder = Recorder()
    registry = ClusterRegistry(api, *options(api, fleet_ns), required=[CONFIGMAPS])
    per_cluster = ClusterControllers({"cm": starts.spec()}, name="t")
    fleet = FleetRecorder()
    loop = FleetLoop("cm-fleet", fleet.spec(CONFIGMAPS), registry.clients, management=api)
    await registry.register_cluster_handler(per_cluster)
    await registry.register_cluster_handler(recorder)
    await registry.register_cluster_handler(loop)
    tasks_before = {t for t in asyncio.all_tasks()}
    runner = asyncio.create_task(loop.run())
    await registry.start()
    try:
        await put_secret(api, fleet_ns, "alpha", kubeconfig(a, tokens[0]))
        await eventually(lambda: starts.hosts() == [a.url], 30, "the controller to run in alpha")
        assert registry.list_clusters() == ["alpha"]
        assert member(registry, "alpha")["ready"]
        first = registry.cluster("alpha")
        await eventually(lambda: loop.union.clusters() == ["alpha"], 10, "alpha to join the fleet union")

        # Identical kubeconfig (a label change, say): nothing restarts.
        await put_secret(api, fleet_ns, "alpha", kubeconfig(a, tokens[0]), annotations={"touched": "yes"})
        await asyncio.sleep(1.0)
        assert starts.starts == 1 and registry.cluster("alpha") is first and len(recorder.added) == 1

        # Rotation: the new connection comes up first, then the swap, then the old one stops.
        await put_secret(api, fleet_ns, "alpha", kubeconfig(a, tokens[1]))
        await eventually(lambda: registry.cluster("alpha") is not first and starts.starts == 2, 30, "the rotation")
        assert len(starts.running) == 1 and recorder.removed == []  # a rotation is not a removal
        assert recorder.cleaned == ["alpha"]  # the old connection's context was cancelled
        # and its connections closed, after its informers have stopped (the rotation does not wait for that)
        await eventually(lambda: first.client.closed, 10, "the old connection to close")
        await eventually(lambda: loop._subs.get("alpha") is registry.cluster("alpha").factory.informers()[0].get(
            CONFIGMAPS), 10, "the fleet union to follow the new connection")
        with kube_client(a) as k:
            kubernetes.client.CoreV1Api(k).delete_namespaced_service_account("fleet-1", "default")
        await asyncio.sleep(1.0)
        assert member(registry, "alpha")["ready"], member(registry, "alpha")

        # Deleted: everything of the cluster stops.
        await delete_secret(api, fleet_ns, "alpha")
        await eventually(lambda: registry.list_clusters() == [] and not starts.running and recorder.removed == ["alpha"],
                         30, "alpha to leave")
        await eventually(lambda: member(registry, "alpha") is None, 10)
        assert loop.union.clusters() == [] and loop._subs == {}
        with pytest.raises(ClusterNotFound):
            registry.cluster("alpha")
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
        await per_cluster.stop()
        await registry.stop()
        logger.remove(sink)
    leaked = {t for t in asyncio.all_tasks() if not t.done()} - tasks_before - {asyncio.current_task()}
    assert not leaked, leaked
    text = "\n".join(log)
    for token in tokens:
        assert token not in text


async def test_deleted_while_unreachable_stops_retrying(api: ApiClient, fleet_ns: str,
                                                        workloads: tuple[ControlPlane, ControlPlane]) -> None:
    a, _ = workloads
    registry = ClusterRegistry(api, *options(api, fleet_ns), required=[CONFIGMAPS])
    await registry.start()
    try:
        await put_secret(api, fleet_ns, "nowhere", kubeconfig(a, server="https://127.0.0.1:1"))
        # Between attempts it shows "retrying"; during one, "connecting" (an attempt counts when it starts).
        await eventually(lambda: (member(registry, "nowhere") or {}).get("attempts", 0) >= 2 and
                         member(registry, "nowhere")["state"] == "retrying", 30, "two attempts, then a wait")
        state = member(registry, "nowhere")
        assert state["conditions"][0]["status"] == "False"
        await delete_secret(api, fleet_ns, "nowhere")
        await eventually(lambda: member(registry, "nowhere") is None, 10, "the member to go")
        await asyncio.sleep(0.1)
        assert not [t for t in asyncio.all_tasks() if t.get_name() == "cluster nowhere" and not t.done()]
    finally:
        await registry.stop()


async def test_conflicts_and_untrusted_kubeconfigs(api: ApiClient, fleet_ns: str, tmp_path: Path,
                                                   workloads: tuple[ControlPlane, ControlPlane]) -> None:
    a, _ = workloads
    other = f"{fleet_ns}-b"
    await api.request("POST", "/api/v1/namespaces", body={"metadata": {"name": other}})
    plugin = tmp_path / "cred-plugin"
    plugin.write_text(f"#!{sys.executable}\nimport json\nprint(json.dumps({{'apiVersion': "
                      "'client.authentication.k8s.io/v1', 'kind': 'ExecCredential', 'status': "
                      f"{{'token': {a.admin_token!r}}}}}))\n")
    plugin.chmod(0o755)
    exec_user = {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": str(plugin),
                          "interactiveMode": "Never"}}
    log: list[str] = []
    sink = logger.add(lambda m: log.append(str(m)), level="DEBUG")
    registry = ClusterRegistry(api, secrets(api, fleet_ns, other),
                               MemberOptions(sync_timeout=20, allowed_exec_commands=(str(plugin),)), required=[CONFIGMAPS])
    await registry.start()
    try:
        await put_secret(api, fleet_ns, "same", kubeconfig(a))
        await eventually(lambda: registry.list_clusters() == ["same"], 30)
        await put_secret(api, other, "same", kubeconfig(a))
        await eventually(lambda: len(registry.status()["conflicts"]) == 1, 10, "the conflict")
        conflict = registry.status()["conflicts"][0]
        assert conflict["secret"] == f"{other}/same" and f"{fleet_ns}/same" in conflict["message"]
        assert registry.list_clusters() == ["same"]

        refused = {"tokenfile": {"tokenFile": "/var/run/secrets/kubernetes.io/serviceaccount/token"},
                   "authprovider": {"auth-provider": {"name": "oidc", "config": {}}},
                   "certfile": {"client-certificate": "/etc/passwd", "client-key": "/etc/passwd"},
                   "exec-other": {"exec": {**exec_user["exec"], "command": "/bin/sh"}}}
        for name, user in refused.items():
            await put_secret(api, fleet_ns, name, kubeconfig(a, user=user))
        await put_secret(api, fleet_ns, "exec-allowed", kubeconfig(a, user=exec_user))
        await put_secret(api, fleet_ns, "garbage", b"{not: [valid")
        for name in (*refused, "garbage"):
            await eventually(lambda: (member(registry, name) or {}).get("state") == "refused", 10, f"{name} refused")
            message = member(registry, name)["conditions"][0]["message"]
            assert f"secret {fleet_ns}/{name}" in message, message
        assert "clusters.allowed_exec_commands" in member(registry, "exec-other")["conditions"][0]["message"]
        await eventually(lambda: "exec-allowed" in registry.list_clusters(), 30, "the allowed exec plugin")
        # The name is free again once its holder goes: the other namespace's secret takes it.
        await delete_secret(api, fleet_ns, "same")
        await eventually(lambda: (member(registry, "same") or {}).get("source") == f"secret {other}/same", 30)
    finally:
        await registry.stop()
        logger.remove(sink)
        await api.request("DELETE", f"/api/v1/namespaces/{other}")
    assert a.admin_token not in "\n".join(log)


async def test_crd_in_one_cluster_then_another(api: ApiClient, fleet_ns: str,
                                               workloads: tuple[ControlPlane, ControlPlane]) -> None:
    a, b = workloads
    starts = Starts(GADGETS)
    fleet = FleetRecorder()
    registry = ClusterRegistry(api, *options(api, fleet_ns), required=[GADGETS])
    per_cluster = ClusterControllers({"gadgets": starts.spec()}, name="t")
    loop = FleetLoop("gadget-fleet", fleet.spec(GADGETS), registry.clients, management=api)
    await registry.register_cluster_handler(per_cluster)
    await registry.register_cluster_handler(loop)
    runner = asyncio.create_task(loop.run())
    await registry.start()
    clients = {cp.url: kube_client(cp) for cp in (a, b)}
    try:
        await put_secret(api, fleet_ns, "a", kubeconfig(a))
        await put_secret(api, fleet_ns, "b", kubeconfig(b))
        await eventually(lambda: registry.list_clusters() == ["a", "b"], 30)
        assert starts.hosts() == []  # nobody serves gadgets yet
        create_crd(clients[a.url], "fleet.example.com", "gadgets", "Gadget")
        wait_established(clients[a.url], "gadgets.fleet.example.com")
        objects = kubernetes.client.CustomObjectsApi(clients[a.url])
        objects.create_namespaced_custom_object("fleet.example.com", "v1", "default", "gadgets",
                                                {"apiVersion": "fleet.example.com/v1", "kind": "Gadget",
                                                 "metadata": {"name": "g1"}})
        await eventually(lambda: starts.hosts() == [a.url], 30, "the controller in a only")
        await eventually(lambda: ("a", "default/g1") in fleet.seen, 30, "the fleet to see a's gadget")
        assert loop.union.clusters() == ["a"]

        create_crd(clients[b.url], "fleet.example.com", "gadgets", "Gadget")
        wait_established(clients[b.url], "gadgets.fleet.example.com")
        await eventually(lambda: starts.hosts() == sorted([a.url, b.url]), 30, "b to join")
        await eventually(lambda: loop.union.clusters() == ["a", "b"], 30)

        objects.delete_namespaced_custom_object("fleet.example.com", "v1", "default", "gadgets", "g1")
        await eventually(lambda: ("a", "default/g1") in fleet.deleted, 30, "the deletion")
        kubernetes.client.ApiextensionsV1Api(clients[a.url]).delete_custom_resource_definition(
            "gadgets.fleet.example.com")
        await eventually(lambda: starts.hosts() == [b.url], 60, "a's controller to stop")
        await eventually(lambda: loop.union.clusters() == ["b"], 30, "a's sub to leave")
        assert member(registry, "b")["ready"]
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
        await per_cluster.stop()
        await registry.stop()
        for k in clients.values():
            k.close()
        with kube_client(b) as k:
            try:
                kubernetes.client.ApiextensionsV1Api(k).delete_custom_resource_definition("gadgets.fleet.example.com")
            except kubernetes.client.ApiException:
                pass


async def test_one_workload_down_only_it_goes_not_ready(api: ApiClient, fleet_ns: str,
                                                        control_plane_factory: Any) -> None:
    down = control_plane_factory()
    up = control_plane_factory()
    starts = Starts(CONFIGMAPS)
    registry = ClusterRegistry(api, *options(api, fleet_ns), required=[CONFIGMAPS])
    per_cluster = ClusterControllers({"cm": starts.spec()}, name="t")
    await registry.register_cluster_handler(per_cluster)
    await registry.start()
    try:
        await put_secret(api, fleet_ns, "down", kubeconfig(down))
        await put_secret(api, fleet_ns, "up", kubeconfig(up))
        await eventually(lambda: len(starts.running) == 2 and member(registry, "down")["ready"] and
                         member(registry, "up")["ready"], 30, "both up")
        await asyncio.to_thread(down.stop_apiserver)
        await eventually(lambda: not member(registry, "down")["ready"], 30, "down to go not-ready")
        assert member(registry, "up")["ready"]
        assert len(starts.running) == 2  # its controllers keep their caches and wait for it
        await asyncio.to_thread(down.start_apiserver)
        await eventually(lambda: member(registry, "down")["ready"], 60, "down to recover")
    finally:
        await per_cluster.stop()
        await registry.stop()


async def test_many_add_remove_cycles_leak_nothing(api: ApiClient, fleet_ns: str,
                                                   workloads: tuple[ControlPlane, ControlPlane]) -> None:
    a, _ = workloads
    recorder = Recorder()
    starts = Starts(CONFIGMAPS)
    registry = ClusterRegistry(api, *options(api, fleet_ns), required=[CONFIGMAPS])
    per_cluster = ClusterControllers({"cm": starts.spec()}, name="t")
    await registry.register_cluster_handler(per_cluster)
    await registry.register_cluster_handler(recorder)
    await registry.start()
    data = kubeconfig(a)

    def rss() -> int:
        return int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def connections() -> int:
        return len(os.listdir("/proc/self/fd"))

    try:
        baseline_tasks = baseline_fds = baseline_rss = 0
        for i in range(100):
            await put_secret(api, fleet_ns, "churn", data)
            await eventually(lambda: len(starts.running) == 1, 30, f"cycle {i} up")
            await delete_secret(api, fleet_ns, "churn")
            await eventually(lambda: not starts.running and member(registry, "churn") is None, 30, f"cycle {i} down")
            if i == 9:
                await asyncio.sleep(0.2)
                gc.collect()
                baseline_tasks, baseline_fds, baseline_rss = len(asyncio.all_tasks()), connections(), rss()
        await asyncio.sleep(0.2)
        gc.collect()
        assert len(recorder.added) == 100 and len(recorder.removed) == 100 and len(recorder.cleaned) == 100
        assert len(asyncio.all_tasks()) <= baseline_tasks
        assert connections() <= baseline_fds + 2
        assert rss() < baseline_rss + 20 * 2**20, (rss() - baseline_rss) / 2**20
    finally:
        await per_cluster.stop()
        await registry.stop()


async def test_fifty_members_against_one_apiserver(api: ApiClient, fleet_ns: str,
                                                   workloads: tuple[ControlPlane, ControlPlane]) -> None:
    a, _ = workloads
    starts = Starts(CONFIGMAPS)
    registry = ClusterRegistry(api, *options(api, fleet_ns, sync_timeout=60.0), required=[CONFIGMAPS])
    per_cluster = ClusterControllers({"cm": starts.spec()}, name="t")
    await registry.register_cluster_handler(per_cluster)
    tasks_before = len(asyncio.all_tasks())
    await registry.start()
    names = [f"m{i:02d}" for i in range(50)]
    try:
        data = kubeconfig(a)
        await asyncio.gather(*(put_secret(api, fleet_ns, n, data) for n in names))
        await eventually(lambda: registry.list_clusters() == names and len(starts.running) == 50, 60, "50 members")
        assert all(c["ready"] for c in registry.status()["clusters"])
        await asyncio.gather(*(delete_secret(api, fleet_ns, n) for n in names))
        await eventually(lambda: registry.status()["clusters"] == [] and not starts.running, 60, "all gone")
    finally:
        await per_cluster.stop()
        await registry.stop()
    await asyncio.sleep(0.1)
    assert len(asyncio.all_tasks()) <= tasks_before


async def test_a_contested_name_goes_to_the_oldest_secret_across_restarts(
        api: ApiClient, fleet_ns: str, workloads: tuple[ControlPlane, ControlPlane]) -> None:
    """Issue 21 item 8: ns1/east (cluster A), ns2/east (B, a conflict); ns1/east deleted (B takes east) and
    recreated (a conflict, B holds); a restart must not hand east back to A. Then an older Secret that starts
    naming a cluster takes it over, as a rotation."""
    a, b = workloads
    ns1, ns2 = fleet_ns, f"{fleet_ns}-2"
    await api.request("POST", "/api/v1/namespaces", body={"metadata": {"name": ns2}})
    opts = MemberOptions(sync_timeout=20.0, probe_interval=3600)

    def host(registry: ClusterRegistry, name: str) -> str | None:
        try:
            return registry.cluster(name).client.host
        except ClusterNotFound:
            return None

    def conflicts(registry: ClusterRegistry) -> set[str]:
        return {c["secret"] for c in registry.status()["conflicts"]}

    registry = ClusterRegistry(api, secrets(api, ns1, ns2), opts, required=[CONFIGMAPS])
    await registry.start()
    try:
        await put_secret(api, ns1, "east", kubeconfig(a))
        await eventually(lambda: host(registry, "east") == a.url, 30, "east on A")
        await put_secret(api, ns2, "east", kubeconfig(b))
        await eventually(lambda: conflicts(registry) == {f"{ns2}/east"}, 10, "ns2/east's conflict")
        assert host(registry, "east") == a.url
        await delete_secret(api, ns1, "east")
        await eventually(lambda: host(registry, "east") == b.url and not conflicts(registry), 30, "B to take east")
        b_created = await created(api, ns2, "east")
        await eventually(lambda: past(b_created), 5, "a second younger than ns2/east")
        await put_secret(api, ns1, "east", kubeconfig(a))
        assert await created(api, ns1, "east") > b_created
        await eventually(lambda: conflicts(registry) == {f"{ns1}/east"}, 10, "the recreated ns1/east's conflict")
        assert host(registry, "east") == b.url

        await registry.stop()  # the restart
        registry = ClusterRegistry(api, secrets(api, ns1, ns2), opts, required=[CONFIGMAPS])
        recorder = Recorder()
        await registry.register_cluster_handler(recorder)
        await registry.start()
        await eventually(lambda: host(registry, "east") is not None, 30, "east after the restart")
        assert host(registry, "east") == b.url, "after a restart east points at the younger Secret's cluster"
        assert member(registry, "east")["source"] == f"secret {ns2}/east"
        assert conflicts(registry) == {f"{ns1}/east"}

        # An older Secret that starts naming a cluster (here: labelled later) takes it: a rotation.
        await put_secret(api, ns1, "west", kubeconfig(a), labels={"unselected": "yes"})
        a_created = await created(api, ns1, "west")
        await eventually(lambda: past(a_created), 5, "a second younger than ns1/west")
        await put_secret(api, ns2, "west", kubeconfig(b))
        await eventually(lambda: host(registry, "west") == b.url, 30, "west on B")
        await put_secret(api, ns1, "west", kubeconfig(a))  # now labelled: selected, and the oldest
        await eventually(lambda: host(registry, "west") == a.url, 30, "west rotated to A")
        assert conflicts(registry) == {f"{ns1}/east", f"{ns2}/west"}
        # Nothing was ever connected to A under east after the restart, not even for a moment.
        assert [(name, c.client.host) for name, c in recorder.added] == [("east", b.url), ("west", b.url),
                                                                         ("west", a.url)]
        assert recorder.removed == []
    finally:
        await registry.stop()
        await api.request("DELETE", f"/api/v1/namespaces/{ns2}")


@pytest.mark.parametrize("probe_interval", [3600.0, 5.0], ids=["watches-only", "after-a-probe-failure"])
async def test_readiness_follows_the_watches(api: ApiClient, fleet_ns: str, control_plane_factory: Any,
                                             probe_interval: float) -> None:
    """Issue 21 item 8: a member whose apiserver goes away is not Connected (and not ready) as soon as its watches
    fail, and is again as soon as they watch again, not at the next /version probe: with the probe too rare to
    play a part, and after the probe has failed during the outage. ``state`` never says ready while ``ready`` is
    false."""
    down = control_plane_factory()
    starts = Starts(CONFIGMAPS)
    registry = ClusterRegistry(api, *options(api, fleet_ns, probe_interval=probe_interval), required=[CONFIGMAPS])
    per_cluster = ClusterControllers({"cm": starts.spec()}, name="t")
    await registry.register_cluster_handler(per_cluster)
    await registry.start()
    shown: list[tuple[str, bool]] = []

    def sample() -> tuple[str, bool, str]:
        m = member(registry, "down") or {"state": "", "ready": False, "conditions": [{"status": "Unknown"}]}
        shown.append((m["state"], m["ready"]))
        return m["state"], m["ready"], m["conditions"][0]["status"]

    def watching() -> bool:
        informer = registry.cluster("down").factory.informers()[0].get(CONFIGMAPS)
        return informer is not None and informer.last_error is None

    try:
        await put_secret(api, fleet_ns, "down", kubeconfig(down))
        await eventually(lambda: sample() == ("ready", True, "True") and len(starts.running) == 1, 30, "ready")
        await asyncio.to_thread(down.stop_apiserver)
        await eventually(lambda: sample() == ("degraded", False, "False"), 30, "not Connected, not ready")
        if probe_interval < 60:
            await eventually(lambda: registry._members["down"].probe_failed_at is not None, 2 * probe_interval + 10,
                             "the probe to fail during the outage")
        await asyncio.to_thread(down.start_apiserver)
        back = time.monotonic()
        await eventually(watching, 30, "the watches to work again")
        watch_seconds = time.monotonic() - back
        # The member's own task sets it on the watch's recovery (a read changes nothing): a loop turn or two later,
        # never the next probe.
        await eventually(lambda: sample()[2] == "True", 2, "Connected as soon as the watches work")
        await eventually(lambda: sample() == ("ready", True, "True"), 30, "ready again")
        print(f"watching again {watch_seconds:.1f}s, ready {time.monotonic() - back:.1f}s after the apiserver")
        assert len(starts.running) == 1
        assert all((state == "ready") == ready for state, ready in shown), sorted(set(shown))
    finally:
        await per_cluster.stop()
        await registry.stop()
