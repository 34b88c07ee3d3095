"""InformerSet: the running informers of a discovering factory, one per wanted GVR.

It starts them (``adopt``), stops them (``stop``, removal hooks first, so the controllers using a GVR stop while
its cache is still whole; kcp stops a vanished GVR's informer at once), and brings the set to a pass's wanted set
(``reconcile``), replacing an informer whose CRD was deleted and recreated (new uid) between passes. Subscribers
are notified when an informer becomes synced, fails or recovers (what ``informers()`` and ``last_error`` say
changed); GVR handlers get per-GVR added/synced/removed events.
"""

from __future__ import annotations

import asyncio
from typing import Callable, Collection, Mapping

from loguru import logger

from .errors import ApiError
from .factory import DynamicSharedInformerFactory
from .gvr import GVR
from .gvr_listeners import GVRHandler, GVRListeners
from .shared_informer import SharedIndexInformer
from .source import Notifier, RemovalHook
from .wait import wait_first


class InformerSet:
    """The informers of ``factory`` that are started (adopted); ``on_not_found`` is called when one's watch
    answers 404 (its GVR may be gone: time for a discovery pass)."""

    def __init__(self, factory: DynamicSharedInformerFactory, notifier: Notifier, on_not_found: Callable[[], None],
                 removal_timeout: float, name: str) -> None:
        self.factory = factory
        self.removal_timeout = removal_timeout
        self._notifier = notifier
        self._on_not_found = on_not_found
        self._listeners = GVRListeners()
        self._removal_hooks: list[RemovalHook] = []
        self._identity: dict[GVR, str] = {}  # GVR -> CRD uid ("" for non-CRD resources, or not known yet)
        self._adopted: dict[GVR, asyncio.Task[None]] = {}  # started informers -> their sync announcement
        self._removing: set[GVR] = set()
        self._log = logger.bind(component=name)

    def all(self) -> Mapping[GVR, SharedIndexInformer]:
        """Every informer the factory holds, started or not yet."""
        return self.factory.informers()

    def adopted(self) -> Collection[GVR]:
        """The GVRs whose informers are started."""
        return self._adopted.keys()

    def identity(self, gvr: GVR) -> str | None:
        """The uid of the CRD behind the informer of ``gvr`` ("" if none or not known yet; None: no informer)."""
        return self._identity.get(gvr)

    def informers(self) -> tuple[dict[GVR, SharedIndexInformer], list[GVR]]:
        """``(synced informers by GVR, GVRs whose informer is not synced yet)``; one being removed is in neither."""
        synced: dict[GVR, SharedIndexInformer] = {}
        not_synced: list[GVR] = []
        for gvr, inf in self.factory.informers().items():
            if gvr in self._removing:
                continue
            if inf.has_synced():
                synced[gvr] = inf
            else:
                not_synced.append(gvr)
        return synced, not_synced

    def add_removal_hook(self, hook: RemovalHook) -> Callable[[], None]:
        """Await ``hook(gvr)`` before the informer of ``gvr`` is stopped (at most ``removal_timeout`` for all of
        one GVR's hooks, run concurrently); returns the unregister function."""
        self._removal_hooks.append(hook)

        def remove() -> None:
            if hook in self._removal_hooks:
                self._removal_hooks.remove(hook)

        return remove

    def add_gvr_handler(self, handler: GVRHandler) -> None:
        """Deliver added/synced/removed events per GVR to ``handler``; current GVRs are replayed first."""
        informers = self.factory.informers()
        self._listeners.add(handler, {gvr: informers[gvr] for gvr in self._adopted if gvr in informers})

    async def remove_gvr_handler(self, handler: GVRHandler) -> None:
        """Stop delivering GVR events to ``handler``."""
        await self._listeners.remove(handler)

    def adopt(self, gvr: GVR) -> None:
        """Start the informer of ``gvr`` (made by the factory if need be) and announce it."""
        inf, _ = self.factory.for_resource(gvr)
        inf.add_error_listener(self._failed)
        inf.add_recovery_listener(self._notifier.notify_all)
        inf.start()
        self._adopted[gvr] = asyncio.create_task(self._announce_sync(gvr, inf), name=f"sync watch {gvr}")
        self._listeners.emit("on_gvr_added", gvr, inf)

    def _failed(self, e: Exception) -> None:
        """An informer's list or watch failed: its subscribers re-read its state (``last_error``); a 404 may mean
        its GVR is gone."""
        self._notifier.notify_all()
        if isinstance(e, ApiError) and e.status == 404:
            self._on_not_found()

    async def _announce_sync(self, gvr: GVR, inf: SharedIndexInformer) -> None:
        await inf.wait_for_sync()
        self._notifier.notify_all()
        self._listeners.emit("on_gvr_synced", gvr, inf)

    async def reconcile(self, desired: Mapping[GVR, str], keep: Collection[GVR],
                        reason: Callable[[GVR], str]) -> bool:
        """Stop what is not ``desired`` (except ``keep``) with ``reason(gvr)``, replace what has a new CRD uid, start
        what is new; whether the set changed."""
        removals: dict[GVR, str] = {}
        for gvr in self.factory.informers():
            if gvr in keep:
                continue
            if gvr not in desired:
                removals[gvr] = reason(gvr)
            elif desired[gvr] and self._identity.get(gvr) not in ("", None, desired[gvr]):
                removals[gvr] = "its CRD was recreated with a new uid"
        async with asyncio.TaskGroup() as tg:
            for gvr, why in removals.items():
                tg.create_task(self.stop(gvr, why))
        changed = bool(removals)
        for gvr, identity in desired.items():
            # The CRD cache may learn a uid after discovery showed the GVR: same informer, now identified.
            self._identity[gvr] = self._identity.get(gvr) or identity
            if gvr not in self._adopted:
                self.adopt(gvr)
                changed = True
        return changed

    async def stop(self, gvr: GVR, reason: str) -> None:
        """Stop and drop the informer of ``gvr``, its removal hooks awaited first."""
        self._log.info("stopping informer for {} ({})", gvr, reason)
        adopted = gvr in self._adopted
        self._removing.add(gvr)
        try:
            await self._await_removal_hooks(gvr)
            self._identity.pop(gvr, None)
            task = self._adopted.pop(gvr, None)
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            await self.factory.stop_resource(gvr)
        finally:
            self._removing.discard(gvr)
        if adopted:
            self._listeners.emit("on_gvr_removed", gvr)

    async def _await_removal_hooks(self, gvr: GVR) -> None:
        hooks = list(self._removal_hooks)
        if not hooks:
            return
        calls = asyncio.gather(*(self._call_hook(hook, gvr) for hook in hooks))
        if await wait_first(calls, timeout=self.removal_timeout) is None:
            self._log.warning("removal hooks for {} did not finish within {:g}s; stopping its informer anyway", gvr,
                              self.removal_timeout)

    async def _call_hook(self, hook: RemovalHook, gvr: GVR) -> None:
        try:
            await hook(gvr)
        except Exception:
            self._log.exception("removal hook {} failed for {}", getattr(hook, "__qualname__", hook), gvr)

    async def close(self) -> None:
        """Stop every informer (without removal hooks: the whole factory is going) and end the GVR handlers."""
        tasks = list(self._adopted.values())
        self._adopted.clear()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._listeners.close()
        await self.factory.shutdown()
        self._identity.clear()
