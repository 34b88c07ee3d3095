"""Worker: takes items off a WorkQueue, handles each, and turns its outcome into the queue's next step.

controller-runtime's ``reconcileHandler``: success forgets the item; ``Result.requeue_after`` re-adds it after that
delay; ``Result.requeue`` and any exception re-add it rate-limited (dropped after ``max_retries`` failures when
that is set); ``TerminalError`` drops it. One loop serves the Controller (requests of one cluster) and the fleet
controller (requests of many), so both treat retries, metrics and the fence alike.

The fence is checked before each item, and again by the handler right before user code (it raises
``TermEnded``): an item of an ended term is put back as it was, not counted, and the worker waits for its
cancellation, which the end of the term brings. ``skip(item)`` may name a reason to drop an item unhandled (the
fleet controller drops requests of a cluster that has left instead of retrying them forever).

A failure is logged with its traceback, unless it is the same (type, message, where it was raised) as the
item's previous attempt's: then it is one line with the count of such attempts in a row, as controller-runtime's rate-limited logging keeps a
reconcile that fails on every retry from filling the log with the same traceback.
"""

from __future__ import annotations

import asyncio
import time
import traceback
import weakref
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Hashable, TypeVar

from .context import ReconcileStats
from .fence import Fence
from .metrics import ReconcileMetrics, ReconcileResult
from .reconcile import Result, TerminalError
from .workqueue import QueueShutDown, WorkQueue

if TYPE_CHECKING:
    from loguru import Logger

T = TypeVar("T", bound=Hashable)


# Per queue (one per controller, shared by its workers), per item: the last failure's signature and its count.
_failures: "weakref.WeakKeyDictionary[WorkQueue[Any], dict[Hashable, tuple[str, int]]]" = \
    weakref.WeakKeyDictionary()


def _signature(e: BaseException) -> str:
    frame = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
    where = f" at {frame.filename}:{frame.lineno}" if frame else ""
    return f"{type(e).__qualname__}: {e}{where}"


def _log_failure(log: Logger, queue: WorkQueue[T], item: T, e: Exception, level: str, what: str) -> None:
    """Log ``what`` for a failure of ``item``: with the traceback the first time, as a counted line when it is
    the same failure as last time."""
    failures = _failures.setdefault(queue, {})
    signature = _signature(e)
    last, count = failures.get(item, ("", 0))
    count = count + 1 if last == signature else 1
    failures[item] = (signature, count)
    if count == 1:
        log.opt(exception=e).log(level, what, item)
    else:
        log.log(level, what + " (the same error, {} times in a row: {}: {})", item, count, type(e).__name__, e)


def _forget_failures(queue: WorkQueue[T], item: T) -> None:
    failures = _failures.get(queue)
    if failures:
        failures.pop(item, None)


class TermEnded(Exception):
    """The fence closed while a work item was being prepared: user code must not start."""


def still_in_term(fence: Fence) -> None:
    """Raise ``TermEnded`` unless ``fence`` holds; handlers call it right before user code, because what they read
    first (a GET, a finalizer PATCH) may outlast the term, and user code can act by other means than the fenced
    client."""
    if not fence.valid():
        raise TermEnded


async def run_worker(
    queue: WorkQueue[T], handle: Callable[[T], Awaitable[Result | None]], *, fence: Fence, stats: ReconcileStats,
    metrics: ReconcileMetrics, log: Logger, max_retries: int | None = None,
    skip: Callable[[T], str | None] | None = None,
) -> None:
    """Handle items of ``queue`` until it shuts down (or this task is cancelled)."""
    while True:
        # A queue with items ready returns without suspending: a reconcile that never awaits (CPU only, or a
        # backlog of such) would otherwise keep the loop from lease renewals, probes and every other task.
        await asyncio.sleep(0)
        try:
            item = await queue.get()
        except QueueShutDown:
            return
        if not fence.valid():
            await _park(queue, item, log)
        dropped = skip(item) if skip is not None else None
        if dropped:
            log.debug("dropping {}: {}", item, dropped)
            _forget_failures(queue, item)
            queue.forget(item)
            queue.done(item)
            continue
        metrics.active_workers += 1
        started = time.monotonic()
        outcome: ReconcileResult = "error"
        terminal = False
        try:
            result = await handle(item)
        except asyncio.CancelledError:
            queue.done(item)
            raise
        except TermEnded:
            await _park(queue, item, log)  # cancelled there: the finally below counts the worker out
        except TerminalError as e:
            terminal = True
            stats.record_error(e)
            log.opt(exception=e).error("reconcile of {} failed with a terminal error; not retrying", item)
            _forget_failures(queue, item)
            queue.forget(item)
        except Exception as e:
            stats.record_error(e)
            retries = queue.num_requeues(item)
            if max_retries is not None and retries >= max_retries:
                log.opt(exception=e).error("reconcile of {} failed {} times; dropping it", item, retries + 1)
                _forget_failures(queue, item)
                queue.forget(item)
            else:
                _log_failure(log, queue, item, e, "WARNING", "reconcile of {} failed; retrying")
                queue.add_rate_limited(item)
        else:
            stats.record_success()
            _forget_failures(queue, item)
            outcome = "success"
            if result is not None and result.requeue_after is not None:
                outcome = "requeue_after"
                queue.forget(item)
                queue.add_after(item, result.requeue_after)
            elif result is not None and result.requeue:
                outcome = "requeue"
                queue.add_rate_limited(item)
            else:
                queue.forget(item)
        finally:
            metrics.active_workers -= 1
        metrics.observe(outcome, time.monotonic() - started, terminal)
        queue.done(item)


async def _park(queue: WorkQueue[T], item: T, log: Logger) -> None:
    """The term has ended and never comes back: leave ``item`` queued as it was (add marks it dirty, done puts it
    back) and wait for the stop that is coming."""
    queue.add(item)
    queue.done(item)
    log.info("leadership term ended; not starting {}", item)
    await asyncio.get_running_loop().create_future()
