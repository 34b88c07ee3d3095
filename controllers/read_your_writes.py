"""ReadYourWrites: a reconcile starts once its request's own earlier writes show in the controller's caches.

controller-runtime waits inside its cached client's Get/List; listers here are synchronous, so the wait comes before
the reconcile, for that request's writes only. Caught up: the informer's or the cached object's resourceVersion is
at least the written one (as integers, KEP-5504; else the object's RV changed), or a deleted UID is gone. On timeout
the reconcile runs with what the cache has (counted). Writes outside a reconcile are not tracked.
"""

from __future__ import annotations

import asyncio
from contextvars import ContextVar, Token
from typing import Callable

from loguru import logger

from informers import GVR, SharedIndexInformer
from informers.resource import Object

from .metrics import ReadYourWritesMetrics
from .reconcile import Request

# The read_your_writes setting's default: the bound on a reconcile's wait, in seconds.
DEFAULT_READ_YOUR_WRITES = 2.0
# The barrier and request of the reconcile running in this task (each worker is a task of its own).
_CURRENT: ContextVar[tuple["ReadYourWrites", Request] | None] = ContextVar("read_your_writes", default=None)
# A request's writes are swept once this many requests have some pending (then at twice the survivors).
_SWEEP_AT = 256


def _int(rv: str | None) -> int | None:
    try:
        return int(rv) if rv else None
    except ValueError:
        return None


class _Write:
    """One write to wait for, in one informer: the written resourceVersion, or (``uid``) a delete."""

    __slots__ = ("informer", "key", "rv", "number", "before", "uid", "gone", "at")

    def __init__(self, informer: SharedIndexInformer, key: str, rv: str | None, uid: str | None, gone: bool,
                 at: float) -> None:
        self.informer, self.key, self.rv, self.number, self.uid, self.gone, self.at = (
            informer, key, rv, _int(rv), uid, gone, at)
        cached = informer.store.get(key)
        self.before = cached["metadata"].get("resourceVersion") if cached is not None else None

    def caught_up(self) -> bool:
        cached = self.informer.store.get(self.key)
        if self.gone:
            return cached is None or cached["metadata"].get("uid") != self.uid
        seen = _int(self.informer.resource_version)
        if self.number is not None and seen is not None and seen >= self.number:
            return True
        if cached is None:
            return False
        rv = cached["metadata"].get("resourceVersion")
        number = _int(rv)
        if self.number is not None and number is not None:
            return number >= self.number
        return bool(rv == self.rv or rv != self.before)


class ReadYourWrites:
    """The read-your-writes barrier of one controller instance: a ``WriteObserver`` of its context's clients.

    ``informers_of(gvr)`` names the controller's informers of a written GVR (none: the write is not tracked);
    ``timeout`` bounds each reconcile's wait, in seconds.
    """

    def __init__(self, controller: str, informers_of: Callable[[GVR], list[SharedIndexInformer]], timeout: float,
                 metrics: ReadYourWritesMetrics) -> None:
        self.controller = controller
        self.timeout = timeout
        self.metrics = metrics
        self._informers_of = informers_of
        self._pending: dict[Request, dict[tuple[GVR, str], _Write]] = {}
        self._sweep_at = _SWEEP_AT

    def reconciling(self, request: Request) -> Token[tuple[ReadYourWrites, Request] | None]:
        """Attribute this task's writes to ``request`` from now on; give the result to ``done``."""
        return _CURRENT.set((self, request))

    @staticmethod
    def done(token: Token[tuple[ReadYourWrites, Request] | None]) -> None:
        """Stop attributing this task's writes (``token``: what ``reconciling`` returned)."""
        _CURRENT.reset(token)

    async def settle(self, request: Request) -> None:
        """Wait, up to ``timeout``, until the writes of ``request``'s earlier reconciles show in the caches; a
        dict lookup when there are none."""
        writes = self._pending.pop(request, None)
        if writes is None:
            return
        waiting = [w for w in writes.values() if not w.caught_up()]
        if not waiting:
            return
        loop = asyncio.get_running_loop()
        started = loop.time()
        deadline = started + self.timeout
        behind = [w for w in waiting if not await w.informer.wait_for_change(w.caught_up, deadline - loop.time())]
        self.metrics.observe(not behind, loop.time() - started)
        if behind:
            logger.bind(controller=self.controller).debug(
                "read-your-writes: {} reconciles after {:g}s without seeing its writes of {}", request.key,
                self.timeout, ", ".join(f"{w.informer.gvr} {w.key}" for w in behind))

    # -- WriteObserver -----------------------------------------------------------------------------------
    def wrote(self, gvr: GVR, answer: Object) -> None:
        """Record a write's resourceVersion for the request reconciling in this task."""
        meta = answer.get("metadata") or {}
        name, rv = meta.get("name"), meta.get("resourceVersion")
        if name and rv:
            self._record(gvr, meta.get("namespace"), name, rv, meta.get("uid"), False)

    def deleted(self, gvr: GVR, namespace: str | None, name: str, uid: str | None, answer: Object | None) -> None:
        """Record a delete: the object should read as gone (or, when the answer shows it held, as written)."""
        meta = (answer or {}).get("metadata") or {}
        if meta.get("deletionTimestamp") and (meta.get("finalizers") or meta.get("deletionGracePeriodSeconds")):
            self.wrote(gvr, answer or {})
            return
        self._record(gvr, namespace, name, None, uid or meta.get("uid"), True)

    def _record(self, gvr: GVR, namespace: str | None, name: str, rv: str | None, uid: str | None,
                gone: bool) -> None:
        current = _CURRENT.get()
        if current is None or current[0] is not self:
            return
        informers = self._informers_of(gvr)
        if not informers:
            return  # the controller does not read this GVR from a cache
        request = current[1]
        key = f"{namespace}/{name}" if namespace else name
        writes = self._pending.get(request)
        if writes is None:
            if len(self._pending) >= self._sweep_at:
                self._sweep()
            writes = self._pending[request] = {}
        now = asyncio.get_running_loop().time()
        for informer in informers:
            slot = (informer.gvr, key)
            if gone and uid is None:
                # The UID of what is to go: the one written before in this request, else the cached one.
                earlier = writes.get(slot)
                cached = informer.store.get(key)
                uid = earlier.uid if earlier is not None else cached["metadata"].get("uid") if cached else None
                if uid is None:
                    writes.pop(slot, None)  # nothing known to wait for
                    continue
            writes[slot] = _Write(informer, key, rv, uid, gone, now)

    def _sweep(self) -> None:
        """Forget the requests whose writes show already or are older than the bound: the pending set stays
        bounded when requests are not reconciled again."""
        oldest = asyncio.get_running_loop().time() - self.timeout
        self._pending = {r: ws for r, ws in self._pending.items()
                         if any(w.at > oldest and not w.caught_up() for w in ws.values())}
        self._sweep_at = max(_SWEEP_AT, 2 * len(self._pending))
