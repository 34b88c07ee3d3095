"""The host-namespaces provider against a real control plane: the management cluster's namespaces, selected by
label, as member clusters sharing its client, each watching its own namespace only."""

from __future__ import annotations

import asyncio
import uuid
from typing import AsyncIterator

import pytest

from controllers.cluster_registry import ClusterRegistry
from controllers.member import MemberOptions
from controllers.provider import ClusterProvider, NamespaceConnection
from controllers.providers.namespaces import HostNamespacesProvider
from informers import ApiClient

from syncer.testing import eventually

from tests.helpers import CONFIGMAPS, HandlerLog


@pytest.fixture
def tenant() -> str:
    """A label value of this test's own: the provider selects only the namespaces it creates."""
    return uuid.uuid4().hex[:8]


@pytest.fixture
async def namespaces(api: ApiClient, tenant: str) -> AsyncIterator[list[str]]:
    """Three namespaces, the first two labelled ``tenant=<tenant>``; deleted afterwards (left Terminating: no
    namespace controller runs here)."""
    names = [f"tenant-{tenant}-{i}" for i in "abc"]
    for i, name in enumerate(names):
        labels = {"tenant": tenant} if i < 2 else {}
        await api.request("POST", "/api/v1/namespaces", body={"metadata": {"name": name, "labels": labels}})
    try:
        yield names
    finally:
        for name in names:
            await api.request("DELETE", f"/api/v1/namespaces/{name}")


async def test_selected_namespaces_are_members_until_deleted(api: ApiClient, tenant: str,
                                                             namespaces: list[str]) -> None:
    a, b, unlabelled = namespaces
    provider = HostNamespacesProvider(api, f"tenant={tenant}")
    changes: list[str] = []
    await provider.start(changes.append)
    try:
        as_protocol: ClusterProvider = provider
        assert isinstance(as_protocol, ClusterProvider)
        assert await provider.wait_synced(30)
        assert provider.names() == {a, b}
        config = provider.get(a)
        assert config is not None and config.connection == NamespaceConnection(a)
        assert config.source == f"namespace {a}"
        assert provider.get(unlabelled) is None and provider.get("") is None
        assert provider.status()["members"] == 2

        await api.request("DELETE", f"/api/v1/namespaces/{b}")  # stays Terminating here: leaves all the same
        await eventually(lambda: provider.names() == {a}, 10, "the terminating namespace to leave")
        await eventually(lambda: b in changes, 10, "changed to be told")
        await api.request("PATCH", f"/api/v1/namespaces/{unlabelled}", body={"metadata": {"labels": {"tenant": tenant}}},
                          headers={"Content-Type": "application/merge-patch+json"})
        await eventually(lambda: provider.names() == {a, unlabelled}, 10, "the newly labelled namespace")
    finally:
        await provider.stop()


async def test_each_namespace_member_shares_the_management_client_and_sees_its_namespace_only(
        api: ApiClient, tenant: str, namespaces: list[str]) -> None:
    a, b, _ = namespaces
    registry = ClusterRegistry(api, [HostNamespacesProvider(api, f"tenant={tenant}")],
                               MemberOptions(sync_timeout=20, probe_interval=3600), required=[CONFIGMAPS])
    members = HandlerLog()
    await registry.register_cluster_handler(members)
    await registry.start()
    try:
        await eventually(lambda: sorted(members.added) == [a, b], 60, "both namespaces to join")
        ca, cb = registry.cluster(a), registry.cluster(b)
        assert ca.client is api and cb.client is api  # one client, one connection: no credentials read
        await api.request("POST", CONFIGMAPS.path(a), body={"metadata": {"name": "only-in-a"}})

        def names_in(cluster_name: str) -> set[str]:
            synced, _ = registry.cluster(cluster_name).factory.informers()
            return {obj["metadata"]["name"] for obj in synced[CONFIGMAPS].store} if CONFIGMAPS in synced else set()

        await eventually(lambda: "only-in-a" in names_in(a), 10, "the ConfigMap in its namespace's member")
        await asyncio.sleep(0.3)
        assert "only-in-a" not in names_in(b)
        assert {obj["metadata"]["namespace"] for obj in registry.cluster(a).factory.informers()[0][CONFIGMAPS].store} \
            == {a}
        await api.request("DELETE", f"/api/v1/namespaces/{b}")
        await eventually(lambda: members.removed == [b], 30, "the deleted namespace to leave")
        assert registry.list_clusters() == [a]
    finally:
        await registry.stop()
