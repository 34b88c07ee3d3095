"""The Controller helper against real informers fed by the test: retries, requeues, predicates, mapping, fence."""

from __future__ import annotations

import asyncio
import functools

import pytest
from prometheus_client import CollectorRegistry

from controllers import (
    LOW_PRIORITY, Controller, ControllerContext, ItemExponentialFailureRateLimiter, Request, Result, TerminalError,
    WorkQueue,
)

from tests.fakes import A, Recorder, obj, run_with
from tests.helpers import nothing_within, settle


class Term:
    """A fence the test opens and closes."""

    def __init__(self):
        self.open = True

    def valid(self):
        return self.open

    def remaining(self):
        return 10.0 if self.open else 0.0


def controller(reconcile, base=0.001, cap=0.008, **kw):
    return Controller("c", reconcile, rate_limiter=ItemExponentialFailureRateLimiter(base, cap),
                      metrics_registry=CollectorRegistry(), **kw)


X = Request("x", "ns")


async def test_a_failing_reconcile_is_retried_forever_with_capped_backoff(sources):
    src = sources()
    inf = src.add(A, objects=[obj("x")])
    rec = Recorder(*[RuntimeError("not yet")] * 1000)
    c = controller(rec).watch(A)
    ctx = ControllerContext("c", {A: inf}, src)

    async def scenario():
        await settle(lambda: len(rec.calls) >= 25)  # client-go's examples, and this helper before, gave up at 16
        assert min(rec.gaps()[-5:]) >= 0.007  # at the cap, and staying there
        assert c.queue.num_requeues(X) >= 24
        stats = ctx.reconcile_stats
        assert stats.errors == len(rec.calls) and stats.last_error == "RuntimeError: not yet"

    await run_with(c, ctx, scenario())


async def test_the_same_failure_again_is_one_counted_line_not_another_traceback(sources):
    from loguru import logger

    src = sources()
    inf = src.add(A, objects=[obj("x")])
    rec = Recorder(*[RuntimeError("not yet")] * 4, KeyError("other"), RuntimeError("not yet"))
    c = controller(rec).watch(A)
    records = []
    sink = logger.add(lambda m: records.append(m.record), level="WARNING")

    async def scenario():
        await settle(lambda: len(rec.calls) == 7)

    try:
        await run_with(c, ControllerContext("c", {A: inf}, src), scenario())
    finally:
        logger.remove(sink)
    failed = [(r["exception"] is not None, r["message"]) for r in records if "failed; retrying" in r["message"]]
    assert [tb for tb, _ in failed] == [True, False, False, False, True, True]
    assert failed[3][1].endswith("(the same error, 4 times in a row: RuntimeError: not yet)")


async def test_an_explicit_max_retries_still_drops_the_request(sources):
    src = sources()
    inf = src.add(A, objects=[obj("x")])
    rec = Recorder(*[RuntimeError("no")] * 1000)
    c = controller(rec, max_retries=3).watch(A)

    async def scenario():
        await settle(lambda: len(rec.calls) == 4 and c.queue.num_requeues(X) == 0)
        await nothing_within(lambda: len(rec.calls) > 4, 0.1)

    await run_with(c, ControllerContext("c", {A: inf}, src), scenario())


async def test_a_terminal_error_is_not_retried_until_the_object_changes(sources):
    src = sources()
    inf = src.add(A, objects=[obj("x")])
    rec = Recorder(TerminalError("invalid spec"))
    c = controller(rec).watch(A)
    ctx = ControllerContext("c", {A: inf}, src)

    async def scenario():
        await settle(lambda: len(rec.calls) == 1)
        await nothing_within(lambda: len(rec.calls) > 1, 0.1)  # a retry would come within 1 ms
        assert c.queue.num_requeues(X) == 0
        assert ctx.reconcile_stats.errors == 1 and ctx.reconcile_stats.last_error == "TerminalError: invalid spec"
        inf.apply("MODIFIED", obj("x", rv="2"))
        await settle(lambda: len(rec.calls) == 2)
        assert ctx.reconcile_stats.errors == 1 and ctx.reconcile_stats.total == 2

    await run_with(c, ctx, scenario())


async def test_requeue_after_runs_again_after_the_delay_and_resets_failures(sources):
    src = sources()
    inf = src.add(A, objects=[obj("x")])
    rec = Recorder(RuntimeError("once"), Result(requeue_after=0.1))
    c = controller(rec).watch(A)

    async def scenario():
        await settle(lambda: len(rec.calls) == 3)
        assert rec.gaps()[1] >= 0.095
        await settle(lambda: c.queue.num_requeues(X) == 0)

    await run_with(c, ControllerContext("c", {A: inf}, src), scenario())


async def test_requeue_goes_through_the_rate_limiter(sources):
    src = sources()
    inf = src.add(A, objects=[obj("x")])
    rec = Recorder(Result(requeue=True), Result(requeue=True))
    c = controller(rec, base=0.02, cap=1.0).watch(A)
    ctx = ControllerContext("c", {A: inf}, src)

    async def scenario():
        await settle(lambda: len(rec.calls) == 3 and c.queue.num_requeues(X) == 0)
        first, second = rec.gaps()
        assert first >= 0.019 and second >= 0.039  # 20 ms, then doubled
        assert ctx.reconcile_stats.total == 3 and ctx.reconcile_stats.errors == 0

    await run_with(c, ctx, scenario())


async def test_predicates_filter_events(sources):
    src = sources()
    red, blue = {"color": "red"}, {"color": "blue"}
    inf = src.add(A, objects=[obj("a", labels=red), obj("b", labels=blue)])
    rec = Recorder()
    c = controller(rec).watch(A, predicate=lambda o: o["metadata"]["labels"].get("color") == "red")

    async def scenario():
        inf.apply("ADDED", obj("c", labels=red))
        await settle(lambda: rec.names == ["a", "c"])  # handler events are in order: b was seen and skipped
        inf.apply("MODIFIED", obj("b", rv="2", labels=red))
        await settle(lambda: rec.names == ["a", "c", "b"])

    await run_with(c, ControllerContext("c", {A: inf}, src), scenario())


async def test_a_field_selector_keeps_matching_objects_and_those_leaving_the_selection(sources):
    src = sources()

    def pod(name, phase, rv="1"):
        return {**obj(name, rv=rv), "status": {"phase": phase}}

    inf = src.add(A, objects=[pod("a", "Running"), pod("b", "Pending")])
    rec = Recorder()
    c = controller(rec).for_(A, field_selector="status.phase=Running")

    async def scenario():
        await settle(lambda: rec.names == ["a"])
        inf.apply("MODIFIED", pod("b", "Running", rv="2"))  # enters the selection
        await settle(lambda: rec.names == ["a", "b"])
        inf.apply("MODIFIED", pod("a", "Failed", rv="2"))  # leaves it: seen once more, as a server would say
        inf.apply("MODIFIED", pod("a", "Unknown", rv="3"))  # outside before and after: not seen
        inf.apply("ADDED", pod("c", "Running"))
        await settle(lambda: rec.names == ["a", "b", "a", "c"])

    await run_with(c, ControllerContext("c", {A: inf}, src), scenario())
    with pytest.raises(ValueError, match="is not field=value"):
        controller(Recorder()).for_(A, field_selector="phase")


def owners(o):
    return [Request(ref["name"], o["metadata"]["namespace"]) for ref in o["metadata"]["ownerReferences"]]


async def test_owner_mapping_reconciles_the_old_and_the_new_owner(sources):
    src = sources()
    inf = src.add(A, objects=[obj("child", owners=["o1"])])
    rec = Recorder()
    c = controller(rec).watch(A, map_fn=owners)

    async def scenario():
        await settle(lambda: rec.names == ["o1"])
        inf.apply("MODIFIED", obj("child", rv="2", owners=["o2"]))  # adopted by another owner
        await settle(lambda: len(rec.calls) == 3)
        assert sorted(rec.names[1:]) == ["o1", "o2"]  # the old owner learns it lost the child
        inf.apply("MODIFIED", obj("child", rv="3", owners=["o2"]))
        await settle(lambda: len(rec.calls) == 4)
        assert rec.names[3] == "o2"  # same owner on both sides: one request
        await nothing_within(lambda: len(rec.calls) > 4, 0.05)
        inf.apply("DELETED", obj("child", rv="4", owners=["o2"]))
        await settle(lambda: rec.names[4:] == ["o2"])

    await run_with(c, ControllerContext("c", {A: inf}, src), scenario())


async def test_a_closed_fence_leaves_new_items_queued_and_uncounted(sources):
    src = sources()
    inf = src.add(A, objects=[obj("x")])
    rec = Recorder()
    term = Term()
    c = controller(rec, workers=2).watch(A)
    ctx = ControllerContext("c", {A: inf}, src, fence=term)

    async def scenario():
        await settle(lambda: rec.names == ["x"])
        term.open = False
        inf.apply("ADDED", obj("y"))
        await nothing_within(lambda: len(rec.calls) > 1, 0.1)
        assert len(c.queue) == 1 and c.queue.processing == 0  # put back, not lost
        assert c.queue.num_requeues(Request("y", "ns")) == 0 and ctx.reconcile_stats.errors == 0

    await run_with(c, ctx, scenario())  # the waiting workers end when cancelled


async def _async_reconcile(extra, req):
    return None


def test_a_synchronous_reconcile_is_refused_when_the_controller_is_built():
    def reconcile(req):
        return None

    with pytest.raises(TypeError, match=r"reconcile test_a_synchronous.*<locals>\.reconcile is not a coroutine"):
        Controller("c", reconcile)
    Controller("c", Recorder())  # an object with an async __call__
    Controller("c", functools.partial(_async_reconcile, 1))


class Gated:
    """A reconcile recording the names of its requests, whose first call waits for ``gate``."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.gate = asyncio.Event()

    async def __call__(self, req: Request) -> None:
        self.names.append(req.name)
        if len(self.names) == 1:
            await self.gate.wait()


def handled(inf) -> bool:
    """Every event the informer has delivered has been handled (the Controller's handlers are synchronous)."""
    return all(r.queue_depth == 0 for r in inf.registrations)


@pytest.mark.parametrize("own, in_ctx, prioritized", [(None, True, True), (None, False, False), (False, True, False)])
async def test_a_live_change_overtakes_the_initial_list_unless_priorities_are_off(sources, own, in_ctx, prioritized):
    src = sources()
    initial = [f"o{i:02}" for i in range(20)]
    inf = src.add(A, objects=[obj(name) for name in initial])
    rec, reg = Gated(), CollectorRegistry()
    c = Controller("c", rec, metrics_registry=reg, priority_queue=own).watch(A)

    async def scenario():
        await settle(lambda: rec.names == ["o00"])  # the others of the initial list wait, low priority
        inf.apply("MODIFIED", obj("o19", rv="2"))  # the last of them changes now
        await settle(lambda: handled(inf))
        live = reg.get_sample_value("workqueue_depth", {"name": "c", "priority": "0"})
        assert live == (1 if prioritized else None) and len(c.queue) == 19
        rec.gate.set()
        await settle(lambda: len(rec.names) == 20)
        assert rec.names == (["o00", "o19", *initial[1:19]] if prioritized else initial)
        await nothing_within(lambda: len(rec.names) > 20, 0.05)  # de-duplicated: o19 once

    await run_with(c, ControllerContext("c", {A: inf}, src, priority_queue=in_ctx), scenario())


async def test_resyncs_wait_behind_live_changes_and_a_relist_s_changes_do_not(sources):
    src = sources()
    inf = src.add(A, objects=[obj("a"), obj("b")])
    rec = Gated()
    resynced: set[str] = set()

    def spy(event) -> bool:
        if event.type == "update" and event.old is event.new:
            resynced.add(event.obj["metadata"]["name"])
        return True

    c = controller(rec).watch(A, predicates=[spy])

    async def scenario():
        await settle(lambda: rec.names == ["a"])  # b waits, low priority
        await settle(lambda: resynced == {"a", "b"})  # a resync: both again, low priority (a once done)
        inf.apply("ADDED", obj("c"))  # live
        inf.replace([obj("a"), obj("b", rv="2"), obj("c")], "3")  # a relist: b changed while not watched
        await settle(lambda: handled(inf))
        rec.gate.set()
        await settle(lambda: len(rec.names) >= 4)
        assert rec.names[:4] == ["a", "c", "b", "a"]  # the relist's change to b is live, behind c

    await run_with(c, ControllerContext("c", {A: inf}, src, resync_period=0.05), scenario())


async def test_the_fleet_handler_queues_a_joining_cluster_s_objects_and_resyncs_low():
    from controllers.fleet import ClusterRequest, _Enqueuer as FleetEnqueuer

    q: WorkQueue[ClusterRequest] = WorkQueue()
    h = FleetEnqueuer(q)
    h.on_add(obj("old"), True, "c1")  # the initial list of a cluster joining
    h.on_update(obj("resynced"), obj("resynced"), "c1")
    h.on_add(obj("new"), False, "c2")
    h.on_update(obj("changed"), obj("changed", rv="2"), "c1")
    h.on_delete(obj("gone"), "c2")
    got = [await q.get_with_priority() for _ in range(5)]
    assert [(r.name, p) for r, p in got] == [("new", 0), ("changed", 0), ("gone", 0), ("old", LOW_PRIORITY),
                                             ("resynced", LOW_PRIORITY)]
