"""Controller: informer events -> requests -> a work queue -> N workers calling ``reconcile(request, rc)``.

controller-runtime's builder (``for_``/``owns``/``watches`` with predicates) and kopf's finalizer handling. Differs:

- ``reconcile(req)`` or ``reconcile(req, rc)`` is told from its signature at build time; it must be a coroutine.
- ``owns`` resolves the primary kind when the controller starts: a map function runs synchronously and cannot ask.
- The finalizer is handled around ``reconcile`` (controller-runtime leaves it to the reconciler): added before a
  reconcile; a deleted object gets ``finalize`` instead, on the object re-read from the server and only while it
  still carries the finalizer, so one deletion is never finalized twice.
- Each worker checks the context's fence before every item; each request is a tracing span.
- A reconcile waits (bounded) for its request's earlier writes to show in the caches (``read_your_writes.py``).
- ``metadata_only=True`` (``OnlyMetadata``) takes a source's events from the metadata-only cache of its GVR.
"""

from __future__ import annotations

import asyncio
import inspect
import socket
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Iterable, Sequence

from loguru import logger
from prometheus_client import CollectorRegistry

from informers import GVR, NotFound, SharedIndexInformer
from informers.store import last_state
from informers.resource import Object

from .context import ControllerContext, ReconcileContext, ReconcileStats
from .events import EventRecorder
from .finalizers import add_finalizer, has_finalizer, remove_finalizer
from .metrics import read_your_writes_metrics, reconcile_metrics
from .owners import owner_requests
from .predicates import Predicate, WatchEvent, WatchEventType, fields_match
from .priority import add_priority, update_priority
from .ratelimiter import RateLimiter
from .read_your_writes import ReadYourWrites
from .reconcile import Request, Result
from .keyed_loop import KeyedLoop, still_in_term
from .tracing import current_tracing
from .workqueue import WorkQueue

ReconcileFunc = Callable[[Request, ReconcileContext], Awaitable[Result | None]]
Reconcile = Callable[[Request], Awaitable[Result | None]] | ReconcileFunc
Finalize = Callable[[Request, ReconcileContext, Object], Awaitable[None]]
MapFunc = Callable[[Any], Iterable[Request]]
Source = SharedIndexInformer | GVR
# How long a stopping controller lets its recorder write pending Events: well within the manager's stop timeout,
# which with leader election is only the margin before a standby may take over (5 s by default).
_EVENTS_CLOSE_TIMEOUT = 1.0


def _own(obj: Any) -> Iterable[Request]:
    return (Request.for_object(obj),)


@dataclass(frozen=True)
class _Watch:
    """One source of requests; ``map_fn`` None means the source's objects map to their controller owner."""

    source: Source
    map_fn: MapFunc | None
    predicates: tuple[Predicate, ...]


class _Enqueuer:
    """Event handler turning informer events that pass the predicates into queued requests, at the event's
    priority (``priority.py``)."""

    def __init__(self, queue: WorkQueue[Request], map_fn: MapFunc, predicates: tuple[Predicate, ...],
                 name: str) -> None:
        self.queue, self.map_fn, self.predicates, self.name = queue, map_fn, predicates, name

    def _passes(self, type: WatchEventType, old: Any, new: Any, state_unknown: bool = False) -> bool:
        if not self.predicates:
            return True
        event = WatchEvent(type, old, new, state_unknown)
        return all(p(event) for p in self.predicates)

    def _enqueue(self, priority: int, *objs: Any) -> None:
        for obj in objs:
            for req in self.map_fn(obj):
                self.queue.add(req, priority)  # the queue drops duplicates

    def on_add(self, obj: Any, is_in_initial_list: bool) -> None:
        if self._passes("add", None, obj):
            self._enqueue(add_priority(is_in_initial_list), obj)

    def on_update(self, old: Any, new: Any) -> None:
        # The old object is mapped too: when the mapping reads a field that changed (an owner reference, a
        # label), the request it named before must learn that the object is no longer its concern.
        if self._passes("update", old, new):
            self._enqueue(update_priority(old, new), new, old)

    def on_delete(self, obj: Any) -> None:
        last = last_state(obj)
        if self._passes("delete", last, None, last is not obj):
            self._enqueue(0, last)


def _require_async(fn: Any, what: str) -> None:
    """Refuse a synchronous function when the Controller is built, rather than failing on every request."""
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None)):
        return
    name = getattr(fn, "__qualname__", None) or type(fn).__qualname__
    raise TypeError(f"{what} {name} is not a coroutine function: define it with 'async def' (a blocking "
                    f"{what} would stall every controller in the process)")


def _with_context(reconcile: Reconcile) -> ReconcileFunc:
    """``reconcile`` as a function of (request, context), whichever of the two it takes."""
    try:
        inspect.signature(reconcile).bind(None, None)
    except TypeError:
        alone: Callable[[Request], Awaitable[Result | None]] = reconcile  # type: ignore[assignment]
        return lambda req, rc: alone(req)
    return reconcile  # type: ignore[return-value]


def _object_predicate(test: Callable[[Any], bool]) -> Predicate:
    """A predicate of the event's object alone (the new state; the last one for a delete)."""
    return lambda event: test(event.obj)


def _with_fields(predicates: Sequence[Predicate], field_selector: str | None) -> tuple[Predicate, ...]:
    return (*predicates, fields_match(field_selector)) if field_selector else tuple(predicates)


def _gvr(source: Source) -> GVR:
    return source.gvr if isinstance(source, SharedIndexInformer) else source


def _source(name: str, source: Source, metadata_only: bool) -> Source:
    """``source``, or its metadata-only key when ``metadata_only``; an informer must already be one then."""
    if not metadata_only:
        return source
    if isinstance(source, SharedIndexInformer):
        if not source.gvr.metadata_only:
            raise ValueError(f"controller {name}: metadata_only=True, but the informer given caches whole {source.gvr} "
                             "objects; pass the GVR, or an informer of gvr.only_metadata()")
        return source
    return source.only_metadata()


async def _kind_of(ctx: ControllerContext, gvr: GVR) -> tuple[str, bool]:
    """The kind of ``gvr``'s objects and whether they are namespaced: from discovery, or, for a controller without
    an API client, from a cached object."""
    if ctx.client is not None:
        info = await ctx.mapper.resource_info(gvr.full)
        return info.kind, info.namespaced
    if gvr.metadata_only:
        raise ValueError(f"controller {ctx.name}: cannot tell the kind of {gvr} for owns() without an API client "
                         "(its cache holds PartialObjectMetadata)")
    for obj in ctx.informer(gvr).store:
        return obj["kind"], bool(obj["metadata"].get("namespace"))
    raise ValueError(f"controller {ctx.name}: cannot tell the kind of {gvr} for owns() without an API client or "
                     "a cached object")


class Controller:
    """Runs ``reconcile`` for the requests of its sources, with retries, requeues, a finalizer and metrics.

    Sources: ``for_`` (each primary object is a request), ``owns`` (the owner is the request), ``watches`` (any
    mapping). ``reconcile`` returns None or a ``Result``, or raises: then it is retried with the queue's rate limiter
    for as long as it fails (bounded by ``max_retries`` if given); ``TerminalError`` is not retried. Workers start once
    every source has delivered its initial list. With ``finalizer`` and ``finalize(req, rc, obj)``, primary objects get
    the finalizer before reconciling and ``finalize`` once being deleted; ``finalize`` must be idempotent.
    ``priority_queue`` (None: the context's) serves live changes before initial lists and resyncs. The name names the
    work queue, the ``controller_runtime_*`` metrics, the field manager and the Events' ``reportingController``.
    """

    def __init__(
        self, name: str, reconcile: Reconcile, *, workers: int = 1, max_retries: int | None = None,
        rate_limiter: RateLimiter | None = None, metrics_registry: CollectorRegistry | None = None,
        finalizer: str | None = None, finalize: Finalize | None = None, priority_queue: bool | None = None,
    ) -> None:
        _require_async(reconcile, "reconcile")
        if (finalizer is None) != (finalize is None):
            raise ValueError(f"controller {name}: give both finalizer= and finalize=, or neither")
        if finalize is not None:
            _require_async(finalize, "finalize")
        self.name = name
        self.reconcile = reconcile
        self.workers = workers
        self.max_retries = max_retries
        self.finalizer = finalizer
        self.finalize = finalize
        self._call = _with_context(reconcile)
        self._rate_limiter = rate_limiter
        self._metrics_registry = metrics_registry
        self.priority_queue = priority_queue
        self._primary: GVR | None = None
        self._watches: list[_Watch] = []
        self.queue: WorkQueue[Request] | None = None
        self.stats = ReconcileStats()
        self._log = logger.bind(controller=name)

    # -- building ----------------------------------------------------------------------------------------
    def for_(self, source: Source, predicates: Sequence[Predicate] = (), *,
             field_selector: str | None = None, metadata_only: bool = False) -> "Controller":
        """The primary resource: each of its objects that an event passing ``predicates`` concerns is a
        request. Once per controller. ``field_selector`` (every method takes one) keeps the events of objects
        that match it (``fields_match``): judged here, on the informer the controller shares; to have the server
        filter, and the cache hold only those objects, set the sidecar's ``field_selectors``. ``metadata_only``
        (every method takes it) reads the source's metadata-only cache (see the module docstring)."""
        if self._primary is not None:
            raise ValueError(f"controller {self.name}: for_() was already called (for {self._primary})")
        source = _source(self.name, source, metadata_only)
        self._primary = _gvr(source)
        self._watches.append(_Watch(source, _own, _with_fields(predicates, field_selector)))
        return self

    def owns(self, source: Source, predicates: Sequence[Predicate] = (), *,
             field_selector: str | None = None, metadata_only: bool = False) -> "Controller":
        """Objects controlled by a primary object (its controller owner reference, see
        ``set_controller_reference``): an event on one, passing ``predicates``, is a request for the owner; an
        update that changes the owner is one for both, a delete one for the last owner."""
        self._watches.append(_Watch(_source(self.name, source, metadata_only), None,
                                    _with_fields(predicates, field_selector)))
        return self

    def watches(self, source: Source, map_fn: MapFunc = _own, predicates: Sequence[Predicate] = (), *,
                predicate: Callable[[Any], bool] | None = None, field_selector: str | None = None,
                metadata_only: bool = False) -> "Controller":
        """Any source: ``map_fn(obj)`` names the requests of an object (by default the object itself; on an
        update, both the old and the new object are mapped). ``predicate`` is the older form of a filter, a test
        of the object alone (the new one on updates)."""
        extra = (_object_predicate(predicate),) if predicate is not None else ()
        self._watches.append(_Watch(_source(self.name, source, metadata_only), map_fn,
                                    _with_fields((*predicates, *extra), field_selector)))
        return self

    watch = watches

    # -- running -----------------------------------------------------------------------------------------
    async def run(self, ctx: ControllerContext | None = None) -> None:
        """Register the handlers, wait for their initial lists, run the workers until cancelled, tear down.

        Without ``ctx`` (outside a manager), every source must be an informer.
        """
        if ctx is None:
            ctx = ControllerContext(self.name, {inf.gvr: inf for inf in (w.source for w in self._watches)
                                                if isinstance(inf, SharedIndexInformer)})
        if self.finalizer is not None:
            if self._primary is None:
                raise ValueError(f"controller {self.name}: a finalizer needs the primary resource: call for_(gvr)")
            ctx.require_client()  # it writes: fail now, not on every request, without an API client
        prioritized = ctx.priority_queue if self.priority_queue is None else self.priority_queue
        queue: WorkQueue[Request] = WorkQueue(self.name, self._rate_limiter, self._metrics_registry,
                                              prioritized=prioritized)
        self.queue = queue
        self.stats = ctx.reconcile_stats
        events = EventRecorder(ctx.client, self.name, socket.gethostname()) if ctx.client is not None else None
        barrier = None
        if ctx.read_your_writes > 0 and ctx.client is not None:
            barrier = ReadYourWrites(self.name, ctx.informers_of, ctx.read_your_writes,
                                     read_your_writes_metrics(self.name, self._metrics_registry))
            ctx.observe_writes(barrier)
        tracing = current_tracing()
        loop = KeyedLoop(self.name, queue,
                         lambda req: self._handle(ReconcileContext(req, ctx, self._primary, events), barrier),
                         workers=self.workers, fence=ctx.fence, stats=self.stats,
                         metrics=reconcile_metrics(self.name, self._metrics_registry),
                         log=ctx.log.bind(controller=self.name), max_retries=self.max_retries,
                         span=lambda req: tracing.reconcile(self.name, ctx.cluster, self._primary, req))
        regs = []
        try:
            to_owner = await self._owner_mapping(ctx) if any(w.map_fn is None for w in self._watches) else _own
            registered: set[GVR] = set()
            for w in self._watches:
                # A second handler on one informer (for_ and owns of ConfigMaps, say) is named apart, so that
                # the informer's per-handler metrics tell them apart.
                gvr = _gvr(w.source)
                name = self.name if gvr not in registered else "owns" if w.map_fn is None else "watches"
                registered.add(gvr)
                regs.append(ctx.add_event_handler(w.source, _Enqueuer(queue, w.map_fn or to_owner, w.predicates,
                                                                      name)))
            await asyncio.gather(*(r.wait_for_sync() for r in regs))
            await loop.run()
        finally:
            await loop.stop()  # its queue, when the loop never ran
            for reg in regs:
                await reg.informer.remove_event_handler(reg)
            if events is not None:
                await events.close(_EVENTS_CLOSE_TIMEOUT)

    async def _owner_mapping(self, ctx: ControllerContext) -> MapFunc:
        if self._primary is None:
            raise ValueError(f"controller {self.name}: owns() needs the primary resource: call for_(gvr)")
        kind, namespaced = await _kind_of(ctx, self._primary)
        api_version = self._primary.group_version
        return lambda obj: owner_requests(obj, api_version, kind, controller_only=True, namespaced=namespaced)

    async def _handle(self, rc: ReconcileContext, barrier: ReadYourWrites | None) -> Result | None:
        """One request, once its earlier writes show in the caches (``barrier``): the finalizer's part, then
        ``reconcile``, unless the object is being deleted."""
        if barrier is None:
            return await self._reconcile(rc)
        await barrier.settle(rc.request)
        token = barrier.reconciling(rc.request)
        try:
            return await self._reconcile(rc)
        finally:
            barrier.done(token)

    async def _reconcile(self, rc: ReconcileContext) -> Result | None:
        if self.finalizer is not None:
            req = rc.request
            obj = rc.lister().get(req.name, req.namespace)
            if obj is not None:
                if obj["metadata"].get("deletionTimestamp"):
                    if has_finalizer(obj, self.finalizer):
                        await self._finalize(rc)
                    return None
                if not has_finalizer(obj, self.finalizer):
                    await add_finalizer(rc.client, obj, self.finalizer)
        still_in_term(rc.ctx.fence)
        return await self._call(rc.request, rc)

    async def _finalize(self, rc: ReconcileContext) -> None:
        assert self.finalizer is not None and self.finalize is not None
        req = rc.request
        try:
            obj = await rc.client.get(req.name, req.namespace)
        except NotFound:
            return
        if obj["metadata"].get("deletionTimestamp") and has_finalizer(obj, self.finalizer):
            still_in_term(rc.ctx.fence)
            await self.finalize(req, rc, obj)
            await remove_finalizer(rc.client, obj, self.finalizer)
            rc.log.info("finalized; removed finalizer {}", self.finalizer)

