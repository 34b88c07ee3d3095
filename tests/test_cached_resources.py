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
from informers import GVR, ApiClient, DiscoveringDynamicSharedInformerFactory, NotFound
from syncer.builtin import cached_resources
from syncer.builtin.cached_resources.admission import one_per_gvr
from syncer.builtin.cached_resources.naming import CACHED_OBJECTS, CLUSTER_CACHED_RESOURCES, schema_selector
from syncer.builtin.cached_resources.root import CachedResources, Options, install_crds
from syncer.testing import ControlPlane
from syncer.testing.pytest_plugin import kube_client
from syncer.webhook import Allow, Deny
from syncer.webhook.review import parse_review

from .helpers import CONFIGMAPS, eventually, fresh_namespace
from .kube import create_crd, wait_established
from .test_multicluster import kubeconfig, options, put_secret

GADGETS = GVR("cache-test.example.com", "v1", "gadgets")


@pytest.fixture
async def fleet_ns(api: ApiClient) -> AsyncIterator[str]:
    async with fresh_namespace(api, "cache") as name:
        yield name


class Running:
    """The registry and the root controller, as the sidecar runs them for a term."""

    def __init__(self, api: ApiClient, ns: str, **kw: Any) -> None:
        self.api = api
        self.registry = ClusterRegistry(api, options(ns), required=[])
        self.factory = DiscoveringDynamicSharedInformerFactory(api, watch="required")
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


async def get_ccr(api: ApiClient, name: str) -> dict[str, Any] | None:
    try:
        obj: dict[str, Any] = await api.request("GET", CLUSTER_CACHED_RESOURCES.path(name=name))
        return obj
    except NotFound:
        return None


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
            "IdentityValid": "True", "ReplicationStarted": "True", "ResourceValid": "True"}
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
