"""The host-namespaces provider against a real control plane: the management cluster's namespaces, selected by
label, as member clusters sharing its client and one informer per GVR, each seeing its own namespace only."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any, AsyncIterator

import pytest
from prometheus_client import CollectorRegistry

from controllers import Controller, ManagedController, ReconcileContext, Request
from controllers.cluster_controllers import ClusterControllers
from controllers.cluster_registry import ClusterRegistry
from controllers.fleet import FleetController, FleetLoop
from controllers.member import MemberOptions
from controllers.provider import ClusterProvider, NamespaceConnection
from controllers.providers.namespaces import HostNamespacesOptions, HostNamespacesProvider
from informers import ApiClient, FuncHandler
from informers.namespace_view import NamespaceInformer

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
    provider = HostNamespacesProvider(api, HostNamespacesOptions(f"tenant={tenant}"))
    changes: list[str] = []
    await provider.start(changes.append)
    try:
        as_protocol: ClusterProvider = provider
        assert isinstance(as_protocol, ClusterProvider)
        assert await provider.wait_synced(30)
        assert provider.names() == {a, b}
        config = provider.get(a)
        assert config is not None and config.connection == NamespaceConnection(a, provider.host)
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
    registry = ClusterRegistry(api, [HostNamespacesProvider(api, HostNamespacesOptions(f"tenant={tenant}"))],
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


def record_watches(api: ApiClient) -> list[str]:
    """The paths of the watches ``api`` opens from now on (its ``stream`` calls)."""
    paths: list[str] = []
    stream = api.stream

    def recording(path: str, params: Any, *args: Any, **kwargs: Any) -> Any:
        paths.append(path)
        return stream(path, params, *args, **kwargs)

    api.stream = recording  # type: ignore[method-assign]
    return paths


async def label(api: ApiClient, namespace: str, value: str | None) -> None:
    await api.request("PATCH", f"/api/v1/namespaces/{namespace}", body={"metadata": {"labels": {"tenant": value}}},
                      headers={"Content-Type": "application/merge-patch+json"})


async def test_namespace_members_share_one_informer_per_gvr(api: ApiClient, tenant: str) -> None:
    """Five members, one configmaps watch (cluster-wide), one cache; a member's view is its namespace's; a member
    that leaves takes its handlers back and the shared informer keeps running."""
    names = [f"share-{tenant}-{i}" for i in range(5)]
    for name in names:
        await api.request("POST", "/api/v1/namespaces", body={"metadata": {"name": name, "labels": {"tenant": tenant}}})
    watches = record_watches(api)
    provider = HostNamespacesProvider(api, HostNamespacesOptions(f"tenant={tenant}"))
    registry = ClusterRegistry(api, [provider], MemberOptions(sync_timeout=20, probe_interval=3600),
                               required=[CONFIGMAPS])
    members = HandlerLog()
    await registry.register_cluster_handler(members)
    await registry.start()
    try:
        await eventually(lambda: sorted(members.added) == names, 60, "every namespace to join")
        for i, name in enumerate(names):
            await api.request("POST", CONFIGMAPS.path(name), body={"metadata": {"name": f"cm-{i}"}})

        def view(name: str) -> NamespaceInformer:
            inf = registry.cluster(name).factory.informers()[0][CONFIGMAPS]
            assert isinstance(inf, NamespaceInformer)
            return inf

        await eventually(lambda: all(view(n).lister.get(f"cm-{i}", n) for i, n in enumerate(names)), 10,
                         "every member's ConfigMap in its view")
        shared = {id(view(n).shared) for n in names}
        assert len(shared) == 1  # one informer, one cache
        assert {o["metadata"]["namespace"] for o in view(names[0]).shared.store} >= set(names)  # every namespace
        for i, name in enumerate(names):
            v = view(name)
            assert [o["metadata"]["name"] for o in v.lister.list()] == [f"cm-{i}"]
            assert len(v.store) == 1 and v.lister.get(f"cm-{(i + 1) % 5}", names[(i + 1) % 5]) is None
            assert v.lister.list(namespace=names[(i + 1) % 5]) == []
        configmap_watches = [p for p in watches if p.endswith("/configmaps")]
        assert set(configmap_watches) == {"/api/v1/configmaps"}, watches  # no per-namespace watch
        assert len(configmap_watches) == 1, watches
        assert provider.status()["views"] == 5

        # A handler through a view hears its namespace only, and goes with its member.
        heard: list[str] = []
        view(names[0]).add_event_handler(FuncHandler(lambda obj, _: heard.append(obj["metadata"]["namespace"])))
        shared_inf = view(names[0]).shared
        assert any(r.namespace == names[0] for r in shared_inf.registrations)
        await label(api, names[0], None)
        await eventually(lambda: names[0] in members.removed, 30, "the unlabelled namespace to leave")
        assert not any(r.namespace == names[0] for r in shared_inf.registrations)  # no leak
        owners = provider.host.factory.demand.owners() if provider.host.factory is not None else set()
        assert not any(f"(namespace {names[0]})" in owner for owner in owners)  # its requirements went too
        assert any(f"(namespace {names[1]})" in owner for owner in owners)
        assert heard == [names[0]]
        assert provider.status()["views"] == 4
        await api.request("POST", CONFIGMAPS.path(names[1]), body={"metadata": {"name": "after"}})
        await eventually(lambda: view(names[1]).lister.get("after", names[1]) is not None, 10,
                         "the shared informer to keep running for the others")
        assert view(names[1]).shared is shared_inf
    finally:
        await registry.stop()
        for name in names:
            await api.request("DELETE", f"/api/v1/namespaces/{name}")
    assert provider.host.views == 0 and provider.host.factory is None  # the last member took the host down


async def test_each_members_controller_sees_its_namespace_and_members_follow_labels(
        api: ApiClient, tenant: str, namespaces: list[str]) -> None:
    """A per-cluster controller in each namespace member reconciles that namespace's objects and events only; a
    namespace labelled in adds a member (its controller starts), one labelled out removes it, and the others'
    controllers keep going."""
    a, b, c = namespaces
    seen: list[tuple[str, str]] = []  # (cluster, namespace/name)
    listed: dict[str, set[str]] = {}  # cluster -> the namespaces its lister answered with

    async def reconcile(req: Request, rc: ReconcileContext) -> None:
        cluster = rc.ctx.cluster or ""
        seen.append((cluster, req.key))
        listed.setdefault(cluster, set()).update(o["metadata"]["namespace"] for o in rc.lister().list())

    def create(ctx: Any) -> Any:
        return Controller("cms", reconcile, metrics_registry=CollectorRegistry()).for_(CONFIGMAPS).run

    registry = ClusterRegistry(api, [HostNamespacesProvider(api, HostNamespacesOptions(f"tenant={tenant}"))],
                               MemberOptions(sync_timeout=20, probe_interval=3600), required=[CONFIGMAPS])
    per_cluster = ClusterControllers({"cms": ManagedController([CONFIGMAPS], create)}, name="t")
    await registry.register_cluster_handler(per_cluster)
    await registry.start()
    try:
        for ns in (a, b, c):
            await api.request("POST", CONFIGMAPS.path(ns), body={"metadata": {"name": "first"}})
        await eventually(lambda: {(a, f"{a}/first"), (b, f"{b}/first")} <= set(seen), 60,
                         "each member's controller to reconcile its namespace's object")
        await api.request("PATCH", CONFIGMAPS.path(a, "first"), body={"data": {"k": "v"}},
                          headers={"Content-Type": "application/merge-patch+json"})
        await eventually(lambda: seen.count((a, f"{a}/first")) >= 2, 10, "a's controller to hear the update")
        assert all(key.startswith(f"{cluster}/") for cluster, key in seen), seen
        assert listed == {a: {a}, b: {b}}

        await label(api, c, tenant)  # c joins: its controller starts on its objects
        await eventually(lambda: (c, f"{c}/first") in seen, 60, "c's controller")
        await label(api, a, None)  # a leaves: its controller stops, the others keep delivering
        await eventually(lambda: a not in registry.list_clusters(), 30, "a to leave")
        before = len(seen)
        await api.request("POST", CONFIGMAPS.path(a), body={"metadata": {"name": "unseen"}})
        for ns in (b, c):
            await api.request("POST", CONFIGMAPS.path(ns), body={"metadata": {"name": "second"}})
        await eventually(lambda: {(b, f"{b}/second"), (c, f"{c}/second")} <= set(seen[before:]), 30,
                         "b's and c's controllers to keep going")
        await asyncio.sleep(0.5)
        assert all(cluster != a for cluster, _ in seen[before:]), seen[before:]
        assert all(key.startswith(f"{cluster}/") for cluster, key in seen), seen
    finally:
        await per_cluster.stop()
        await registry.stop()


async def test_a_fleet_controller_over_namespace_members_reads_each_namespace_as_a_cluster(
        api: ApiClient, tenant: str, namespaces: list[str]) -> None:
    """The fleet loop's union takes each member's view (through the GVR handlers of its namespace source): a request
    is a member's object, under that member's name, and a member that leaves leaves the union."""
    a, b, c = namespaces
    seen: list[tuple[str, str]] = []

    class Reconciler:
        async def reconcile(self, cluster: str, request: Request) -> None:
            seen.append((cluster, request.key))

    registry = ClusterRegistry(api, [HostNamespacesProvider(api, HostNamespacesOptions(f"tenant={tenant}"))],
                               MemberOptions(sync_timeout=20, probe_interval=3600), required=[CONFIGMAPS])
    loop = FleetLoop("cms", FleetController(CONFIGMAPS, lambda ctx: Reconciler()), registry.clients, management=api)
    await registry.register_cluster_handler(loop)
    runner = asyncio.create_task(loop.run())
    await registry.start()
    try:
        for ns in (a, b, c):
            await api.request("POST", CONFIGMAPS.path(ns), body={"metadata": {"name": "x"}})
        await eventually(lambda: loop.union.clusters() == sorted([a, b]), 60, "both members in the union")
        await eventually(lambda: {(a, f"{a}/x"), (b, f"{b}/x")} <= set(seen), 30, "each member's object")
        for cluster in (a, b):
            assert {o["metadata"]["namespace"] for o in loop.union.lister.list_for_cluster(cluster)} == {cluster}
        await label(api, a, None)
        await eventually(lambda: loop.union.clusters() == [b], 30, "a to leave the union")
        assert all(key.startswith(f"{cluster}/") for cluster, key in seen), seen
        assert (c, f"{c}/x") not in seen
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
        await loop.close()
        await registry.stop()
