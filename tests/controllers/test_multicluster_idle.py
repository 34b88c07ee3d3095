"""Issue 23: an idle fleet costs no requests per member beyond its watches, and member informer metrics are
labelled by cluster. Against the session's real apiserver (each member is another Secret pointing at it) and,
where the member must change (a CRD, an outage), a plane of its own.

Time is scaled down through options: what a member's server says every second here (ConfigMap churn) stands
for the bookmark it sends every minute at steady state (kube-apiserver's cacher, ``defaultBookmarkFrequency``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import psutil
import pytest
from prometheus_client import CollectorRegistry

from controllers.cluster_registry import ClusterRegistry
from controllers.member import MemberOptions
from informers import GVR, ApiClient, DiscoveringDynamicSharedInformerFactory, DiscoveryOptions, ReflectorOptions
from informers.discovery_triggers import APISERVICES, CRDS
from syncer.testing import ControlPlane
from syncer.testing.pytest_plugin import kube_client

from tests.fleet import delete_secret, kubeconfig, member, put_secret, secrets
from tests.helpers import CONFIGMAPS, eventually
from tests.kube import create_crd

GIZMOS = GVR("idle.example.com", "v1", "gizmos")


def requests_made(client: ApiClient) -> int:
    return sum(client.request_counts.codes.values())


def watches_opened(registry: CollectorRegistry, cluster: str) -> float:
    return sum(s.value for family in registry.collect() for s in family.samples
               if s.name == "informer_watches_total" and s.labels["cluster"] == cluster)


def series_of(registry: CollectorRegistry, cluster: str) -> set[tuple[str, str]]:
    """(metric, gvr) of every informer series labelled ``cluster``."""
    return {(s.name, s.labels["gvr"]) for family in registry.collect() for s in family.samples
            if s.name.startswith("informer_") and s.labels.get("cluster") == cluster}


def quiet_factory(metrics: CollectorRegistry, **kw: Any) -> Any:
    """A member factory whose periodic discovery pass would show within the test's window if it ran."""
    def make(client: ApiClient, name: str) -> DiscoveringDynamicSharedInformerFactory:
        return DiscoveringDynamicSharedInformerFactory(client, DiscoveryOptions(watch="required", **kw),
                                                       name=f"discovery {name}", metrics_registry=metrics,
                                                       metrics_cluster=name)
    return make


async def churn(api: ApiClient, namespace: str, stop: asyncio.Event) -> None:
    """A ConfigMap written every 0.3 s: the member's watches hear from its server all the time."""
    body = {"metadata": {"name": "tick"}, "data": {"n": "0"}}
    await api.request("POST", CONFIGMAPS.path(namespace), body=body)
    n = 0
    while not stop.is_set():
        n += 1
        body["data"] = {"n": str(n)}
        await api.request("PUT", CONFIGMAPS.path(namespace, "tick"), body=body)
        await asyncio.sleep(0.3)


def test_defaults_keep_a_watched_member_from_being_probed() -> None:
    """The rule the defaults rest on: a watch hears a bookmark every minute (the apiserver's cacher) and is
    reopened after ``inactivity_timeout`` of silence, both well within ``probe_interval``, so a member with a
    working watch is always heard from between two probe rounds."""
    bookmark_every = 60.0  # k8s.io/apiserver pkg/storage/cacher: defaultBookmarkFrequency = time.Minute
    assert bookmark_every < ReflectorOptions().inactivity_timeout < MemberOptions().probe_interval


async def test_a_member_heard_from_makes_no_requests_beyond_its_watches(
        api: ApiClient, fleet_ns: str, control_plane: ControlPlane) -> None:
    """While a member's watches hear from its server, there is no /version probe and no periodic discovery
    pass: every request in the window is a watch (re)opened. Once it is silent for a whole ``probe_interval``,
    one probe per interval asks after it."""
    metrics = CollectorRegistry()
    registry = ClusterRegistry(api, secrets(api, fleet_ns), MemberOptions(probe_interval=2.0),
                               required=[CONFIGMAPS], metrics_registry=metrics,
                               make_factory=quiet_factory(metrics, rediscovery_interval=1.0,
                                                          full_rediscovery_interval=3600.0))
    await registry.start()
    stop = asyncio.Event()
    ticking = asyncio.create_task(churn(api, fleet_ns, stop))
    try:
        await put_secret(api, fleet_ns, "quiet", kubeconfig(control_plane))
        await eventually(lambda: (member(registry, "quiet") or {}).get("ready") is True, 30, "the member ready")
        cluster = registry.cluster("quiet")
        factory = cluster.factory
        assert not factory.triggers.started(CRDS)  # ConfigMaps only: no CRD or APIService can change their serving
        await asyncio.sleep(3.0)  # the start's own requests are over
        requests, watches, passes = requests_made(cluster.client), watches_opened(metrics, "quiet"), factory.passes
        await asyncio.sleep(7.0)  # three probe rounds, seven short rediscovery periods
        assert factory.passes == passes, "no periodic discovery pass while the triggers watch"
        assert requests_made(cluster.client) - requests == watches_opened(metrics, "quiet") - watches
        assert member(registry, "quiet")["ready"]

        stop.set()
        await ticking
        # Silent now (the next bookmark is up to a minute away): the probe asks, once per round.
        requests = requests_made(cluster.client) - watches_opened(metrics, "quiet")
        await asyncio.sleep(7.0)
        probes = requests_made(cluster.client) - watches_opened(metrics, "quiet") - requests
        assert 2 <= probes <= 4, probes
        assert member(registry, "quiet")["ready"]
    finally:
        stop.set()
        await ticking
        await registry.stop()


async def test_a_crd_installed_in_a_member_is_picked_up_by_its_trigger(
        api: ApiClient, fleet_ns: str, control_plane_factory: Any) -> None:
    """With the periodic pass out of reach, the CRD trigger alone brings a new required GVR's informer up."""
    plane = control_plane_factory()
    metrics = CollectorRegistry()
    registry = ClusterRegistry(api, secrets(api, fleet_ns), MemberOptions(probe_interval=3600.0),
                               required=[CONFIGMAPS, GIZMOS], metrics_registry=metrics,
                               make_factory=quiet_factory(metrics, rediscovery_interval=3600.0))
    await registry.start()
    try:
        await put_secret(api, fleet_ns, "crds", kubeconfig(plane))
        await eventually(lambda: "crds" in registry.list_clusters(), 30, "the member up")
        factory = registry.cluster("crds").factory
        passes = factory.passes
        with kube_client(plane) as k:
            create_crd(k, GIZMOS.group, GIZMOS.resource, "Gizmo")
        await eventually(lambda: GIZMOS in factory.informers()[0], 15, "the gizmos informer synced")
        assert factory.passes > passes
        await eventually(lambda: member(registry, "crds")["ready"], 10, "ready with gizmos synced")
    finally:
        await registry.stop()


@pytest.mark.parametrize("required", [[GIZMOS], [CONFIGMAPS]], ids=["triggers", "core-only"])
async def test_the_safety_net_pass_runs_while_the_triggers_watch(api: ApiClient, required: list[GVR]) -> None:
    """Triggers watching, or not needed (only core resources wanted): passes come at ``full_rediscovery_interval``
    (jittered), not at the short period."""
    f = DiscoveringDynamicSharedInformerFactory(
        api, DiscoveryOptions(watch="required", rediscovery_interval=0.2, full_rediscovery_interval=1.0),
        metrics_registry=CollectorRegistry())
    f.require("test", required)
    await f.start()
    try:
        watching = f.triggers.watching(CRDS) and f.triggers.watching(APISERVICES)
        assert watching is (required == [GIZMOS])
        passes = f.passes
        await asyncio.sleep(4.0)
        # 1 to 1.2 s apart: three or four in 4 s (twenty at the short period)
        assert 2 <= f.passes - passes <= 4, f.passes - passes
    finally:
        await f.shutdown()


async def test_a_pass_follows_the_server_answering_again(control_plane_factory: Any) -> None:
    """After an outage (an upgrade, say, which may serve other built-in APIs) a pass runs as soon as the server
    answers again, not at the safety net."""
    plane = control_plane_factory()
    async with ApiClient.from_kubeconfig(str(plane.kubeconfig)) as client:
        f = DiscoveringDynamicSharedInformerFactory(
            client, DiscoveryOptions(watch="required", full_rediscovery_interval=3600.0),
            metrics_registry=CollectorRegistry())
        f.require("test", [CONFIGMAPS])
        await f.start()
        try:
            await eventually(lambda: CONFIGMAPS in f.informers()[0], 20, "configmaps synced")
            passes = f.passes
            await asyncio.to_thread(plane.stop_apiserver)
            await eventually(lambda: f.informers()[0][CONFIGMAPS].last_error is not None, 20, "the watch failing")
            await asyncio.to_thread(plane.start_apiserver)
            # The first request to get through after the outage is a watch or discovery retry, which may be one
            # backoff cap (30 s, client-go's) after the restart when the outage was long (a loaded machine).
            await eventually(lambda: f.passes > passes, 60, "a pass once the server answers")
        finally:
            await f.shutdown()


@pytest.mark.parametrize("http2", [True, False], ids=["http2", "http1"])
async def test_a_request_after_the_old_keep_alive_reuses_the_connection(control_plane: ControlPlane,
                                                                        http2: bool) -> None:
    """A request 20 s after the last one (aiohttp's default keep-alive was 15 s, the old probe interval) goes on
    the pooled connection: no new TLS handshake."""
    def ports() -> set[int]:
        return {c.laddr.port for c in psutil.Process().net_connections("tcp")
                if c.raddr and c.raddr.port == control_plane.port and c.status == psutil.CONN_ESTABLISHED}

    async with ApiClient.from_kubeconfig(str(control_plane.kubeconfig)) as client:
        client.http2 = http2
        before = ports()
        await client.request("GET", "/version")
        ours = ports() - before
        assert len(ours) == 1, ours
        await asyncio.sleep(20.0)
        assert ours <= ports(), "the pooled connection was closed"
        await client.request("GET", "/version")
        assert ports() - before == ours


async def test_member_informer_metrics_are_labelled_by_cluster_and_leave_with_it(
        api: ApiClient, fleet_ns: str, control_plane: ControlPlane) -> None:
    """Two members watching the same GVR have their own series (``cluster`` label) on the registry's metrics
    registry, next to the process's own (``cluster=""``); a member's go when it leaves, all of them when the
    registry stops."""
    metrics = CollectorRegistry()
    registry = ClusterRegistry(api, secrets(api, fleet_ns), MemberOptions(probe_interval=3600.0),
                               required=[CONFIGMAPS], metrics_registry=metrics)  # the default member factory
    own = DiscoveringDynamicSharedInformerFactory(api, DiscoveryOptions(watch="required"), metrics_registry=metrics)
    own.require("test", [CONFIGMAPS])
    await own.start()
    await registry.start()
    try:
        for name in ("alpha", "beta"):
            await put_secret(api, fleet_ns, name, kubeconfig(control_plane))
        await eventually(lambda: registry.list_clusters() == ["alpha", "beta"], 30, "both members up")
        await eventually(lambda: CONFIGMAPS in own.informers()[0], 20, "the process's own configmaps synced")
        cms = str(CONFIGMAPS)
        for cluster in ("alpha", "beta", ""):
            assert {("informer_objects", cms), ("informer_synced", cms), ("informer_watches_total", cms),
                    ("informer_events_total", cms)} <= series_of(metrics, cluster), cluster
        objects = {s.labels["cluster"]: s.value for family in metrics.collect() for s in family.samples
                   if s.name == "informer_objects" and s.labels["gvr"] == cms}
        assert objects["alpha"] == objects["beta"] > 0
        alpha = series_of(metrics, "alpha")

        await delete_secret(api, fleet_ns, "beta")
        await eventually(lambda: registry.list_clusters() == ["alpha"], 30, "beta gone")
        await eventually(lambda: series_of(metrics, "beta") == set(), 10, "beta's series gone")
        assert series_of(metrics, "alpha") == alpha
    finally:
        await registry.stop()
        await own.shutdown()
    assert series_of(metrics, "alpha") == series_of(metrics, "beta") == series_of(metrics, "") == set()
