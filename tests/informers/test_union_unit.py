"""UnionInformer and UnionLister against informers fed by hand (no API server).

The subs are real SharedIndexInformers over a client that never answers: their caches are filled with
``replace`` (a list) and ``apply`` (a watch event), as the reflector would, so handler queues, replays and
has-synced are the real ones.
"""

from __future__ import annotations

import asyncio
from contextlib import asynccontextmanager

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from informers import (
    GVR, ClusterNotFound, ClusterObject, DeletedFinalStateUnknown, FuncHandler, HandlerInstallError, InformerMetrics,
    NotFound, SelectorError, SharedIndexInformer, UnionInformer,
)

from tests.helpers import eventually

CONFIGMAPS = GVR("", "v1", "configmaps")


class IdleClient:
    """A server that never answers: the reflector waits on its first watch until it is cancelled."""

    recoveries = 0

    @asynccontextmanager
    async def stream(self, path, params, inactivity_timeout=None):
        await asyncio.get_running_loop().create_future()
        yield


class Sub(SharedIndexInformer):
    """An informer of one cluster, fed by hand; ``refuse_after=n`` makes installs after the n-th fail."""

    def __init__(self, *objs, refuse_after=None, synced=True):
        super().__init__(IdleClient(), CONFIGMAPS, metrics=InformerMetrics.for_registry(CollectorRegistry()))
        self.refuse_after = refuse_after
        self.start()
        if synced:
            self.replace([cm(o) if isinstance(o, str) else o for o in objs], "1")

    def add_event_handler(self, handler, resync_period=None, name=None):
        if self.refuse_after is not None:
            if self.refuse_after == 0:
                raise RuntimeError("install refused")
            self.refuse_after -= 1
        return super().add_event_handler(handler, resync_period, name)


def cm(name, ns="ns", rv="1", labels=None):
    return {"metadata": {"name": name, "namespace": ns, "resourceVersion": rv, "labels": labels or {}}}


class Recorder:
    """A cluster-aware handler: records ``(cluster, kind, name, extra)``."""

    def __init__(self, name="rec"):
        self.name = name
        self.events = []

    def on_add(self, obj, is_in_initial_list, cluster):
        self.events.append((cluster, "add", obj["metadata"]["name"], is_in_initial_list))

    def on_update(self, old, new, cluster):
        self.events.append((cluster, "update", new["metadata"]["name"], new["metadata"]["resourceVersion"]))

    def on_delete(self, obj, cluster):
        key = obj.key if isinstance(obj, DeletedFinalStateUnknown) else obj["metadata"]["name"]
        self.events.append((cluster, "delete", key, None))

    def seen(self, kind=None):
        return {(c, n) for c, k, n, _ in self.events if kind is None or k == kind}


def union(**kw):
    return UnionInformer(kw.pop("name", "u"), metrics_registry=kw.pop("registry", CollectorRegistry()))


def leaked(before):
    """Tasks alive now that were not before (the fixture's teardown runs in a task of its own)."""
    return asyncio.all_tasks() - before - {asyncio.current_task()}


async def settle(check, timeout=3.0):
    await eventually(check, timeout)


@pytest.fixture
async def subs():
    """Make Subs; all are stopped when the test ends, and no task may outlive them."""
    before = asyncio.all_tasks()
    made = []

    def make(*objs, **kw):
        s = Sub(*objs, **kw)
        made.append(s)
        return s

    yield make
    for s in made:
        await s.stop()
    assert leaked(before) == set()


# -- handlers ------------------------------------------------------------------------------------------------
async def test_handler_reaches_current_and_later_subs_with_their_cluster(subs):
    u = union()
    a = subs("a1")
    await u.add("Alpha", a)
    rec = Recorder()
    reg = u.add_event_handler(rec)
    await u.add("beta", subs("b1"))
    await settle(lambda: rec.seen("add") == {("Alpha", "a1"), ("beta", "b1")})
    # Both are initial adds: the late handler's replay on Alpha, and beta's cache given to a handler on join.
    assert all(e[3] is True for e in rec.events)
    a.apply("MODIFIED", cm("a1", rv="2"))
    a.apply("DELETED", cm("a1", rv="3"))
    await settle(lambda: rec.seen("delete") == {("Alpha", "a1")})
    assert ("Alpha", "update", "a1", "2") in rec.events
    assert reg.has_synced()
    assert u.clusters() == ["Alpha", "beta"]


async def test_plain_and_async_handlers_work_unchanged_and_cluster_is_optional_per_method(subs):
    u = union()
    await u.add("a", subs("x"))
    plain, mixed = [], []

    class Mixed:  # bound async method that asks for the cluster; another method that does not
        async def on_add(self, obj, is_in_initial_list, *, cluster):
            await asyncio.sleep(0)
            mixed.append((cluster, obj["metadata"]["name"]))

        def on_delete(self, obj):
            mixed.append(("no cluster", obj["metadata"]["name"]))

    u.add_event_handler(FuncHandler(on_add=lambda obj, initial: plain.append(obj["metadata"]["name"])))
    u.add_event_handler(Mixed())
    u.add_event_handler(FuncHandler(on_add=lambda obj, initial, **kw: plain.append(kw["cluster"])))
    await settle(lambda: sorted(plain) == ["a", "x"] and mixed == [("a", "x")])


async def test_handler_is_installed_with_its_resync_period_and_a_per_cluster_name(subs):
    u = union()
    a = subs("x")
    await u.add("a", a)
    reg = u.add_event_handler(Recorder("r"), 30.0, name="mine")
    b = subs()
    await u.add("B", b)
    assert [(r.name, r.resync_period) for r in a.registrations] == [("mine@a", 30.0)]
    assert [(r.name, r.resync_period) for r in b.registrations] == [("mine@B", 30.0)]
    assert reg.name == "mine" and reg.informer is u


async def test_names_are_case_insensitive_and_readd_replaces_detaching_the_old_sub_first(subs):
    u = union()
    old, new = subs("o1"), subs("n1")
    rec = Recorder()
    u.add_event_handler(rec)
    await u.add("Alpha", old)
    await settle(lambda: rec.seen() == {("Alpha", "o1")})
    await u.add("ALPHA", new)
    assert u.clusters() == ["ALPHA"] and old.registrations == [] and len(new.registrations) == 1
    old.apply("ADDED", cm("late-from-old"))
    new.apply("ADDED", cm("n2"))
    await settle(lambda: ("ALPHA", "n2") in rec.seen())
    assert ("ALPHA", "n1") in rec.seen() and not any(n == "late-from-old" for _, n in rec.seen())
    assert u.sub_lister("alpha")[0] == "ALPHA"


async def test_replace_stops_old_deliveries_before_the_new_sub_delivers(subs):
    u = union()
    old = subs(*[f"o{i}" for i in range(300)])
    order = []
    u.add_event_handler(FuncHandler(on_add=lambda obj, initial, cluster: order.append(obj["metadata"]["name"][0]),
                                    on_update=lambda old_, new_, cluster: order.append("u")))
    await u.add("a", old)
    await settle(lambda: len(order) == 300)
    for i in range(300):  # queued on the old sub's handler, not yet delivered when the replace happens
        old.apply("MODIFIED", cm(f"o{i}", rv="2"))
    await u.add("a", subs(*[f"n{i}" for i in range(300)]))
    await settle(lambda: order.count("n") == 300)
    tail = order[300:]
    assert "u" not in tail[tail.index("n"):]  # no event of the old sub after the first of the new one


async def test_failed_replace_keeps_the_old_sub_fully_wired(subs):
    reg_ = CollectorRegistry()
    u = union(registry=reg_)
    old = subs("o1")
    first, second = Recorder("first"), Recorder("second")
    await u.add("a", old)
    r1, r2 = u.add_event_handler(first), u.add_event_handler(second)
    bad = subs("n1", refuse_after=1)  # takes the first handler, refuses the second
    with pytest.raises(HandlerInstallError, match="cluster 'a'"):
        await u.add("a", bad)
    assert bad.registrations == []
    assert sorted(r.name for r in old.registrations) == ["first@a", "second@a"]
    assert u.sub_lister("a")[1] is old.lister and u.registrations == [r1, r2]
    old.apply("ADDED", cm("o2"))
    await settle(lambda: ("a", "o2") in first.seen() and ("a", "o2") in second.seen())
    assert r1.has_synced() and r2.has_synced()
    assert reg_.get_sample_value("union_informer_handler_install_failures_total", {"union": "u"}) == 1


async def test_failed_add_of_a_new_cluster_leaves_no_trace(subs):
    u = union()
    u.add_event_handler(Recorder("first"))
    u.add_event_handler(Recorder("second"))
    bad = subs("x", refuse_after=1)
    with pytest.raises(HandlerInstallError):
        await u.add("a", bad)
    assert u.clusters() == [] and bad.registrations == []


async def test_add_event_handler_failing_on_one_sub_rolls_back_the_others_and_is_not_remembered(subs):
    u = union()
    a, c = subs("a1"), subs("c1")
    await u.add("a", a)
    await u.add("b", subs("b1", refuse_after=0))
    await u.add("c", c)
    with pytest.raises(HandlerInstallError, match="on cluster 'b'"):
        u.add_event_handler(Recorder())
    await u.settle()
    assert a.registrations == [] and c.registrations == [] and u.registrations == []
    later = subs("d1")
    await u.add("d", later)
    assert later.registrations == []


async def test_remove_event_handler_forgets_then_removes_and_ignores_foreign_registrations(subs):
    u, other = union(), union(name="other")
    a = subs("a1")
    await u.add("a", a)
    await other.add("a", subs("a1"))
    reg = u.add_event_handler(Recorder())
    foreign = other.add_event_handler(Recorder())
    plain = a.add_event_handler(Recorder("direct"))
    await u.remove_event_handler(foreign)
    await u.remove_event_handler(plain)  # a sub's own registration is not the union's to remove
    assert len(a.registrations) == 2 and other.registrations == [foreign]
    await asyncio.gather(u.remove_event_handler(reg), u.remove_event_handler(reg))  # idempotent, also at once
    assert a.registrations == [plain] and u.registrations == [] and not reg.has_synced()
    b = subs("b1")
    await u.add("b", b)
    assert b.registrations == []  # forgotten: not installed on later subs
    await a.remove_event_handler(plain)


async def test_remove_detaches_keeps_handlers_for_later_and_leaves_the_sub_running(subs):
    u = union()
    a = subs("a1")
    rec = Recorder()
    u.add_event_handler(rec)
    await u.add("a", a)
    await u.remove("A")
    await u.remove("a")  # idempotent
    await u.remove("never-added")
    assert a.registrations == [] and u.clusters() == [] and a.started
    a.apply("ADDED", cm("a2"))
    await u.add("a", a)
    await settle(lambda: ("a", "a2") in rec.seen())
    assert len(a.registrations) == 1


async def test_add_of_the_same_sub_is_idempotent(subs):
    u = union(registry=(r := CollectorRegistry()))
    a = subs("a1")
    rec = Recorder()
    u.add_event_handler(rec)
    await u.add("a", a)
    await u.add("a", a)
    await settle(lambda: rec.seen() == {("a", "a1")})
    await asyncio.sleep(0.05)
    assert len(rec.events) == 1 and len(a.registrations) == 1
    assert r.get_sample_value("union_informer_handler_installs_total", {"union": "u"}) == 1


async def test_reads_and_other_mutations_do_not_wait_for_a_slow_detach(subs):
    gate = asyncio.Event()

    class SlowSub(Sub):
        async def remove_event_handler(self, registration):
            await gate.wait()
            await super().remove_event_handler(registration)

    u = union()
    old = SlowSub("o1")
    first = u.add_event_handler(Recorder("first"))
    await u.add("a", old)
    new = subs("n1")
    replacing = asyncio.create_task(u.add("a", new))
    await asyncio.sleep(0.01)
    assert not replacing.done()  # still detaching the old sub
    assert u.clusters() == ["a"] and u.lister.get("n1", "ns").cluster == "a" and u.lister.get("o1", "ns") is None
    second = u.add_event_handler(Recorder("second"))
    await u.add("b", subs("b1"))
    assert sorted(r.name for r in new.registrations) == ["first@a", "second@a"]
    assert [r.name for r in old.registrations] == ["first@a"]  # never given the handler added meanwhile
    gate.set()
    await replacing
    assert old.registrations == [] and u.registrations == [first, second]
    await old.stop()


async def test_add_rejects_bad_names_and_subs_without_a_lister(subs):
    u = union()
    s = subs()
    for bad in (None, 3):
        with pytest.raises(ValueError, match="must be a string"):
            await u.add(bad, s)
    with pytest.raises(ValueError, match="no lister"):
        await u.add("a", None)
    s.lister = None
    with pytest.raises(ValueError, match="no lister"):
        await u.add("a", s)
    assert u.clusters() == []


# -- sync state ----------------------------------------------------------------------------------------------
async def test_has_synced_truth_table(subs):
    u = union()
    reg = u.add_event_handler(Recorder())
    assert u.has_synced() and reg.has_synced()  # empty: vacuously synced
    a = subs(synced=False)
    await u.add("a", a)
    assert not u.has_synced() and not reg.has_synced()  # the sub has not synced
    a.replace([cm("a1")], "1")
    assert u.has_synced()
    await settle(reg.has_synced)  # once the handler has been given a's initial list
    b = subs("b1")
    await u.add("b", b)
    assert u.has_synced()
    late = u.add_event_handler(Recorder("late"))
    await settle(late.has_synced)
    await u.remove("a")
    await u.remove("b")
    assert u.has_synced() and reg.has_synced()  # empty again
    await u.remove_event_handler(reg)
    assert not reg.has_synced()  # a removed registration is not synced


async def test_registration_has_synced_needs_the_handler_on_every_sub():
    class Blocked:  # the handler has not yet been given its initial list on the slow sub
        def __init__(self):
            self.gate = asyncio.Event()

        async def on_add(self, obj, is_in_initial_list, cluster):
            if cluster == "slow":
                await self.gate.wait()

    before = asyncio.all_tasks()
    fast, slow = Sub("f1"), Sub("s1")
    u = union()
    await u.add("fast", fast)
    await u.add("slow", slow)
    h = Blocked()
    reg = u.add_event_handler(h)
    await asyncio.sleep(0.05)
    assert u.has_synced() and not reg.has_synced()
    assert not await reg.wait_for_sync(0.05)
    h.gate.set()
    assert await reg.wait_for_sync(1)
    await fast.stop()
    await slow.stop()
    assert asyncio.all_tasks() - before == set()


async def test_registration_wait_for_sync_follows_clusters_joining_and_its_removal(subs):
    u = union()
    reg = u.add_event_handler(Recorder())
    a = subs(synced=False)
    await u.add("a", a)
    waiter = asyncio.create_task(reg.wait_for_sync(2))
    await asyncio.sleep(0.02)
    b = subs(synced=False)
    await u.add("b", b)
    a.replace([], "1")
    await asyncio.sleep(0.02)
    assert not waiter.done()
    b.replace([], "1")
    assert await waiter
    await u.add("c", subs(synced=False))
    waiter = asyncio.create_task(reg.wait_for_sync())
    await asyncio.sleep(0.02)
    await u.remove_event_handler(reg)
    assert await waiter is False


async def test_readiness_gate_needs_every_expected_cluster_synced(subs):
    u = union()
    assert u.has_synced_clusters([])
    assert not u.has_synced_clusters(["a"])  # not there yet: an empty union is synced, the gate is not open
    a = subs(synced=False)
    await u.add("a", a)
    assert not u.has_synced_clusters(["A"])
    a.replace([], "1")
    assert u.has_synced_clusters(["A"]) and not u.has_synced_clusters(["a", "b"])


async def test_cluster_ready_follows_the_reflector_error_of_that_cluster_only(subs):
    u = union()
    a, b = subs("a1"), subs("b1")
    await u.add("a", a)
    await u.add("b", b)
    assert u.cluster_ready("a") and u.cluster_ready("B")
    a.reflector.last_error = ConnectionRefusedError("down")
    assert not u.cluster_ready("a") and u.cluster_ready("b") and u.has_synced()
    a.reflector.last_error = None
    assert u.cluster_ready("a") and not u.cluster_ready("missing")


# -- lister --------------------------------------------------------------------------------------------------
class FakeLister:
    def __init__(self, error):
        self.error = error

    def get(self, name, namespace=None):
        raise self.error

    def list(self, namespace=None, label_selector=None):
        raise self.error


async def test_lister_tags_objects_without_copying_in_a_stable_cluster_order(subs):
    u = union()
    z, a = subs(cm("x", labels={"app": "web"}), "y"), subs(cm("x", labels={"app": "db"}))
    await u.add("zeta", z)
    await u.add("Alpha", a)
    got = u.lister.list()
    assert [(o.cluster, o.obj["metadata"]["name"]) for o in got] == [("Alpha", "x"), ("zeta", "x"), ("zeta", "y")]
    assert got[0].obj is a.store.get("ns/x") and "cluster" not in got[0].obj  # the cached object itself
    assert u.lister.list(label_selector="app=web") == [ClusterObject("zeta", z.store.get("ns/x"))]
    assert u.lister.list(namespace="other") == []
    assert u.lister.get("x", "ns") == ClusterObject("Alpha", a.store.get("ns/x"))  # first in the order
    assert u.lister.get("y", "ns").cluster == "zeta" and u.lister.get("nope", "ns") is None
    assert u.lister.get_for_cluster("ZETA", "x", "ns") is z.store.get("ns/x")
    assert u.lister.get_for_cluster("alpha", "y", "ns") is None
    assert [o["metadata"]["name"] for o in u.lister.list_for_cluster("zeta", "ns", "app")] == ["x"]
    with pytest.raises(ClusterNotFound):
        u.lister.list_for_cluster("gone")
    with pytest.raises(ClusterNotFound):
        u.lister.get_for_cluster("gone", "x", "ns")
    with pytest.raises(SelectorError):
        u.lister.list(label_selector="a in x")


async def test_lister_get_tries_the_next_cluster_on_not_found_and_stops_on_other_errors(subs):
    u = union()
    missing, broken, has = subs(), subs(), subs("x")
    missing.lister = FakeLister(NotFound(404, "NotFound", "no"))
    broken.lister = FakeLister(RuntimeError("broken cache"))
    await u.add("a", missing)
    await u.add("b", has)
    assert u.lister.get("x", "ns").cluster == "b"
    assert u.lister.get_for_cluster("a", "x", "ns") is None
    await u.add("a", broken)
    with pytest.raises(RuntimeError, match="broken cache"):
        u.lister.get("x", "ns")
    with pytest.raises(RuntimeError, match="broken cache"):
        u.lister.list()


async def test_lister_drops_a_removed_cluster_at_once(subs):
    u = union()
    await u.add("a", subs("x"))
    await u.add("b", subs("y"))
    await u.remove("a")
    assert [o.cluster for o in u.lister.list()] == ["b"] and u.lister.get("x", "ns") is None


# -- metrics -------------------------------------------------------------------------------------------------
async def test_metrics_count_subs_events_per_cluster_and_installs(subs):
    registry = CollectorRegistry()
    u = union(registry=registry)
    unnamed = UnionInformer(metrics_registry=registry)  # no name: no series
    a, b = subs("a1"), subs("b1")
    await u.add("a", a)
    await u.add("b", b)
    await unnamed.add("a", a)
    u.add_event_handler(Recorder())
    a.reflector.event_counts.update(ADDED=3, MODIFIED=2, BOOKMARK=7)

    def value(name, **labels):
        return registry.get_sample_value(name, {"union": "u", **labels})

    assert value("union_informer_subs") == 2
    assert value("union_informer_events_total", cluster="a") == 5
    assert value("union_informer_events_total", cluster="b") == 0
    assert value("union_informer_handler_installs_total") == 2
    assert value("union_informer_handler_install_failures_total") == 0
    await u.remove("a")
    assert value("union_informer_subs") == 1 and value("union_informer_events_total", cluster="a") is None
    assert registry.get_sample_value("union_informer_subs", {"union": ""}) is None


# -- property: any interleaving converges ---------------------------------------------------------------------
OPS = st.lists(st.tuples(st.sampled_from(["add", "replace", "remove", "handler", "unhandle", "bad", "yield"]),
                         st.integers(0, 2)), max_size=30)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(OPS)
def test_random_interleavings_leave_every_sub_with_exactly_the_union_handlers(ops):
    async def scenario():
        before = asyncio.all_tasks()
        u = union()
        made, regs, pending = [], [], []
        for verb, i in ops:
            name = "abc"[i]
            if verb in ("add", "replace", "bad"):
                s = Sub(f"o{i}", refuse_after=0 if verb == "bad" else None)
                made.append(s)
                pending.append(asyncio.create_task(u.add(name.upper() if verb == "replace" else name, s)))
            elif verb == "remove":
                pending.append(asyncio.create_task(u.remove(name)))
            elif verb == "handler":
                try:
                    regs.append(u.add_event_handler(Recorder(f"h{len(regs)}")))
                except HandlerInstallError:
                    pass
            elif verb == "unhandle" and regs:
                pending.append(asyncio.create_task(u.remove_event_handler(regs[i % len(regs)])))
            else:
                await asyncio.sleep(0)
        await asyncio.gather(*pending, return_exceptions=True)
        await u.settle()
        current = set(u.registrations)
        members = {s: c for c, s in ((c, s) for c in u.clusters() for s in made if u.sub_lister(c)[1] is s.lister)}
        for s in made:
            names = sorted(r.name for r in s.registrations)
            want = sorted(f"{r.name}@{members[s]}" for r in current) if s in members else []
            assert names == want, (s, names, want)
        handler_tasks = [t for t in asyncio.all_tasks() if t.get_name().startswith("handler ")]
        assert len(handler_tasks) == sum(len(s.registrations) for s in made)  # detached ones are gone
        for s in made:
            await s.stop()
        assert asyncio.all_tasks() - before == set()  # no handler or detach task left behind

    asyncio.run(scenario())
