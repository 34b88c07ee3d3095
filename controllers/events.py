"""EventRecorder: Kubernetes Events about objects, aggregated and rate-limited, written off the caller's path.

Differs from client-go's recorder (controller-runtime's ``record.EventRecorder``, kopf's ``kopf.info``):

- ``events.k8s.io/v1`` Events, ``core/v1`` only where the newer group is not served.
- Repeats of (object, type, reason, action, note) within 10 minutes add to the Event's ``series``; the note is part
  of the key (client-go leaves it out), and the count is written every ``series_interval`` s, not 30 minutes.
- client-go's per-object spam filter limits writes, not counting; a global bucket paces all writes.
- ``event()`` never blocks or raises: one owned worker drains a bounded queue; ``close()`` flushes the counts.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Literal

from loguru import logger

from informers import GVR, ApiClient
from informers.errors import NotFound
from informers.resource import Object, ResourceClient

from .ratelimiter import BucketRateLimiter

EventType = Literal["Normal", "Warning"]

_EVENTS_V1 = GVR("events.k8s.io", "v1", "events")
_CORE_EVENTS = GVR("", "v1", "events")
_SERIES_WINDOW = 600.0  # seconds after its last occurrence that an Event still takes more
_MAX_TRACKED = 4096  # series and per-object buckets remembered, as client-go's LRU caches
_NOTE_LIMIT = 1024  # bytes; the server refuses a longer note


@dataclass(frozen=True, slots=True)
class _Key:
    """What makes two occurrences the same Event."""

    regarding: tuple[str, ...]
    type: str
    reason: str
    action: str
    note: str


@dataclass(slots=True)
class _Series:
    """One Event: how it is named, and how many occurrences it has seen and the server knows of."""

    name: str
    namespace: str
    regarding: dict[str, str]
    first_seen: float  # wall-clock seconds
    last_seen: float
    last_seen_monotonic: float
    count: int = 1
    written: int = 0  # the count the server has; 0 before the Event is created
    written_at: float = 0.0  # monotonic
    queued: bool = False


class _TokenBucket:
    """``burst`` tokens refilled at ``rate`` a second; ``take`` refuses when empty instead of reserving a future
    token, as ``BucketRateLimiter`` does (a spam filter must drop or postpone, not queue up debt)."""

    def __init__(self, burst: int, rate: float, now: float) -> None:
        self.burst, self.rate = burst, rate
        self._tokens = float(burst)
        self._last = now

    def take(self, now: float) -> float:
        """Take a token (returns 0.0) or return the seconds until one is available (taking nothing)."""
        self._tokens = min(float(self.burst), self._tokens + (now - self._last) * self.rate)
        self._last = now
        if self._tokens >= 1:
            self._tokens -= 1
            return 0.0
        return (1 - self._tokens) / self.rate


class EventRecorder:
    """Records Events about objects for one controller (``reporting_controller``, e.g. ``example.com/widgets``)
    and process (``reporting_instance``, e.g. the pod name).

    Call ``event`` from the event loop's thread; close the recorder (``await close()`` or ``async with``) so its
    worker task ends. ``per_object_burst`` / ``per_object_refill`` (tokens a second) are the spam filter,
    ``qps`` / ``burst`` the global pace, ``series_interval`` the least time between two writes of a series' count,
    ``queue_size`` the bound on pending writes. ``dropped`` counts events that were not written (spam filter, full
    queue, recorded after close).
    """

    def __init__(self, api: ApiClient, reporting_controller: str, reporting_instance: str, *,
                 per_object_burst: int = 25, per_object_refill: float = 1 / 300, qps: float = 5.0, burst: int = 25,
                 series_interval: float = 10.0, queue_size: int = 1000,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.api = api
        self.reporting_controller = reporting_controller
        self.reporting_instance = reporting_instance
        self.series_interval = series_interval
        self.dropped = 0
        self._per_object = (per_object_burst, per_object_refill)
        self._clock = clock
        self._pace = BucketRateLimiter(qps, burst, clock)
        self._queue: asyncio.Queue[_Key] = asyncio.Queue(queue_size)
        self._series: OrderedDict[_Key, _Series] = OrderedDict()  # least recently seen first
        self._buckets: OrderedDict[tuple[str, ...], _TokenBucket] = OrderedDict()
        self._deferred: dict[_Key, asyncio.TimerHandle] = {}
        self._events: ResourceClient | None = None  # chosen by the first write
        self._worker: asyncio.Task[None] | None = None
        self._closed = False
        self._queue_full = False
        self._log = logger.bind(component="events", controller=reporting_controller)

    def event(self, obj: Object, type: EventType, reason: str, action: str, note: str = "") -> None:
        """Record that ``action`` happened to ``obj`` for ``reason`` (``type`` Normal or Warning), with a
        human-readable ``note``; the Event is written in the background."""
        try:
            self._record(obj, type, reason, action, note)
        except Exception:  # a broken event must never break the reconcile that reports it
            self._log.exception("could not record event {} {} for {}", type, reason, _describe(obj))

    async def close(self, timeout: float = 5.0) -> None:
        """Stop taking events, write the pending writes and series counts for up to ``timeout`` seconds, then stop
        the worker."""
        if self._closed:
            return
        self._closed = True
        for handle in self._deferred.values():
            handle.cancel()
        self._deferred.clear()
        if self._worker is None:
            return
        for key, series in self._series.items():
            if 0 < series.written < series.count:
                self._enqueue(key, series)
        try:
            await asyncio.wait_for(self._queue.join(), timeout)
        except TimeoutError:
            self._log.warning("closing with {} event writes still pending; dropping them", self._queue.qsize())
        self._worker.cancel()
        await asyncio.wait([self._worker])

    async def __aenter__(self) -> "EventRecorder":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- recording (caller's path: no I/O) ---------------------------------------------------------------
    def _record(self, obj: Object, type: EventType, reason: str, action: str, note: str) -> None:
        if self._closed:
            self.dropped += 1
            self._log.debug("recorder closed; dropping event {} for {}", reason, _describe(obj))
            return
        if type not in ("Normal", "Warning"):
            raise ValueError(f"event type must be Normal or Warning, not {type!r}")
        note = note.encode()[:_NOTE_LIMIT].decode(errors="ignore")
        regarding = _reference(obj)
        # The resourceVersion is left out of the identity: occurrences across updates of the object aggregate.
        identity = tuple(f"{k}={v}" for k, v in regarding.items() if k != "resourceVersion")
        key = _Key(identity, type, reason, action, note)
        now, wall = self._clock(), time.time()
        self._forget_old(now)
        series = self._series.get(key)
        if series is None:
            series = _Series(f"{regarding['name']}.{time.time_ns():x}", regarding.get("namespace") or "default",
                             regarding, wall, wall, now)
            self._series[key] = series
        else:
            series.count += 1
            series.last_seen, series.last_seen_monotonic = wall, now
            self._series.move_to_end(key)
        self._enqueue(key, series)

    def _forget_old(self, now: float) -> None:
        while self._series:
            oldest = next(iter(self._series.values()))
            if now - oldest.last_seen_monotonic <= _SERIES_WINDOW and len(self._series) < _MAX_TRACKED:
                return
            self._series.popitem(last=False)

    def _enqueue(self, key: _Key, series: _Series) -> None:
        if series.queued or key in self._deferred:
            return  # the pending write will carry this occurrence too
        try:
            self._queue.put_nowait(key)
        except asyncio.QueueFull:
            self.dropped += 1
            if not self._queue_full:
                self._log.warning("event queue full ({} pending writes); dropping events", self._queue.maxsize)
            self._queue_full = True
            return
        self._queue_full = False
        series.queued = True
        if self._worker is None:
            self._worker = asyncio.get_running_loop().create_task(self._run(), name="event recorder")

    # -- writing (the worker) ----------------------------------------------------------------------------
    async def _run(self) -> None:
        while True:
            key = await self._queue.get()
            try:
                await self._write(key)
            except Exception as e:
                # Forget the series: the next occurrence starts a new Event rather than patching one that may
                # not exist.
                series = self._series.pop(key, None)
                self._log.warning("could not write event {} for {}: {!r}", key.reason,
                                  series.regarding if series else key.regarding, e)
            finally:
                self._queue.task_done()

    async def _write(self, key: _Key) -> None:
        series = self._series.get(key)
        if series is None:
            return  # forgotten since it was queued
        series.queued = False
        if series.written == series.count:
            return
        now = self._clock()
        if not series.written:
            if self._bucket(key.regarding).take(now):
                self.dropped += 1
                self._log.debug("spam filter: not creating event {} for {} now", key.reason, series.regarding)
                return
        elif not self._closed:  # the final counts written by close() skip both limits: one write per series
            wait = series.written_at + self.series_interval - now
            if wait <= 0:
                wait = self._bucket(key.regarding).take(now)
            if wait > 0:
                self._postpone(key, wait)
                return
        await asyncio.sleep(self._pace.when(None))
        events = await self._client()
        v1 = events.gvr == _EVENTS_V1
        count, last_seen = series.count, series.last_seen  # occurrences during the request queue another write
        if not series.written:
            await events.create(self._new_event(key, series, count, last_seen, v1))
        else:
            await events.patch(series.name, _series_patch(count, last_seen, v1), type="merge",
                               namespace=series.namespace)
        series.written, series.written_at = count, self._clock()

    def _bucket(self, regarding: tuple[str, ...]) -> _TokenBucket:
        bucket = self._buckets.get(regarding)
        if bucket is None:
            bucket = self._buckets[regarding] = _TokenBucket(*self._per_object, self._clock())
            if len(self._buckets) > _MAX_TRACKED:
                self._buckets.popitem(last=False)
        self._buckets.move_to_end(regarding)
        return bucket

    def _postpone(self, key: _Key, delay: float) -> None:
        self._deferred[key] = asyncio.get_running_loop().call_later(delay, self._retry, key)

    def _retry(self, key: _Key) -> None:
        del self._deferred[key]
        series = self._series.get(key)
        if series is not None:
            self._enqueue(key, series)

    async def _client(self) -> ResourceClient:
        if self._events is None:
            try:
                await self.api.request("GET", f"/apis/{_EVENTS_V1.group_version}")
                gvr = _EVENTS_V1
            except NotFound:
                self._log.info("the server does not serve {}; writing core/v1 Events", _EVENTS_V1.group_version)
                gvr = _CORE_EVENTS
            self._events = ResourceClient(self.api, gvr, namespaced=True)
        return self._events

    def _new_event(self, key: _Key, series: _Series, count: int, last_seen: float, v1: bool) -> Object:
        """The Event to create, in ``events.k8s.io/v1`` (``v1``) or ``core/v1`` form."""
        meta = {"name": series.name, "namespace": series.namespace}
        common = {"metadata": meta, "type": key.type, "reason": key.reason, "action": key.action,
                  "reportingInstance": self.reporting_instance}
        if v1:
            # events.k8s.io refuses a series of one: the first occurrence is an Event without one.
            return {"apiVersion": "events.k8s.io/v1", "kind": "Event", **common,
                    "eventTime": _micro_time(series.first_seen), "note": key.note,
                    "reportingController": self.reporting_controller, "regarding": series.regarding,
                    **(_series_patch(count, last_seen, v1) if count > 1 else {})}
        return {"apiVersion": "v1", "kind": "Event", **common, "message": key.note,
                "involvedObject": series.regarding, "source": {"component": self.reporting_controller},
                "reportingComponent": self.reporting_controller, "firstTimestamp": _time(series.first_seen),
                **_series_patch(count, last_seen, v1)}


def _series_patch(count: int, last_seen: float, v1: bool) -> dict[str, Any]:
    """The fields that say how often and when last an Event happened, in either API's form."""
    if v1:
        return {"series": {"count": count, "lastObservedTime": _micro_time(last_seen)}}
    return {"count": count, "lastTimestamp": _time(last_seen)}


def _reference(obj: Object) -> dict[str, str]:
    """The object reference an Event points at (only the fields the object has)."""
    meta = obj.get("metadata") or {}
    ref = {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"), "namespace": meta.get("namespace"),
           "name": meta.get("name"), "uid": meta.get("uid"), "resourceVersion": meta.get("resourceVersion")}
    if not ref["name"]:
        raise ValueError("the object has no metadata.name")
    return {k: str(v) for k, v in ref.items() if v}


def _describe(obj: Any) -> str:
    meta = (obj.get("metadata") or {}) if isinstance(obj, dict) else {}
    return "/".join(p for p in (meta.get("namespace"), meta.get("name")) if p) or repr(obj)[:80]


def _micro_time(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _time(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
