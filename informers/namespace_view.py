"""Namespace views: one namespace of a cluster's shared informers, as if it had informers of its own.

- ``NamespaceHost`` holds the one discovering factory the views of a cluster share, started by the first view that
  starts and shut down with the last.
- ``NamespaceSource`` is one namespace's informer source; it takes back all it registered at ``shutdown()``.
- ``NamespaceInformer`` answers for its namespace from the namespace index, and its handlers are routed by namespace
  (multicluster-runtime offers every event to every namespace's filter).

Cluster-scoped GVRs are not visible to a namespace, as in multicluster-runtime (``explain`` says why).
"""

from __future__ import annotations

import asyncio
import builtins
import weakref
from typing import Any, Callable, Iterable, Iterator, Mapping, NoReturn

from .discovering_factory import DiscoveringDynamicSharedInformerFactory, GVRStatus
from .discovery import DiscoveryResult
from .discovery_triggers import APISERVICES, CRDS, DiscoveryTriggers
from .gvr import GVR
from .gvr_listeners import GVRHandler
from .lister import Lister
from .shared_informer import EventHandler, FuncHandler, HandlerRegistration, SharedIndexInformer, optional_method
from .source import RemovalHook, Subscription
from .store import NAMESPACE_INDEX, IndexFunc, Obj, Store
from .supervisor import Supervisor


_TRIGGERS = (CRDS, APISERVICES)


def _read_only(*_: Any, **__: Any) -> NoReturn:
    raise TypeError("a namespace view is read-only: its shared informer owns the cache and its life")


class NamespaceStore(Store):
    """The objects of ``namespace`` in ``store``, read-only (a ``Store`` for whoever reads one); indexers added
    through it are the shared store's."""

    def __init__(self, store: Store, namespace: str) -> None:  # a view: Store's own state stays unused
        self._shared = store
        self.namespace = namespace
        self._prefix = namespace + "/"

    def get(self, key: str) -> Obj | None:
        """The object with ``key`` if it is in this namespace."""
        return self._shared.get(key) if key.startswith(self._prefix) else None

    def list(self) -> builtins.list[Obj]:
        """The namespace's objects."""
        return self._shared.by_index(NAMESPACE_INDEX, self.namespace)

    def keys(self) -> builtins.list[str]:
        """The namespace's keys."""
        return [self._prefix + o["metadata"]["name"] for o in self.list()]

    def by_index(self, name: str, value: str) -> builtins.list[Obj]:
        """The namespace's objects whose index function ``name`` yields ``value``."""
        if name == NAMESPACE_INDEX:
            return self.list() if value == self.namespace else []
        return [o for o in self._shared.by_index(name, value) if o["metadata"].get("namespace") == self.namespace]

    @property
    def indexers(self) -> dict[str, IndexFunc]:
        """The shared store's index functions."""
        return self._shared.indexers

    def add_indexers(self, indexers: Mapping[str, IndexFunc]) -> None:
        """Add index functions to the shared store (every namespace's view shares them)."""
        self._shared.add_indexers(indexers)

    def remove_indexers(self, names: Iterable[str]) -> None:
        """Drop named indices of the shared store."""
        self._shared.remove_indexers(names)

    def __len__(self) -> int:
        return len(self.list())

    def __iter__(self) -> Iterator[Obj]:
        return iter(self.list())

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and key.startswith(self._prefix) and key in self._shared

    upsert = delete = clear = replace = _read_only


class NamespaceInformer(SharedIndexInformer):
    """Namespace ``namespace`` of ``shared``: a ``SharedIndexInformer`` to its readers (see the module), owning
    nothing; ``reflector``, ``last_error`` and ``resource_version`` are the shared informer's, and so are the
    event counts a member's liveness reads."""

    def __init__(self, shared: SharedIndexInformer, namespace: str) -> None:  # a view: no reflector of its own
        self.shared = shared
        self.gvr = shared.gvr
        self.namespace = namespace
        self.store = NamespaceStore(shared.store, namespace)
        self.lister = Lister(self.store)
        self.transform = shared.transform
        self.reflector = shared.reflector
        self._mine: weakref.WeakSet[HandlerRegistration] = weakref.WeakSet()

    def has_synced(self) -> bool:
        """The shared informer's."""
        return self.shared.has_synced()

    async def wait_for_sync(self, timeout: float | None = None) -> bool:
        """The shared informer's."""
        return await self.shared.wait_for_sync(timeout)

    @property
    def started(self) -> bool:
        """The shared informer's."""
        return self.shared.started

    async def wait_for_change(self, ready: Callable[[], bool], timeout: float) -> bool:
        """As the shared informer's (any change to the shared cache tests ``ready`` again)."""
        return await self.shared.wait_for_change(ready, timeout)

    def objects(self, namespace: str | None = None) -> builtins.list[Obj]:
        """The cached objects of this namespace (of ``namespace`` if another: none)."""
        return self.store.list() if namespace in (None, self.namespace) else []

    def add_indexers(self, indexers: Mapping[str, IndexFunc]) -> None:
        """Add index functions to the shared store."""
        self.shared.add_indexers(indexers)

    def remove_indexers(self, names: Iterable[str]) -> None:
        """Drop named indices of the shared store."""
        self.shared.remove_indexers(names)

    def add_error_listener(self, listener: Callable[[Exception], None]) -> None:
        """On the shared informer (its failures are every namespace's)."""
        self.shared.add_error_listener(listener)

    def add_event_handler(
        self, handler: EventHandler | FuncHandler, resync_period: float | None = None, name: str | None = None, *,
        namespace: str | None = None,
    ) -> HandlerRegistration:
        """A handler of this namespace's events on the shared informer, named ``<namespace>/<name>`` (its metric
        series and logs tell the namespaces apart)."""
        if namespace not in (None, self.namespace):
            raise ValueError(f"the view of namespace {self.namespace} has no events of namespace {namespace}")
        base = name or getattr(handler, "name", None) or type(handler).__qualname__
        reg = self.shared.add_event_handler(handler, resync_period, f"{self.namespace}/{base}",
                                            namespace=self.namespace)
        self._mine.add(reg)
        return reg

    async def remove_event_handler(self, registration: HandlerRegistration) -> None:
        """Remove it from the shared informer."""
        await self.shared.remove_event_handler(registration)

    @property
    def registrations(self) -> builtins.list[HandlerRegistration]:
        """The registrations made through this view and still in place."""
        return [r for r in self.shared.registrations if r in self._mine]

    async def remove_all(self) -> None:
        """Remove every handler registered through this view."""
        for reg in self.registrations:
            await self.shared.remove_event_handler(reg)

    start = run = replace = apply = _read_only

    async def stop(self) -> None:
        """Not the view's to do."""
        _read_only()


class _ViewedGVRHandler:
    """A GVR handler of a namespace source: told of the namespace's informers instead of the shared ones (and not
    of the host's trigger informers)."""

    def __init__(self, source: "NamespaceSource", handler: GVRHandler) -> None:
        self.source, self.handler = source, handler

    def _call(self, method: str, gvr: GVR, *informer: SharedIndexInformer) -> Any:
        fn = optional_method(self.handler, method)
        if fn is None or gvr.full in _TRIGGERS:
            return None
        return fn(gvr, *(self.source.view(gvr, inf) for inf in informer))

    def on_gvr_added(self, gvr: GVR, informer: SharedIndexInformer) -> Any:
        return self._call("on_gvr_added", gvr, informer)

    def on_gvr_synced(self, gvr: GVR, informer: SharedIndexInformer) -> Any:
        return self._call("on_gvr_synced", gvr, informer)

    def on_gvr_removed(self, gvr: GVR) -> Any:
        return self._call("on_gvr_removed", gvr)


class NamespaceSource:
    """Namespace ``namespace`` of ``host``'s shared factory, as an informer source (see the module). ``start()``
    waits for the host's first discovery pass; ``shutdown()`` takes back all it declared, then lets the host go."""

    def __init__(self, host: "NamespaceHost", factory: DiscoveringDynamicSharedInformerFactory,
                 namespace: str) -> None:
        self.host = host
        self.factory = factory
        self.namespace = namespace
        self._views: dict[GVR, NamespaceInformer] = {}
        self._owners: set[str] = set()
        self._subscriptions: set[str] = set()
        self._hooks: dict[int, Callable[[], None]] = {}
        self._gvr_handlers: dict[int, _ViewedGVRHandler] = {}
        self._closed = False

    def _own(self, name: str) -> str:
        return f"{name} (namespace {self.namespace})"

    def view(self, gvr: GVR, shared: SharedIndexInformer) -> NamespaceInformer:
        """This namespace's view of ``shared`` (the same view while the informer is the same one)."""
        v = self._views.get(gvr)
        if v is None or v.shared is not shared:
            v = self._views[gvr] = NamespaceInformer(shared, self.namespace)
        return v

    # -- InformerSource and its capabilities ---------------------------------------------------------------
    def subscribe(self, id: str) -> Subscription:
        """The host's subscription, under this namespace's name for ``id``."""
        self._subscriptions.add(id)
        return self.factory.subscribe(self._own(id))

    def unsubscribe(self, id: str) -> None:
        """End the subscription ``id``."""
        self._subscriptions.discard(id)
        self.factory.unsubscribe(self._own(id))

    def informers(self) -> tuple[dict[GVR, SharedIndexInformer], builtins.list[GVR]]:
        """The host's, each synced one as this namespace's view (its trigger informers left out)."""
        synced, pending = self.factory.informers()
        return ({gvr: self.view(gvr, inf) for gvr, inf in synced.items() if gvr.full not in _TRIGGERS},
                [gvr for gvr in pending if gvr.full not in _TRIGGERS])

    def require(self, owner: str, gvrs: Iterable[GVR]) -> None:
        """Declare to the host, under this namespace's name for ``owner``."""
        self._owners.add(owner)
        self.factory.require(self._own(owner), gvrs)

    def release(self, owner: str) -> None:
        """Drop ``owner``'s declaration."""
        self._owners.discard(owner)
        self.factory.release(self._own(owner))

    def add_removal_hook(self, hook: RemovalHook) -> Callable[[], None]:
        """A removal hook on the host (taken back at ``shutdown`` if not before)."""
        unhook = self.factory.add_removal_hook(hook)
        key = id(hook)

        def remove() -> None:
            self._hooks.pop(key, None)
            unhook()

        self._hooks[key] = remove
        return remove

    def explain(self, gvr: GVR) -> str | None:
        """The host's reason (``excluded: cluster-scoped, ...`` for a cluster-scoped GVR)."""
        if gvr.full in _TRIGGERS:
            return "excluded: cluster-scoped, and a namespace sees namespaced resources only"
        return self.factory.explain(gvr)

    def add_gvr_handler(self, handler: GVRHandler) -> None:
        """GVR events of the host, with this namespace's views of its informers."""
        viewed = self._gvr_handlers[id(handler)] = _ViewedGVRHandler(self, handler)
        self.factory.add_gvr_handler(viewed)

    async def remove_gvr_handler(self, handler: GVRHandler) -> None:
        """Stop delivering GVR events to ``handler``."""
        viewed = self._gvr_handlers.pop(id(handler), None)
        if viewed is not None:
            await self.factory.remove_gvr_handler(viewed)

    # -- what a member reads -----------------------------------------------------------------------------
    @property
    def supervisor(self) -> Supervisor:
        """The host's (its discovery is every namespace's)."""
        return self.factory.supervisor

    @property
    def last_pass(self) -> DiscoveryResult | None:
        """The host's last discovery pass."""
        return self.factory.last_pass

    @property
    def triggers(self) -> DiscoveryTriggers:
        """The host's CRD and APIService caches."""
        return self.factory.triggers

    def status(self) -> builtins.list[GVRStatus]:
        """The host's GVRs."""
        return self.factory.status()

    def events_received(self) -> int:
        """The host's watch events: the one connection every namespace's member shares says it is alive."""
        return self.factory.events_received()

    # -- lifecycle ---------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Return once the host has made its first discovery pass (started by the first view to ask)."""
        await self.host.started(self.factory)

    async def shutdown(self) -> None:
        """Take back everything this namespace declared or registered on the host, then release the host (the last
        view to go shuts it down). Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            for id in list(self._subscriptions):
                self.unsubscribe(id)
            for remove in list(self._hooks.values()):
                remove()
            for handler in list(self._gvr_handlers.values()):
                await self.factory.remove_gvr_handler(handler)
            self._gvr_handlers.clear()
            for v in self._views.values():
                await v.remove_all()
            self._views.clear()
            for owner in list(self._owners):
                self.release(owner)
        finally:
            await self.host.release(self.factory)


class NamespaceHost:
    """The shared factory of one cluster's namespace views (``name``: the factory's, for its logs and metrics),
    made when the first view is asked for (restricted to namespaced resources, see the module) and shut down when
    the last view shuts down."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.factory: DiscoveringDynamicSharedInformerFactory | None = None
        self._views = 0
        self._start: asyncio.Task[None] | None = None

    def view(self, namespace: str, make: Callable[[str], DiscoveringDynamicSharedInformerFactory]) -> NamespaceSource:
        """A new view of ``namespace`` (each member its own: what it declares is taken back at its shutdown);
        ``make(name)`` builds the shared factory if there is none."""
        if self.factory is None:
            self.factory = make(self.name)
            self.factory.filter = self.factory.filter.restricted_to_namespaced()
        self._views += 1
        return NamespaceSource(self, self.factory, namespace)

    async def started(self, factory: DiscoveringDynamicSharedInformerFactory) -> None:
        """Wait for ``factory``'s start, begun by the first caller; a caller cancelled while waiting (a member's
        sync timeout) does not cancel it. A start that failed is tried again by the next caller."""
        if factory is not self.factory:
            raise RuntimeError(f"{self.name}: a view of a factory already shut down cannot start it")
        s = self._start
        if s is None or (s.done() and (s.cancelled() or s.exception() is not None)):
            s = self._start = asyncio.ensure_future(factory.start())
        await asyncio.shield(s)

    async def release(self, factory: DiscoveringDynamicSharedInformerFactory) -> None:
        """One view of ``factory`` fewer; after the last, stop its start and shut it down."""
        if factory is not self.factory:
            return
        self._views -= 1
        if self._views:
            return
        start, self._start, self.factory = self._start, None, None
        if start is not None:
            start.cancel()
            await asyncio.gather(start, return_exceptions=True)
        await factory.shutdown()

    @property
    def views(self) -> int:
        """How many views are open."""
        return self._views

