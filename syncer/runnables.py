"""Stores and runnables that plugins contribute next to their controllers, and the leader's lifecycle of them.

A store (``name``, ``recover()``) holds state controllers need before their first reconcile; a runnable (``name``,
``run()``, ``shutdown()``) is other long-lived leader work; either may report ``health()``. Each term, in furiko's
order: stores recovered, then runnables and controllers started; stop is concurrent. Unlike furiko, a failing
``recover()`` is retried with backoff and reported (controllers wait for it), a failing ``run()`` is restarted
alone, and ``stop()`` bounds every ``shutdown()`` by one deadline, then cancels and names any that ignore it.
The same objects serve every term.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence, runtime_checkable

from loguru import logger

from controllers.health import HealthItem
from informers import Backoff

# How long a run() that was cancelled at the deadline gets to finish before it is reported as stuck.
_CANCEL_GRACE = 1.0


@dataclass(frozen=True)
class Health:
    """What a store or runnable says about itself: ``healthy``, and why not in ``message``."""

    healthy: bool
    message: str = ""


@runtime_checkable
class ReportsHealth(Protocol):
    """A store or runnable that says how it is: ``health()`` is shown in ``/healthz`` next to its state."""

    def health(self) -> Health: ...


class Store(Protocol):
    """State recovered before the controllers start: ``await recover()`` raises if it could not (it is retried).
    May define ``health() -> Health``."""

    name: str

    async def recover(self) -> None: ...


class Runnable(Protocol):
    """Long-lived work of the leader: ``await run()`` until ``await shutdown()`` makes it return (or it is
    cancelled). May define ``health() -> Health``."""

    name: str

    async def run(self) -> None: ...

    async def shutdown(self) -> None: ...


def check_store(item: Any) -> str:
    """What keeps ``item`` from being a Store ("" if nothing)."""
    return _check(item, ("recover",))


def check_runnable(item: Any) -> str:
    """What keeps ``item`` from being a Runnable ("" if nothing)."""
    return _check(item, ("run", "shutdown"))


def _check(item: Any, methods: tuple[str, ...]) -> str:
    name = getattr(item, "name", None)
    if not isinstance(name, str) or not name:
        return f"{type(item).__name__} has no 'name' string"
    for method in methods:
        if not inspect.iscoroutinefunction(getattr(item, method, None)):
            return f"{name!r}: {method} must be an 'async def' method"
    if isinstance(item, ReportsHealth) and not callable(item.health):
        return f"{name!r}: health must be a method returning Health"
    return ""


def _own_health(item: Any) -> Health | None:
    """The item's own ``health()``, or an unhealthy Health saying why it could not be had."""
    if not isinstance(item, ReportsHealth):
        return None
    try:
        value = item.health()
    except Exception as e:
        return Health(False, f"health() raised {type(e).__name__}: {e}")
    return value if isinstance(value, Health) else Health(False, f"health() returned {value!r}, not a Health")


@dataclass
class _State:
    """The sidecar's view of one store or runnable."""

    name: str
    state: str
    attempts: int = 0
    failures: int = 0
    last_error: str = ""
    since: float = 0.0

    def set(self, state: str, error: str | None = None) -> None:
        self.state, self.since = state, time.monotonic()
        if error is not None:
            self.last_error = error


def _health_items(kind: str, items: Sequence[Any], states: dict[str, _State],
                  failing: Callable[[_State], bool]) -> list[HealthItem]:
    out = []
    for item in items:
        st = states[item.name]
        own = _own_health(item)
        healthy = not failing(st) and (own is None or own.healthy)
        message = st.last_error if failing(st) else (own.message if own and not own.healthy else st.state)
        out.append(HealthItem(f"{kind} {item.name}", healthy, message))
    return out


class Stores:
    """Recovers ``stores`` together, each retried with backoff until it succeeds (attempts bounded by
    ``attempt_timeout``)."""

    def __init__(self, stores: Sequence[Store], attempt_timeout: float,
                 backoff: Callable[[], Backoff] | None = None) -> None:
        self.stores = list(stores)
        self.attempt_timeout = attempt_timeout
        self._backoff = backoff or (lambda: Backoff(initial=1.0, cap=30.0, jitter=0.5))
        self._states = {s.name: _State(s.name, "standby") for s in self.stores}

    async def recover(self) -> None:
        """Return once every store has recovered (cancelling this cancels the attempts under way)."""
        async with asyncio.TaskGroup() as group:
            for store in self.stores:
                group.create_task(self._recover(store), name=f"recover store {store.name}")

    def standby(self) -> None:
        """Mark every store as not recovered for this replica (its term ended)."""
        for st in self._states.values():
            st.set("standby")

    def health(self) -> list[HealthItem]:
        """One item per store: unhealthy while its recovery fails, or if it says so."""
        return _health_items("store", self.stores, self._states, lambda st: st.state == "backoff")

    def status(self) -> list[dict[str, Any]]:
        """Each store's state, attempts and last error."""
        return [_as_dict(self._states[s.name]) for s in self.stores]

    async def _recover(self, store: Store) -> None:
        st, backoff = self._states[store.name], self._backoff()
        log = logger.bind(store=store.name)
        while True:
            st.attempts += 1
            st.set("recovering")
            started = time.monotonic()
            try:
                async with asyncio.timeout(self.attempt_timeout) as deadline:
                    await store.recover()
            except Exception as e:
                expired = isinstance(e, TimeoutError) and deadline.expired()
                error = (f"recover() did not finish within {self.attempt_timeout:g}s" if expired else
                         _raised("recover()", e))
                delay = backoff.next()
                st.failures += 1
                st.set("backoff", error)
                log.opt(exception=None if expired else e).warning("store {}: {}; retrying in {:.1f}s",
                                                                  store.name, error, delay)
                await asyncio.sleep(delay)
                continue
            st.set("recovered", "")
            log.info("store {} recovered in {:.2f}s", store.name, time.monotonic() - started)
            return


class Runnables:
    """Runs ``runnables`` while started: each ``run()`` in a task of its own, restarted with backoff if it raises."""

    def __init__(self, runnables: Sequence[Runnable], backoff: Callable[[], Backoff] | None = None) -> None:
        self.runnables = list(runnables)
        self._backoff = backoff or (lambda: Backoff(initial=1.0, cap=60.0, jitter=0.5))
        self._states = {r.name: _State(r.name, "standby") for r in self.runnables}
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._stuck: dict[str, asyncio.Task[None]] = {}  # run() tasks that ignored stop(): never run twice at once
        self._stopping = False

    def start(self) -> None:
        """Start every ``run()``, except one whose previous ``run()`` is still stuck."""
        for runnable in self.runnables:
            stuck = self._stuck.pop(runnable.name, None)
            if stuck is not None and not stuck.done():
                self._stuck[runnable.name] = stuck
            elif runnable.name not in self._tasks:
                self._tasks[runnable.name] = asyncio.create_task(self._run(runnable), name=f"run {runnable.name}")

    async def stop(self, deadline: float) -> list[str]:
        """Call every ``shutdown()`` at once, wait for them and the ``run()`` tasks, then cancel what is left, all
        within ``deadline`` seconds (the last second or less is the cancellation's). Returns the names of the
        runnables whose ``run()`` or ``shutdown()`` is still alive (they ignored the cancellation too)."""
        grace = min(_CANCEL_GRACE, deadline / 2)
        tasks, self._tasks = self._tasks, {}
        live = [r for r in self.runnables if r.name in tasks]
        shutdowns: dict[str, asyncio.Task[None]] = {}
        self._stopping = True  # a run() that fails from now on is not restarted
        try:
            for r in live:
                if self._states[r.name].state == "backoff":
                    tasks[r.name].cancel()  # waiting to restart: there is nothing to shut down
                self._states[r.name].set("stopping")
            shutdowns = {r.name: asyncio.create_task(self._shutdown(r), name=f"shutdown {r.name}") for r in live}
            if live:
                await asyncio.wait({*shutdowns.values(), *tasks.values()}, timeout=deadline - grace)
        finally:  # also when this stop is cancelled: nothing started here is left behind unowned
            left = [t for t in (*shutdowns.values(), *tasks.values()) if not t.done()]
            for task in left:
                task.cancel()
            if left:
                await asyncio.wait(left, timeout=grace)
            self._stopping = False
        pending = {t for t in (*shutdowns.values(), *tasks.values()) if not t.done()}
        stuck = [r.name for r in live if tasks[r.name] in pending or shutdowns[r.name] in pending]
        for r in live:
            if r.name in stuck:
                self._states[r.name].set("stuck", f"did not stop within {deadline:g}s of shutdown() "
                                                  "and cancellation")
            else:
                self._states[r.name].set("standby")
        self._stuck.update((name, tasks[name]) for name in stuck)
        if stuck:
            logger.error("runnable(s) {} did not stop within {:g}s of shutdown() and cancellation",
                         ", ".join(stuck), deadline)
        return stuck

    def health(self) -> list[HealthItem]:
        """One item per runnable: unhealthy while it backs off after a failure, when stuck,
        or if it says so."""
        return _health_items("runnable", self.runnables, self._states,
                             lambda st: st.state in ("backoff", "stuck"))

    def status(self) -> list[dict[str, Any]]:
        """Each runnable's state, starts, failures and last error."""
        return [_as_dict(self._states[r.name]) for r in self.runnables]

    async def _run(self, runnable: Runnable) -> None:
        st, backoff = self._states[runnable.name], self._backoff()
        log = logger.bind(runnable=runnable.name)
        while True:
            st.attempts += 1
            st.set("running")
            try:
                await runnable.run()
            except Exception as e:
                delay = backoff.next()
                st.failures += 1
                st.set("backoff", _raised("run()", e))
                if self._stopping:
                    log.opt(exception=e).error("runnable {} failed while stopping", runnable.name)
                    return
                log.opt(exception=e).error("runnable {} failed; restarting in {:.1f}s", runnable.name, delay)
                await asyncio.sleep(delay)
                continue
            st.set("done")
            return

    async def _shutdown(self, runnable: Runnable) -> None:
        try:
            await runnable.shutdown()
        except Exception as e:
            logger.bind(runnable=runnable.name).opt(exception=e).error("runnable {} shutdown() raised {}: {}",
                                                                       runnable.name, type(e).__name__, e)


def _raised(call: str, e: BaseException) -> str:
    return f"{call} raised {type(e).__name__}: {e}" if str(e) else f"{call} raised {type(e).__name__}"


def _as_dict(st: _State) -> dict[str, Any]:
    return {"name": st.name, "state": st.state, "attempts": st.attempts, "failures": st.failures,
            "last_error": st.last_error, "for_seconds": round(time.monotonic() - st.since, 3)}
