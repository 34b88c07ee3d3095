"""WorkQueue and rate limiters: client-go semantics."""

from __future__ import annotations

import asyncio
import random

import pytest
from prometheus_client import CollectorRegistry

from controllers import (
    BucketRateLimiter, ItemExponentialFailureRateLimiter, QueueShutDown, WorkQueue, default_controller_rate_limiter,
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
