"""GVR lifecycle listeners: per-handler ordered delivery of "added", "synced" and "removed" events for GVRs.

As in kcp, each handler has its own queue, so a slow handler delays nobody else. Unlike kcp's dedup queue,
events are not merged: a GVR removed and re-added reaches the handler as "removed" then "added" (merged, the
handler would miss that the informer was replaced), and "synced" is an event of its own. A failing handler
is logged and gets the next event; ``close()`` cancels and awaits every delivery task.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal, Mapping, Protocol

from loguru import logger

from .gvr import GVR
from .shared_informer import SharedIndexInformer, optional_method

Event = Literal["on_gvr_added", "on_gvr_synced", "on_gvr_removed"]


class GVRHandler(Protocol):
    """Receives precise GVR lifecycle events (any method may be missing, sync or async)."""

    def on_gvr_added(self, gvr: GVR, informer: SharedIndexInformer) -> Any: ...

    def on_gvr_synced(self, gvr: GVR, informer: SharedIndexInformer) -> Any: ...

    def on_gvr_removed(self, gvr: GVR) -> Any: ...


class _Listener:
    """Delivers lifecycle events to one GVRHandler in order, on its own task."""

    def __init__(self, handler: GVRHandler) -> None:
        self.handler = handler
        self.queue: asyncio.Queue[tuple[Event, tuple[Any, ...]]] = asyncio.Queue()
        self.task = asyncio.create_task(self._run(), name=f"gvr-listener {type(handler).__name__}")

    async def _run(self) -> None:
        while True:
            method, args = await self.queue.get()
            fn = optional_method(self.handler, method)
            if fn is None:
                continue
            try:
                result = fn(*args)
                if asyncio.iscoroutine(result):
                    await result
            except Exception:
                logger.exception("GVR handler {} failed in {}{}", type(self.handler).__name__, method, args[:1])


class GVRListeners:
    """The registered GVR handlers; owns their delivery tasks."""

    def __init__(self) -> None:
        self._listeners: list[_Listener] = []

    def add(self, handler: GVRHandler, current: Mapping[GVR, SharedIndexInformer]) -> None:
        """Register ``handler``; it first gets ``added`` (and ``synced``, if so) for each of ``current``."""
        listener = _Listener(handler)
        for gvr, inf in current.items():
            listener.queue.put_nowait(("on_gvr_added", (gvr, inf)))
            if inf.has_synced():
                listener.queue.put_nowait(("on_gvr_synced", (gvr, inf)))
        self._listeners.append(listener)

    async def remove(self, handler: GVRHandler) -> None:
        """Stop delivering to ``handler`` (its pending events are dropped); awaits its delivery task."""
        gone = [listener for listener in self._listeners if listener.handler is handler]
        self._listeners = [listener for listener in self._listeners if listener.handler is not handler]
        for listener in gone:
            listener.task.cancel()
        await asyncio.gather(*(listener.task for listener in gone), return_exceptions=True)

    def emit(self, method: Event, *args: Any) -> None:
        """Queue one event for every handler; never blocks."""
        for listener in self._listeners:
            listener.queue.put_nowait((method, args))

    async def close(self) -> None:
        """Cancel and await every delivery task; events still queued are dropped."""
        listeners, self._listeners = self._listeners, []
        for listener in listeners:
            listener.task.cancel()
        await asyncio.gather(*(listener.task for listener in listeners), return_exceptions=True)
