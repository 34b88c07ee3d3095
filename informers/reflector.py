"""Reflector: keeps a sink in step with the server by list + watch, with client-go's recovery rules.

- First sync by watch-list streaming (``sendInitialEvents``) when the server supports it, else a paged LIST
  (``limit`` + ``continue``) at ``resourceVersion=0``; a relist asks for the last synced RV, and falls back to
  ``""`` (a consistent read) when that RV has expired.
- WATCH from the last RV with bookmarks and a random server timeout; a normal end re-watches without a relist;
  410/Expired/too-large-RV relists; 429 re-watches after Retry-After; connection errors re-watch after a
  backoff; a watch that ends in under a second with no events counts as an error; a stream silent for
  ``inactivity_timeout`` is abandoned (half-open TCP) and re-opened.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import aiohttp
from loguru import logger

from .backoff import Backoff
from .client import ApiClient
from .errors import ApiError
from .gvr import GVR
from .metrics import InformerMetrics
from .store import Obj, object_key

INITIAL_EVENTS_END = "k8s.io/initial-events-end"
# Statuses with which a server that lacks watch-list streaming refuses ``sendInitialEvents``.
_WATCH_LIST_REFUSED = {400, 405, 415, 422, 501}


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
    """A watch closed almost at once without delivering anything: treated like an error (client-go)."""


class Reflector:
    """Lists and watches one GVR (optionally one namespace, server-side selectors) into a sink."""

    def __init__(
        self, client: ApiClient, gvr: GVR, sink: ReflectorSink, *, namespace: str | None = None,
        label_selector: str | None = None, field_selector: str | None = None,
        options: ReflectorOptions | None = None, metrics: InformerMetrics | None = None,
        on_error: Callable[[Exception], None] | None = None, transform: Callable[[Obj], Obj] | None = None,
    ) -> None:
        self.client = client
        self.gvr = gvr
        self.sink = sink
        self.namespace = namespace
        self.options = options or ReflectorOptions()
        self.path = gvr.path(namespace)
        self.selectors = {k: v for k, v in (("labelSelector", label_selector), ("fieldSelector", field_selector)) if v}
        self.resource_version = ""
        self.last_error: Exception | None = None
        self.use_watch_list = self.options.watch_list
        self._on_error = on_error
        # Applied as each object is decoded, so that what it drops (managedFields) never piles up in a big
        # list or the watch-list's pending set: freed later, that memory would stay with the process.
        self._transform = transform
        self._rv_unavailable = False
        self._need_list = True
        self._backoff = self.options.backoff()
        self._init_backoff = Backoff(initial=0.05, jitter=0.2)
        self._log = logger.bind(gvr=str(gvr))
        m = metrics or InformerMetrics.for_registry()
        g = str(gvr)
        self._m_lists = m.lists.labels(g)
        self._m_relists = m.relists
        self._m_watches = m.watches
        self._m_errors = m.errors
        self.event_counts = {"ADDED": 0, "MODIFIED": 0, "DELETED": 0, "BOOKMARK": 0}
        m.event_counters[self] = self.event_counts
        m.resource_version.labels(g).set_function(self._numeric_rv)
        self._gvr_label = g

    def _numeric_rv(self) -> float:
        try:
            return float(self.resource_version)
        except ValueError:
            return 0.0

    async def run(self) -> None:
        """List and watch until cancelled; never returns otherwise."""
        while True:
            try:
                if self._need_list and self.use_watch_list is not False:
                    if await self._watch_list():
                        continue
                if self._need_list:
                    await self._list()
                await self._watch()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # every failure is recovered from: that is the reflector's job
                delay = self._handle_error(e)
                await asyncio.sleep(delay)

    # -- errors ------------------------------------------------------------------------------------------
    def _handle_error(self, e: Exception) -> float:
        """Record ``e``, decide whether a relist is needed, and return the delay before the next attempt."""
        self.last_error = e
        delay = self._backoff.next()
        if isinstance(e, ApiError):
            kind = str(e.status)
            if e.is_gone:
                kind = "expired"
                self._rv_unavailable = True
                self._require_relist("expired")
            elif e.status == 429:
                delay = e.retry_after if e.retry_after is not None else delay
                if "initializing" in e.message:
                    # A new resource's watch cache is ready within milliseconds although the server asks
                    # for a full second: retry sooner, doubling up to what the server asked.
                    delay = min(delay, self._init_backoff.next())
            else:
                self._require_relist(f"http_{e.status}")
            level = "WARNING" if e.status in (401, 403, 404) else "DEBUG" if "initializing" in e.message else "INFO"
            self._log.log(level, "{} {} failed ({}); retrying in {:.1f}s", "list" if self._need_list else "watch",
                          self.gvr, e, delay)
        elif isinstance(e, (aiohttp.ClientError, OSError, TimeoutError)):
            kind = "timeout" if isinstance(e, TimeoutError) else "connection"
            self._log.info("watch of {} interrupted ({}: {}); retrying in {:.1f}s", self.gvr, kind,
                           e or type(e).__name__, delay)
        elif isinstance(e, ShortWatchError):
            kind = "short_watch"
            self._require_relist("short_watch")
            self._log.info("{}; relisting in {:.1f}s", e, delay)
        else:
            kind = type(e).__name__
            self._require_relist("error")
            self._log.opt(exception=e).error("unexpected error syncing {}; relisting in {:.1f}s", self.gvr, delay)
        self._m_errors.labels(self._gvr_label, kind).inc()
        if self._on_error is not None:
            self._on_error(e)
        return delay

    def _require_relist(self, reason: str) -> None:
        if not self._need_list:
            self._need_list = True
            self._m_relists.labels(self._gvr_label, reason).inc()

    def _succeeded(self) -> None:
        self.last_error = None
        self._init_backoff.reset()

    # -- list --------------------------------------------------------------------------------------------
    async def _list(self) -> None:
        rv = "" if self._rv_unavailable else (self.resource_version or "0")
        try:
            items, list_rv = await self._paged_list(rv)
        except ApiError as e:
            if not (e.is_gone and rv != ""):
                raise
            self._log.info("list of {} at resourceVersion {} expired; listing the latest", self.gvr, rv)
            items, list_rv = await self._paged_list("")
        self._rv_unavailable = False
        self.sink.replace(items, list_rv)
        self.resource_version = list_rv
        self._need_list = False
        self._succeeded()

    async def _paged_list(self, rv: str) -> tuple[list[Obj], str]:
        params = {**self.selectors, "resourceVersion": rv}
        if self.options.page_size:
            params["limit"] = str(self.options.page_size)
        items: list[Obj] = []
        while True:
            self._m_lists.inc()
            try:
                page = await self.client.request("GET", self.path, params)
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
            for item in page.get("items") or ():
                # LIST items lack apiVersion/kind; set them so cached objects look like watched ones.
                item.setdefault("apiVersion", api_version)
                item.setdefault("kind", kind)
                items.append(item if transform is None else transform(item))
            meta = page.get("metadata") or {}
            token = meta.get("continue")
            if not token:
                return items, meta.get("resourceVersion", "")
            params = {**self.selectors, "limit": str(self.options.page_size), "continue": token}

    # -- watch -------------------------------------------------------------------------------------------
    def _watch_params(self) -> dict[str, str]:
        low = self.options.min_watch_timeout
        return {**self.selectors, "watch": "1", "allowWatchBookmarks": "true",
                "timeoutSeconds": str(random.randint(low, 2 * low))}

    async def _watch_list(self) -> bool:
        """Sync by watch-list streaming; False if the server refused it (then the caller lists)."""
        params = self._watch_params()
        params.update(sendInitialEvents="true", resourceVersionMatch="NotOlderThan",
                      resourceVersion="" if self._rv_unavailable else self.resource_version)
        try:
            await self._stream(params, initial=True)
        except ApiError as e:
            if self.use_watch_list is None and e.status in _WATCH_LIST_REFUSED:
                self._log.info("server refused watch-list for {} ({}); using list + watch", self.gvr, e)
                self.use_watch_list = False
                return False
            raise
        return True

    async def _watch(self) -> None:
        params = self._watch_params()
        params["resourceVersion"] = self.resource_version
        await self._stream(params, initial=False)

    async def _stream(self, params: dict[str, str], initial: bool) -> None:
        """Consume one watch stream; returns on a normal end, raises on errors."""
        self._m_watches.labels(self._gvr_label, "watch_list" if initial else "watch").inc()
        started = time.monotonic()
        count = 0
        pending: dict[str, Obj] | None = {} if initial else None
        sink_apply = self.sink.apply
        transform = self._transform
        counts = self.event_counts
        async with self.client.stream(self.path, params, self.options.inactivity_timeout) as events:
            async for ev in events:
                typ = ev["type"]
                obj = ev["object"]
                if typ == "BOOKMARK":
                    counts["BOOKMARK"] += 1
                    meta = obj["metadata"]
                    if pending is not None and (meta.get("annotations") or {}).get(INITIAL_EVENTS_END) == "true":
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
            if self.use_watch_list is None:
                # A server that ignores sendInitialEvents never sends the end marker: stop trying it.
                self.use_watch_list = False
            raise ShortWatchError(f"watch-list of {self.gvr} ended before its initial events were complete")
        if count == 0 and time.monotonic() - started < self.options.short_watch:
            raise ShortWatchError(f"very short watch of {self.gvr}: closed within "
                                  f"{self.options.short_watch:g}s without any event")
        self._succeeded()
