"""WorkQueue: client-go's rate-limited, delaying, de-duplicating work queue for asyncio.

- An item added while it waits is not added twice; one added while being processed is marked dirty and
  queued again when ``done`` is called, so two workers never hold the same item.
- ``add_after`` holds an item back; a second ``add_after`` can only move its ready time earlier.
- ``add_rate_limited`` delays by the rate limiter; ``forget`` resets the item's failures.
- ``shutdown`` wakes every waiting ``get`` (which then raises ``QueueShutDown``) once the queue is empty;
  ``shutdown_with_drain`` also waits until items being processed are done.
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
        depth = GaugeMetricFamily("workqueue_depth", "Current depth of the workqueue.", labels=["name"])
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
            depth.add_metric([name], sum(len(q) for q in queues))
            adds.add_metric([name], sum(q._adds for q in queues))
            retries.add_metric([name], sum(q._retries for q in queues))
            unfinished.add_metric([name], sum(q._unfinished() for q in queues))
            longest.add_metric([name], max(q._longest() for q in queues))
            for family, attr in ((latency, "_latency"), (work, "_work")):
                histograms = [getattr(q, attr) for q in queues]
                family.add_metric([name], Histogram.buckets(histograms), sum(h.total for h in histograms))
        yield from (depth, adds, retries, unfinished, longest, latency, work)


def queue_depths(registry: CollectorRegistry | None = None) -> dict[str, int]:
    """``workqueue_depth`` without a scrape: the items waiting in the live named queues of ``registry``, summed by
    name (the status page's history samples them)."""
    collector = _Collector.registered(registry)
    if collector is None:
        return {}
    return {name: sum(len(q) for q in queues) for name, queues in collector.by_name().items()}


class WorkQueue(Generic[T]):
    """A de-duplicating work queue with delayed and rate-limited adds.

    Metrics (the usual ``workqueue_*`` names, label ``name``) are recorded when ``name`` is given; a queue that is
    shut down leaves the exposition.
    """

    def __init__(
        self, name: str = "", rate_limiter: RateLimiter | None = None,
        metrics_registry: CollectorRegistry | None = None,
    ) -> None:
        self.name = name
        self.rate_limiter = rate_limiter or default_controller_rate_limiter()
        self._queue: deque[T] = deque()
        self._dirty: set[T] = set()
        self._processing: set[T] = set()
        self._getters: deque[asyncio.Future[None]] = deque()
        self._waiting: list[tuple[float, int, T]] = []  # heap of (ready time, seq, item)
        self._ready_at: dict[T, float] = {}
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
    def add(self, item: T) -> None:
        """Queue ``item`` unless it is already waiting; if it is being processed, queue it again after ``done``."""
        if self._shutting_down or item in self._dirty:
            return
        self._dirty.add(item)
        if self._metered:
            self._adds += 1
            self._added_at.setdefault(item, time.monotonic())
        if item in self._processing:
            return
        self._queue.append(item)
        self._wake_one()

    def _wake_one(self) -> None:
        while self._getters:
            fut = self._getters.popleft()
            if not fut.done():
                fut.set_result(None)
                return

    async def get(self) -> T:
        """The next item (mark it processing); raises QueueShutDown when shut down and empty."""
        while not self._queue:
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
        item = self._queue.popleft()
        self._processing.add(item)
        self._dirty.discard(item)
        if self._metered:
            now = time.monotonic()
            added = self._added_at.pop(item, None)
            if added is not None:
                self._latency.observe(now - added)
            self._started_at[item] = now
        return item

    def done(self, item: T) -> None:
        """Mark ``item`` processed; if it was added meanwhile, queue it again."""
        self._processing.discard(item)
        if self._metered:
            started = self._started_at.pop(item, None)
            if started is not None:
                self._work.observe(time.monotonic() - started)
        if item in self._dirty:
            self._queue.append(item)
            self._wake_one()
        elif self._drained is not None and not self._processing:
            self._drained.set()

    def __len__(self) -> int:
        return len(self._queue)

    @property
    def processing(self) -> int:
        """Items taken by ``get`` and not yet ``done``."""
        return len(self._processing)

    # -- delays ------------------------------------------------------------------------------------------
    def add_after(self, item: T, delay: float) -> None:
        """Queue ``item`` after ``delay`` seconds; if already waiting, keep the earlier ready time."""
        if self._shutting_down:
            return
        if delay <= 0:
            self.add(item)
            return
        ready = time.monotonic() + delay
        current = self._ready_at.get(item)
        if current is not None and current <= ready:
            return
        self._ready_at[item] = ready
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
            if self._ready_at.get(item) == ready:  # stale heap entries were superseded by an earlier add_after
                del self._ready_at[item]
                self.add(item)
        self._schedule()

    # -- rate limiting -----------------------------------------------------------------------------------
    def add_rate_limited(self, item: T) -> None:
        """Queue ``item`` after the rate limiter's delay for it."""
        self._retries += 1
        self.add_after(item, self.rate_limiter.when(item))

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
        if not self._processing and not self._queue:
            return True
        try:
            async with asyncio.timeout(timeout):
                while self._processing or self._queue:
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
