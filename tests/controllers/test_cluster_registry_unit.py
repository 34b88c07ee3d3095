"""Cluster registry and fleet loop races, with fake clients and factories (the real-cluster behaviour is in
test_multicluster.py): removal during a pending rotation, cleanups that a cancellation must not cut short, a fleet
sub joining while its cluster goes, and the local cluster in a fleet union."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import kubernetes
import pytest

from controllers import provider as connections
from controllers.cluster import ClusterContext, ConditionType
from controllers.cluster_registry import ClusterRegistry
from controllers.fence import OPEN
from controllers.member import Member, MemberOptions, MemberState
from controllers.provider import ClusterConfig, UntrustedKubeconfig
from controllers.providers.secrets import SecretOptions, SecretProvider
from controllers.fleet import FleetController, FleetLoop, _Feed
from informers import GVR, ApiClient
from informers.source import Notifier
from informers.request_metrics import RequestCounts

from tests.helpers import FakeProvider, eventually

CONFIGMAPS = GVR("", "v1", "configmaps")
CONNECT_DELAY: dict[bytes, float] = {}  # kubeconfig -> how long connecting with it takes


class FakeClient:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.closed = False
        self.host = "https://fake"
        self.request_counts = RequestCounts(self.host)

    async def request(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        await asyncio.sleep(CONNECT_DELAY.get(self.data, 0.0))
        return {"gitVersion": "v1.36"}

    async def close(self) -> None:
        self.closed = True


class _Supervisor:
    def problems(self) -> list[Any]:
        return []

    def next_wedge_in(self) -> float | None:
        return None


class FakeFactory:
    def __init__(self, client: Any, name: str) -> None:
        self.client = client
        self.notifier = Notifier()
        self.supervisor = _Supervisor()
        self.last_pass = None
        self.down = False

    def require(self, owner: str, gvrs: Any) -> None: ...

    def release(self, owner: str) -> None: ...

    async def start(self) -> None: ...

    def status(self) -> list[Any]:
        return []

    def subscribe(self, id: str) -> Any:
        return self.notifier.subscribe(id)

    def unsubscribe(self, id: str) -> None:
        self.notifier.unsubscribe(id)

    def informers(self) -> tuple[dict[GVR, Any], list[GVR]]:
        return {}, []

    def events_received(self) -> int:
        return 0

    async def shutdown(self) -> None:
        self.down = True
        self.notifier.close_all()


def management() -> ApiClient:
    config = kubernetes.client.Configuration()
    config.host = "https://127.0.0.1:1"
    return ApiClient(config)


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setattr(connections, "client_from_untrusted_kubeconfig", lambda data, **kw: FakeClient(data))
    provider = FakeProvider()
    reg = ClusterRegistry(management(), [provider], MemberOptions(probe_interval=3600),
                          make_factory=FakeFactory)  # type: ignore[arg-type]
    return reg, provider


def put(reg: ClusterRegistry, provider: FakeProvider, data: bytes | None, name: str = "c1") -> None:
    """Cluster ``name`` given with kubeconfig ``data`` (None: no longer given), and the coordinator told."""
    if data is None:
        provider.configs.pop(name, None)
    else:
        provider.configs[name] = ClusterConfig(name, f"fake {name}", UntrustedKubeconfig(data))
    reg.coordinator.changed(name)


async def settle(rounds: int = 30) -> None:
    """Let the coordinator take in one change before the next (an order of events, not a wait for a state)."""
    for _ in range(rounds):
        await asyncio.sleep(0)


async def test_deleting_during_a_pending_rotation_stops_every_connection(registry: Any) -> None:
    reg, secrets = registry

    class Blocking:
        gate: asyncio.Event | None = None

        async def add_cluster(self, ctx: ClusterContext, name: str, cluster: Any) -> None:
            if self.gate is not None:
                await self.gate.wait()

    handler = Blocking()
    await reg.register_cluster_handler(handler)
    put(reg, secrets, b"v1")
    await eventually(lambda: reg.list_clusters() == ["c1"], 5, "c1 engaged")
    first = reg._members["c1"]
    handler.gate = asyncio.Event()  # v2 stays inside its engagement, still replacing v1
    put(reg, secrets, b"v2")
    await settle()
    put(reg, secrets, b"v3")
    await settle()
    put(reg, secrets, None)
    await eventually(lambda: reg._members == {} and reg.list_clusters() == [] and first.task.done(), 5,
                     "c1 gone and its first connection stopped")
    assert first.ctx.cancelled()
    async with asyncio.timeout(5):
        await reg.stop()


async def test_a_cancellation_does_not_cut_the_old_connections_cleanups_short(registry: Any) -> None:
    reg, secrets = registry
    log: list[tuple[str, bytes]] = []

    class Slow:
        def add_cluster(self, ctx: ClusterContext, name: str, cluster: Any) -> None:
            data = cluster.client.data

            async def last() -> None:
                log.append(("last", data))

            async def slow() -> None:
                await asyncio.sleep(0.3)
                log.append(("slow", data))

            ctx.add_cleanup(last)
            ctx.add_cleanup(slow)

    await reg.register_cluster_handler(Slow())
    put(reg, secrets, b"v1")
    await eventually(lambda: reg.list_clusters() == ["c1"], 5, "c1 engaged")
    put(reg, secrets, b"v2")  # v1's slow cleanup runs while v2 waits for it...
    await asyncio.sleep(0.1)
    put(reg, secrets, None)  # ...and v2 is cancelled meanwhile
    await asyncio.sleep(1.0)
    assert log == [("slow", b"v1"), ("last", b"v1"), ("slow", b"v2"), ("last", b"v2")]
    await reg.stop()


class FakeInformer:
    lister = object()

    def add_event_handler(self, *args: Any, **kwargs: Any) -> object:
        return object()

    async def remove_event_handler(self, registration: Any) -> None:
        await asyncio.sleep(0.2)  # a detach that takes a while, so a leave can arrive during a join


async def test_a_sub_never_stays_once_its_cluster_has_gone() -> None:
    loop = FleetLoop("f", FleetController(CONFIGMAPS, lambda ctx: None), clients=None)  # type: ignore[arg-type]
    loop.union.add_event_handler(lambda *args: None, name="h")
    ctx1, ctx2 = ClusterContext("c1"), ClusterContext("c1")
    feed1, feed2 = _Feed(loop, ctx1, "c1", CONFIGMAPS), _Feed(loop, ctx2, "c1", CONFIGMAPS)
    ctx1.add_cleanup(feed1.leave)
    ctx2.add_cleanup(feed2.leave)
    await feed1.on_gvr_synced(CONFIGMAPS, FakeInformer())
    rotation = asyncio.create_task(feed2.on_gvr_synced(CONFIGMAPS, FakeInformer()))
    await asyncio.sleep(0.05)
    await ctx2.run_cleanups(1)
    await ctx1.run_cleanups(1)
    await rotation
    assert loop._subs == {} and loop.union.clusters() == []


async def test_the_local_cluster_joins_a_fleet_union_under_a_name() -> None:
    loop = FleetLoop("f", FleetController(CONFIGMAPS, lambda ctx: None), clients=None)  # type: ignore[arg-type]
    feed = _Feed(loop, ClusterContext(""), "", CONFIGMAPS)
    await feed.on_gvr_synced(CONFIGMAPS, FakeInformer())
    assert list(loop._subs) == [""] and loop.union.clusters() == [""]
    await feed.leave()
    assert loop.union.clusters() == []


async def test_an_annotation_naming_an_invalid_cluster_is_reported() -> None:
    provider = SecretProvider(management(), SecretOptions(namespaces=("ns",)))
    changed: list[str] = []
    await provider.start(changed.append)
    secret = {"metadata": {"name": "c1", "namespace": "ns", "annotations": {"kube-syncer.io/cluster-name": "Prod"}},
              "data": {"kubeconfig": base64.b64encode(b"x").decode()}}
    provider._informers[0].store.upsert(secret)  # as the informer's cache has it (never listed)
    provider._saw(secret)
    assert changed == [] and provider.names() == set() and provider.get("Prod") is None
    (conflict,) = provider.conflicts()
    assert "'Prod'" in conflict.message and "DNS-1123" in conflict.message
    assert conflict.as_dict()["secret"] == "ns/c1"
    await provider.stop()


async def test_a_slow_cleanup_in_one_cluster_delays_no_other(registry: Any) -> None:
    reg, secrets = registry
    engaged: list[str] = []

    class SlowToLeave:
        def add_cluster(self, ctx: ClusterContext, name: str, cluster: Any) -> None:
            engaged.append(name)

            async def cleanup() -> None:
                await asyncio.sleep(2.0)

            ctx.add_cleanup(cleanup)

    def put_named(name: str, present: bool) -> None:
        put(reg, secrets, name.encode() if present else None, name)

    await reg.register_cluster_handler(SlowToLeave())
    put_named("slow", True)
    await settle()
    put_named("slow", False)  # its cleanup now takes 2 s
    await settle()
    put_named("fast", True)
    await eventually(lambda: "fast" in engaged, 0.5, "fast engaged while slow's cleanup runs")
    await reg.stop()


class Log:
    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []

    def add_cluster(self, ctx: ClusterContext, name: str, cluster: Any) -> None:
        data = cluster.client.data
        self.events.append(("add", data))

        async def cleanup() -> None:
            self.events.append(("cleanup", data))

        ctx.add_cleanup(cleanup)

    def remove_cluster(self, name: str) -> None:
        self.events.append(("remove", name))


async def test_a_second_rotation_keeps_the_working_connection(registry: Any) -> None:
    reg, secrets = registry
    log = Log()
    await reg.register_cluster_handler(log)
    put(reg, secrets, b"v1")
    await eventually(lambda: reg.list_clusters() == ["c1"], 5, "c1 engaged")
    CONNECT_DELAY.update({b"v2": 1.0, b"v3": 0.3, b"v4": 1.0})
    try:
        put(reg, secrets, b"v2")  # still connecting when...
        await settle()
        put(reg, secrets, b"v3")  # ...the next rotation comes
        await asyncio.sleep(0.1)
        assert log.events == [("add", b"v1")] and reg.list_clusters() == ["c1"]  # v1 still serves
        await asyncio.sleep(0.6)
        assert log.events == [("add", b"v1"), ("add", b"v3"), ("cleanup", b"v1")]
        put(reg, secrets, b"v4")
        await settle()
        put(reg, secrets, b"v3")  # back to the running one while v4 connects: nothing reconnects
        await asyncio.sleep(0.1)
        assert reg._members["c1"].config.connection.data == b"v3" and log.events[-1] == ("cleanup", b"v1")
    finally:
        CONNECT_DELAY.clear()
        await reg.stop()


async def test_removal_during_an_engagement_calls_remove_cluster_once(registry: Any) -> None:
    reg, secrets = registry
    log = Log()
    gate = asyncio.Event()

    class Slow:
        async def add_cluster(self, ctx: ClusterContext, name: str, cluster: Any) -> None:
            if cluster.client.data == b"v2":
                await gate.wait()

    await reg.register_cluster_handler(log)
    await reg.register_cluster_handler(Slow())
    put(reg, secrets, b"v1")
    await eventually(lambda: reg.list_clusters() == ["c1"], 5, "c1 engaged")
    put(reg, secrets, b"v2")  # told to the log, then stuck in Slow
    await settle()
    put(reg, secrets, None)
    await asyncio.sleep(0.2)
    assert log.events.count(("remove", "c1")) == 1
    assert sorted(e for e in log.events if e[0] == "cleanup") == [("cleanup", b"v1"), ("cleanup", b"v2")]
    await reg.stop()


def test_a_member_moves_only_along_its_transitions() -> None:
    m = Member(ClusterConfig("c1", "fake c1", UntrustedKubeconfig(b"v1")), OPEN)
    with pytest.raises(RuntimeError, match="connecting -> ready"):
        m.to(MemberState.READY)  # engaged without having synced
    for state in (MemberState.DISCOVERING, MemberState.SYNCING, MemberState.READY, MemberState.SUPERSEDED):
        m.to(state)
    assert m.settled.is_set() and not m.ending
    m.to(MemberState.STOPPING)
    with pytest.raises(RuntimeError, match="stopping -> stopping"):
        m.to(MemberState.STOPPING)  # a second cancellation would cut the teardown short
    m.to(MemberState.STOPPED)
    assert m.ending


async def test_reading_status_and_metrics_changes_nothing(registry: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from controllers.cluster_metrics import track

    reg, secrets = registry
    metrics = CollectorRegistry()
    track(reg, metrics)
    put(reg, secrets, b"v1")
    await eventually(lambda: reg.list_clusters() == ["c1"], 5, "c1 engaged")
    m = reg._members["c1"]
    await eventually(lambda: m.conditions[ConditionType.SYNCED].status is True, 5, "Synced set by the member")
    refreshes: list[str] = []
    monkeypatch.setattr(Member, "_refresh", lambda self, *a: refreshes.append(self.name))
    before = [(c.status, c.reason, c.since) for c in m.current_conditions()]
    for _ in range(3):
        reg.status()
        generate_latest(metrics)
    assert refreshes == [] and [(c.status, c.reason, c.since) for c in m.current_conditions()] == before
    async with asyncio.timeout(5):
        await reg.stop()


async def test_a_cluster_assigned_here_is_warmed_then_adopted_without_a_new_connection(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The warm standby of sharded member clusters: assigned (not held) -> brought up ahead; its Lease taken -> the
    # member adopts that client and factory (nothing connected or started again); unassigned -> released.
    from syncer.sharding.units import ClusterUnits

    made: list[Any] = []

    class Counting(FakeFactory):
        def __init__(self, client: Any, name: str) -> None:
            super().__init__(client, name)
            self.starts = 0
            made.append(self)

        async def start(self) -> None:
            self.starts += 1

    class NoneStuck:
        def take_stuck(self, unit: str) -> list[str]:
            return []

    monkeypatch.setattr(connections, "client_from_untrusted_kubeconfig", lambda data, **kw: FakeClient(data))
    tasks_before = len(asyncio.all_tasks())
    provider = FakeProvider()
    units = ClusterUnits(NoneStuck(), warm=True)  # type: ignore[arg-type]
    reg = ClusterRegistry(management(), [provider], MemberOptions(probe_interval=3600), coordinator=units,
                          make_factory=Counting)  # type: ignore[arg-type]
    provider.configs["c1"] = ClusterConfig("c1", "fake c1", UntrustedKubeconfig(b"v1"))
    units.assigned(frozenset({"c1"}))
    assert reg.warm.names() == ["c1"] and reg.list_clusters() == []
    await eventually(lambda: len(made) == 1 and made[0].starts == 1, 5, "c1 brought up ahead")
    warm = made[0]
    await units.start("c1", OPEN)  # type: ignore[arg-type]
    assert reg.cluster("c1").factory is warm and reg.cluster("c1").fence is OPEN
    assert len(made) == 1 and warm.starts == 1 and reg.warm.names() == []
    await units.stop("c1")  # its Lease lost, still assigned here: warmed again
    assert warm.down and reg.warm.names() == ["c1"]
    await eventually(lambda: len(made) == 2 and made[1].starts == 1, 5, "c1 brought up ahead again")
    units.assigned(frozenset())  # assigned elsewhere: released
    assert reg.warm.names() == []
    await reg.stop()
    assert all(f.down for f in made)
    await asyncio.sleep(0)
    assert len(asyncio.all_tasks()) <= tasks_before


async def test_a_discovery_refused_before_version_answers_is_told_as_discoverys(monkeypatch: pytest.MonkeyPatch) -> None:
    # /version and the first discovery pass go out together; a 403 on discovery may come back first, and must
    # still leave the member Connected (the server answered) and not Discovered, as when they went one by one.
    from informers.discovery import DiscoveryForbidden
    from informers.errors import ApiError

    class Refused(FakeFactory):
        async def start(self) -> None:
            raise DiscoveryForbidden(ApiError(403, "Forbidden", "no discovery for you"))

    monkeypatch.setattr(connections, "client_from_untrusted_kubeconfig", lambda data, **kw: FakeClient(data))
    monkeypatch.setitem(CONNECT_DELAY, b"slow-version", 0.05)
    provider = FakeProvider()
    reg = ClusterRegistry(management(), [provider], MemberOptions(probe_interval=3600),
                          make_factory=Refused)  # type: ignore[arg-type]
    put(reg, provider, b"slow-version")
    await eventually(lambda: "c1" in reg._members and reg._members["c1"].state is MemberState.RETRYING, 5,
                     "c1 refused and retrying")
    conditions = reg._members["c1"].conditions
    assert conditions[ConditionType.CONNECTED].status is True
    assert conditions[ConditionType.DISCOVERED].status is False
    assert conditions[ConditionType.DISCOVERED].reason == "DiscoveryForbidden"
    async with asyncio.timeout(5):
        await reg.stop()
