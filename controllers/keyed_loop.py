"""KeyedLoop: N workers taking keys off one WorkQueue, turning each outcome into the queue's next step; the one loop
of the Controller and the fleet loop, so retries, metrics, the fence and stopping work alike in both.

Outcomes as controller-runtime's ``reconcileHandler`` (success forgets, ``requeue_after`` delays, ``requeue`` and
exceptions rate-limit, ``TerminalError`` drops); a re-add keeps the key's priority. A key of an ended fence term is
put back uncounted, and the worker takes no other. Stopping drops queued keys, lets busy workers finish for up to
``drain`` (default 0: a stop usually means the leadership term ended), cancels them and reports those that outlive
``stop_timeout``. A failure identical to the key's previous one logs one line with a count, not the traceback again.
"""

from __future__ import annotations

import asyncio
import time
import traceback
from typing import TYPE_CHECKING, Awaitable, Callable, Generic, Hashable, Literal, TypeVar

from loguru import logger

from .context import ReconcileStats
from .fence import OPEN, Fence
from .metrics import ReconcileMetrics, ReconcileResult
from .reconcile import Result, TerminalError
from .tracing import NO_SPAN, Span
from .workqueue import QueueShutDown, WorkQueue

if TYPE_CHECKING:
    from loguru import Logger

T = TypeVar("T", bound=Hashable)

# The attributes a loop sets on a key's span: how its handling ended (the metrics' result), and whether (and after
# how many seconds, when the handler said) it was queued again.
RESULT, REQUEUE, REQUEUE_AFTER = ("kube_syncer.reconcile.result", "kube_syncer.reconcile.requeue",
                                  "kube_syncer.reconcile.requeue_after")
# How long a worker runs keys back to back before it lets the loop's other tasks run: long enough that a fleet's
# backlog of member registrations is settled in a few turns of a busy loop, far below any lease or probe deadline.
_SLICE = 0.020
LoopState = Literal["new", "running", "stopping", "stopped"]
# "stopping" lasts while workers that did not stop in time are still running.
_TRANSITIONS: dict[LoopState, tuple[LoopState, ...]] = {
    "new": ("running", "stopping"), "running": ("stopping",), "stopping": ("stopped",), "stopped": (),
}


class TermEnded(Exception):
    """The fence closed while a work item was being prepared: user code must not start."""


def still_in_term(fence: Fence) -> None:
    """Raise ``TermEnded`` unless ``fence`` holds; handlers call it right before user code, because what they read
    first (a GET, a finalizer PATCH) may outlast the term, and user code can act by other means than the fenced
    client."""
    if not fence.valid():
        raise TermEnded


def untraced(key: object) -> Span:
    """A key's span when its handling is not traced: one that does nothing."""
    return NO_SPAN


def _signature(e: BaseException) -> str:
    frame = traceback.extract_tb(e.__traceback__)[-1] if e.__traceback__ else None
    where = f" at {frame.filename}:{frame.lineno}" if frame else ""
    return f"{type(e).__qualname__}: {e}{where}"


class KeyedLoop(Generic[T]):
    """Runs ``handle(key)`` for the keys of ``queue`` on ``workers`` tasks: ``await run()`` until cancelled.

    The caller adds keys to ``queue`` (from event handlers, say); the loop does everything else with it, and shuts
    it down when it stops, so a loop runs once. ``action`` names a key's handling in the log, with ``{}`` for the
    key (``"reconcile of {}"``). Each handling is counted in ``stats`` and ``metrics`` (private records unless
    given; ``reconcile_metrics`` gives the exposed ones). ``span(key)`` is the span of a key's handling
    (``tracing.py``), current while ``handle`` runs; the loop sets its result and requeue on it.
    """

    def __init__(
        self, name: str, queue: WorkQueue[T], handle: Callable[[T], Awaitable[Result | None]], *, workers: int = 1,
        fence: Fence = OPEN, stats: ReconcileStats | None = None, metrics: ReconcileMetrics | None = None,
        log: Logger | None = None, action: str = "reconcile of {}", max_retries: int | None = None,
        skip: Callable[[T], str | None] | None = None, drain: float = 0.0, stop_timeout: float | None = None,
        span: Callable[[T], Span] = untraced,
    ) -> None:
        if workers < 1:
            raise ValueError(f"{name}: workers must be at least 1, not {workers}")
        if action.count("{}") != 1:
            raise ValueError(f"{name}: action {action!r} must name the key once, with {{}}")
        self.name, self.queue, self.workers, self.fence = name, queue, workers, fence
        self.stats = stats if stats is not None else ReconcileStats()
        self.metrics = metrics if metrics is not None else ReconcileMetrics()
        self.metrics.max_concurrent_reconciles = workers
        self.drain, self.stop_timeout = drain, stop_timeout
        self._handle, self._action, self._max_retries, self._skip = handle, action, max_retries, skip
        self._span = span
        self._log = log if log is not None else logger.bind(controller=name)
        self._state: LoopState = "new"
        self._stop_begun = asyncio.Event()  # wakes the workers parked by an ended term
        self._tasks: set[asyncio.Task[None]] = set()
        self._failures: dict[T, tuple[str, int]] = {}  # per key: the last failure's signature and its count

    @property
    def state(self) -> LoopState:
        """``new``, ``running``, ``stopping`` (also while workers that did not stop in time run on), ``stopped``."""
        return self._state

    def _to(self, state: LoopState) -> None:
        if state not in _TRANSITIONS[self._state]:
            raise RuntimeError(f"{self.name}: a keyed loop cannot go from {self._state} to {state} (it runs once: "
                               "its queue is shut down for good when it stops)")
        self._state = state

    async def run(self) -> None:
        """Start the workers and wait until cancelled, or until every worker has ended (the queue was shut down
        elsewhere) or one has failed (its exception is raised here); then ``stop``."""
        self._to("running")
        self._tasks = {asyncio.create_task(self._work(), name=f"{self.name} worker {i}") for i in range(self.workers)}
        try:
            done, _ = await asyncio.wait(self._tasks, return_when=asyncio.FIRST_EXCEPTION)
            failed = next((t.exception() for t in done if not t.cancelled() and t.exception() is not None), None)
        finally:
            await self.stop()
        if failed is not None:
            raise failed

    async def stop(self) -> list[str]:
        """Stop as the module docstring says; the names of the workers still running when it returns (none when
        ``stop_timeout`` is None). Idempotent; a loop never run just shuts its queue down."""
        if self._state == "stopped":
            return []
        if self._state != "stopping":
            self._to("stopping")
            self._stop_begun.set()
        self.queue.shutdown()
        tasks = list(self._tasks)
        try:
            if self.drain > 0 and tasks:
                _, late = await asyncio.wait(tasks, timeout=self.drain)
                for task in late:
                    self._log.warning("{} did not finish its item within {:g}s; cancelling it", task.get_name(),
                                      self.drain)
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.wait(tasks, timeout=self.stop_timeout)
        except asyncio.CancelledError:
            for task in tasks:
                task.cancel()
            raise
        self._tasks = {t for t in tasks if not t.done()}
        stuck = sorted(t.get_name() for t in self._tasks)
        if stuck:
            self._log.error("{} did not stop within {:g}s of being cancelled", ", ".join(stuck), self.stop_timeout)
        elif self._state == "stopping":  # a concurrent stop may have got there first
            self._to("stopped")
        return stuck

    async def _work(self) -> None:
        queue = self.queue
        clock = asyncio.get_running_loop().time
        resumed = -_SLICE
        while True:
            # A queue with items ready returns without suspending: a handler that never awaits (CPU only, or a
            # backlog of such) would otherwise keep the loop from lease renewals, probes and every other task. So
            # the worker yields once it has run for a slice; not after every key, which would hand a backlog of
            # quick keys out one per turn of a busy loop (a fleet's 500 new members registered over seconds).
            if clock() - resumed >= _SLICE:
                await asyncio.sleep(0)
                resumed = clock()
            try:
                key, priority = await queue.get_with_priority()
            except QueueShutDown:
                return
            if self._state != "running":
                queue.done(key)
                continue
            if not self.fence.valid():
                await self._park(key, priority)
                continue
            dropped = self._skip(key) if self._skip is not None else None
            if dropped:
                self._log.debug("dropping {}: {}", key, dropped)
                self._forget(key)
                queue.done(key)
                continue
            await self._process(key, priority)

    async def _process(self, key: T, priority: int) -> None:
        self.metrics.active_workers += 1
        started = time.monotonic()
        try:
            outcome, terminal = await self._attempt(key, priority)
        except asyncio.CancelledError:
            self.queue.done(key)
            raise
        except TermEnded:
            outcome = None
        finally:
            self.metrics.active_workers -= 1
        if outcome is None:
            await self._park(key, priority)
            return
        self.metrics.observe(outcome, time.monotonic() - started, terminal)
        self.queue.done(key)

    async def _attempt(self, key: T, priority: int) -> tuple[ReconcileResult, bool]:
        """Handle ``key`` (taken with ``priority``) inside its span and set its next step in the queue: (the metrics'
        result, whether an error is terminal)."""
        queue = self.queue
        with self._span(key) as span:
            try:
                result = await self._handle(key)
            except TermEnded:
                raise
            except TerminalError as e:
                span.fail(e)
                span.set(RESULT, "error")
                self.stats.record_error(e)
                self._log.opt(exception=e).error(self._action + " failed with a terminal error; not retrying", key)
                self._forget(key)
                return "error", True
            except Exception as e:
                span.fail(e)
                span.set(RESULT, "error")
                self.stats.record_error(e)
                retries = queue.num_requeues(key)
                if self._max_retries is not None and retries >= self._max_retries:
                    self._log.opt(exception=e).error(self._action + " failed {} times; dropping it", key, retries + 1)
                    self._forget(key)
                else:
                    self._log_failure(key, e)
                    queue.add_rate_limited(key, priority)
                    span.set(REQUEUE, True)
                return "error", False
            self.stats.record_success()
            self._failures.pop(key, None)
            if result is not None and result.priority is not None:
                priority = result.priority
            if result is not None and result.requeue_after is not None:
                queue.forget(key)
                queue.add_after(key, result.requeue_after, priority)
                span.set(RESULT, "requeue_after")
                span.set(REQUEUE, True)
                span.set(REQUEUE_AFTER, result.requeue_after)
                return "requeue_after", False
            if result is not None and result.requeue:
                queue.add_rate_limited(key, priority)
                span.set(RESULT, "requeue")
                span.set(REQUEUE, True)
                return "requeue", False
            queue.forget(key)
            span.set(RESULT, "success")
            return "success", False

    def _forget(self, key: T) -> None:
        self._failures.pop(key, None)
        self.queue.forget(key)

    def _log_failure(self, key: T, e: Exception) -> None:
        """Log a retried failure of ``key``: with the traceback the first time, as a counted line when it is the
        same failure as last time."""
        what = self._action + " failed; retrying"
        signature = _signature(e)
        last, count = self._failures.get(key, ("", 0))
        count = count + 1 if last == signature else 1
        self._failures[key] = (signature, count)
        if count == 1:
            self._log.opt(exception=e).warning(what, key)
        else:
            self._log.warning(what + " (the same error, {} times in a row: {}: {})", key, count, type(e).__name__, e)

    async def _park(self, key: T, priority: int) -> None:
        """The term has ended and never comes back: leave ``key`` queued as it was (add marks it dirty, done puts it
        back) and wait for the stop that is coming."""
        self.queue.add(key, priority)
        self.queue.done(key)
        self._log.info("leadership term ended; not starting {}", key)
        await self._stop_begun.wait()
