"""UnionController: keeps a UnionInformer in step with a changing set of cluster records.

The records are whatever represents clusters (kubeconfig Secrets, say), read through an informer and its lister;
a factory turns a record into an unstarted sub-informer, or None for "not yet". Each event of the source queues
the record's key; a worker then looks the key up *in the lister*, never in the event's payload (a stale payload
could resurrect a cluster that is gone):

- present, without a sub: ``factory(record)``; the sub is added to the union under the record's key, then
  started (so the union's handlers get its first list as their initial list). None from the factory is retried
  with the queue's per-key backoff. Present with a sub: nothing (a changed record does not rebuild its sub).
- absent: the sub is removed from the union, then stopped and awaited.

``run()`` works until cancelled, then: the queue is shut down, each worker finishes its current item (up to
``stop_timeout``, then it is cancelled), the source handler is removed, and every sub is removed from the union
and stopped. ``ready()`` is the strict readiness gate.

Differences from ARO-HCP's UnionKubeApplierInformersController, and why:

- A factory returning None is retried with backoff without waiting for another event of that cluster: ARO-HCP
  skips it until the record changes again, so a cluster whose informer could not be built yet may never join.
- Shutdown also removes the subs from the union: ARO-HCP stops them but leaves them in it, so the union's
  ``has_synced`` and lister keep reading caches that no longer follow their clusters.
- The union's cluster name is the record's object key (``namespace/name``, or ``name`` when cluster-scoped):
  two records of one name in different namespaces never collide, and a removal needs nothing but the key.
- A sub is tracked before anything is awaited for it, so an item cut short (a failed add, a stop that times
  out) stops the sub it created instead of leaving it running outside the union.
- The sub's lifecycle is the controller's (``start()`` / ``await stop()``): a factory that builds a client per
  cluster returns a sub whose ``stop`` also closes it.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Awaitable, Callable, Protocol

from loguru import logger
from prometheus_client import CollectorRegistry

from informers.shared_informer import FuncHandler, HandlerRegistration, SharedIndexInformer
from informers.store import DeletedFinalStateUnknown, Obj, object_key
from informers.union_informer import SubInformer, UnionInformer
from informers.union_lister import SubLister

from .ratelimiter import RateLimiter
from .workqueue import QueueShutDown, WorkQueue


class ManagedSub(SubInformer, Protocol):
    """A sub-informer whose lifecycle the controller owns: ``SharedIndexInformer`` satisfies it."""

    def start(self) -> None: ...

    async def stop(self) -> None: ...


SubFactory = Callable[[Obj], ManagedSub | None | Awaitable[ManagedSub | None]]


class UnionController:
    """Adds and removes the subs of ``union`` as records come and go in ``source`` (read through ``lister``,
    by default ``source.lister``)."""

    def __init__(
        self, union: UnionInformer, source: SharedIndexInformer, factory: SubFactory, *,
        lister: SubLister | None = None, name: str = "union-controller", workers: int = 2,
        stop_timeout: float = 10.0, rate_limiter: RateLimiter | None = None,
        metrics_registry: CollectorRegistry | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError(f"{name}: workers must be at least 1, not {workers}")
        self.union = union
        self.name = name
        self.workers = workers
        self.stop_timeout = stop_timeout
        self._source = source
        self._lister = lister if lister is not None else source.lister
        self._factory = factory
        self._queue: WorkQueue[str] = WorkQueue(name, rate_limiter, metrics_registry)
        self._subs: dict[str, ManagedSub] = {}  # record key -> the sub this controller created and owns
        self._registration: HandlerRegistration | None = None
        self._stopping = False
        self._log = logger.bind(controller=name)

    def ready(self) -> bool:
        """True once the source has synced and given its initial records to this controller, and every record
        now in the lister has a sub in the union that has synced (a factory still saying "not yet" blocks it)."""
        reg = self._registration
        return (reg is not None and reg.has_synced()
                and self.union.has_synced_clusters(object_key(r) for r in self._lister.list()))

    async def run(self) -> None:
        """Keep the union in step until cancelled, then shut down as the module docstring says (once only)."""
        if self._registration is not None or self._stopping:
            raise RuntimeError(f"{self.name} runs once")  # its queue is shut down for good when it stops
        self._registration = self._source.add_event_handler(
            FuncHandler(lambda obj, _initial: self._enqueue(obj), lambda _old, new: self._enqueue(new),
                        self._enqueue), name=self.name)
        workers = [asyncio.create_task(self._worker(), name=f"{self.name} worker {i}") for i in range(self.workers)]
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.shield(self._shutdown(self._registration, workers))

    async def sync(self, key: str) -> bool:
        """Bring the union in line with the record ``key`` in the lister; False means "retry later"."""
        namespace, _, name = key.rpartition("/")
        record = self._lister.get(name, namespace or None)
        if record is None:
            await self._drop(key)
            return True
        if key in self._subs:
            return True
        made = self._factory(record)
        sub = await made if inspect.isawaitable(made) else made
        if sub is None:
            self._log.debug("{}: no informer for cluster {} yet; retrying with backoff", self.name, key)
            return False
        self._subs[key] = sub
        try:
            await self.union.add(key, sub)
            sub.start()
        except BaseException:
            await self._drop(key)
            raise
        self._log.info("{}: cluster {} joined the union", self.name, key)
        return True

    def _enqueue(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        self._queue.add(obj.key if isinstance(obj, DeletedFinalStateUnknown) else object_key(obj))

    async def _worker(self) -> None:
        queue = self._queue
        while True:
            try:
                key = await queue.get()
            except QueueShutDown:
                return
            try:
                if self._stopping:  # what is still queued at shutdown is dropped, not started only to be stopped
                    continue
                if await self.sync(key):
                    queue.forget(key)
                else:
                    queue.add_rate_limited(key)
            except Exception as e:
                self._log.opt(exception=e).error("{}: syncing cluster {} failed; retrying with backoff", self.name, key)
                queue.add_rate_limited(key)
            finally:
                queue.done(key)

    async def _drop(self, key: str) -> None:
        sub = self._subs.pop(key, None)
        if sub is not None:
            await self.union.remove(key)
            await sub.stop()
            self._log.info("{}: cluster {} left the union", self.name, key)

    async def _shutdown(self, registration: HandlerRegistration, workers: list[asyncio.Task[None]]) -> None:
        self._stopping = True
        self._queue.shutdown()
        _, late = await asyncio.wait(workers, timeout=self.stop_timeout)
        for task in late:
            self._log.warning("{} did not finish its item within {:g}s; cancelling it", task.get_name(),
                              self.stop_timeout)
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        await self._source.remove_event_handler(registration)
        self._registration = None
        keys = list(self._subs)
        for key, result in zip(keys, await asyncio.gather(*(self._drop(key) for key in keys), return_exceptions=True)):
            if isinstance(result, Exception):
                self._log.opt(exception=result).error("{}: stopping the informer of cluster {} failed", self.name, key)
