"""KeyedLoop alone, over a queue of plain string keys: retries, drops, the fence, and stopping (drain, cancel,
stuck workers). The Controller and fleet tests cover it under their handlers."""

from __future__ import annotations

import asyncio

import pytest

from controllers import LOW_PRIORITY, ItemExponentialFailureRateLimiter, Result, WorkQueue
from controllers.keyed_loop import KeyedLoop

from tests.helpers import eventually


class Term:
    """A fence the test opens and closes."""

    def __init__(self) -> None:
        self.open = True

    def valid(self) -> bool:
        return self.open


def queue() -> WorkQueue[str]:
    return WorkQueue("", ItemExponentialFailureRateLimiter(0.001, 0.01))


@pytest.fixture
async def no_leaks():
    before = asyncio.all_tasks()
    yield
    assert asyncio.all_tasks() - before - {asyncio.current_task()} == set()  # the teardown runs in a task of its own


async def running(loop: KeyedLoop[str]) -> asyncio.Task[None]:
    task = asyncio.create_task(loop.run())
    await eventually(lambda: loop.state == "running", 5, "the loop to start")
    return task


async def test_failures_are_retried_rate_limited_and_a_success_forgets_the_key(no_leaks):
    calls: list[str] = []

    async def sync(key: str) -> Result | None:
        calls.append(key)
        if calls.count(key) < 3:
            raise RuntimeError("not yet")
        return None

    q = queue()
    loop = KeyedLoop("secrets", q, sync, action="processing secret {}")
    q.add("ns/a")
    task = await running(loop)
    await eventually(lambda: calls == ["ns/a"] * 3 and q.processing == 0, 5, "three attempts")
    assert q.num_requeues("ns/a") == 0 and len(q) == 0
    assert (loop.stats.total, loop.stats.errors) == (3, 2)
    assert loop.metrics.results["success"] == 1 and loop.metrics.errors == 2
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert loop.state == "stopped" and q.shutting_down


class TakenQueue(WorkQueue[str]):
    """Records (key, priority) of every key handed out."""

    def __init__(self) -> None:
        super().__init__("", ItemExponentialFailureRateLimiter(0.001, 0.01))
        self.taken: list[tuple[str, int]] = []

    async def get_with_priority(self) -> tuple[str, int]:
        got = await super().get_with_priority()
        self.taken.append(got)
        return got


async def test_retries_and_requeues_keep_the_priority_taken_unless_the_result_names_one(no_leaks):
    script: list[Exception | Result | None] = [
        RuntimeError("once"), Result(requeue=True), Result(requeue_after=0.001, priority=5), Result(requeue=True),
        None]

    async def sync(key: str) -> Result | None:
        answer = script.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    q = TakenQueue()
    loop = KeyedLoop("l", q, sync)
    q.add("k", LOW_PRIORITY)
    task = await running(loop)
    await eventually(lambda: not script and q.processing == 0, 5, "every answer used")
    assert q.taken == [("k", LOW_PRIORITY)] * 3 + [("k", 5)] * 2
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


async def test_stop_lets_a_busy_worker_finish_within_drain_and_drops_what_is_still_queued(no_leaks):
    gate, entered, handled = asyncio.Event(), asyncio.Event(), []

    async def sync(key: str) -> Result | None:
        if key == "slow":
            entered.set()
            await gate.wait()
        handled.append(key)
        return None

    q = queue()
    loop = KeyedLoop("l", q, sync, workers=1, drain=5)
    task = await running(loop)
    q.add("slow")
    await entered.wait()
    q.add("queued")
    stop = asyncio.create_task(loop.stop())
    done, _ = await asyncio.wait([stop], timeout=0.05)
    assert not done  # the worker finishes its key first
    gate.set()
    assert await stop == []
    assert handled == ["slow"]  # what was still queued was dropped, not started
    await task
    assert loop.state == "stopped"


async def test_stop_cancels_a_worker_past_drain(no_leaks):
    cancelled = asyncio.Event()

    async def sync(key: str) -> Result | None:
        try:
            await asyncio.get_running_loop().create_future()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return None

    q = queue()
    loop = KeyedLoop("l", q, sync, drain=0.05)
    task = await running(loop)
    q.add("x")
    await eventually(lambda: q.processing == 1, 5, "x in progress")
    assert await loop.stop() == []
    assert cancelled.is_set() and q.processing == 0
    await task


async def test_stop_names_the_workers_that_do_not_end_within_stop_timeout_and_waits_for_them_again(no_leaks):
    release = asyncio.Event()

    async def stubborn(key: str) -> Result | None:
        while not release.is_set():  # a handler that outlives every cancellation
            try:
                await release.wait()
            except asyncio.CancelledError:
                pass
        return None

    q = queue()
    loop = KeyedLoop("l", q, stubborn, workers=2, stop_timeout=0.05)
    task = await running(loop)
    q.add("x")
    await eventually(lambda: q.processing == 1, 5, "x in progress")
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)  # run returns once its stop has given up
    assert loop.state == "stopping"
    [stuck] = await loop.stop()  # cancelled again, and still running
    assert stuck.startswith("l worker ")
    release.set()
    assert await loop.stop() == []
    assert loop.state == "stopped"


async def test_a_worker_that_fails_ends_run_with_its_exception(no_leaks):
    def skip(key: str) -> str | None:
        raise KeyError(key)

    async def sync(key: str) -> Result | None:
        return None

    q = queue()
    loop = KeyedLoop("l", q, sync, workers=3, skip=skip)
    q.add("x")
    with pytest.raises(KeyError, match="x"):
        await loop.run()
    assert loop.state == "stopped"


async def test_a_key_of_an_ended_term_stays_queued_and_its_worker_wakes_when_the_stop_begins(no_leaks):
    handled: list[str] = []

    async def sync(key: str) -> Result | None:
        handled.append(key)
        return None

    term = Term()
    q = queue()
    loop = KeyedLoop("l", q, sync, fence=term, drain=30)
    task = await running(loop)
    term.open = False
    q.add("x")
    await eventually(lambda: len(q) == 1 and q.processing == 0, 5, "x put back")
    assert handled == [] and q.num_requeues("x") == 0 and loop.stats.total == 0
    assert await asyncio.wait_for(loop.stop(), 5) == []  # the parked worker does not hold the drain
    await task


async def test_a_loop_runs_once_and_refuses_bad_arguments(no_leaks):
    async def sync(key: str) -> Result | None:
        return None

    q = queue()
    loop = KeyedLoop("l", q, sync)
    assert await loop.stop() == [] and q.shutting_down  # never run: its queue is shut down all the same
    with pytest.raises(RuntimeError, match="runs once"):
        await loop.run()
    with pytest.raises(ValueError, match="workers must be at least 1"):
        KeyedLoop("l", queue(), sync, workers=0)
    with pytest.raises(ValueError, match="must name the key once"):
        KeyedLoop("l", queue(), sync, action="syncing")


async def test_a_backlog_of_quick_keys_runs_in_slices_and_other_tasks_still_get_turns(no_leaks):
    """A worker takes ready keys back to back for a slice (20 ms): 300 keys queued at once are not handed out one
    per turn of the loop (with hundreds of tasks ready, each turn is long), yet a handler that only computes still
    lets the loop's other tasks run between slices."""
    done: list[str] = []
    spin = 0.0

    async def handle(key: str) -> Result | None:
        if spin:
            t = asyncio.get_running_loop().time()
            while asyncio.get_running_loop().time() - t < spin:
                pass
        done.append(key)
        return None

    async def interleavings(n: int) -> int:
        """How many times another task ran while the backlog of ``n`` keys was part done."""
        seen: set[int] = set()

        async def other() -> None:
            while True:
                if 0 < len(done) < n:
                    seen.add(len(done))
                await asyncio.sleep(0)

        q = queue()
        loop = KeyedLoop("backlog", q, handle)
        task = await running(loop)
        done.clear()
        tick = asyncio.create_task(other())
        for i in range(n):
            q.add(f"k{i}")
        await eventually(lambda: len(done) == n, 10, f"{n} keys handled")
        tick.cancel()
        task.cancel()
        await asyncio.gather(tick, task, return_exceptions=True)
        return len(seen)

    assert await interleavings(300) < 50  # one per key before
    spin = 0.002  # 2 ms of computing per key: a slice ends every ten keys or so
    assert await interleavings(100) >= 5
