"""Reflector: keeps a sink in step with the server by list + watch, with client-go's recovery rules.

First sync by watch-list (``sendInitialEvents``), dropped for a GVR only when the server proves it lacks it, else a
paged LIST at ``"0"``; then WATCH from the last RV with bookmarks. Differs from client-go:

- A relist at the last synced RV reads *not older than* (no ``limit``, or paged with ``NotOlderThan``), never
  *exact*, which loops on 410 after an apiserver restart; ``""`` only when that relist itself answers 410.
- Outage recovery: a reflector backing off retries once a later request of its ApiClient succeeds (once per
  outage, spread by ``_RESUME_SPREAD``); one waiter per client probes ``/readyz`` each second; API errors until the
  next success back off from ``_RESUME_INITIAL``. One relist per outage, seconds after (client-go: up to a minute).
  Its log lines are a client's, not a reflector's: its start and end at INFO once (``OutageLog``), the rest DEBUG.
- Nothing but cancellation ends ``run``: a listener, the sink or the error handling raising is logged.
- A ``MetadataGVR`` asks for ``PartialObjectMetadata``; whole objects from a server that cannot are cut down here.

Over 400 lines: one state machine (list, watch, backoff, probe) whose recovery state every path reads.
"""

from __future__ import annotations

import asyncio
import random
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Protocol

from loguru import logger

from .backoff import Backoff
from .client import CONNECTION_ERRORS, ApiClient
from .errors import ApiError
from .gvr import GVR
from .metrics import InformerMetrics, Reading
from .object_shard import ObjectShard
from .outage_log import OutageLog
from .store import Obj, object_key
from .wait import wait_first

INITIAL_EVENTS_END = "k8s.io/initial-events-end"
# Statuses with which a server that lacks watch-list streaming refuses ``sendInitialEvents``.
_WATCH_LIST_REFUSED = {400, 405, 415, 422, 501}
# While reflectors back off after connection errors, one of them per client asks this every _PROBE_INTERVAL.
_PROBE_PATH = "/readyz"
_PROBE_INTERVAL = 1.0
# After a connection error cut short by an answer, the retry waits a random part of this (module docstring).
_RESUME_SPREAD = 0.5
_RESUME_INITIAL = 0.1  # the first delay of the backoff for API errors between an outage and the next success
_probe_locks: "weakref.WeakKeyDictionary[ApiClient, asyncio.Lock]" = weakref.WeakKeyDictionary()
# When the probe of a client last failed with a connection error; dropped once one gets an answer.
_probe_refused: "weakref.WeakKeyDictionary[ApiClient, float]" = weakref.WeakKeyDictionary()
# The pause before retrying after each client's last recovery: (its ``recoveries``, the pause), drawn once.
_resume_pauses: "weakref.WeakKeyDictionary[ApiClient, tuple[int, float]]" = weakref.WeakKeyDictionary()
# A client's outage is logged at INFO once (its first connection error, its answer again), repeats at DEBUG.
_OUTAGE_STARTS, _OUTAGE_ENDS = OutageLog(), OutageLog()
_PARTIAL_API_VERSION, _PARTIAL_KIND = "meta.k8s.io/v1", "PartialObjectMetadata"
_METADATA_LIST_ACCEPT = f"application/json;as={_PARTIAL_KIND}List;g=meta.k8s.io;v=v1,application/json"
_METADATA_WATCH_ACCEPT = f"application/json;as={_PARTIAL_KIND};g=meta.k8s.io;v=v1,application/json"


def as_partial_object_metadata(obj: Obj) -> Obj:
    """``obj`` as a ``PartialObjectMetadata`` (itself when it is one already)."""
    if obj.get("kind") == _PARTIAL_KIND:
        return obj
    return {"apiVersion": _PARTIAL_API_VERSION, "kind": _PARTIAL_KIND, "metadata": obj.get("metadata") or {}}


class ReflectorSink(Protocol):
    """What a reflector feeds: a whole list (atomic replace) and single watch events."""

    def replace(self, objs: list[Obj], resource_version: str) -> None: ...

    def apply(self, event_type: str, obj: Obj) -> None: ...


@dataclass
class ReflectorOptions:
    """Tunables; the defaults are client-go's.

    ``watch_list``: None = use watch-list streaming when the server accepts it, True/False = always/never.
    ``inactivity_timeout``: seconds of silence after which a watch stream is considered dead (the server sends
    a bookmark about every minute).
    """

    page_size: int = 500
    watch_list: bool | None = None
    min_watch_timeout: int = 300
    inactivity_timeout: float = 150.0
    short_watch: float = 1.0
    backoff: Callable[[], Backoff] = field(default=Backoff)


class ShortWatchError(Exception):
    """A watch that ended too soon: closed almost at once without delivering anything (client-go treats that
    like an error), or a watch-list stream that ended before its initial events were complete."""


class _WatchListIgnored(Exception):
    """The server answered a watch-list request with a plain watch (an ordinary bookmark came first)."""


class Reflector:
    """Lists and watches one GVR (optionally one namespace, server-side selectors) into a sink."""

    def __init__(
        self, client: ApiClient, gvr: GVR, sink: ReflectorSink, *, namespace: str | None = None,
        label_selector: str | None = None, field_selector: str | None = None,
        options: ReflectorOptions | None = None, metrics: InformerMetrics | None = None,
        on_error: Callable[[Exception], None] | None = None, on_recovered: Callable[[], None] | None = None,
        transform: Callable[[Obj], Obj] | None = None, shard: ObjectShard | None = None,
    ) -> None:
        self.client = client
        self.gvr = gvr
        self.sink = sink
        self.namespace = namespace
        self.options = options or ReflectorOptions()
        self.path = gvr.path(namespace)
        self.selectors = {k: v for k, v in (("labelSelector", label_selector), ("fieldSelector", field_selector),
                                            ("shardSelector", shard.selector() if shard else None)) if v}
        self.shard = shard
        self.shard_served: bool | None = None  # whether the last list came back filtered by the server
        self.resource_version = ""
        self.last_error: Exception | None = None
        # A sharded informer syncs by list: only a list answer says whether the server applied the shard selector.
        self.use_watch_list = False if shard is not None else self.options.watch_list
        self._on_error = on_error
        self._on_recovered = on_recovered
        # Applied as each object is decoded, so that what it drops (managedFields) never piles up in a big
        # list or the watch-list's pending set: freed later, that memory would stay with the process.
        self._transform = transform
        self._list_kwargs: dict[str, Any] = {}  # only a MetadataGVR's requests carry headers of their own
        self._watch_kwargs: dict[str, Any] = {}
        if gvr.metadata_only:
            self._list_kwargs = {"headers": {"Accept": _METADATA_LIST_ACCEPT}}
            self._watch_kwargs = {"headers": {"Accept": _METADATA_WATCH_ACCEPT}}
            self._transform = as_partial_object_metadata if transform is None else \
                lambda obj: transform(as_partial_object_metadata(obj))
        self._rv_unavailable = False
        self._paginated_result = False  # the first list at "0" came in pages: the server has no watch cache
        self._need_list = True
        self._doing = "list"  # the request under way, for log lines: "list", "watch" or "watch-list"
        self._backoff = self.options.backoff()
        self._unreachable = False  # the last failure was a connection error
        self._shortcut_taken = False  # one early retry per unreachable run: see the module docstring
        self._resuming = False  # answered again after connection errors, and no success yet
        self._restarted = False  # told its server is shutting down, and no success yet: a 410 next is expected
        self._resume_backoff = Backoff(initial=_RESUME_INITIAL)
        self._init_backoff = Backoff(initial=0.05, jitter=0.2)
        self._log = logger.bind(gvr=str(gvr))
        self.event_counts = {"ADDED": 0, "MODIFIED": 0, "DELETED": 0, "BOOKMARK": 0}
        # (family, label values after cluster and gvr) -> count, for /metrics (``metric_readings``).
        self._counts: dict[tuple[str, tuple[str, ...]], int] = {("informer_lists_total", ()): 0}
        (metrics or InformerMetrics.for_registry()).observe(self, str(gvr))

    def metric_readings(self) -> Iterator[Reading]:
        """Its counters and last resourceVersion, read at scrape time (``InformerMetrics.observe``)."""
        try:
            rv = float(self.resource_version)
        except ValueError:
            rv = 0.0
        yield "informer_last_resource_version", (), rv
        for (name, labels), n in list(self._counts.items()):
            yield name, labels, n
        for typ, n in list(self.event_counts.items()):
            yield "informer_events_total", (typ,), n

    def _count(self, family: str, *labels: str) -> None:
        key = (family, labels)
        self._counts[key] = self._counts.get(key, 0) + 1

    async def run(self) -> None:
        """List and watch until cancelled; never returns otherwise, and raises nothing but CancelledError."""
        while True:
            try:
                if self._need_list and self.use_watch_list is not False:
                    self._doing = "watch-list"
                    if await self._watch_list():
                        continue
                if self._need_list:
                    self._doing = "list"
                    await self._list()
                self._doing = "watch"
                await self._watch()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # every failure is recovered from: that is the reflector's job
                try:
                    delay = self._handle_error(e)
                except Exception:
                    self._log.opt(exception=True).error("handling a failure of {} failed; retrying in {:.1f}s",
                                                        self.gvr, self._backoff.cap)
                    delay = self._backoff.cap
                await self._back_off(delay)

    # -- errors ------------------------------------------------------------------------------------------
    def _handle_error(self, e: Exception) -> float:
        """Record ``e``, decide whether a relist is needed, and return the delay before the next attempt."""
        self.last_error = e
        what = self._doing
        unreachable = isinstance(e, CONNECTION_ERRORS)
        if self._unreachable and not unreachable:
            # The server answers again: the backoff grew while it was down, not because of this error.
            self._backoff.reset()
            self._resuming, self._shortcut_taken = True, False
        self._unreachable = unreachable
        delay = (self._resume_backoff if self._resuming and not unreachable else self._backoff).next()
        if isinstance(e, ApiError):
            kind = str(e.status)
            if e.is_gone:
                kind = "expired"
                self._require_relist("expired")
            elif e.status == 429:
                delay = e.retry_after if e.retry_after is not None else delay
                if "initializing" in e.message:
                    # A new resource's watch cache is ready within milliseconds although the server asks
                    # for a full second: retry sooner, doubling up to what the server asked.
                    delay = min(delay, self._init_backoff.next())
            else:
                if e.status == 503 and "shutting down" in e.message:
                    self.client.went_away()  # what answers next is the restarted server: an outage's end
                    self._restarted = True
                self._require_relist(f"http_{e.status}")
            if e.status in (401, 403, 404):
                level = "WARNING"
            elif "initializing" in e.message or (e.is_gone and self._after_outage):
                level = "DEBUG"  # a restarted server's first answers: expected, and the relist follows
            elif e.status == 503 and "shutting down" in e.message:
                level = _OUTAGE_STARTS.level(self.client)
            else:
                level = "INFO"
            self._log.log(level, "{} of {} failed ({}); retrying in {:.1f}s", what, self.gvr, e, delay)
        elif unreachable:
            kind = "timeout" if isinstance(e, TimeoutError) else "connection"
            self._log.log(_OUTAGE_STARTS.level(self.client), "{} of {} interrupted ({}: {}); retrying in {:.1f}s",
                          what, self.gvr, kind, e or type(e).__name__, delay)
        elif isinstance(e, ShortWatchError):
            kind = "short_watch"
            self._require_relist("short_watch")
            self._log.info("{}; relisting in {:.1f}s", e, delay)
        else:
            kind = type(e).__name__
            self._require_relist("error")
            self._log.opt(exception=e).error("unexpected error syncing {}; relisting in {:.1f}s", self.gvr, delay)
        self._count("informer_errors_total", kind)
        if self._on_error is not None:
            self._on_error(e)
        return delay

    async def _back_off(self, delay: float) -> None:
        """Sleep ``delay``; after a connection error, only until a request of the client sent since succeeds
        (then a random pause of up to _RESUME_SPREAD), once per unreachable run."""
        if not self._unreachable or self._shortcut_taken:
            await asyncio.sleep(delay)
            return
        errors = self.client.connection_errors  # this failure's included: only an answer sent after it counts
        while await wait_first(asyncio.sleep(delay), self.client.answered_after(errors), self._probe()) == 0:
            refused = _probe_refused.get(self.client)
            if refused is None or time.monotonic() - refused > 2 * _PROBE_INTERVAL:
                return  # the backoff is over and the probe has no news: retry
            # The probe could not connect a moment ago: neither would this request. Wait on.
            delay = self._backoff.next()
        self._shortcut_taken = True
        self._backoff.reset()
        pause = self._resume_pause()
        self._log.log(_OUTAGE_ENDS.level(self.client), "the server answers again; retrying {} in {:.2f}s",
                      self.gvr, pause)
        await asyncio.sleep(pause)

    def _resume_pause(self) -> float:
        """A random pause of up to _RESUME_SPREAD, the same for every reflector of the client woken by the same
        recovery: the clients of one server spread out, a client's informers resume together (one member does
        not show some informers watching and others still unreachable)."""
        recoveries = self.client.recoveries
        drawn = _resume_pauses.get(self.client)
        if drawn is None or drawn[0] != recoveries:
            drawn = _resume_pauses[self.client] = (recoveries, random.uniform(0, _RESUME_SPREAD))
        return drawn[1]

    async def _probe(self) -> None:
        """Ask the server whether it is back, about every _PROBE_INTERVAL (jittered: the clients of one server
        lost at one moment do not all ask at the same one), as one of the client's reflectors at a time (the
        others queue on the lock and take over when this one's backoff ends). Never returns: its success ends
        the backoff of every waiting reflector through ``answered_after``."""
        async with _probe_locks.setdefault(self.client, asyncio.Lock()):
            while True:
                await asyncio.sleep(_PROBE_INTERVAL * random.uniform(0.5, 1.5))
                try:
                    await self.client.request_bytes("GET", _PROBE_PATH, timeout=10 * _PROBE_INTERVAL)
                except CONNECTION_ERRORS:
                    _probe_refused[self.client] = time.monotonic()
                    continue
                except Exception:  # not ready yet, a credential problem: the reflector's retry reports it
                    pass
                _probe_refused.pop(self.client, None)

    def _require_relist(self, reason: str) -> None:
        if not self._need_list:
            self._need_list = True
            self._count("informer_relists_total", reason)

    @property
    def _after_outage(self) -> bool:
        """Whether the server is answering again after being unreachable or restarting: its 410s are expected."""
        return self._resuming or self._restarted

    def _clear_error(self) -> None:
        """The last failure no longer describes the reflector: tell ``on_recovered`` if there was one."""
        if self.last_error is not None:
            self.last_error = None
            if self._on_recovered is not None:
                self._on_recovered()

    def _succeeded(self) -> None:
        self._clear_error()
        self._unreachable = self._shortcut_taken = self._resuming = self._restarted = False
        self._init_backoff.reset()
        self._resume_backoff.reset()

    # -- list --------------------------------------------------------------------------------------------
    async def _list(self) -> None:
        rv = "" if self._rv_unavailable else (self.resource_version or "0")
        try:
            items, list_rv, paginated = await self._paged_list(rv)
        except ApiError as e:
            if not (e.is_gone and rv != ""):
                raise
            self._log.log("DEBUG" if self._after_outage else "INFO",
                          "list of {} at resourceVersion {} expired; listing the latest", self.gvr, rv)
            items, list_rv, _ = await self._paged_list("")
        else:
            # Only "0" tells: a list at "" is paged by etcd whether or not the server has a watch cache.
            if rv == "0" and paginated:
                self._paginated_result = True
        self._rv_unavailable = False
        self.sink.replace(items, list_rv)
        self.resource_version = list_rv
        self._need_list = False
        self._succeeded()

    async def _paged_list(self, rv: str) -> tuple[list[Obj], str, bool]:
        """Every item at ``rv`` (the module docstring says when in pages), the list's RV, and whether the
        server answered in more than one page."""
        params = {**self.selectors, "resourceVersion": rv}
        if self.options.page_size and (rv in ("", "0") or self._paginated_result):
            params["limit"] = str(self.options.page_size)
            if rv not in ("", "0"):
                params["resourceVersionMatch"] = "NotOlderThan"
        items: list[Obj] = []
        paginated = False
        while True:
            self._count("informer_lists_total")
            try:
                page = await self.client.request("GET", self.path, params, **self._list_kwargs)
            except ApiError as e:
                if "continue" in params and e.is_gone:
                    # The continue token expired mid-way: one unpaged list at the same RV instead.
                    params = {**self.selectors, "resourceVersion": rv}
                    items = []
                    continue
                raise
            api_version, kind = page.get("apiVersion", ""), page.get("kind", "")
            if kind.endswith("List"):
                kind = kind[:-4]
            transform = self._transform
            shard = self.shard
            if shard is not None:
                self.shard_served = "shardInfo" in (page.get("metadata") or {})
            for item in page.get("items") or ():
                if shard is not None and not shard.contains(item):
                    continue
                # LIST items lack apiVersion/kind; set them so cached objects look like watched ones.
                item.setdefault("apiVersion", api_version)
                item.setdefault("kind", kind)
                items.append(item if transform is None else transform(item))
            meta = page.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                return items, meta.get("resourceVersion", ""), paginated
            paginated = True
            params = {**self.selectors, "limit": str(self.options.page_size), "continue": token}

    # -- watch -------------------------------------------------------------------------------------------
    def _watch_params(self) -> dict[str, str]:
        low = self.options.min_watch_timeout
        return {**self.selectors, "watch": "1", "allowWatchBookmarks": "true",
                "timeoutSeconds": str(random.randint(low, 2 * low))}

    async def _watch_list(self) -> bool:
        """Sync by watch-list streaming; False if the server does not support it (then the caller lists)."""
        while True:
            rv = "" if self._rv_unavailable else self.resource_version
            params = self._watch_params()
            params.update(sendInitialEvents="true", resourceVersionMatch="NotOlderThan", resourceVersion=rv)
            try:
                await self._stream(params, initial=True)
                return True
            except ApiError as e:
                if e.is_gone and rv and self._need_list:
                    # As with a LIST: the last synced RV has expired, so stream the latest state at once.
                    self._log.log("DEBUG" if self._after_outage else "INFO",
                                  "watch-list of {} at resourceVersion {} expired; streaming the latest", self.gvr, rv)
                    self._rv_unavailable = True
                    continue
                if self.use_watch_list is not None or e.status not in _WATCH_LIST_REFUSED:
                    raise
                self._log.info("server refused watch-list for {} ({}); using list + watch", self.gvr, e)
            except _WatchListIgnored:
                if self.use_watch_list is not None:
                    raise
                self._log.info("server ignores watch-list for {} (a bookmark came before the initial-events-end "
                               "one); using list + watch", self.gvr)
            self.use_watch_list = False
            return False

    async def _watch(self) -> None:
        params = self._watch_params()
        params["resourceVersion"] = self.resource_version
        await self._stream(params, initial=False)

    async def _stream(self, params: dict[str, str], initial: bool) -> None:
        """Consume one watch stream; returns on a normal end, raises on errors."""
        self._count("informer_watches_total", "watch_list" if initial else "watch")
        started = time.monotonic()
        count = 0
        pending: dict[str, Obj] | None = {} if initial else None
        sink_apply = self.sink.apply
        transform = self._transform
        shard = self.shard
        counts = self.event_counts
        async with self.client.stream(self.path, params, self.options.inactivity_timeout,
                                      **self._watch_kwargs) as events:
            # Watching again: the last failure no longer describes the informer (it shows in status and
            # per-cluster readiness until now).
            self._clear_error()
            # A watch re-opened after a connection failure ends that failure streak with its first event: the
            # next cut (one dead HTTP/2 connection fails every watch on it at once) gets the shortcut again
            # instead of sleeping out a backoff grown by the cut before.
            unproven = self._unreachable or self._shortcut_taken or self._resuming
            async for ev in events:
                typ = ev["type"]
                obj = ev["object"]
                if unproven and pending is None and typ != "ERROR":
                    # An ERROR event is no proof: after an apiserver restart the first answer to the re-opened
                    # watch is typically an in-stream 410, which must be handled as the answer after an outage.
                    unproven = False
                    self._succeeded()
                if typ == "BOOKMARK":
                    counts["BOOKMARK"] += 1
                    meta = obj["metadata"]
                    if pending is not None:
                        # A server that streams initial events marks its first bookmark as their end.
                        if (meta.get("annotations") or {}).get(INITIAL_EVENTS_END) != "true":
                            raise _WatchListIgnored()
                        self.sink.replace(list(pending.values()), meta["resourceVersion"])
                        pending = None
                        self._rv_unavailable = False
                        self._need_list = False
                        self._succeeded()
                    self.resource_version = meta["resourceVersion"]
                    continue
                if typ == "ERROR":
                    raise ApiError.from_status(obj)
                count += 1
                counts[typ] += 1
                if shard is not None and not shard.contains(obj):  # a server that ignores or cannot apply it
                    if pending is None:
                        self.resource_version = obj["metadata"]["resourceVersion"]
                    continue
                if transform is not None:
                    obj = transform(obj)
                if pending is not None:
                    if typ == "DELETED":
                        pending.pop(object_key(obj), None)
                    else:
                        pending[object_key(obj)] = obj
                    continue
                sink_apply(typ, obj)
                self.resource_version = obj["metadata"]["resourceVersion"]
        if pending is not None:
            # Typically the server's timeoutSeconds came before the end of a large initial set: that says
            # nothing about support, so the next attempt streams again.
            raise ShortWatchError(f"watch-list of {self.gvr} ended before its initial events were complete")
        if count == 0 and time.monotonic() - started < self.options.short_watch:
            raise ShortWatchError(f"very short watch of {self.gvr}: closed within "
                                  f"{self.options.short_watch:g}s without any event")
        self._succeeded()
