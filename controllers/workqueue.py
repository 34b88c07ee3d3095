"""WorkQueue: client-go's rate-limited, delaying, de-duplicating work queue for asyncio, with controller-runtime's
priorities (its ``priorityqueue``).

- An item is queued once; one re-added while processed is queued again on ``done``: two workers never hold it.
- ``get`` hands out the highest priority first, FIFO within one; a re-add keeps the higher priority.
  ``prioritized=False`` is client-go's FIFO queue exactly.
- ``add_after`` holds an item back apart from the queue, as client-go (controller-runtime keeps one entry).
- ``done`` of an item not handed out does nothing (client-go's would queue a dirty one twice).
- ``shutdown`` wakes waiting ``get`` calls (``QueueShutDown``); ``shutdown_with_drain`` also awaits processing.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
import weakref
from collections import deque
from typing import Any, Generic, Hashable, Iterator, TypeVar

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from informers.metrics import Histogram, MetricSet

from .ratelimiter import RateLimiter, default_controller_rate_limiter

T = TypeVar("T", bound=Hashable)


class QueueShutDown(Exception):
    """``get`` on a queue that is shut down and empty."""


_BUCKETS = (1e-8, 1e-7, 1e-6, 1e-5, 1e-4, 1e-3, 0.01, 0.1, 1.0, 10.0, 100.0)
# Priorities a queue keeps a level for once emptied, and that workqueue_depth shows apart (controller-runtime's
# limit of distinct priority labels); the lower ones are summed under _OVER_LIMIT.
_MAX_LEVELS = 25
_OVER_LIMIT = "exceeded_cardinality_limit"


class _Collector(MetricSet):
    """Exposes every live named queue of a registry under client-go's ``workqueue_*`` names."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.queues: "weakref.WeakSet[WorkQueue[Any]]" = weakref.WeakSet()
        registry.register(self)

    def by_name(self) -> dict[str, list[WorkQueue[Any]]]:
        """The live queues (not shutting down), by name."""
        by_name: dict[str, list[WorkQueue[Any]]] = {}
        for q in list(self.queues):
            if not q.shutting_down:
                by_name.setdefault(q.name, []).append(q)
        return by_name

    def collect(self) -> Iterator[Metric]:
        by_name = self.by_name()
        depth = GaugeMetricFamily("workqueue_depth", "Current depth of the workqueue.", labels=["name", "priority"])
        adds = CounterMetricFamily("workqueue_adds_total", "Adds handled by the workqueue.", labels=["name"])
        retries = CounterMetricFamily("workqueue_retries_total", "Rate-limited re-adds.", labels=["name"])
        unfinished = GaugeMetricFamily("workqueue_unfinished_work_seconds", "Seconds of work in progress not yet "
                                       "done.", labels=["name"])
        longest = GaugeMetricFamily("workqueue_longest_running_processor_seconds", "Seconds the longest running "
                                    "item has been processed.", labels=["name"])
        latency = HistogramMetricFamily("workqueue_queue_duration_seconds", "Seconds an item waits before being "
                                        "taken.", labels=["name"])
        work = HistogramMetricFamily("workqueue_work_duration_seconds", "Seconds processing an item takes.",
                                     labels=["name"])
        for name, queues in sorted(by_name.items()):
            for priority, n in _depths(queues):
                depth.add_metric([name, priority], n)
            adds.add_metric([name], sum(q._adds for q in queues))
            retries.add_metric([name], sum(q._retries for q in queues))
            unfinished.add_metric([name], sum(q._unfinished() for q in queues))
            longest.add_metric([name], max(q._longest() for q in queues))
            for family, attr in ((latency, "_latency"), (work, "_work")):
                histograms = [getattr(q, attr) for q in queues]
                family.add_metric([name], Histogram.buckets(histograms), sum(h.total for h in histograms))
        yield from (depth, adds, retries, unfinished, longest, latency, work)


def _depths(queues: list["WorkQueue[Any]"]) -> list[tuple[str, int]]:
    """The depth of queues of one name by priority label: ``""`` for a queue without priorities (as
    controller-runtime labels client-go's), the highest ``_MAX_LEVELS`` priorities apart, the others together."""
    plain = sum(len(q) for q in queues if not q.prioritized)
    by_level: dict[int, int] = {}
    for q in queues:
        if q.prioritized:
            for level, n in q._depths():
                by_level[level] = by_level.get(level, 0) + n
    levels = sorted(by_level, reverse=True)
    out = [(str(level), by_level[level]) for level in levels[:_MAX_LEVELS]]
    if len(levels) > _MAX_LEVELS:
        out.append((_OVER_LIMIT, sum(by_level[level] for level in levels[_MAX_LEVELS:])))
    if plain or not by_level:
        out.append(("", plain))
    return out


def queue_depths(registry: CollectorRegistry | None = None) -> dict[str, int]:
    """``workqueue_depth`` without a scrape: the items waiting in the live named queues of ``registry``, summed by
    name (the status page's history samples them)."""
    collector = _Collector.registered(registry)
    if collector is None:
        return {}
    return {name: sum(len(q) for q in queues) for name, queues in collector.by_name().items()}


class WorkQueue(Generic[T]):
    """A de-duplicating work queue with priorities, delayed and rate-limited adds (see the module docstring).

    Metrics (the usual ``workqueue_*`` names, label ``name``; ``workqueue_depth`` also ``priority``) are recorded
    when ``name`` is given; a queue that is shut down leaves the exposition.
    """

    def __init__(
        self, name: str = "", rate_limiter: RateLimiter | None = None,
        metrics_registry: CollectorRegistry | None = None, *, prioritized: bool = True,
    ) -> None:
        self.name = name
        self.rate_limiter = rate_limiter or default_controller_rate_limiter()
        self.prioritized = prioritized
        # The items waiting to be handed out, one deque per priority, of (priority, item) entries. An item added and
        # not yet handed out is in _dirty with its entry: the one in a deque when it waits, a new one when it is
        # being processed (queued on done). An entry is live while _dirty holds it (by identity); a raised
        # priority leaves a stale entry behind, skipped when reached (or dropped when the queue empties) and
        # counted in _stale by priority until then. Keys are hashed as often as in client-go's queue.
        self._levels: dict[int, deque[tuple[int, T]]] = {0: deque()}
        self._order: list[tuple[int, deque[tuple[int, T]]]] = [(0, self._levels[0])]  # highest priority first
        self._dirty: dict[T, tuple[int, T]] = {}
        self._count = 0  # items waiting (live entries)
        self._stale: dict[int, int] = {}
        self._processing: set[T] = set()
        self._getters: deque[asyncio.Future[None]] = deque()
        self._waiting: list[tuple[float, int, T]] = []  # heap of (ready time, seq, item)
        self._ready_at: dict[T, tuple[float, int]] = {}  # held-back items: (ready time, priority)
        self._seq = itertools.count()
        self._timer: asyncio.TimerHandle | None = None
        self._shutting_down = False
        self._drained: asyncio.Event | None = None
        self._metered = bool(name)
        self._added_at: dict[T, float] = {}
        self._started_at: dict[T, float] = {}
        self._adds = self._retries = 0
        self._latency, self._work = Histogram(_BUCKETS), Histogram(_BUCKETS)
        if self._metered:
            _Collector.for_registry(metrics_registry).queues.add(self)

    # -- basic queue -------------------------------------------------------------------------------------
    def add(self, item: T, priority: int = 0) -> None:
        """Queue ``item`` with ``priority`` unless it is already waiting (then keep the higher priority); if it is
        being processed, queue it again after ``done``."""
        if self._shutting_down:
            return
        if not self.prioritized:
            priority = 0
        entry = self._dirty.get(item)
        if entry is not None:
            if priority > entry[0]:
                self._dirty[item] = raised = (priority, item)
                if item not in self._processing:  # waiting: to the tail of the higher priority
                    self._stale[entry[0]] = self._stale.get(entry[0], 0) + 1
                    self._level(priority).append(raised)
            return
        self._dirty[item] = entry = (priority, item)
        if self._metered:
            self._adds += 1
            self._added_at.setdefault(item, time.monotonic())
        if item in self._processing:
            return
        level = self._levels.get(priority)
        (level if level is not None else self._level(priority)).append(entry)
        self._count += 1
        if self._getters:
            self._wake_one()

    def _level(self, priority: int) -> deque[tuple[int, T]]:
        level = self._levels.get(priority)
        if level is None:
            level = self._levels[priority] = deque()
            self._order = sorted(self._levels.items(), key=lambda pl: pl[0], reverse=True)
        return level

    def _take(self) -> tuple[int, T]:
        """The first live entry of the highest priority, off the queue; its item is marked processing."""
        dirty = self._dirty
        for priority, level in self._order:
            while level:
                entry = level.popleft()
                item = entry[1]
                live = dirty.pop(item, None)
                if live is entry:
                    self._count -= 1
                    self._processing.add(item)
                    if self._metered:
                        now = time.monotonic()
                        added = self._added_at.pop(item, None)
                        if added is not None:
                            self._latency.observe(now - added)
                        self._started_at[item] = now
                    if not level and priority and len(self._levels) > _MAX_LEVELS:
                        del self._levels[priority]
                        self._order = [pl for pl in self._order if pl[0] != priority]
                    if self._stale and not self._count:  # nothing left to hand out: drop the stale entries too
                        for stale_level in self._levels.values():
                            stale_level.clear()
                        self._stale.clear()
                    return entry
                if live is not None:
                    dirty[item] = live
                left = self._stale[priority] - 1
                if left:
                    self._stale[priority] = left
                else:
                    del self._stale[priority]
        raise AssertionError("a queued item has no entry")

    def _wake_one(self) -> None:
        while self._getters:
            fut = self._getters.popleft()
            if not fut.done():
                fut.set_result(None)
                return

    async def _wait(self) -> None:
        if self._shutting_down:
            raise QueueShutDown(self.name)
        fut = asyncio.get_running_loop().create_future()
        self._getters.append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            # Pass a wake-up we may have consumed on to another getter.
            if fut.done() and not fut.cancelled():
                self._wake_one()
            raise

    async def get(self) -> T:
        """The next item (mark it processing); raises QueueShutDown when shut down and empty."""
        while not self._count:
            await self._wait()
        return self._take()[1]

    async def get_with_priority(self) -> tuple[T, int]:
        """``get``, with the priority the item was queued with (controller-runtime's ``GetWithPriority``): a
        worker re-adding the item keeps it."""
        while not self._count:
            await self._wait()
        priority, item = self._take()
        return item, priority

    def done(self, item: T) -> None:
        """Mark ``item`` processed; if it was added meanwhile, queue it again."""
        try:
            self._processing.remove(item)
        except KeyError:  # not handed out: nothing to do
            return
        if self._metered:
            started = self._started_at.pop(item, None)
            if started is not None:
                self._work.observe(time.monotonic() - started)
        entry = self._dirty.get(item)
        if entry is not None:
            self._level(entry[0]).append(entry)
            self._count += 1
            if self._getters:
                self._wake_one()
        elif self._drained is not None and not self._processing:
            self._drained.set()

    def __len__(self) -> int:
        return self._count

    def _depths(self) -> list[tuple[int, int]]:
        """(priority, items waiting) of every level."""
        return [(p, len(level) - self._stale.get(p, 0)) for p, level in self._levels.items()]

    @property
    def processing(self) -> int:
        """Items taken by ``get`` and not yet ``done``."""
        return len(self._processing)

    # -- delays ------------------------------------------------------------------------------------------
    def add_after(self, item: T, delay: float, priority: int = 0) -> None:
        """Queue ``item`` with ``priority`` after ``delay`` seconds; if already held back, keep the earlier ready
        time and the higher priority."""
        if self._shutting_down:
            return
        if delay <= 0:
            self.add(item, priority)
            return
        ready = time.monotonic() + delay
        current = self._ready_at.get(item)
        if current is not None:
            priority = max(priority, current[1])
            if current[0] <= ready:
                self._ready_at[item] = (current[0], priority)
                return
        self._ready_at[item] = (ready, priority)
        heapq.heappush(self._waiting, (ready, next(self._seq), item))
        if self._waiting[0][0] == ready:  # the new item is now the earliest: re-arm the timer
            self._schedule()

    def _schedule(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._waiting:
            loop = asyncio.get_running_loop()
            delay = self._waiting[0][0] - time.monotonic()
            self._timer = loop.call_at(loop.time() + max(delay, 0), self._release)

    def _release(self) -> None:
        self._timer = None
        now = time.monotonic()
        while self._waiting and self._waiting[0][0] <= now:
            ready, _, item = heapq.heappop(self._waiting)
            current = self._ready_at.get(item)
            if current is not None and current[0] == ready:  # stale heap entries were superseded by an earlier one
                del self._ready_at[item]
                self.add(item, current[1])
        self._schedule()

    # -- rate limiting -----------------------------------------------------------------------------------
    def add_rate_limited(self, item: T, priority: int = 0) -> None:
        """Queue ``item`` with ``priority`` after the rate limiter's delay for it."""
        self._retries += 1
        self.add_after(item, self.rate_limiter.when(item), priority)

    def forget(self, item: T) -> None:
        """Reset the item's failure count in the rate limiter."""
        self.rate_limiter.forget(item)

    def num_requeues(self, item: T) -> int:
        """How many times the item was rate-limited since it was last forgotten."""
        return self.rate_limiter.num_requeues(item)

    # -- shutdown ----------------------------------------------------------------------------------------
    @property
    def shutting_down(self) -> bool:
        """Whether ``shutdown`` was called."""
        return self._shutting_down

    def shutdown(self) -> None:
        """Refuse new items; getters drain what is queued, then get QueueShutDown. Delayed items are dropped."""
        self._shutting_down = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._waiting.clear()
        self._ready_at.clear()
        while self._getters:
            fut = self._getters.popleft()
            if not fut.done():
                fut.set_result(None)

    async def shutdown_with_drain(self, timeout: float | None = None) -> bool:
        """Shut down and wait until the queue is empty and nothing is being processed; False on timeout."""
        self.shutdown()
        self._drained = asyncio.Event()
        if not self._processing and not self._count:
            return True
        try:
            async with asyncio.timeout(timeout):
                while self._processing or self._count:
                    self._drained.clear()
                    await self._drained.wait()
        except TimeoutError:
            return False
        return True

    def _unfinished(self) -> float:
        now = time.monotonic()
        return sum(now - t for t in self._started_at.values())

    def _longest(self) -> float:
        return time.monotonic() - min(self._started_at.values()) if self._started_at else 0.0
