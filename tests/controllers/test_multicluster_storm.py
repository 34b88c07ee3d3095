"""A relist storm against real control planes: the API server behind 50 members (kubeconfig Secrets pointing at
one workload plane) restarts; every member comes back and converges exactly, each informer relisting at most
once, and a member on another server stays ready all along. Times are not asserted (bench/storm_bench.py)."""

from __future__ import annotations

import asyncio
from typing import Any

from controllers.cluster import Cluster, ClusterContext
from controllers.cluster_registry import ClusterRegistry
from informers import GVR, ApiClient, SharedIndexInformer
from informers.store import Obj
from syncer.testing import ControlPlane

from tests.fleet import kubeconfig, member, options, put_secret
from tests.helpers import CONFIGMAPS, cache_state, create_configmaps, eventually, server_state
from tests.kube import delete_crd, post_crd, unique_group

MEMBERS = 50


class Clusters:
    """A cluster handler that notes each engaged member's cluster."""

    def __init__(self) -> None:
        self.clusters: dict[str, Cluster] = {}

    def add_cluster(self, ctx: ClusterContext, name: str, cluster: Cluster) -> None:
        self.clusters[name] = cluster

    def remove_cluster(self, name: str) -> None:
        self.clusters.pop(name, None)


class CountingSink:
    """A reflector's sink that counts the relists (whole-list replaces) it gets."""

    def __init__(self, sink: Any) -> None:
        self.sink = sink
        self.replaced = 0

    def replace(self, objs: list[Obj], resource_version: str) -> None:
        self.replaced += 1
        self.sink.replace(objs, resource_version)

    def apply(self, event_type: str, obj: Obj) -> None:
        self.sink.apply(event_type, obj)


def informers_of(cluster: Cluster) -> list[SharedIndexInformer]:
    """Every informer of a member: its required ones and its discovery triggers'."""
    factory = cluster.factory
    return [*factory.informer_set.all().values(), *factory._meta.informers().values()]


async def test_an_apiserver_restarted_behind_50_members_converges_exactly_relisting_once(
        api: ApiClient, fleet_ns: str, control_plane: ControlPlane, control_plane_factory: Any) -> None:
    work = control_plane_factory()
    clusters = Clusters()
    # A custom resource besides ConfigMaps, so that the members' CRD trigger goes through the storm too.
    widgets = GVR(unique_group("storm"), "v1", "widgets")
    registry = ClusterRegistry(api, *options(api, fleet_ns, sync_timeout=120.0), required=[CONFIGMAPS, widgets])
    await registry.register_cluster_handler(clusters)
    await registry.start()
    names = [f"m{i:02d}" for i in range(MEMBERS)]
    flaps: list[dict[str, Any]] = []
    watching = True

    async def watch_steady() -> None:
        # The member whose server never goes down: it must stay ready throughout (/healthz does not flap).
        while watching:
            row = member(registry, "steady")
            if row is None or not row["ready"]:
                flaps.append(row or {})
            await asyncio.sleep(0.05)

    async with ApiClient.from_kubeconfig(str(work.kubeconfig)) as admin:
        await admin.request("POST", "/api/v1/namespaces", body={"metadata": {"name": "storm"}})
        await create_configmaps(admin, "storm", 30)
        await post_crd(admin, widgets.group)
        await post_crd(api, widgets.group)  # for the member on the other server
        try:
            data = kubeconfig(work)
            await asyncio.gather(*(put_secret(api, fleet_ns, n, data) for n in names))
            await put_secret(api, fleet_ns, "steady", kubeconfig(control_plane))
            await eventually(lambda: all((member(registry, n) or {}).get("ready") for n in [*names, "steady"]),
                             180, "every member ready")
            sinks: list[tuple[str, CountingSink]] = []
            for n in names:
                for inf in informers_of(clusters.clusters[n]):
                    sink = inf.reflector.sink = CountingSink(inf.reflector.sink)
                    sinks.append((f"{n} {inf.gvr}", sink))
            assert len(sinks) >= 3 * MEMBERS  # configmaps, widgets and (at least) the CRD trigger
            steady = asyncio.create_task(watch_steady())

            await asyncio.to_thread(work.stop_apiserver)
            await eventually(lambda: not any((member(registry, n) or {}).get("ready") for n in names), 60,
                             "every member of the stopped server to go not-ready")
            await asyncio.sleep(3)
            await asyncio.to_thread(work.start_apiserver)
            # changes right after the restart, while the members relist: deleted, updated and new objects
            for i in range(5):
                await admin.request("DELETE", CONFIGMAPS.path("storm", f"cm-{i}"))
                await admin.request("PATCH", CONFIGMAPS.path("storm", f"cm-{10 + i}"), body={"data": {"x": "z"}})
                await admin.request("POST", CONFIGMAPS.path("storm"), body={"metadata": {"name": f"new-{i}"}})

            async def all_converged() -> bool:
                want = await server_state(admin, CONFIGMAPS)
                return all(cache_state(clusters.clusters[n].factory.for_resource(CONFIGMAPS)[0]) == want
                           for n in names)

            await eventually(all_converged, 120, "every member's cache to match the server")
            await eventually(lambda: all((member(registry, n) or {}).get("ready") for n in names), 60,
                             "every member ready again")
            watching = False
            await steady
            relists = {name: sink.replaced for name, sink in sinks}
            assert max(relists.values()) <= 1, {k: v for k, v in relists.items() if v > 1}
            assert sum(relists.values()) >= MEMBERS  # the configmap informers at least had to relist (410)
            assert flaps == []
        finally:
            watching = False
            await registry.stop()
            await delete_crd(api, f"widgets.{widgets.group}")
