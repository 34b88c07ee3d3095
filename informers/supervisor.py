"""Supervisor: owns long-lived background tasks, restarts the ones that fail, and says which are unhealthy.

client-go leaves a goroutine that panics to crash the process, and asyncio lets a task that raises die
unnoticed (its exception surfaces, if at all, when the task is garbage collected). Neither fits a sidecar: a
discovery loop that died on one cut connection must be restarted and reported, never silently frozen. Every
supervised task is restarted with backoff after an exception (or an unexpected return), its last error is
kept, and ``problems()`` names each task that is dead (restarts disabled) or wedged (busy for longer than it
declared it may be), for ``/healthz`` and ``/status``.
"""

from __future__ import annotations

import asyncio
import enum
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Iterator

from loguru import logger

from .backoff import Backoff
from .errors import describe_error


class TaskState(str, enum.Enum):
    """Where a supervised task is: running its body, waiting to restart after a failure, dead or stopped."""

    RUNNING = "running"
    BACKOFF = "backoff"
    DEAD = "dead"
    STOPPED = "stopped"


@dataclass
class TaskHealth:
    """One supervised task: state, restarts, the last error (text and time) and whether it is wedged now."""

    name: str
    state: TaskState
    restarts: int
    last_error: str
    last_error_at: float | None
    busy_for: float | None
    wedged: bool

    @property
    def healthy(self) -> bool:
        """Dead or wedged is unhealthy; a task backing off after an error is alive and retrying."""
        return self.state is not TaskState.DEAD and not self.wedged

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"name": self.name, "state": self.state.value, "restarts": self.restarts,
                "last_error": self.last_error, "last_error_at": self.last_error_at,
                "busy_for": None if self.busy_for is None else round(self.busy_for, 3), "wedged": self.wedged,
                "healthy": self.healthy}


class TaskHandle:
    """What a supervised body is given: mark work as busy (for wedge detection) and report handled errors."""

    def __init__(self, supervisor: "Supervisor", name: str, wedge_after: float | None, restart: bool,
                 backoff: Backoff) -> None:
        self.supervisor = supervisor
        self.name = name
        self.wedge_after = wedge_after
        self.restart = restart
        self.backoff = backoff
        self.state = TaskState.RUNNING
        self.restarts = 0
        self.last_error = ""
        self.last_error_at: float | None = None
        self.busy_since: float | None = None
        self.task: asyncio.Task[None] | None = None

    @contextmanager
    def busy(self) -> Iterator[None]:
        """Mark a unit of work (a pass, a renewal) that must finish within ``wedge_after`` seconds."""
        self.busy_since = time.monotonic()
        try:
            yield
        finally:
            self.busy_since = None

    def failed(self, error: BaseException) -> None:
        """Record an error the body handled itself (it keeps running); shown until ``succeeded()``."""
        self.last_error = describe_error(error)
        self.last_error_at = time.time()

    def succeeded(self) -> None:
        """Clear the last handled error."""
        self.last_error = ""
        self.last_error_at = None

    def health(self, now: float | None = None) -> TaskHealth:
        """A snapshot of this task's health."""
        now = time.monotonic() if now is None else now
        busy_for = None if self.busy_since is None else now - self.busy_since
        wedged = bool(self.wedge_after is not None and busy_for is not None and busy_for > self.wedge_after)
        return TaskHealth(self.name, self.state, self.restarts, self.last_error, self.last_error_at, busy_for,
                          wedged)


Body = Callable[[TaskHandle], Awaitable[None]]


class Supervisor:
    """Runs named background tasks; ``await stop()`` cancels and awaits every one of them."""

    def __init__(self, name: str = "supervisor") -> None:
        self.name = name
        self._handles: dict[str, TaskHandle] = {}
        self._log = logger.bind(component=name)

    def spawn(self, name: str, body: Body, *, restart: bool = True, wedge_after: float | None = None,
              backoff: Callable[[], Backoff] | None = None) -> TaskHandle:
        """Run ``body(handle)`` as task ``name`` (a name already running is an error).

        An exception (or, with ``restart``, a return) is logged with the task's name and the body restarted
        after a backoff; ``restart=False`` records the task as dead instead.
        """
        old = self._handles.get(name)
        if old is not None and old.task is not None and not old.task.done():
            raise RuntimeError(f"{self.name}: task {name!r} is already running")
        handle = TaskHandle(self, name, wedge_after, restart, (backoff or Backoff)())
        self._handles[name] = handle
        handle.task = asyncio.create_task(self._run(handle, body), name=name)
        return handle

    async def cancel(self, name: str, timeout: float | None = None) -> bool:
        """Cancel one task, await it (at most ``timeout`` seconds) and forget it (no-op if unknown). False if it
        is still running after ``timeout`` (it ignores its cancellation): it stays listed, for the caller to
        report."""
        handle = self._handles.get(name)
        if handle is not None and handle.task is not None:
            handle.task.cancel()
            await asyncio.wait({handle.task}, timeout=timeout)
            if not handle.task.done():
                return False
            handle.state = TaskState.STOPPED
        if self._handles.get(name) is handle:
            self._handles.pop(name, None)
        return True

    async def stop(self) -> None:
        """Cancel every task and await them all."""
        handles, self._handles = list(self._handles.values()), {}
        tasks = [h.task for h in handles if h.task is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for h in handles:
            h.state = TaskState.STOPPED

    def health(self) -> list[TaskHealth]:
        """Every task's health, by name."""
        now = time.monotonic()
        return [h.health(now) for _, h in sorted(self._handles.items())]

    def problems(self) -> list[TaskHealth]:
        """The tasks that are dead or wedged."""
        return [h for h in self.health() if not h.healthy]

    def next_wedge_in(self) -> float | None:
        """Seconds until a task busy now would count as wedged (None if none is busy with a bound): when to look
        again for whoever reports ``problems()`` as it changes."""
        now = time.monotonic()
        return min((h.wedge_after - (now - h.busy_since) for h in self._handles.values()
                    if h.wedge_after is not None and h.busy_since is not None), default=None)

    async def _run(self, handle: TaskHandle, body: Body) -> None:
        while True:
            handle.state = TaskState.RUNNING
            try:
                await body(handle)
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise asyncio.CancelledError  # the body swallowed our cancellation: it must still end us
            except asyncio.CancelledError:
                raise
            except Exception as e:
                handle.failed(e)
                if not handle.restart:
                    handle.state = TaskState.DEAD
                    self._log.opt(exception=e).error("background task {} died: {}", handle.name, describe_error(e))
                    return
                delay = handle.backoff.next()
                self._log.opt(exception=e).error("background task {} failed ({}); restarting in {:.1f}s",
                                                 handle.name, describe_error(e), delay)
            else:
                if not handle.restart:
                    # A one-shot task that did its job: nothing left to report on.
                    handle.state = TaskState.STOPPED
                    if self._handles.get(handle.name) is handle:
                        del self._handles[handle.name]
                    return
                handle.failed(RuntimeError("returned unexpectedly"))
                delay = handle.backoff.next()
                self._log.error("background task {} returned unexpectedly; restarting in {:.1f}s", handle.name, delay)
            handle.state = TaskState.BACKOFF
            handle.restarts += 1
            handle.busy_since = None
            await asyncio.sleep(delay)

