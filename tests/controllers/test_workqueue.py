"""WorkQueue and rate limiters: client-go semantics, and controller-runtime's priorities."""

from __future__ import annotations

import asyncio
import random

import pytest
from prometheus_client import CollectorRegistry

from controllers import (
    LOW_PRIORITY, BucketRateLimiter, ItemExponentialFailureRateLimiter, QueueShutDown, WorkQueue,
    default_controller_rate_limiter,
)

from tests.helpers import nothing_within, settle


async def test_dedup_processing_and_dirty_requeue():
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    q.add("a")
    q.add("b")
    assert len(q) == 2
    item = await q.get()
    assert item == "a"
    q.add("a")  # while processing: marked dirty, not queued
    assert len(q) == 1
    q.done("a")  # re-queued now
    assert [await q.get(), await q.get()] == ["b", "a"]


async def test_concurrent_workers_never_hold_the_same_item():
    q: WorkQueue[int] = WorkQueue()
    held: set[int] = set()
    processed = 0

    async def worker():
        nonlocal processed
        while True:
            try:
                item = await q.get()
            except QueueShutDown:
                return
            assert item not in held
            held.add(item)
            await asyncio.sleep(random.random() / 1000)
            held.discard(item)
            processed += 1
            q.done(item)

    workers = [asyncio.create_task(worker()) for _ in range(8)]
    for _ in range(2000):
        q.add(random.randrange(20))
        if random.random() < 0.3:
            await asyncio.sleep(0)
    assert await q.shutdown_with_drain(10)
    await asyncio.gather(*workers)
    assert processed >= 20


async def test_add_after_keeps_the_earlier_ready_time():
    q: WorkQueue[str] = WorkQueue()
    q.add_after("x", 5)
    q.add_after("x", 0.05)
    q.add_after("x", 10)  # later: ignored
    loop = asyncio.get_running_loop()
    t = loop.time()
    assert await asyncio.wait_for(q.get(), 2) == "x"
    assert 0.04 <= loop.time() - t < 1
    q.done("x")
    await nothing_within(lambda: len(q) > 0, 0.1)  # the superseded ready times do not bring it back


async def test_rate_limited_requeues_forget_and_metrics():
    reg = CollectorRegistry()
    q: WorkQueue[str] = WorkQueue("wq-test", ItemExponentialFailureRateLimiter(0.01, 1), reg)
    for _ in range(3):
        q.add_rate_limited("r")
        item = await asyncio.wait_for(q.get(), 2)
        q.done(item)
    assert q.num_requeues("r") == 3
    q.forget("r")
    assert q.num_requeues("r") == 0
    names = {s.name for m in reg.collect() for s in m.samples}
    for expected in ("workqueue_depth", "workqueue_adds_total", "workqueue_queue_duration_seconds_bucket",
                     "workqueue_work_duration_seconds_bucket", "workqueue_unfinished_work_seconds",
                     "workqueue_longest_running_processor_seconds", "workqueue_retries_total"):
        assert expected in names
    assert reg.get_sample_value("workqueue_retries_total", {"name": "wq-test"}) == 3


async def test_shutdown_drains_and_then_raises():
    q: WorkQueue[str] = WorkQueue()
    q.add("a")
    q.add("b")
    item = await q.get()
    drain = asyncio.create_task(q.shutdown_with_drain(5))
    await settle(lambda: q.shutting_down)
    q.add("c")  # refused after shutdown
    assert await q.get() == "b"  # remaining items are still handed out
    assert not drain.done()
    q.done(item)
    q.done("b")
    assert await drain
    with pytest.raises(QueueShutDown):
        await q.get()


async def test_waiting_getter_is_woken_by_shutdown():
    q: WorkQueue[str] = WorkQueue()
    getter = asyncio.create_task(q.get())
    await settle(lambda: len(q._getters) == 1)  # waiting: not the path of a get on a queue already shut down
    q.shutdown()
    with pytest.raises(QueueShutDown):
        await getter


def test_default_limiter_is_max_of_exponential_and_bucket():
    limiter = default_controller_rate_limiter()
    assert [limiter.when("i") for _ in range(4)] == [0.005, 0.01, 0.02, 0.04]
    exp = ItemExponentialFailureRateLimiter(0.005, 1000)
    assert max(exp.when("j") for _ in range(40)) == 1000
    now = [0.0]
    bucket = BucketRateLimiter(10, 100, clock=lambda: now[0])
    delays = [bucket.when(i) for i in range(101)]
    assert delays[:100] == [0.0] * 100 and delays[100] == pytest.approx(0.1)


# -- priorities (controller-runtime's priority queue) ----------------------------------------------------------
LOW = LOW_PRIORITY


async def take(q: WorkQueue[str], n: int) -> list[str]:
    out = []
    for _ in range(n):
        item = await asyncio.wait_for(q.get(), 2)
        q.done(item)
        out.append(item)
    return out


def depth(reg: CollectorRegistry, name: str, priority: str) -> float | None:
    return reg.get_sample_value("workqueue_depth", {"name": name, "priority": priority})


async def test_the_highest_priority_is_served_first_and_fifo_within_one():
    q: WorkQueue[str] = WorkQueue()
    for item, priority in (("i1", LOW), ("i2", LOW), ("live1", 0), ("urgent", 5), ("live2", 0), ("i3", LOW)):
        q.add(item, priority)
    assert len(q) == 6
    assert await take(q, 6) == ["urgent", "live1", "live2", "i1", "i2", "i3"]


async def test_a_re_add_keeps_the_higher_priority_and_a_rise_joins_the_tail_of_its_new_priority():
    reg = CollectorRegistry()
    q: WorkQueue[str] = WorkQueue("pq-rise", metrics_registry=reg)
    for item in ("i1", "i2", "i3", "i4"):
        q.add(item, LOW)
    q.add("live", 0)
    q.add("i3", 0)  # a live change to an object still waiting from the initial list
    q.add("i3", LOW)  # a lower re-add changes nothing
    q.add("live", LOW)
    q.add("i1", LOW)
    assert len(q) == 5  # one entry per item: de-duplicated
    assert (depth(reg, "pq-rise", "0"), depth(reg, "pq-rise", "-100")) == (2, 3)
    assert reg.get_sample_value("workqueue_adds_total", {"name": "pq-rise"}) == 5
    assert await q.get_with_priority() == ("live", 0)
    assert await q.get_with_priority() == ("i3", 0)  # behind the live change that came first
    assert (depth(reg, "pq-rise", "0"), depth(reg, "pq-rise", "-100")) == (0, 3)
    for item in ("live", "i3"):
        q.done(item)
    q.add("i3", LOW)  # back at its old priority, behind the others: its stale entry there is not used
    assert await take(q, 4) == ["i1", "i2", "i4", "i3"]
    assert len(q) == 0 and depth(reg, "pq-rise", "-100") == 0


async def test_an_item_added_while_processed_is_queued_once_after_done_at_its_highest_priority():
    q: WorkQueue[str] = WorkQueue()
    q.add("a", LOW)
    q.add("b", LOW)
    assert await q.get_with_priority() == ("a", LOW)
    q.add("a", LOW)
    q.add("a", 0)
    q.add("a", LOW)
    assert len(q) == 1 and q.processing == 1  # not handed out again before done
    q.done("a")
    assert len(q) == 2
    assert await q.get_with_priority() == ("a", 0)
    q.done("a")
    assert await take(q, 1) == ["b"] and len(q) == 0


async def test_workers_never_hold_the_same_item_with_priorities_and_every_item_is_served():
    q: WorkQueue[int] = WorkQueue()
    held: set[int] = set()
    served: set[int] = set()

    async def worker():
        while True:
            try:
                item, _ = await q.get_with_priority()
            except QueueShutDown:
                return
            assert item not in held
            held.add(item)
            await asyncio.sleep(random.random() / 1000)
            held.discard(item)
            served.add(item)
            q.done(item)

    workers = [asyncio.create_task(worker()) for _ in range(8)]
    added = set()
    for _ in range(3000):
        item = random.randrange(50)
        added.add(item)
        q.add(item, random.choice((LOW, 0, 0, 3)))
        if random.random() < 0.3:
            await asyncio.sleep(0)
    assert await q.shutdown_with_drain(10)
    await asyncio.gather(*workers)
    assert served == added and len(q) == 0 and q.processing == 0
    assert sum(len(level) for level in q._levels.values()) == 0  # no stale entry left behind


async def test_delayed_and_rate_limited_adds_keep_their_priority_and_the_earlier_time():
    q: WorkQueue[str] = WorkQueue("", ItemExponentialFailureRateLimiter(0.01, 0.01))
    q.add("i1", LOW)
    q.add("i2", LOW)
    q.add_rate_limited("retry", 0)
    q.add_after("later", 0.02, LOW)
    q.add_after("later", 5, 0)  # later: the time stays, the priority rises
    await settle(lambda: len(q) == 4)
    assert await q.get_with_priority() == ("retry", 0)
    assert await q.get_with_priority() == ("later", 0)
    assert q.num_requeues("retry") == 1
    q.forget("retry")
    assert q.num_requeues("retry") == 0


async def test_a_queue_without_priorities_is_client_gos_fifo():
    reg = CollectorRegistry()
    q: WorkQueue[str] = WorkQueue("pq-off", metrics_registry=reg, prioritized=False)
    for item, priority in (("i1", LOW), ("live", 0), ("i1", 0), ("urgent", 5)):
        q.add(item, priority)
    assert depth(reg, "pq-off", "") == 3 and depth(reg, "pq-off", "0") is None
    assert await q.get_with_priority() == ("i1", 0)
    q.done("i1")
    assert await take(q, 2) == ["live", "urgent"]


async def test_workqueue_depth_shows_25_priorities_apart_and_sums_the_others():
    reg = CollectorRegistry()
    q: WorkQueue[int] = WorkQueue("pq-many", metrics_registry=reg)
    for p in range(30):
        q.add(p, p)
        q.add(100 + p, p)
    labels = {s.labels["priority"]: s.value for m in reg.collect() for s in m.samples
              if s.name == "workqueue_depth" and s.labels["name"] == "pq-many"}
    assert len(labels) == 26 and labels["exceeded_cardinality_limit"] == 10  # priorities 0-4, lowest, together
    assert labels["29"] == 2 and "4" not in labels and "5" in labels
    assert [await q.get() for _ in range(4)] == [29, 129, 28, 128]
    for p in range(30):  # emptied levels beyond the limit are dropped
        q.add(1000 + p, p)
    assert len(q._levels) <= 31
