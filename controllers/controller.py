"""Controller: informer events -> request keys -> a work queue -> N workers calling ``reconcile(request)``.

The common case in a few lines::

    def create(ctx):
        c = Controller("widgets", reconcile, workers=2)
        c.watch(WIDGETS)
        return c.run

    ManagedController([WIDGETS], create)
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable, Callable, Iterable

from loguru import logger
from prometheus_client import CollectorRegistry

from informers import GVR, SharedIndexInformer

from .context import ControllerContext
from .ratelimiter import RateLimiter
from .reconcile import Request, Result
from .workqueue import QueueShutDown, WorkQueue

Reconcile = Callable[[Request], Awaitable[Result | None]]
MapFunc = Callable[[Any], Iterable[Request]]


def _own(obj: Any) -> Iterable[Request]:
    return (Request.for_object(obj),)


class _Enqueuer:
    """Event handler turning informer events into queued requests."""

    def __init__(self, queue: WorkQueue[Request], map_fn: MapFunc, predicate: Callable[[Any], bool] | None,
                 name: str) -> None:
        self.queue, self.map_fn, self.predicate, self.name = queue, map_fn, predicate, name

    def _enqueue(self, obj: Any) -> None:
        if self.predicate is None or self.predicate(obj):
            for req in self.map_fn(obj):
                self.queue.add(req)

    def on_add(self, obj: Any, is_in_initial_list: bool) -> None:
        self._enqueue(obj)

    def on_update(self, old: Any, new: Any) -> None:
        self._enqueue(new)

    def on_delete(self, obj: Any) -> None:
        self._enqueue(getattr(obj, "obj", obj))


class Controller:
    """Runs ``reconcile`` for requests derived from watched informers, with retries and requeues.

    A reconcile that raises is retried with the queue's rate limiter (client-go's default limiter unless
    given) until ``max_retries`` is reached, after which the request is dropped and logged. Workers start only
    once every watched informer has delivered its initial list to this controller.
    """

    def __init__(
        self, name: str, reconcile: Reconcile, *, workers: int = 1, max_retries: int | None = 15,
        rate_limiter: RateLimiter | None = None, metrics_registry: CollectorRegistry | None = None,
    ) -> None:
        self.name = name
        self.reconcile = reconcile
        self.workers = workers
        self.max_retries = max_retries
        self._rate_limiter = rate_limiter
        self._metrics_registry = metrics_registry
        self._watches: list[tuple[SharedIndexInformer | GVR, MapFunc, Callable[[Any], bool] | None]] = []
        self.queue: WorkQueue[Request] | None = None
        self._log = logger.bind(controller=name)

    def watch(self, source: SharedIndexInformer | GVR, map_fn: MapFunc = _own,
              predicate: Callable[[Any], bool] | None = None) -> "Controller":
        """Reconcile on events of an informer (or a GVR resolved through the context): by default the object
        itself; ``map_fn(obj)`` may name other objects (e.g. an owner); ``predicate(obj)`` filters events."""
        self._watches.append((source, map_fn, predicate))
        return self

    async def run(self, ctx: ControllerContext | None = None) -> None:
        """Register the handlers, wait for their initial lists, run the workers until cancelled, tear down."""
        queue: WorkQueue[Request] = WorkQueue(self.name, self._rate_limiter, self._metrics_registry)
        self.queue = queue
        regs = []
        try:
            for source, map_fn, predicate in self._watches:
                handler = _Enqueuer(queue, map_fn, predicate, self.name)
                if ctx is not None:
                    regs.append(ctx.add_event_handler(source, handler))
                elif isinstance(source, SharedIndexInformer):
                    regs.append(source.add_event_handler(handler, name=self.name))
                else:
                    raise TypeError(f"controller {self.name}: watching {source} needs a ControllerContext")
            await asyncio.gather(*(r.wait_for_sync() for r in regs))
            async with asyncio.TaskGroup() as tg:
                for i in range(self.workers):
                    tg.create_task(self._worker(queue), name=f"{self.name} worker {i}")
        finally:
            queue.shutdown()
            for reg in regs:
                await reg.informer.remove_event_handler(reg)

    async def _worker(self, queue: WorkQueue[Request]) -> None:
        while True:
            try:
                req = await queue.get()
            except QueueShutDown:
                return
            try:
                result = await self.reconcile(req)
            except asyncio.CancelledError:
                queue.done(req)
                raise
            except Exception as e:
                retries = queue.num_requeues(req)
                if self.max_retries is not None and retries >= self.max_retries:
                    self._log.opt(exception=e).error("reconcile of {} failed {} times; dropping it", req,
                                                     retries + 1)
                    queue.forget(req)
                else:
                    self._log.opt(exception=e).warning("reconcile of {} failed; retrying", req)
                    queue.add_rate_limited(req)
            else:
                if result is not None and result.requeue_after is not None:
                    queue.forget(req)
                    queue.add_after(req, result.requeue_after)
                elif result is not None and result.requeue:
                    queue.add_rate_limited(req)
                else:
                    queue.forget(req)
            queue.done(req)
