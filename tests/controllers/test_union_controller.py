"""UnionController against a real control plane (and a second one as another cluster): seed 000's cases.

Records are ConfigMaps of the test's namespace; each names, in ``data``, a namespace whose ConfigMaps its sub
watches (of the same cluster, or of the cluster of ``data.kubeconfig``). The factory builds an unstarted informer
of that namespace, or answers None / raises while the test says so.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any, AsyncIterator

import pytest
from prometheus_client import CollectorRegistry

from controllers import ItemExponentialFailureRateLimiter, UnionController
from informers import AlreadyExists, ApiClient, InformerMetrics, SharedIndexInformer
from informers.store import Obj
from syncer.testing import ControlPlane
from tests.helpers import CONFIGMAPS, eventually, fresh_namespace, nothing_within


class Sub(SharedIndexInformer):
    """A ConfigMap informer of one namespace; with a kubeconfig, of another cluster, whose client it closes."""

    def __init__(self, client: ApiClient, namespace: str, own_client: bool = False) -> None:
        super().__init__(client, CONFIGMAPS, namespace=namespace,
                         metrics=InformerMetrics.for_registry(CollectorRegistry()))
        self.client, self.own_client, self.stopped = client, own_client, False

    async def stop(self) -> None:
        try:
            await super().stop()
        finally:
            self.stopped = True
            if self.own_client:
                await self.client.close()


class Factory:
    """Builds a Sub per record; ``not_yet`` answers None, ``failing`` raises, for the record names in them."""

    def __init__(self, api: ApiClient) -> None:
        self.api = api
        self.not_yet: set[str] = set()
        self.failing: set[str] = set()
        self.stopped: set[str] = set()  # hand over an informer already stopped (start() raises)
        self.calls: list[str] = []
        self.made: list[Sub] = []

    async def __call__(self, record: Obj) -> Sub | None:
        name, data = record["metadata"]["name"], record["data"]
        self.calls.append(name)
        if name in self.not_yet:
            return None
        if name in self.failing:
            raise RuntimeError(f"cannot build {name} yet")
        if "kubeconfig" in data:
            sub = Sub(ApiClient.from_kubeconfig(data["kubeconfig"]), data["namespace"], own_client=True)
        else:
            sub = Sub(self.api, data["namespace"])
        self.made.append(sub)
        if name in self.stopped:
            await sub.stop()
        return sub


class Seen:
    """A union handler: ``(cluster, name) -> initial`` of every add, the names added in order, and the deletes."""

    def __init__(self) -> None:
        self.adds: dict[tuple[str, str], bool] = {}
        self.order: list[str] = []
        self.deletes: set[tuple[str, str]] = set()

    def on_add(self, obj: Obj, is_in_initial_list: bool, cluster: str) -> None:
        self.adds[(cluster, obj["metadata"]["name"])] = is_in_initial_list
        self.order.append(obj["metadata"]["name"])

    def on_delete(self, obj: Any, cluster: str) -> None:
        self.deletes.add((cluster, (obj.obj if hasattr(obj, "obj") else obj)["metadata"]["name"]))


async def put(api: ApiClient, where: str, name: str, **data: str) -> None:
    """Create or replace ConfigMap ``name`` of namespace ``where`` with ``data``."""
    body: dict[str, Any] = {"metadata": {"name": name, "namespace": where}, "data": data}
    try:
        await api.request("POST", CONFIGMAPS.path(where), body=body)
    except AlreadyExists:
        current = await api.request("GET", CONFIGMAPS.path(where, name))
        body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        await api.request("PUT", CONFIGMAPS.path(where, name), body=body)


async def delete(api: ApiClient, where: str, name: str) -> None:
    await api.request("DELETE", CONFIGMAPS.path(where, name))


class Harness:
    """A records informer over the test's namespace, a controller over it, and its run task."""

    def __init__(self, api: ApiClient, records_ns: str, **kw: Any) -> None:
        self.api, self.ns = api, records_ns
        self.records = SharedIndexInformer(api, CONFIGMAPS, namespace=records_ns,
                                           metrics=InformerMetrics.for_registry(CollectorRegistry()))
        self.factory = Factory(api)
        kw.setdefault("key", lambda r: r["metadata"]["name"])
        self.controller = UnionController(self.records, factory=self.factory, name="test-union",
                                          rate_limiter=ItemExponentialFailureRateLimiter(0.01, 0.2),
                                          metrics_registry=CollectorRegistry(), **kw)
        self.union = self.controller.union()
        self.seen = Seen()
        self.union.add_event_handler(self.seen)
        self.task: asyncio.Task[None] | None = None

    async def start(self, workers: int = 2) -> None:
        self.records.start()
        assert await self.records.wait_for_sync(30)
        self.task = asyncio.create_task(self.controller.run(workers))

    async def stop(self) -> None:
        if self.task is not None:
            self.task.cancel()
            await asyncio.gather(self.task, return_exceptions=True)
        await self.records.stop()


@pytest.fixture
async def harness(api: ApiClient) -> AsyncIterator[Any]:
    """Makes Harnesses over fresh namespaces; afterwards stops them and checks that no task is left behind."""
    before = asyncio.all_tasks()
    made: list[Harness] = []
    async with fresh_namespace(api, "records") as ns:

        def make(**kw: Any) -> Harness:
            made.append(Harness(api, ns, **kw))
            return made[-1]

        yield make
        for h in made:
            await h.stop()
    await asyncio.sleep(0)
    assert asyncio.all_tasks() - before - {asyncio.current_task()} == set()


async def test_a_record_added_joins_started_with_the_handlers_replayed_and_a_duplicate_is_a_no_op(
        api: ApiClient, harness: Any) -> None:
    h = harness()
    async with fresh_namespace(api, "target") as target:
        await put(api, target, "before")
        await h.start()
        await put(api, h.ns, "one", namespace=target)
        await eventually(lambda: h.controller.ready() and h.union.clusters() == ["one"], 30, "one ready")
        assert h.factory.made[0].started
        await eventually(lambda: h.seen.adds.get(("one", "before")) is True, 10, "the first list, as initial adds")
        await put(api, target, "after")
        await eventually(lambda: h.seen.adds.get(("one", "after")) is False, 10, "a later add")
        assert h.union.lister.get_for_cluster("one", "after", target) is not None

        # The same record again (a label, a relist): no new informer.
        record = await api.request("GET", CONFIGMAPS.path(h.ns, "one"))
        record["metadata"]["labels"] = {"touched": "yes"}
        await api.request("PUT", CONFIGMAPS.path(h.ns, "one"), body=record)
        await eventually(lambda: h.records.lister.get("one", h.ns)["metadata"].get("labels") == {"touched": "yes"})
        assert await h.controller.sync_once("one")
        await nothing_within(lambda: len(h.factory.calls) > 1, 0.3)
        assert h.factory.calls == ["one"]


async def test_a_record_deleted_leaves_the_union_and_its_informer_stops(api: ApiClient, harness: Any,
                                                                        member_plane: ControlPlane) -> None:
    """One record names a namespace of the same cluster, the other one of another cluster (its own client)."""
    h = harness()
    async with fresh_namespace(api, "target") as target:
        await h.start()
        await put(api, h.ns, "local", namespace=target)
        await put(api, h.ns, "remote", namespace="default", kubeconfig=str(member_plane.kubeconfig))
        await eventually(lambda: h.controller.ready() and h.union.clusters() == ["local", "remote"], 30, "both ready")
        remote = next(s for s in h.factory.made if s.own_client)
        async with ApiClient.from_kubeconfig(str(member_plane.kubeconfig)) as member:
            await put(member, "default", "on-member")
            await eventually(lambda: ("remote", "on-member") in h.seen.adds, 30, "the other cluster's object")
            await delete(api, h.ns, "remote")
            await eventually(lambda: h.union.clusters() == ["local"], 30, "remote gone")
            await eventually(lambda: remote.stopped and remote.client.closed, 10, "its informer and client closed")
            assert remote.registrations == []
            await put(member, "default", "after-removal")
            await put(api, target, "marker")
            await eventually(lambda: ("local", "marker") in h.seen.adds, 30, "marker")
            assert ("remote", "after-removal") not in h.seen.adds
            await delete(member, "default", "on-member")
            await delete(member, "default", "after-removal")
        assert h.controller.ready()


async def test_a_changed_record_swaps_its_informer_at_once_and_only_when_its_identity_changed(
        api: ApiClient, harness: Any) -> None:
    h = harness()
    async with fresh_namespace(api, "old") as old_ns, fresh_namespace(api, "new") as new_ns:
        await put(api, old_ns, "in-old")
        await put(api, new_ns, "in-new")
        await h.start()
        await put(api, h.ns, "view", namespace=old_ns)
        await eventually(lambda: h.controller.ready() and h.union.clusters() == ["view"], 30, "view ready")
        old = h.factory.made[0]
        assert ("view", "in-old") in h.seen.adds

        async def churn_old() -> None:  # the old namespace keeps changing while the view moves
            for i in range(1000):
                await put(api, old_ns, f"old-{i}")
                await asyncio.sleep(0.01)

        churn = asyncio.create_task(churn_old())
        try:
            await eventually(lambda: any(n.startswith("old-") for n in h.seen.order), 10, "the old one delivers")
            await put(api, h.ns, "view", namespace=new_ns)
            await eventually(lambda: len(h.factory.made) == 2 and h.controller.ready(), 30, "the new informer ready")
            await eventually(lambda: "in-new" in h.seen.order, 10, "the new one's first list")
            await asyncio.sleep(0.3)  # the old namespace still changing
        finally:
            churn.cancel()
            await asyncio.gather(churn, return_exceptions=True)
        first_new = h.seen.order.index("in-new")
        assert not [n for n in h.seen.order[first_new:] if n.startswith("old-")]  # never both delivering
        new = h.factory.made[1]
        assert h.union.sub_lister("view")[1] is new.lister and h.seen.adds[("view", "in-new")] is True
        await eventually(lambda: old.stopped, 10, "the old informer stopped")
        assert old.registrations == [] and [r.name for r in new.registrations] == ["Seen@view"]
        await put(api, new_ns, "late-in-new")
        await eventually(lambda: ("view", "late-in-new") in h.seen.adds, 10, "the new one delivers")
        assert [o.obj["metadata"]["name"] for o in h.union.lister.list()] == ["in-new", "late-in-new"]
        assert h.factory.calls == ["view", "view"]


async def test_factory_none_or_raising_is_retried_without_another_event(api: ApiClient, harness: Any) -> None:
    h = harness()
    h.factory.not_yet.add("late")
    h.factory.failing.add("broken")
    async with fresh_namespace(api, "target") as target:
        await h.start()
        for name in ("late", "broken", "now"):
            await put(api, h.ns, name, namespace=target)
        await eventually(lambda: h.factory.calls.count("late") >= 3 and h.factory.calls.count("broken") >= 3, 30,
                         "retries with no new event")
        assert h.union.clusters() == ["now"] and not h.controller.ready()
        assert h.controller.stats.errors >= 2  # the raising factory; "not yet" is no error
        h.factory.not_yet.clear()
        h.factory.failing.clear()
        await eventually(lambda: h.controller.ready() and h.union.clusters() == ["broken", "late", "now"], 30,
                         "all ready")

        # A record that is gone is not retried (no resurrection).
        h.factory.not_yet.add("gone")
        await put(api, h.ns, "gone", namespace=target)
        await eventually(lambda: "gone" in h.factory.calls, 10, "gone tried")
        await delete(api, h.ns, "gone")
        await eventually(lambda: h.records.lister.get("gone", h.ns) is None, 10)
        await asyncio.sleep(0.3)  # any retry already queued runs and finds nothing
        calls = len(h.factory.calls)
        await nothing_within(lambda: len(h.factory.calls) > calls, 0.5)


async def test_run_exit_stops_every_informer_it_made_and_removes_its_handler_and_index(
        api: ApiClient, harness: Any) -> None:
    h = harness()
    async with fresh_namespace(api, "target") as target:
        await h.start(workers=3)
        for i in range(4):
            await put(api, h.ns, f"r{i}", namespace=target)
        await eventually(lambda: h.controller.ready() and len(h.union.clusters()) == 4, 30, "all four")
        assert [r.name for r in h.records.registrations] == ["test-union"]
        indexers = set(h.records.store.indexers)
        assert h.task is not None
        h.task.cancel()
        await asyncio.gather(h.task, return_exceptions=True)
        assert h.union.clusters() == [] and h.records.registrations == []
        assert all(s.stopped and s.registrations == [] for s in h.factory.made)
        assert set(h.records.store.indexers) == indexers - {h.controller._index}
        assert h.union.registrations  # the union's own handlers stay; it is simply empty
        with pytest.raises(RuntimeError, match="runs once"):
            await h.controller.run()
        with pytest.raises(ValueError, match="workers"):
            await UnionController(h.records, lambda r: "k", h.factory, metrics_registry=CollectorRegistry()).run(0)


async def test_a_stop_while_the_factory_works_ends_at_once_and_leaks_nothing(api: ApiClient, harness: Any) -> None:
    h = harness()
    entered, never = asyncio.Event(), asyncio.Event()
    plain = h.factory.__call__

    async def slow(record: Obj) -> Sub | None:
        if record["metadata"]["name"] == "slow":
            entered.set()
            await never.wait()
        return await plain(record)

    h.controller._factory = slow
    async with fresh_namespace(api, "target") as target:
        await h.start()
        await put(api, h.ns, "fast", namespace=target)
        await put(api, h.ns, "slow", namespace=target)
        await asyncio.wait_for(entered.wait(), 30)
        await eventually(lambda: h.union.clusters() == ["fast"], 30, "fast joined")
        assert h.task is not None
        h.task.cancel()
        await asyncio.wait_for(asyncio.gather(h.task, return_exceptions=True), 5)
        assert h.union.clusters() == [] and all(s.stopped for s in h.factory.made)


async def test_sync_once_without_run_follows_the_records_cache(api: ApiClient, harness: Any) -> None:
    """The seed's SyncOnce: the record as the cache has it, whatever the events said."""
    h = harness()
    async with fresh_namespace(api, "target") as target:
        h.records.start()
        await put(api, h.ns, "a", namespace=target)
        await eventually(lambda: h.records.lister.get("a", h.ns) is not None, 10)
        h.factory.stopped.add("a")
        with pytest.raises(RuntimeError, match="stopped"):
            await h.controller.sync_once("a")
        assert h.union.clusters() == [] and h.factory.made[0].registrations == []
        h.factory.stopped.clear()
        assert await h.controller.sync_once("a") and h.union.clusters() == ["a"]
        assert await h.controller.sync_once("a") and len(h.factory.made) == 2
        assert await h.controller.sync_once("nothing") and h.union.clusters() == ["a"]
        await delete(api, h.ns, "a")
        await eventually(lambda: h.records.lister.get("a", h.ns) is None, 10)
        assert await h.controller.sync_once("a") and h.union.clusters() == []
        assert all(s.stopped for s in h.factory.made)
        h.records.remove_indexers([h.controller._index])


async def test_a_key_given_by_two_records_is_held_by_the_oldest(api: ApiClient, harness: Any) -> None:
    h = harness(key=lambda r: r["data"]["cluster"])
    async with fresh_namespace(api, "target") as target:
        await h.start()
        await put(api, h.ns, "first", namespace=target, cluster="east")
        await eventually(lambda: h.controller.ready() and h.union.clusters() == ["east"], 30, "east ready")
        await asyncio.sleep(1.1)  # creation timestamps have a resolution of one second
        await put(api, h.ns, "second", namespace=target, cluster="east")
        await put(api, h.ns, "keyless", namespace=target)  # its key function raises: left out
        await eventually(lambda: h.records.lister.get("keyless", h.ns) is not None, 10)
        await nothing_within(lambda: len(h.factory.calls) > 1, 0.3)
        await delete(api, h.ns, "first")
        await eventually(lambda: h.factory.calls == ["first", "second"] and h.controller.ready(), 30,
                         "second takes east over")
        assert h.union.clusters() == ["east"] and h.factory.made[0].stopped


async def test_concurrent_churn_ends_with_the_union_matching_the_records(api: ApiClient, harness: Any,
                                                                         seed: int) -> None:
    rng = random.Random(seed)
    h = harness()
    async with fresh_namespace(api, "a") as ns_a, fresh_namespace(api, "b") as ns_b:
        await h.start(workers=4)
        names = [f"r{i}" for i in range(8)]
        present: dict[str, str] = {}

        async def step() -> None:
            name = rng.choice(names)
            if name in present and rng.random() < 0.4:
                del present[name]
                await delete(api, h.ns, name)
            else:
                present[name] = rng.choice([ns_a, ns_b])
                await put(api, h.ns, name, namespace=present[name])
            if rng.random() < 0.2:
                h.factory.not_yet ^= {rng.choice(names)}

        for _ in range(60):
            await step()
            if rng.random() < 0.3:
                await asyncio.sleep(rng.random() * 0.05)
        h.factory.not_yet.clear()
        await eventually(lambda: h.controller.ready() and h.union.clusters() == sorted(present), 60,
                         "the union matches the records")
        for name, ns in present.items():
            _, lister = h.union.sub_lister(name)
            sub = next(s for s in h.factory.made if s.lister is lister)
            assert sub.namespace == ns and sub.started and not sub.stopped
        live = [s for s in h.factory.made if not s.stopped]
        assert len(live) == len(present)  # every informer replaced or removed was stopped
        assert all(s.registrations == [] for s in h.factory.made if s.stopped)
