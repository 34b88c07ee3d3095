"""SharedIndexInformer: one reflector, one indexed store, any number of event handlers.

Each handler registration has its own queue and task, so a slow or failing handler never delays the reflector or
the other handlers; handler methods may be plain functions or coroutines. A registration may be for one namespace:
its events are routed by a dict lookup, so an event costs only its own namespace's handlers (client-go has no such
thing; multicluster-runtime offers every event to every namespace's filter).
Cached objects are shared, frozen (``frozen.py``): client-go asks callers not to modify them, here it raises.

Over 400 lines: the informer and its registrations are one delivery path (store, queues, namespace routing).
"""

from __future__ import annotations

import asyncio
import inspect
from collections import deque
from typing import Any, Callable, Iterable, Iterator, Mapping, Protocol

from loguru import logger

from .client import ApiClient
from .frozen import freeze, read_only_cache
from .gvr import GVR
from .lister import Lister
from .metrics import InformerMetrics, Reading
from .object_shard import ObjectShard
from .reflector import Reflector, ReflectorOptions
from .store import NAMESPACE_INDEX, DeletedFinalStateUnknown, IndexFunc, Obj, Store, deleted_key, object_key

Transform = Callable[[Obj], Obj]


def _then_freeze(transform: Transform | None) -> Transform:
    if transform is None:
        return freeze
    return lambda obj: freeze(transform(obj))


_ADD, _UPDATE, _DELETE, _SYNCED = range(4)
# After this many events in a row a handler task yields, so one busy handler cannot starve the loop.
_BATCH = 256


class EventHandler(Protocol):
    """Receives cache events; any method may be missing, sync or async."""

    def on_add(self, obj: Obj, is_in_initial_list: bool) -> Any: ...

    def on_update(self, old: Obj, new: Obj) -> Any: ...

    def on_delete(self, obj: Obj | DeletedFinalStateUnknown) -> Any: ...


class FuncHandler:
    """An EventHandler from plain callables (``on_add(obj, is_in_initial_list)``, ``on_update(old, new)``,
    ``on_delete(obj_or_tombstone)``); omitted ones ignore their events."""

    def __init__(
        self, on_add: Callable[..., Any] | None = None, on_update: Callable[..., Any] | None = None,
        on_delete: Callable[..., Any] | None = None, name: str | None = None,
    ) -> None:
        self.on_add = on_add
        self.on_update = on_update
        self.on_delete = on_delete
        self.name = name or next(
            (getattr(f, "__qualname__", repr(f)) for f in (on_add, on_update, on_delete) if f), "FuncHandler"
        )


async def _wait(event: asyncio.Event, timeout: float | None) -> bool:
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
    except TimeoutError:
        return False
    return True


def optional_method(handler: Any, method: str) -> Callable[..., Any] | None:
    """``handler``'s ``method``, or None: event and GVR handlers are duck-typed with every method optional (as
    client-go's ``ResourceEventHandlerFuncs`` with nil funcs); the one place one is looked up."""
    return getattr(handler, method, None)


def _bind(handler: Any, method: str) -> tuple[Callable[..., Any] | None, bool]:
    fn = optional_method(handler, method)
    return fn, bool(fn is not None and inspect.iscoroutinefunction(fn))


class HandlerRegistration:
    """One handler on one informer: its queue, its task and its own has-synced; ``namespace``: the only namespace
    whose events it gets (None: all)."""

    def __init__(self, informer: "SharedIndexInformer", handler: Any, name: str, resync_period: float | None,
                 namespace: str | None = None) -> None:
        self.informer = informer
        self.handler = handler
        self.name = name
        self.resync_period = resync_period
        self.namespace = namespace
        self._queue: deque[tuple[int, Any, Any]] = deque()
        self._wake = asyncio.Event()
        self._synced = asyncio.Event()
        self._add = _bind(handler, "on_add")
        self._update = _bind(handler, "on_update")
        self._delete = _bind(handler, "on_delete")
        self._tasks: list[asyncio.Task[None]] = []
        self._log = logger.bind(gvr=str(informer.gvr), handler=name)

    def has_synced(self) -> bool:
        """True once the informer has synced and this handler has been given every object of the initial list."""
        return self._synced.is_set()

    async def wait_for_sync(self, timeout: float | None = None) -> bool:
        """Wait until ``has_synced()``; False on timeout."""
        return await _wait(self._synced, timeout)

    @property
    def queue_depth(self) -> int:
        """Events waiting to be handled."""
        return len(self._queue)

    def _enqueue(self, item: tuple[int, Any, Any]) -> None:
        self._queue.append(item)
        if not self._wake.is_set():
            self._wake.set()

    def _start(self) -> None:
        self._tasks.append(asyncio.create_task(self._run(), name=f"handler {self.name} {self.informer.gvr}"))
        if self.resync_period:
            self._tasks.append(asyncio.create_task(self._resync(self.resync_period),
                                                   name=f"resync {self.name} {self.informer.gvr}"))

    async def _stop(self) -> None:
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks.clear()
        self._queue.clear()

    async def _resync(self, period: float) -> None:
        while True:
            await asyncio.sleep(period)
            if self.informer.has_synced():
                for obj in self.informer.objects(self.namespace):
                    self._enqueue((_UPDATE, obj, obj))

    async def _run(self) -> None:
        queue = self._queue
        while True:
            if not queue:
                self._wake.clear()
                await self._wake.wait()
                continue
            for _ in range(_BATCH):
                if not queue:
                    break
                kind, a, b = queue.popleft()
                if kind == _SYNCED:
                    self._synced.set()
                    continue
                fn, is_async = self._add if kind == _ADD else self._update if kind == _UPDATE else self._delete
                if fn is None:
                    continue
                try:
                    result = fn(a, b) if kind != _DELETE else fn(a)
                    if is_async:
                        await result
                except asyncio.CancelledError:
                    raise
                except Exception:
                    self._log.exception("event handler {} failed on {} of {}; event skipped", self.name,
                                        ("add", "update", "delete")[kind], _describe(b if kind == _UPDATE else a))
            else:
                await asyncio.sleep(0)


def _namespace_of(obj: Obj | DeletedFinalStateUnknown) -> str:
    if isinstance(obj, DeletedFinalStateUnknown):
        obj = obj.obj
    return obj["metadata"].get("namespace") or ""


def _describe(obj: Any) -> str:
    try:
        return deleted_key(obj)
    except (KeyError, TypeError):
        return "?"


class SharedIndexInformer:
    """A shared, indexed cache of one GVR, kept current by a reflector, fanning events out to handlers.

    ``start()`` (inside a running loop) begins listing/watching; ``await stop()`` cancels and awaits every task
    and closes the watch connection. ``store`` and ``lister`` read the cache.
    """

    def __init__(
        self, client: ApiClient, gvr: GVR, *, namespace: str | None = None, label_selector: str | None = None,
        field_selector: str | None = None, indexers: Mapping[str, IndexFunc] | None = None,
        transform: Transform | None = None, options: ReflectorOptions | None = None,
        metrics: InformerMetrics | None = None, shard: ObjectShard | None = None,
    ) -> None:
        self.gvr = gvr
        self.namespace = namespace
        self.store = Store(indexers)
        self.lister = Lister(self.store)
        self.transform = transform
        # Whatever enters the cache is frozen (KUBE_SYNCER_READONLY_CACHE=0 turns it off). The reflector freezes
        # each object as it is decoded, after the transform: freezing a watch-list sync's objects only once it has
        # ended would hold every container twice at the peak, memory the process then keeps.
        self._read_only = read_only_cache()
        self._metrics = metrics or InformerMetrics.for_registry()
        self._gvr_label = str(gvr)
        self._registrations: list[HandlerRegistration] = []  # of every namespace
        self._routed: dict[str, list[HandlerRegistration]] = {}  # namespace -> its own registrations
        self._synced = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopped = False
        self._error_listeners: list[Callable[[Exception], None]] = []
        self._recovery_listeners: list[Callable[[], None]] = []
        self._change_waiters: list[asyncio.Future[None]] = []
        self.reflector = Reflector(
            client, gvr, self, namespace=namespace, label_selector=label_selector, field_selector=field_selector,
            options=options, metrics=self._metrics, on_error=self._reflector_error,
            on_recovered=self._reflector_recovered,
            transform=_then_freeze(transform) if self._read_only else transform, shard=shard,
        )
        self._metrics.observe(self, self._gvr_label)

    def metric_readings(self) -> Iterator[Reading]:
        """Its gauges, read at scrape time (``InformerMetrics.observe``)."""
        yield "informer_objects", (), len(self.store)
        if self.has_synced():
            yield "informer_synced", (), 1
        depths = {reg.name: reg.queue_depth for reg in self.registrations}  # of one name, the last registered
        for name, depth in depths.items():
            yield "informer_handler_queue_depth", (name,), depth

    # -- state -------------------------------------------------------------------------------------------
    def has_synced(self) -> bool:
        """True once the first full list has been stored."""
        return self._synced.is_set()

    async def wait_for_sync(self, timeout: float | None = None) -> bool:
        """Wait for the first full list; False on timeout."""
        return await _wait(self._synced, timeout)

    @property
    def last_error(self) -> Exception | None:
        """The reflector's most recent failure, cleared by the next success."""
        return self.reflector.last_error

    @property
    def resource_version(self) -> str:
        """The last resourceVersion the cache reflects."""
        return self.reflector.resource_version

    @property
    def started(self) -> bool:
        """Whether ``start()`` has been called."""
        return self._task is not None

    async def wait_for_change(self, ready: Callable[[], bool], timeout: float) -> bool:
        """Wait until ``ready()`` holds, testing it now and after each change to the cache (a watch event applied,
        a relist); False if it still does not after ``timeout`` seconds. ``resource_version`` already names the
        change when ``ready`` is tested. A cache that does not change costs nothing while nobody waits."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not ready():
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            changed: asyncio.Future[None] = loop.create_future()
            self._change_waiters.append(changed)
            try:
                async with asyncio.timeout(remaining):
                    await changed
            except TimeoutError:
                return ready()
            finally:
                if changed in self._change_waiters:
                    self._change_waiters.remove(changed)
        return True

    def _changed(self) -> None:
        # The waiters run after the reflector has recorded the event's resourceVersion (it does so right after
        # handing the event over, without awaiting in between).
        waiters, self._change_waiters = self._change_waiters, []
        for changed in waiters:
            if not changed.done():
                changed.set_result(None)

    def objects(self, namespace: str | None = None) -> list[Obj]:
        """The cached objects of ``namespace`` (None: all), from the namespace index."""
        return self.store.list() if namespace is None else self.store.by_index(NAMESPACE_INDEX, namespace)

    def add_indexers(self, indexers: Mapping[str, IndexFunc]) -> None:
        """Add index functions (also on a running informer: the index is built at once)."""
        self.store.add_indexers(indexers)

    def remove_indexers(self, names: Iterable[str]) -> None:
        """Drop named indices (an unknown name is ignored; the namespace index stays)."""
        self.store.remove_indexers(names)

    def add_error_listener(self, listener: Callable[[Exception], None]) -> None:
        """Call ``listener(exc)`` on every list/watch failure (e.g. to react to 404 or 403).

        A listener that raises is logged and skipped; the informer and the other listeners carry on.
        """
        self._error_listeners.append(listener)

    def add_recovery_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` when a list or watch works again after a failure (``last_error`` is cleared); a
        listener that raises is logged and skipped."""
        self._recovery_listeners.append(listener)

    def _reflector_error(self, e: Exception) -> None:
        for listener in self._error_listeners:
            self._call_listener("error", listener, e)

    def _reflector_recovered(self) -> None:
        for listener in self._recovery_listeners:
            self._call_listener("recovery", listener)

    def _call_listener(self, kind: str, listener: Callable[..., None], *args: Any) -> None:
        try:
            listener(*args)
        except Exception:
            logger.bind(gvr=self._gvr_label).exception(
                "{} listener {} of {} failed ({!r})", kind, getattr(listener, "__qualname__", repr(listener)),
                self.gvr, args[0] if args else "recovered")

    # -- handlers ----------------------------------------------------------------------------------------
    def add_event_handler(
        self, handler: EventHandler | FuncHandler, resync_period: float | None = None, name: str | None = None, *,
        namespace: str | None = None,
    ) -> HandlerRegistration:
        """Register a handler (for the events of ``namespace`` only, if given: see the module); if the informer has
        synced, it first gets every cached object (of that namespace) as an initial add."""
        if self._stopped:
            raise RuntimeError(f"informer for {self.gvr} is stopped")
        reg_name = name or getattr(handler, "name", None) or type(handler).__qualname__
        reg = HandlerRegistration(self, handler, reg_name, resync_period, namespace)
        if self.has_synced():
            for obj in self.objects(namespace):
                reg._enqueue((_ADD, obj, True))
            reg._enqueue((_SYNCED, None, None))
        if namespace is None:
            self._registrations.append(reg)
        else:
            self._routed.setdefault(namespace, []).append(reg)
        if self._task is not None:
            reg._start()
        return reg

    async def remove_event_handler(self, registration: HandlerRegistration) -> None:
        """Stop delivering to a registration and await its task; removing twice (or a foreign one) is a no-op."""
        ns = registration.namespace
        regs = self._registrations if ns is None else self._routed.get(ns, [])
        if registration not in regs:
            return
        regs.remove(registration)
        if ns is not None and not regs:
            del self._routed[ns]
        await registration._stop()

    @property
    def registrations(self) -> list[HandlerRegistration]:
        """Current handler registrations (of every namespace, then those of one namespace)."""
        return [*self._registrations, *(r for regs in self._routed.values() for r in regs)]

    # -- lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the reflector and the handler tasks (idempotent); needs a running event loop."""
        if self._stopped:
            raise RuntimeError(f"informer for {self.gvr} is stopped and cannot be restarted")
        if self._task is not None:
            return
        self._task = asyncio.create_task(self.reflector.run(), name=f"reflector {self.gvr}")
        for reg in self.registrations:
            reg._start()

    async def stop(self) -> None:
        """Cancel and await the reflector and every handler task; drop the cache, the handlers and (unless
        another informer of the same GVR still runs) the GVR's metric series."""
        self._stopped = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        for reg in self.registrations:
            await self.remove_event_handler(reg)
        self.store.clear()
        self._metrics.forget(self)
        self._metrics.forget(self.reflector)

    async def run(self) -> None:
        """Start, then run until cancelled, then stop: for use as a task body."""
        self.start()
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.shield(self.stop())

    # -- reflector sink ----------------------------------------------------------------------------------
    def replace(self, objs: list[Obj], resource_version: str) -> None:
        """Atomically replace the cache with a full list and notify handlers of the differences."""
        upserts, deletes = self.store.replace(map(freeze, objs) if self._read_only else objs)
        initial = not self._synced.is_set()
        for old, new in upserts:
            if old is None:
                item: tuple[int, Any, Any] = (_ADD, new, initial)
            elif old.get("metadata", {}).get("resourceVersion") == new["metadata"].get("resourceVersion"):
                continue  # unchanged across a relist: nothing to tell
            else:
                item = (_UPDATE, old, new)
            self._deliver(item, new)
        for tomb in deletes:
            self._deliver((_DELETE, tomb, None), tomb)
        if initial:
            self._synced.set()
            for reg in self.registrations:
                reg._enqueue((_SYNCED, None, None))
        if self._change_waiters:
            self._changed()

    def apply(self, event_type: str, obj: Obj) -> None:
        """Apply one watch event to the cache and queue it for every handler."""
        if self._read_only:
            obj = freeze(obj)  # already frozen when the reflector feeds it; not when a caller applies an event
        if event_type == "DELETED":
            self.store.delete(object_key(obj))
            item: tuple[int, Any, Any] = (_DELETE, obj, None)
        else:
            old = self.store.upsert(obj)
            item = (_ADD, obj, False) if old is None else (_UPDATE, old, obj)
        self._deliver(item, obj)
        if self._change_waiters:
            self._changed()

    def _deliver(self, item: tuple[int, Any, Any], obj: Obj | DeletedFinalStateUnknown) -> None:
        """Queue ``item`` for the handlers of every namespace and those of ``obj``'s."""
        for reg in self._registrations:
            reg._enqueue(item)
        if self._routed:
            for reg in self._routed.get(_namespace_of(obj), ()):
                reg._enqueue(item)

