"""ControllerManager: starts each managed controller when all its required GVRs are synced, stops it when one
goes away, and restarts it (fresh ``create``) when they come back.

Unlike kcp's original: a pass runs at startup and on every source notification (including "an informer
became synced", so no polling); a stop is awaited, so a restarted controller never overlaps its predecessor;
a failing ``create`` or a controller that returns or crashes on its own is retried with exponential backoff;
handlers a controller registered through its context are removed when it stops.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Sequence, Union

from loguru import logger
from prometheus_client import CollectorRegistry, Counter, Gauge

from informers import GVR, ApiClient, Backoff, InformerSource

from informers.metrics import MetricSet

from .context import ControllerContext

CONTROLLER_NAME_PREFIX = "syncer-controller-manager-"

StartFunc = Callable[[ControllerContext], Awaitable[None]]
CreateFunc = Callable[[ControllerContext], Union[StartFunc, Awaitable[StartFunc]]]


@dataclass(frozen=True)
class ManagedController:
    """A controller to run while all of ``required_gvrs`` are synced.

    ``create(ctx)`` (sync or async) builds a fresh controller and returns its start function; ``start(ctx)`` runs
    until cancelled. ``create`` is called again for every (re)start.
    """

    required_gvrs: Sequence[GVR]
    create: CreateFunc


@dataclass
class ControllerStatus:
    """One controller's state: ``waiting`` (for GVRs), ``running``, ``backoff`` (after a failure) or ``stuck``
    (did not stop within the timeout; it is not restarted until it does)."""

    name: str
    state: str = "waiting"
    missing: list[str] = field(default_factory=list)
    not_synced: list[str] = field(default_factory=list)
    running_since: float | None = None
    restarts: int = 0
    failures: int = 0
    last_error: str = ""

    @property
    def healthy(self) -> bool:
        """Unhealthy while stuck or backing off after a failure."""
        return self.state not in ("stuck", "backoff")

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"name": self.name, "state": self.state, "missing": self.missing, "not_synced": self.not_synced,
                "running_since": self.running_since, "restarts": self.restarts, "failures": self.failures,
                "last_error": self.last_error, "healthy": self.healthy}


class _Metrics(MetricSet):
    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.running = Gauge("controller_manager_controllers_running", "Managed controllers running.",
                             ["manager"], registry=registry)
        self.starts = Counter("controller_manager_starts_total", "Controller starts.", ["manager", "controller"],
                              registry=registry)
        self.stops = Counter("controller_manager_stops_total", "Controller stops.", ["manager", "controller"],
                             registry=registry)
        self.failures = Counter("controller_manager_failures_total", "Controller create/run failures.",
                                ["manager", "controller", "reason"], registry=registry)



class _Runner:
    """The mutable state of one managed controller."""

    def __init__(self, name: str, spec: ManagedController, backoff: Backoff) -> None:
        self.name = name
        self.spec = spec
        self.status = ControllerStatus(name)
        self.backoff = backoff
        self.task: asyncio.Task[None] | None = None
        self.ctx: ControllerContext | None = None
        self.retry_at = 0.0
        self.timer: asyncio.TimerHandle | None = None
        self.starts = 0
        self.stopping = False


class ControllerManager:
    """Manages (create/start/stop) GVR-dependent controllers according to an InformerSource's synced set."""

    def __init__(
        self, suffix: str, informer_source: InformerSource, controllers: dict[str, ManagedController], *,
        stop_timeout: float = 30.0, backoff: Callable[[], Backoff] | None = None,
        metrics_registry: CollectorRegistry | None = None, client: ApiClient | None = None, workers: int = 1,
        resync_period: float | None = None,
    ) -> None:
        self.name = CONTROLLER_NAME_PREFIX + suffix
        self.source = informer_source
        self.client = client
        self.workers = workers
        self.resync_period = resync_period
        self.stop_timeout = stop_timeout
        make_backoff = backoff or (lambda: Backoff(initial=1.0, cap=60.0, jitter=0.5))
        self._runners = {name: _Runner(name, spec, make_backoff()) for name, spec in controllers.items()}
        self._m = _Metrics.for_registry(metrics_registry)
        self._m.running.labels(self.name).set_function(
            lambda: sum(1 for r in self._runners.values() if r.status.state == "running"))
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self.passes = 0
        self._log = logger.bind(manager=self.name)

    # -- public ------------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Subscribe to the source and begin passes (the first one at once)."""
        if self._tasks:
            return
        subscription = self.source.subscribe(self.name)

        async def forward() -> None:
            async for _ in subscription:
                self._wake.set()

        self._tasks = [asyncio.create_task(forward(), name=f"{self.name} notifications"),
                       asyncio.create_task(self._loop(), name=f"{self.name} passes")]

    async def stop(self) -> None:
        """Stop every controller (awaited), unsubscribe and end the pass loop."""
        self.source.unsubscribe(self.name)
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        await asyncio.gather(*(self._stop(r, "manager stopping") for r in self._runners.values()))
        for r in self._runners.values():
            if r.timer is not None:
                r.timer.cancel()
        try:
            self._m.running.remove(self.name)
        except KeyError:
            pass

    def status(self) -> dict[str, ControllerStatus]:
        """Every controller's status."""
        return {name: r.status for name, r in self._runners.items()}

    def health(self) -> list[dict[str, Any]]:
        """``{name, healthy, message}`` per controller (seed 001's HealthStatus)."""
        out = []
        for r in self._runners.values():
            st = r.status
            message = st.last_error if not st.healthy else ("" if st.state == "running" else st.state)
            out.append({"name": st.name, "healthy": st.healthy, "message": message})
        return out

    # -- passes ------------------------------------------------------------------------------------------
    async def _loop(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            await self._process()

    async def _process(self) -> None:
        """One pass: one snapshot of the source; stop what must stop, then start what may start."""
        self.passes += 1
        synced, not_synced = self.source.informers()
        pending = set(not_synced)
        to_start = []
        for r in self._runners.values():
            required = r.spec.required_gvrs
            missing = [g for g in required if g not in synced]
            r.status.missing = [str(g) for g in missing if g not in pending]
            r.status.not_synced = [str(g) for g in missing if g in pending]
            if missing:
                if r.task is not None:
                    await self._stop(r, f"required GVRs unavailable: {', '.join(map(str, missing))}")
                if r.status.state not in ("stuck",):
                    r.status.state = "waiting"
                continue
            if r.task is not None and r.ctx is not None and any(synced[g] is not r.ctx.informers[g]
                                                                 for g in required):
                # A GVR was removed and re-added between two passes: its informer is a new one.
                await self._stop(r, "a required GVR's informer was replaced")
            if r.task is None:
                to_start.append(r)
        now = time.monotonic()
        for r in to_start:
            if r.status.state == "stuck":
                continue
            if now < r.retry_at:
                r.status.state = "backoff"
                continue
            await self._start(r, {g: synced[g] for g in r.spec.required_gvrs})

    async def _start(self, r: _Runner, informers: dict[GVR, Any]) -> None:
        ctx = ControllerContext(r.name, informers, self.source, self.client, self.workers, self.resync_period)
        try:
            start = r.spec.create(ctx)
            if inspect.isawaitable(start):
                start = await start
            if not callable(start):
                raise TypeError(f"create() returned {type(start).__name__}, not a start function")
        except Exception as e:
            await ctx.release()
            self._failed(r, "create", e)
            return
        r.ctx = ctx
        r.status.state = "running"
        r.status.running_since = time.time()
        if r.starts:
            r.status.restarts += 1
        r.starts += 1
        r.stopping = False
        self._m.starts.labels(self.name, r.name).inc()
        self._log.info("started controller {}", r.name)
        r.task = asyncio.create_task(self._run(r, start, ctx), name=f"controller {r.name}")

    async def _run(self, r: _Runner, start: StartFunc, ctx: ControllerContext) -> None:
        try:
            await start(ctx)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            error: Exception = e
        else:
            error = RuntimeError("start returned while its GVRs are still available")
        if r.stopping:
            return  # it was being stopped and returned instead of raising CancelledError: not a failure
        # Exited on its own: clean up and schedule a fresh create.
        r.task = None
        r.ctx = None
        await ctx.release()
        self._m.stops.labels(self.name, r.name).inc()
        self._failed(r, "run", error)

    def _failed(self, r: _Runner, phase: str, error: Exception) -> None:
        delay = r.backoff.next()
        r.retry_at = time.monotonic() + delay
        r.status.state = "backoff"
        r.status.running_since = None
        r.status.failures += 1
        r.status.last_error = f"{phase}: {type(error).__name__}: {error}"
        self._m.failures.labels(self.name, r.name, phase).inc()
        self._log.opt(exception=error if phase == "run" else None).warning(
            "controller {} failed in {} ({}); retrying in {:.1f}s", r.name, phase, error, delay)
        if r.timer is not None:
            r.timer.cancel()
        r.timer = asyncio.get_running_loop().call_later(delay, self._wake.set)

    async def _stop(self, r: _Runner, why: str) -> None:
        task, ctx = r.task, r.ctx
        if task is None:
            return
        if not r.stopping:
            # Cancel once: a second cancel would interrupt the controller's own clean-up.
            self._log.info("stopping controller {} ({})", r.name, why)
            r.stopping = True
            task.cancel()
        done, _ = await asyncio.wait({task}, timeout=self.stop_timeout)
        if not done:
            r.status.state = "stuck"
            r.status.last_error = f"did not stop within {self.stop_timeout:g}s"
            self._log.error("controller {} did not stop within {:g}s; it will not be restarted until it does",
                            r.name, self.stop_timeout)
            task.add_done_callback(lambda _: self._unstuck(r))
        else:
            r.status.state = "waiting"
        r.task = None
        r.ctx = None
        r.status.running_since = None
        if ctx is not None:
            await ctx.release()
        self._m.stops.labels(self.name, r.name).inc()

    def _unstuck(self, r: _Runner) -> None:
        if r.status.state == "stuck":
            r.status.state = "waiting"
            self._wake.set()
