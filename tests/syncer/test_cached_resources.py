"""Cached resource replication end to end (real control planes: the management plane is the cache, workload planes
are the sources): the root controller's status and phases, CRD-following children, the delete flow (also with the
source CRD gone first), the one-per-GVR admission rule, and the plugin's settings."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any, AsyncIterator

import kubernetes
import pytest

from controllers.cluster_registry import ClusterRegistry
from controllers.fleet import FleetScope
from informers import GVR, ApiClient, DiscoveringDynamicSharedInformerFactory, DiscoveryOptions
from syncer.builtin import cached_resources
from syncer.builtin.cached_resources.admission import one_per_gvr
from syncer.builtin.cached_resources.naming import CACHED_OBJECTS, CLUSTER_CACHED_RESOURCES, schema_selector
from syncer.builtin.cached_resources.root import CachedResources, Options, install_crds
from syncer.testing import ControlPlane
from syncer.testing.pytest_plugin import kube_client
from syncer.webhook import Allow, Deny
from syncer.webhook.review import parse_review

from tests.cached_resources import get_ccr
from tests.fleet import kubeconfig, options, put_secret
from tests.helpers import CONFIGMAPS, eventually, fresh_namespace
from tests.kube import create_crd, wait_established
from tests.proxy import Proxy

GADGETS = GVR("cache-test.example.com", "v1", "gadgets")


@pytest.fixture
async def fleet_ns(api: ApiClient) -> AsyncIterator[str]:
    async with fresh_namespace(api, "cache") as name:
        yield name


class Running:
    """The registry and the root controller, as the sidecar runs them for a term."""

    def __init__(self, api: ApiClient, ns: str, **kw: Any) -> None:
        self.api = api
        self.registry = ClusterRegistry(api, *options(api, ns), required=[])
        self.factory = DiscoveringDynamicSharedInformerFactory(api, DiscoveryOptions(watch="required"))
        self.component = CachedResources(Options(identity_namespace=ns, **kw))
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> "Running":
        await self.factory.start()
        await self.registry.start()
        self.task = asyncio.create_task(self.component.run(FleetScope(self.registry, self.api, self.factory,
                                                                      _open())))
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.task is not None
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)
        await self.registry.stop()
        await self.factory.shutdown()


def _open() -> Any:
    from controllers.fence import OPEN
    return OPEN


async def ccr(api: ApiClient, name: str, gvr: GVR, selector: dict[str, Any] | None = None) -> None:
    await api.request("POST", CLUSTER_CACHED_RESOURCES.path(), body={
        "apiVersion": "cache.kcp.io/v1alpha1", "kind": "ClusterCachedResource", "metadata": {"name": name},
        "spec": {"group": gvr.group, "version": gvr.version, "resource": gvr.resource,
                 **({"labelSelector": selector} if selector else {})}})


async def wrappers(api: ApiClient, gvr: GVR, cluster: str | None = None) -> list[dict[str, Any]]:
    out = await api.request("GET", CACHED_OBJECTS.path(), {"labelSelector": schema_selector(gvr, cluster)})
    return list(out["items"])


async def test_replication_status_and_delete_flow(api: ApiClient, fleet_ns: str, admin_client: Any,
                                                  control_plane_factory: Any) -> None:
    source = control_plane_factory()
    await install_crds(api)
    wait_established(admin_client, "clustercachedresources.cache.kcp.io")
    wait_established(admin_client, "cachedobjects.cache.kcp.io")
    async with Running(api, fleet_ns):
        await put_secret(api, fleet_ns, "src", kubeconfig(source))
        with kube_client(source) as k:
            core = kubernetes.client.CoreV1Api(k)
            for i in range(3):
                core.create_namespaced_config_map("default", {"metadata": {"name": f"cm-{i}",
                                                                           "labels": {"cache": "yes"}}})
            core.create_namespaced_config_map("default", {"metadata": {"name": "other"}})
        await ccr(api, "configmaps", CONFIGMAPS, {"matchLabels": {"cache": "yes"}})

        async def ready() -> bool:
            obj = await get_ccr(api, "configmaps")
            status = (obj or {}).get("status") or {}
            return status.get("phase") == "Ready" and status.get("resourceCounts") == {"local": 3, "cache": 3}

        await eventually(ready, 60, "the ClusterCachedResource to be Ready with 3 objects")
        obj = await get_ccr(api, "configmaps")
        assert obj is not None
        assert obj["metadata"]["annotations"]["cache.kcp.io/resource-kind"] == "ConfigMap"
        assert obj["metadata"]["annotations"]["cache.kcp.io/resource-scope"] == "Namespaced"
        assert "cache.kcp.io/clustercachedresource" in obj["metadata"]["finalizers"]
        assert len(obj["status"]["identityHash"]) == 64
        assert {c["type"]: c["status"] for c in obj["status"]["conditions"]} == {
            "IdentityValid": "True", "ReplicationStarted": "True", "ResourceValid": "True", "SourcesReachable": "True"}
        assert len(await wrappers(api, CONFIGMAPS)) == 3

        # Delete: phases in order, wrappers purged, finalizer removed, object gone.
        phases: list[str] = []

        async def gone() -> bool:
            current = await get_ccr(api, "configmaps")
            if current is not None:
                phase = (current.get("status") or {}).get("phase")
                if phase and (not phases or phases[-1] != phase):
                    phases.append(phase)
            return current is None

        await api.request("DELETE", CLUSTER_CACHED_RESOURCES.path(name="configmaps"))
        await eventually(gone, 60, "the ClusterCachedResource to go")
        assert await wrappers(api, CONFIGMAPS) == []
        assert all(p in ("Ready", "Deleting", "Deleted") for p in phases), phases


async def test_children_follow_the_source_crd_and_delete_does_not_hang_without_it(
        api: ApiClient, fleet_ns: str, admin_client: Any, control_plane_factory: Any) -> None:
    source = control_plane_factory()
    await install_crds(api)
    wait_established(admin_client, "clustercachedresources.cache.kcp.io")
    async with Running(api, fleet_ns) as running:
        await put_secret(api, fleet_ns, "src", kubeconfig(source))
        await ccr(api, "gadgets", GADGETS)

        async def condition(type_: str) -> str:
            obj = await get_ccr(api, "gadgets") or {}
            return next((c["status"] for c in (obj.get("status") or {}).get("conditions") or ()
                         if c["type"] == type_), "")

        await eventually(lambda: condition("ResourceValid"), 30)
        assert await condition("ResourceValid") == "False"  # not served anywhere yet
        with kube_client(source) as k:
            create_crd(k, "cache-test.example.com", "gadgets", "Gadget")
            wait_established(k, "gadgets.cache-test.example.com")
            objects = kubernetes.client.CustomObjectsApi(k)
            objects.create_namespaced_custom_object("cache-test.example.com", "v1", "default", "gadgets", {
                "apiVersion": "cache-test.example.com/v1", "kind": "Gadget", "metadata": {"name": "g1"}})
        await eventually(lambda: _count(api, GADGETS, 1), 60, "the gadget to be replicated")
        replication = running.component._children["gadgets"].replication
        assert replication._loop.union.clusters() == ["src"]
        with kube_client(source) as k:
            kubernetes.client.ApiextensionsV1Api(k).delete_custom_resource_definition("gadgets.cache-test.example.com")
        # The child's source informer goes with the CRD...
        await eventually(lambda: replication._loop.union.clusters() == [], 60, "the source informer to leave")
        with kube_client(source) as k:  # ...and comes back with it: replication resumes
            create_crd(k, "cache-test.example.com", "gadgets", "Gadget")
            wait_established(k, "gadgets.cache-test.example.com")
            kubernetes.client.CustomObjectsApi(k).create_namespaced_custom_object(
                "cache-test.example.com", "v1", "default", "gadgets",
                {"apiVersion": "cache-test.example.com/v1", "kind": "Gadget", "metadata": {"name": "g2"}})
        await eventually(lambda: _names(api, GADGETS, ["src.v1.gadgets.cache-test.example.com.default.g2"]), 60,
                         "replication to resume with the recreated CRD")
        with kube_client(source) as k:
            kubernetes.client.ApiextensionsV1Api(k).delete_custom_resource_definition("gadgets.cache-test.example.com")
        await asyncio.sleep(2)
        await api.request("DELETE", CLUSTER_CACHED_RESOURCES.path(name="gadgets"))
        await eventually(lambda: _absent(api, "gadgets"), 60, "the delete flow without the source CRD")
        assert await wrappers(api, GADGETS) == []


async def _count(api: ApiClient, gvr: GVR, n: int) -> bool:
    return len(await wrappers(api, gvr)) == n


async def _names(api: ApiClient, gvr: GVR, expected: list[str]) -> bool:
    return sorted(w["metadata"]["name"] for w in await wrappers(api, gvr)) == expected


async def _absent(api: ApiClient, name: str) -> bool:
    return await get_ccr(api, name) is None


async def test_one_cluster_cached_resource_per_gvr(api: ApiClient, admin_client: Any) -> None:
    await install_crds(api)
    wait_established(admin_client, "clustercachedresources.cache.kcp.io")
    name = f"one-{uuid.uuid4().hex[:6]}"
    await ccr(api, name, GVR("one.example.com", "v1", "things"))
    try:
        def review(obj_name: str, group: str) -> Any:
            return parse_review(json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
                "uid": "u", "operation": "CREATE", "name": obj_name, "namespace": "",
                "resource": {"group": "cache.kcp.io", "version": "v1alpha1", "resource": "clustercachedresources"},
                "kind": {"group": "cache.kcp.io", "version": "v1alpha1", "kind": "ClusterCachedResource"},
                "userInfo": {}, "object": {"metadata": {"name": obj_name},
                                           "spec": {"group": group, "version": "v1", "resource": "things"}}}}))

        denied = await one_per_gvr(review("second", "one.example.com"), api)
        assert isinstance(denied, Deny) and name in denied.message and "at most one" in denied.message
        assert isinstance(await one_per_gvr(review(name, "one.example.com"), api), Allow)  # re-apply of itself
        assert isinstance(await one_per_gvr(review("third", "two.example.com"), api), Allow)
    finally:
        await api.request("DELETE", CLUSTER_CACHED_RESOURCES.path(name=name))


def test_plugin_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="sources must be a list"):
        cached_resources.options({"sources": "east"})
    with pytest.raises(ValueError, match="unknown setting"):
        cached_resources.options({"sourcez": []})
    (component,) = cached_resources.syncer_fleet_components({"sources": ["east"]})
    assert component.name == "cached-resources"
    (hook,) = cached_resources.syncer_webhooks({})
    assert hook.name == "validate.clustercachedresources.cache.kcp.io"


# -- issue 21 ------------------------------------------------------------------------------------------------
WIDGETS = GVR("cache-test.example.com", "v1", "widgets")


async def condition_of(api: ApiClient, name: str, type_: str) -> dict[str, Any]:
    obj = await get_ccr(api, name) or {}
    return next((c for c in (obj.get("status") or {}).get("conditions") or () if c["type"] == type_), {})


async def create_objects(plane: ControlPlane, gvr: GVR, kind: str, count: int,
                         labels: dict[str, str] | None = None) -> None:
    async with ApiClient.from_kubeconfig(str(plane.kubeconfig)) as client:
        gate = asyncio.Semaphore(16)

        async def one(i: int) -> None:
            async with gate:
                await client.request("POST", gvr.path("default"), body={
                    "apiVersion": gvr.group_version, "kind": kind,
                    "metadata": {"name": f"{gvr.resource[:-1]}-{i}", "labels": labels or {}}})

        await asyncio.gather(*(one(i) for i in range(count)))


async def ready_with(api: ApiClient, name: str, local: int, cache: int) -> bool:
    status = ((await get_ccr(api, name)) or {}).get("status") or {}
    return status.get("phase") == "Ready" and status.get("resourceCounts") == {"local": local, "cache": cache}


def install_crd(plane: ControlPlane, gvr: GVR, kind: str) -> None:
    with kube_client(plane) as k:
        create_crd(k, gvr.group, gvr.resource, kind)
        wait_established(k, f"{gvr.resource}.{gvr.group}")


async def test_wrappers_go_with_a_source_that_stops_serving_or_leaves_and_stay_while_it_is_unreachable(
        api: ApiClient, fleet_ns: str, admin_client: Any, control_plane_factory: Any) -> None:
    """Widgets from two sources. East's CRD deleted (its 100 widgets with it): east's wrappers go, although the
    replication drops east's queued deletes as east leaves it. West cut off: its wrappers stay and the condition
    says it is unreachable; west back, then its Secret deleted: its wrappers go."""
    east, west = await asyncio.gather(*(asyncio.to_thread(control_plane_factory) for _ in range(2)))
    await install_crds(api)
    wait_established(admin_client, "clustercachedresources.cache.kcp.io")
    for plane in (east, west):
        install_crd(plane, WIDGETS, "Widget")
    await asyncio.gather(create_objects(east, WIDGETS, "Widget", 100), create_objects(west, WIDGETS, "Widget", 30))
    proxy = await Proxy(west.port).start()
    try:
        async with Running(api, fleet_ns):
            try:
                await put_secret(api, fleet_ns, "east", kubeconfig(east))
                await put_secret(api, fleet_ns, "west", kubeconfig(west, server=f"https://127.0.0.1:{proxy.port}"))
                await ccr(api, "widgets", WIDGETS)

                await eventually(lambda: ready_with(api, "widgets", 130, 130), 90, "130 widgets replicated")
                with kube_client(east) as k:
                    kubernetes.client.ApiextensionsV1Api(k).delete_custom_resource_definition(
                        f"{WIDGETS.resource}.{WIDGETS.group}")
                await eventually(lambda: _count(api, WIDGETS, 30), 30, "east's wrappers to go with its CRD")
                assert len(await wrappers(api, WIDGETS, "west")) == 30
                await eventually(lambda: ready_with(api, "widgets", 30, 30), 30, "the counts to follow")
                reachable = await condition_of(api, "widgets", "SourcesReachable")
                assert reachable["status"] == "True", reachable
                assert f"not serving {WIDGETS} (their cached objects are removed): east" in reachable["message"], \
                    reachable

                # West stops answering: it may still hold its widgets, so its wrappers stay, and the condition says so.
                proxy.refuse = True
                proxy.cut()

                async def unreachable() -> bool:
                    c = await condition_of(api, "widgets", "SourcesReachable")
                    return c.get("status") == "False" and c.get("reason") == "Unreachable" and "west" in c["message"]

                await eventually(unreachable, 30, "SourcesReachable=False naming west")
                assert len(await wrappers(api, WIDGETS, "west")) == 30
                proxy.refuse = False
                await eventually(lambda: _condition_is(api, "widgets", "SourcesReachable", "True"), 30,
                                 "west to answer again")
                assert len(await wrappers(api, WIDGETS, "west")) == 30

                # West leaves the fleet: its wrappers go.
                await api.request("DELETE", f"/api/v1/namespaces/{fleet_ns}/secrets/west")
                await eventually(lambda: _count(api, WIDGETS, 0), 30, "west's wrappers to go with its Secret")
            finally:
                await api.request("DELETE", CLUSTER_CACHED_RESOURCES.path(name="widgets"))
                await eventually(lambda: _absent(api, "widgets"), 30, "widgets to go")
    finally:
        await proxy.stop()


async def test_wrappers_of_a_source_whose_crd_went_while_nobody_replicated_are_removed(
        api: ApiClient, fleet_ns: str, admin_client: Any, control_plane_factory: Any) -> None:
    """The CRD deleted on a source while the syncer is down: that source never joins the replication again, and
    its wrappers still go once the syncer is back."""
    source = control_plane_factory()
    gvr = GVR("cache-test.example.com", "v1", "sprockets")
    install_crd(source, gvr, "Sprocket")
    await create_objects(source, gvr, "Sprocket", 10)
    await install_crds(api)
    wait_established(admin_client, "clustercachedresources.cache.kcp.io")
    await put_secret(api, fleet_ns, "src", kubeconfig(source))
    async with Running(api, fleet_ns):
        await ccr(api, "sprockets", gvr)
        await eventually(lambda: ready_with(api, "sprockets", 10, 10), 60, "10 sprockets replicated")
    with kube_client(source) as k:
        kubernetes.client.ApiextensionsV1Api(k).delete_custom_resource_definition(f"{gvr.resource}.{gvr.group}")
    async with Running(api, fleet_ns):
        try:
            await eventually(lambda: _count(api, gvr, 0), 30, "the wrappers of the CRD that went meanwhile to go")
        finally:
            await api.request("DELETE", CLUSTER_CACHED_RESOURCES.path(name="sprockets"))
            await eventually(lambda: _absent(api, "sprockets"), 30, "sprockets to go")


async def _condition_is(api: ApiClient, name: str, type_: str, status: str) -> bool:
    return (await condition_of(api, name, type_)).get("status") == status


async def test_a_resource_served_nowhere_is_not_ready(api: ApiClient, fleet_ns: str, admin_client: Any) -> None:
    await install_crds(api)
    wait_established(admin_client, "clustercachedresources.cache.kcp.io")
    name = f"nowhere-{uuid.uuid4().hex[:6]}"
    async with Running(api, fleet_ns):
        await ccr(api, name, GVR("nowhere.example.com", "v1", "things"))
        try:
            # Its replication runs (and has synced: there is nothing to sync), but over nothing.
            await eventually(lambda: _condition_is(api, name, "ReplicationStarted", "True"), 30,
                             "the replication to start")
            obj = await get_ccr(api, name)
            assert obj is not None
            assert (await condition_of(api, name, "ResourceValid"))["status"] == "False"
            assert obj["status"]["phase"] == "Initializing", obj["status"]
        finally:
            await api.request("DELETE", CLUSTER_CACHED_RESOURCES.path(name=name))
            await eventually(lambda: _absent(api, name), 30, f"{name} to go")


DUPS = GVR("cache-test.example.com", "v1", "dups")


async def test_duplicates_for_one_gvr_the_oldest_replicates_the_others_conflict(
        api: ApiClient, fleet_ns: str, admin_client: Any, control_plane_factory: Any) -> None:
    """Two ClusterCachedResources for one GVR (as two racing creates leave them; no webhook here): the oldest
    replicates, the other shows Conflict naming it and writes nothing; deleting the winner promotes the other."""
    source = control_plane_factory()
    install_crd(source, DUPS, "Dup")
    await create_objects(source, DUPS, "Dup", 5)
    await install_crds(api)
    wait_established(admin_client, "clustercachedresources.cache.kcp.io")
    async with Running(api, fleet_ns):
        await put_secret(api, fleet_ns, "src", kubeconfig(source))
        await asyncio.gather(ccr(api, "dups-b", DUPS), ccr(api, "dups-a", DUPS))
        stamps = {}
        for name in ("dups-a", "dups-b"):
            obj = await get_ccr(api, name)
            assert obj is not None
            stamps[name] = (obj["metadata"]["creationTimestamp"], name)
        winner, loser = sorted(stamps, key=stamps.__getitem__)
        try:
            async def settled(winner: str, loser: str) -> bool:
                w, lo = await get_ccr(api, winner) or {}, await get_ccr(api, loser) or {}
                ws, ls = w.get("status") or {}, lo.get("status") or {}
                hashes = {(x["metadata"].get("annotations") or {}).get("cache.kcp.io/identity-hash")
                          for x in await wrappers(api, DUPS)}
                return (ws.get("phase") == "Ready" and ws.get("resourceCounts") == {"local": 5, "cache": 5}
                        and ls.get("phase") == "Conflict" and hashes == {ws.get("identityHash")})

            await eventually(lambda: settled(winner, loser), 60, f"{winner} Ready, {loser} Conflict")
            conflict = await condition_of(api, loser, "ResourceValid")
            assert conflict["status"] == "False" and conflict["reason"] == "Conflict", conflict
            assert repr(winner) in conflict["message"], conflict
            lo = await get_ccr(api, loser)
            assert lo is not None and "cache.kcp.io/clustercachedresource" in lo["metadata"]["finalizers"]

            # The winner goes (its delete flow purges its wrappers): the other takes over and replicates anew.
            await api.request("DELETE", CLUSTER_CACHED_RESOURCES.path(name=winner))
            await eventually(lambda: _absent(api, winner), 30, f"{winner} to go")

            async def promoted() -> bool:
                status = (await get_ccr(api, loser) or {}).get("status") or {}
                hashes = {(x["metadata"].get("annotations") or {}).get("cache.kcp.io/identity-hash")
                          for x in await wrappers(api, DUPS)}
                return (status.get("phase") == "Ready" and status.get("resourceCounts") == {"local": 5, "cache": 5}
                        and hashes == {status.get("identityHash")})

            await eventually(promoted, 60, f"{loser} to take over")
        finally:
            for name in (winner, loser):
                if await get_ccr(api, name) is not None:
                    await api.request("DELETE", CLUSTER_CACHED_RESOURCES.path(name=name))
            await eventually(lambda: _absent(api, winner), 30, f"{winner} to go")
            await eventually(lambda: _absent(api, loser), 30, f"{loser} to go")
        assert await wrappers(api, DUPS) == []


async def test_the_webhook_judges_only_changes_of_the_gvr(api: ApiClient, admin_client: Any) -> None:
    """With two for one GVR already there (admitted together), updates of either that keep the GVR (a finalizer
    added, a label, the selector) are admitted; a create or a change of the GVR to a taken one is not."""
    await install_crds(api)
    wait_established(admin_client, "clustercachedresources.cache.kcp.io")
    group = f"judge-{uuid.uuid4().hex[:6]}.example.com"
    await ccr(api, "judge-a", GVR(group, "v1", "things"))
    await ccr(api, "judge-b", GVR(group, "v1", "things"))
    try:
        def review(operation: str, spec_group: str, old_group: str | None) -> Any:
            def obj(g: str, **meta: Any) -> dict[str, Any]:
                return {"metadata": {"name": "judge-b", **meta}, "spec": {"group": g, "version": "v1",
                                                                           "resource": "things"}}
            return parse_review(json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                            "request": {
                "uid": "u", "operation": operation, "name": "judge-b", "namespace": "",
                "resource": {"group": "cache.kcp.io", "version": "v1alpha1", "resource": "clustercachedresources"},
                "kind": {"group": "cache.kcp.io", "version": "v1alpha1", "kind": "ClusterCachedResource"},
                "userInfo": {}, "object": obj(spec_group, finalizers=["cache.kcp.io/clustercachedresource"]),
                "oldObject": obj(old_group) if old_group is not None else None}}))

        assert isinstance(await one_per_gvr(review("UPDATE", group, group), api), Allow)  # its finalizer
        denied = await one_per_gvr(review("UPDATE", group, "elsewhere.example.com"), api)  # moving onto a taken GVR
        assert isinstance(denied, Deny) and "'judge-a'" in denied.message, denied
        assert isinstance(await one_per_gvr(review("UPDATE", "free.example.com", group), api), Allow)
    finally:
        for name in ("judge-a", "judge-b"):
            await api.request("DELETE", CLUSTER_CACHED_RESOURCES.path(name=name))
