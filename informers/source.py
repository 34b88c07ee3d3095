"""InformerSource: a changing set of informers, and coalescing change notifications for its subscribers."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, AsyncIterator, Awaitable, Callable, Iterable, Protocol

from .gvr import GVR
from .gvr_listeners import GVRHandler
from .shared_informer import SharedIndexInformer
from .supervisor import Supervisor

if TYPE_CHECKING:
    from .discovering_factory import GVRStatus
    from .discovery import DiscoveryResult
    from .discovery_triggers import DiscoveryTriggers


class Subscription:
    """An async iterator of change ticks. Ticks coalesce: however many changes happen while the subscriber is
    busy, it sees one tick, after which it should re-read ``informers()``. When unsubscribed, a tick still
    pending is delivered first, then iteration ends."""

    def __init__(self, id: str) -> None:
        self.id = id
        self._wake = asyncio.Event()
        self._pending = False
        self._closed = False

    def notify(self) -> None:
        """Record a change; never blocks (no-op once closed)."""
        if not self._closed:
            self._pending = True
            self._wake.set()

    def close(self) -> None:
        """End the iteration (after a pending tick, if any, has been taken)."""
        self._closed = True
        self._wake.set()

    @property
    def closed(self) -> bool:
        """Whether the subscription has ended."""
        return self._closed

    def __aiter__(self) -> AsyncIterator[None]:
        return self

    async def __anext__(self) -> None:
        while not self._pending:
            if self._closed:
                raise StopAsyncIteration
            self._wake.clear()
            await self._wake.wait()
        self._pending = False


class Notifier:
    """Subscriptions by id: re-subscribing an id replaces (and ends) the previous subscription."""

    def __init__(self) -> None:
        self._subs: dict[str, Subscription] = {}

    def subscribe(self, id: str) -> Subscription:
        """A new subscription under ``id``; it starts with one tick so the subscriber reads the current state."""
        old = self._subs.pop(id, None)
        if old is not None:
            old.close()
        sub = self._subs[id] = Subscription(id)
        sub.notify()
        return sub

    def unsubscribe(self, id: str) -> None:
        """End the subscription ``id`` (no-op if absent)."""
        sub = self._subs.pop(id, None)
        if sub is not None:
            sub.close()

    def notify_all(self) -> None:
        """Tick every subscription."""
        for sub in self._subs.values():
            sub.notify()

    def close_all(self) -> None:
        """End every subscription."""
        for sub in self._subs.values():
            sub.close()
        self._subs.clear()


RemovalHook = Callable[[GVR], Awaitable[None]]


class RemovalHooks(Protocol):
    """``add_removal_hook(hook)``: every hook is awaited before the source stops and drops an informer, so whatever
    reads that informer's cache can be stopped while the cache is still whole; the returned function unregisters
    the hook."""

    def add_removal_hook(self, hook: RemovalHook) -> Callable[[], None]: ...


class DemandSource(Protocol):
    """A source that watches only what is required (the discovering factory with ``watch="required"``): it starts
    informers for the union of the owners' declared GVRs and stops those nobody requires any more. ``require``
    replaces the owner's previous declaration; ``release`` drops it. A source that watches everything may accept
    and ignore them."""

    def require(self, owner: str, gvrs: Iterable[GVR]) -> None: ...

    def release(self, owner: str) -> None: ...


class Explains(Protocol):
    """``explain(gvr)``: why ``gvr`` has no informer (excluded, forbidden, not served yet, ...), or None when it has
    one."""

    def explain(self, gvr: GVR) -> str | None: ...


class InformerSource(DemandSource, RemovalHooks, Explains, Protocol):
    """What a ControllerManager consumes: subscribe to changes, read the synced / not-synced split, declare what
    its controllers require (``DemandSource``), stop them before an informer goes (``RemovalHooks``) and say why a
    GVR has no informer (``Explains``); the discovering factory and a namespace's view of one are the sources."""

    def subscribe(self, id: str) -> Subscription: ...

    def unsubscribe(self, id: str) -> None: ...

    def informers(self) -> tuple[dict[GVR, SharedIndexInformer], list[GVR]]: ...


class ClusterSource(InformerSource, Protocol):
    """All a member cluster's informers offer (its own discovering factory, or its namespace's view of a shared one,
    ``namespace_view.py``): the capabilities above, GVR lifecycle handlers, the discovery's ``status()`` and
    ``supervisor``, what its last pass found and its CRD and APIService caches (``triggers``), the watch events
    heard so far, ``start()`` (returns after the first discovery pass) and
    ``shutdown()``."""

    @property
    def supervisor(self) -> Supervisor: ...

    @property
    def last_pass(self) -> DiscoveryResult | None: ...

    @property
    def triggers(self) -> DiscoveryTriggers: ...

    def status(self) -> list[GVRStatus]: ...

    def events_received(self) -> int: ...

    def add_gvr_handler(self, handler: GVRHandler) -> None: ...

    async def remove_gvr_handler(self, handler: GVRHandler) -> None: ...

    async def start(self) -> None: ...

    async def shutdown(self) -> None: ...
