"""The Cluster API provider against a real control plane: a minimal Cluster CRD (v1beta2 and v1beta1, a status
subresource) and Secrets written as Cluster API writes them."""

from __future__ import annotations

import asyncio
import base64
from typing import Any, AsyncIterator

import pytest

from controllers.cluster_registry import ClusterRegistry
from controllers.member import MemberOptions
from controllers.provider import ClusterProvider, UntrustedKubeconfig
from controllers.providers.cluster_api import (
    ClusterAPIOptions, ClusterAPIProvider, ProviderState, control_plane_initialized,
)
from informers import GVR, ApiClient, ApiError

from syncer.testing import ControlPlane, eventually

from tests.helpers import CONFIGMAPS, HandlerLog, fresh_namespace
from tests.kube import crd_body

CRDS = GVR("apiextensions.k8s.io", "v1", "customresourcedefinitions")
CLUSTERS = GVR("cluster.x-k8s.io", "v1beta2", "clusters")
SECRETS = GVR("", "v1", "secrets")
CRD_NAME = "clusters.cluster.x-k8s.io"


async def _gone(api: ApiClient, path: str) -> bool:
    try:
        await api.request("GET", path)
    except ApiError as e:
        return e.status == 404
    return False


async def remove_crd(api: ApiClient) -> None:
    if not await _gone(api, CRDS.path(None, CRD_NAME)):
        await api.request("DELETE", CRDS.path(None, CRD_NAME))
    await eventually(lambda: _gone(api, CRDS.path(None, CRD_NAME)), 60, "the Cluster CRD to go")
    await eventually(lambda: _gone(api, f"/apis/{CLUSTERS.group}/{CLUSTERS.version}"), 30, "discovery to drop it")


async def install_crd(api: ApiClient) -> None:
    if await _gone(api, CRDS.path(None, CRD_NAME)):
        await api.request("POST", CRDS.path(None), body=crd_body("cluster.x-k8s.io", "clusters", "Cluster",
                                                                  versions=("v1beta2", "v1beta1")))

    async def established() -> bool:
        crd = await api.request("GET", CRDS.path(None, CRD_NAME))
        return any(c["type"] == "Established" and c["status"] == "True"
                   for c in (crd.get("status") or {}).get("conditions") or ())

    await eventually(established, 30, "the Cluster CRD to be established")


@pytest.fixture
async def crd(api: ApiClient) -> None:
    await install_crd(api)


async def create_cluster(api: ApiClient, namespace: str, name: str, **meta: Any) -> dict[str, Any]:
    body = {"apiVersion": "cluster.x-k8s.io/v1beta2", "kind": "Cluster",
            "metadata": {"name": name, **meta}, "spec": {}}
    result: dict[str, Any] = await api.request("POST", CLUSTERS.path(namespace), body=body)
    return result


async def create_capi_secret(api: ApiClient, namespace: str, cluster: str, data: bytes) -> None:
    """The kubeconfig Secret as Cluster API's ``util/kubeconfig`` writes it."""
    await api.request("POST", SECRETS.path(namespace), body={
        "metadata": {"name": f"{cluster}-kubeconfig", "labels": {"cluster.x-k8s.io/cluster-name": cluster}},
        "type": "cluster.x-k8s.io/secret", "data": {"value": base64.b64encode(data).decode()}})


@pytest.fixture
async def ns(api: ApiClient) -> AsyncIterator[str]:
    async with fresh_namespace(api, "capi") as ns:
        yield ns


async def started(api: ApiClient, options: ClusterAPIOptions) -> tuple[ClusterAPIProvider, list[str]]:
    provider = ClusterAPIProvider(api, options)
    changes: list[str] = []  # the names changed was called with
    await provider.start(changes.append)
    assert await provider.wait_synced(30)
    return provider, changes


async def test_waits_for_the_cluster_api_then_picks_clusters_up(api: ApiClient, ns: str) -> None:
    await remove_crd(api)
    provider, changes = await started(api, ClusterAPIOptions(namespaces=[ns], discovery_interval=0.2))
    try:
        as_protocol: ClusterProvider = provider  # it is one, statically
        assert isinstance(as_protocol, ClusterProvider)
        assert provider.state is ProviderState.NOT_INSTALLED and provider.names() == set()
        assert "not installed" in provider.status()["message"]
        await install_crd(api)
        await create_cluster(api, ns, "late")
        await create_capi_secret(api, ns, "late", b"late kubeconfig")
        await eventually(lambda: provider.get("late") is not None, 30, "the Cluster once the CRD is there")
        assert provider.status()["resource"] == "clusters.v1beta2.cluster.x-k8s.io"
        assert provider.status()["state"] == ProviderState.WATCHING.value
        await eventually(lambda: "late" in changes, 10, "changed to be told")
    finally:
        await provider.stop()


async def test_a_cluster_with_its_secret_is_a_member_until_deleted(api: ApiClient, crd: None, ns: str) -> None:
    provider, changes = await started(api, ClusterAPIOptions(namespaces=[ns]))
    try:
        await create_capi_secret(api, ns, "orphan", b"no cluster")  # a Secret without its Cluster
        await create_cluster(api, ns, "east")
        await create_cluster(api, ns, "bare")  # a Cluster without its Secret
        await create_capi_secret(api, ns, "east", b"east kubeconfig")
        await eventually(lambda: provider.get("east") is not None, 10, "the member")
        config = provider.get("east")
        assert config is not None
        assert config.connection == UntrustedKubeconfig(b"east kubeconfig", where="data key 'value'")
        assert config.source == f"cluster {ns}/east"
        await eventually(lambda: "east" in changes, 10, "changed to be told")
        assert provider.names() == {"east"}
        assert provider.get("orphan") is None and provider.get("bare") is None

        # Being deleted is enough to leave, with its Secret still there (no garbage collector here).
        await api.request("PATCH", CLUSTERS.path(ns, "east"), body={"metadata": {"finalizers": ["test/keep"]}},
                          headers={"Content-Type": "application/merge-patch+json"})
        await api.request("DELETE", CLUSTERS.path(ns, "east"))
        await eventually(lambda: provider.get("east") is None, 10, "the deleting Cluster to leave")
        await api.request("PATCH", CLUSTERS.path(ns, "east"), body={"metadata": {"finalizers": None}},
                          headers={"Content-Type": "application/merge-patch+json"})

        await create_cluster(api, ns, "west")
        await create_capi_secret(api, ns, "west", b"west kubeconfig")
        await eventually(lambda: provider.get("west") is not None, 10, "the second member")
        del changes[:]
        await api.request("DELETE", CLUSTERS.path(ns, "west"))
        await eventually(lambda: provider.get("west") is None, 10, "the deleted Cluster to leave")
        await eventually(lambda: "west" in changes, 10, "changed to be told")
        assert provider.names() == set()
    finally:
        await provider.stop()


async def test_ready_only_holds_a_cluster_back_until_its_control_plane_is_initialized(
        api: ApiClient, crd: None, ns: str) -> None:
    provider, changes = await started(api, ClusterAPIOptions(namespaces=[ns], ready_only=True))
    try:
        cluster = await create_cluster(api, ns, "slow")
        await create_capi_secret(api, ns, "slow", b"slow kubeconfig")
        await eventually(lambda: "slow" in changes, 10, "the events of the Cluster and its Secret")
        await asyncio.sleep(0.3)
        assert provider.get("slow") is None
        cluster["status"] = {"phase": "Provisioned", "initialization": {"infrastructureProvisioned": True}}
        cluster = await api.request("PUT", CLUSTERS.path(ns, "slow") + "/status", body=cluster)
        await asyncio.sleep(0.3)
        assert provider.get("slow") is None  # Provisioned says nothing about the control plane answering
        cluster["status"]["initialization"]["controlPlaneInitialized"] = True
        await api.request("PUT", CLUSTERS.path(ns, "slow") + "/status", body=cluster)
        await eventually(lambda: provider.get("slow") is not None, 10, "the initialized Cluster")
    finally:
        await provider.stop()


def test_the_field_that_says_ready_is_the_versions_own() -> None:
    assert control_plane_initialized({"apiVersion": "cluster.x-k8s.io/v1beta1", "status": {"controlPlaneReady": True}})
    assert not control_plane_initialized({"apiVersion": "cluster.x-k8s.io/v1beta1", "status": {
        "initialization": {"controlPlaneInitialized": True}}})
    assert control_plane_initialized({"apiVersion": "cluster.x-k8s.io/v1beta2", "status": {
        "initialization": {"controlPlaneInitialized": True}}})
    assert not control_plane_initialized({"apiVersion": "cluster.x-k8s.io/v1beta2", "status": {
        "phase": "Provisioned", "conditions": [{"type": "Available", "status": "True"}]}})


async def test_one_name_in_two_namespaces_is_held_by_the_oldest_cluster(api: ApiClient, crd: None) -> None:
    # The older ns sorts last: the creation time decides, not the name.
    async with fresh_namespace(api, "capi-z") as older, fresh_namespace(api, "capi-a") as newer:
        provider, _ = await started(api, ClusterAPIOptions(namespaces=[older, newer]))
        try:
            await create_cluster(api, older, "dup")
            await create_capi_secret(api, older, "dup", b"older")
            await asyncio.sleep(1.1)  # creationTimestamp has second precision
            await create_cluster(api, newer, "dup")
            await create_capi_secret(api, newer, "dup", b"newer")
            await eventually(lambda: len(provider.conflicts()) == 1, 10, "the conflict")
            config = provider.get("dup")
            assert config is not None and config.connection == UntrustedKubeconfig(b"older", "data key 'value'")
            [conflict] = provider.conflicts()
            assert (conflict.kind, conflict.key, conflict.cluster, conflict.holder) == \
                ("cluster", f"{newer}/dup", "dup", f"cluster {older}/dup")
            await api.request("DELETE", CLUSTERS.path(older, "dup"))
            await eventually(lambda: getattr(provider.get("dup"), "source", "") == f"cluster {newer}/dup", 10,
                             "the newer Cluster to hold the name")
            assert provider.conflicts() == []
        finally:
            await provider.stop()


async def test_label_selector_picks_clusters(api: ApiClient, crd: None, ns: str) -> None:
    provider, _ = await started(api, ClusterAPIOptions(namespaces=[ns], label_selector="fleet=yes"))
    try:
        await create_cluster(api, ns, "in", labels={"fleet": "yes"})
        await create_cluster(api, ns, "out")
        for name in ("in", "out"):
            await create_capi_secret(api, ns, name, name.encode())
        await eventually(lambda: provider.get("in") is not None, 10, "the selected Cluster")
        await asyncio.sleep(0.3)
        assert provider.names() == {"in"}
    finally:
        await provider.stop()


async def test_a_cluster_joins_the_registry_with_its_secret_and_leaves_with_its_cluster(
        api: ApiClient, crd: None, ns: str, member_plane: ControlPlane) -> None:
    registry = ClusterRegistry(api, [ClusterAPIProvider(api, ClusterAPIOptions(namespaces=(ns,)))],
                               MemberOptions(sync_timeout=20, probe_interval=3600), required=[CONFIGMAPS])
    members = HandlerLog()
    await registry.register_cluster_handler(members)
    await registry.start()
    try:
        await create_cluster(api, ns, "east")
        await asyncio.sleep(0.5)
        assert members.added == []  # a Cluster without its kubeconfig Secret is not a member yet
        await create_capi_secret(api, ns, "east", member_plane.member_kubeconfig())
        await eventually(lambda: members.added == ["east"], 60, "east to join")
        assert registry.cluster("east").client.host == member_plane.url
        assert registry.status()["clusters"][0]["source"] == f"cluster {ns}/east"
        await api.request("DELETE", CLUSTERS.path(ns, "east"))  # its Secret stays: no garbage collector here
        await eventually(lambda: members.removed == ["east"], 30, "east to leave")
        assert registry.list_clusters() == []
    finally:
        await registry.stop()
