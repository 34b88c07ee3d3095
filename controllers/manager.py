"""ControllerManager: starts each managed controller when all its required GVRs are synced, stops it when one
goes away, and restarts it (fresh ``create``) when they come back.

Unlike kcp's: a pass runs on every source notification (no polling) and never waits: each instance runs in its own
task, so a slow one delays no other, and none is restarted before its previous instance ended. Failing or hung
(``start_timeout``) instances are retried with backoff; their handlers are removed however they end. The source's
removal hooks stop a GVR's controllers before its informer goes, and the source is told every required GVR (kcp's
source watches everything). One ignoring its cancellation is reported ``stuck`` (``stop()`` returns it), not
forgotten.

Over 400 lines: one scheduler; each runner's state is read and written by the pass, its task and stop.
"""

from __future__ import annotations

import asyncio
import inspect
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterator, Literal, Mapping, Sequence, Union

from loguru import logger
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from informers import (
    GVR, ApiClient, Backoff, InformerSource, SharedIndexInformer, Subscription,
    Supervisor,
)
from informers.discovering_factory import NOT_SERVED_YET
from informers.discovery import NOTHING_PROVIDES
from informers.metrics import MetricSet

from .context import ControllerContext, ReconcileStats
from .read_your_writes import DEFAULT_READ_YOUR_WRITES
from .fence import OPEN, Fence
from .health import HealthItem

CONTROLLER_NAME_PREFIX = "syncer-controller-manager-"
_NOT_SERVED = "not served"

StartFunc = Callable[[ControllerContext], Awaitable[None]]
CreateFunc = Callable[[ControllerContext], Union[StartFunc, Awaitable[StartFunc]]]
ControllerState = Literal["waiting", "starting", "running", "stopping", "backoff", "stuck"]


@dataclass(frozen=True)
class ManagedController:
    """A controller to run while all of ``required_gvrs`` are synced.

    ``create(ctx)`` (sync or async) builds a fresh controller and returns its start function; ``start(ctx)`` runs
    until cancelled. ``create`` is called again for every (re)start.

    ``provided_by`` names, for a required GVR that the user installs, what serves it, in words they can act on:
    ``{WIDGETS: "the CRD in examples/crds/widget.json (kubectl apply -f examples/crds/widget.json)"}``. While
    nothing serves it, the manager's "waits for" line (at INFO: an expected step, not a mistake) and the
    controller's status say so.
    """

    required_gvrs: Sequence[GVR]
    create: CreateFunc
    provided_by: Mapping[GVR, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        stray = [str(g) for g in self.provided_by if g not in self.required_gvrs]
        if stray:
            raise ValueError(f"provided_by names GVRs the controller does not require: {', '.join(stray)}")

    def waiting_reason(self, gvr: GVR, reason: str) -> str:
        """``reason`` why ``gvr`` is not served, and then what would provide it when nothing does
        (``NOTHING_PROVIDES``, or a source that does not explain) and ``provided_by`` says."""
        provider = self.provided_by.get(gvr)
        if provider and (reason == _NOT_SERVED or reason.startswith(NOTHING_PROVIDES)):
            return f"{reason}; it would be provided by {provider}"
        return reason


@dataclass
class ControllerStatus:
    """One controller's state: ``waiting`` for its GVRs (``missing``: not served, as ``gvr (reason)``;
    ``not_synced``), ``starting`` (``create`` running), ``running``, ``stopping``, ``backoff`` (until its retry) or
    ``stuck`` (did not stop within ``stop_timeout``; not restarted until it ends).

    ``reconciles`` sums its instances' reports: a reconcile that always fails shows here, not only in a metric.
    """

    name: str
    state: ControllerState = "waiting"
    missing: list[str] = field(default_factory=list)
    not_synced: list[str] = field(default_factory=list)
    running_since: float | None = None
    restarts: int = 0
    failures: int = 0
    last_error: str = ""
    reconciles: ReconcileStats = field(default_factory=ReconcileStats)

    @property
    def healthy(self) -> bool:
        """Unhealthy while stuck or backing off after a failure."""
        return self.state not in ("stuck", "backoff")

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"name": self.name, "state": self.state, "missing": self.missing, "not_synced": self.not_synced,
                "running_since": self.running_since, "restarts": self.restarts, "failures": self.failures,
                "last_error": self.last_error, "healthy": self.healthy, "reconciles": self.reconciles.total,
                "reconcile_errors": self.reconciles.errors, "last_reconcile_error": self.reconciles.last_error,
                "last_reconcile_error_at": self.reconciles.last_error_at}


class _Metrics(MetricSet):
    """The manager families, read at scrape time from the managers between ``start()`` and ``stop()``: a
    manager's series go with it, so a fleet whose members come and go (a manager per member) keeps no series of
    the members that left. A manager made again under a name (a new term, a rotated member) counts afresh, which
    its ``_created`` samples tell Prometheus."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.managers: "weakref.WeakSet[ControllerManager]" = weakref.WeakSet()
        registry.register(self)

    def collect(self) -> Iterator[Metric]:
        running = GaugeMetricFamily("controller_manager_controllers_running", "Managed controllers running.",
                                    labels=["manager"])
        starts = CounterMetricFamily("controller_manager_starts_total", "Controller starts.",
                                     labels=["manager", "controller"])
        stops = CounterMetricFamily("controller_manager_stops_total", "Controller stops.",
                                    labels=["manager", "controller"])
        failures = CounterMetricFamily("controller_manager_failures_total", "Controller create/run failures.",
                                       labels=["manager", "controller", "reason"])
        for m in sorted(self.managers, key=lambda m: m.name):
            runners = m._runners.values()
            running.add_metric([m.name], sum(1 for r in runners if r.status.state == "running"))
            for r in runners:
                starts.add_metric([m.name, r.name], r.starts, created=m._created)
                stops.add_metric([m.name, r.name], r.stops, created=m._created)
                for reason, n in sorted(r.failures.items()):
                    failures.add_metric([m.name, r.name, reason], n, created=m._created)
        yield from (running, starts, stops, failures)


class _Runner:
    """The mutable state of one managed controller."""

    def __init__(self, name: str, spec: ManagedController, backoff: Backoff) -> None:
        self.name = name
        self.spec = spec
        self.status = ControllerStatus(name)
        self.backoff = backoff
        # The current (or last) instance: create + start. Kept after it ends, so a stuck one can be inspected.
        self.task: asyncio.Task[None] | None = None
        self.ctx: ControllerContext | None = None
        self.stopping = False
        self.retry_at = 0.0
        self.retry_timer: asyncio.TimerHandle | None = None
        self.stuck_timer: asyncio.TimerHandle | None = None
        self.starts = 0
        self.stops = 0
        self.failures: dict[str, int] = {}  # by phase (create, run)
        self.waiting_logged: dict[GVR, str] = {}  # why each missing GVR is missing, as last logged

    @property
    def alive(self) -> bool:
        """Whether the instance's task has not ended (starting, running, stopping, stuck, or failed and still
        releasing its handlers)."""
        return self.task is not None and not self.task.done()


class ControllerManager:
    """Manages (create/start/stop) GVR-dependent controllers according to an InformerSource's synced set.

    ``fence`` (the leadership term) is handed to every controller's context; ``start_timeout`` bounds an async
    ``create``; ``stop_timeout`` is how long a cancelled controller may take to end before it is ``stuck``.
    The pass loop runs under ``supervisor`` (a private one if not given): a pass that raises is logged and the
    loop restarted, and the process's ``/healthz`` can tell. ``cluster``: the member cluster it serves, if any
    (handed to every context), as are ``workers``, ``resync_period``, ``priority_queue`` and ``read_your_writes``.
    """

    def __init__(
        self, suffix: str, informer_source: InformerSource, controllers: dict[str, ManagedController], *,
        stop_timeout: float = 30.0, start_timeout: float = 60.0, backoff: Callable[[], Backoff] | None = None,
        metrics_registry: CollectorRegistry | None = None, client: ApiClient | None = None, workers: int = 1,
        resync_period: float | None = None, fence: Fence = OPEN, supervisor: Supervisor | None = None,
        cluster: str | None = None, priority_queue: bool = True, read_your_writes: float = DEFAULT_READ_YOUR_WRITES,
    ) -> None:
        self.name = CONTROLLER_NAME_PREFIX + suffix
        self.source = informer_source
        self.client = client
        self.workers = workers
        self.resync_period = resync_period
        self.priority_queue = priority_queue
        self.read_your_writes = read_your_writes
        self.stop_timeout = stop_timeout
        self.start_timeout = start_timeout
        self.fence = fence
        self.cluster = cluster
        make_backoff = backoff or (lambda: Backoff(initial=1.0, cap=60.0, jitter=0.5))
        self._runners = {name: _Runner(name, spec, make_backoff()) for name, spec in controllers.items()}
        self._metrics = _Metrics.for_registry(metrics_registry)
        self._created = time.time()  # of its counters, as Prometheus reads a restart from it
        self.supervisor = supervisor or Supervisor(self.name)
        self._loop_name = f"{self.name} passes"
        self._looping = False
        self._wake: Callable[[], None] = lambda: None
        self._unhook: Callable[[], None] | None = None
        self.passes = 0
        self._log = logger.bind(manager=self.name)

    # -- public ------------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Declare the required GVRs to the source (if it takes declarations), subscribe to it (and its removal
        hooks, if it has them) and begin passes (the first at once)."""
        if self._looping:
            return
        self.source.require(self.name, {g for r in self._runners.values() for g in r.spec.required_gvrs})
        subscription = self.source.subscribe(self.name)
        # Our own wake-ups (a retry is due, an instance ended) are ticks of the same subscription: they coalesce
        # with the source's, and one loop serves them all.
        self._wake = subscription.notify
        self._unhook = self.source.add_removal_hook(self._before_removal)
        self._looping = True
        self._metrics.managers.add(self)
        self.supervisor.spawn(self._loop_name, lambda _: self._loop(subscription))

    async def stop(self) -> list[str]:
        """End the passes, stop every controller (together, awaited up to ``stop_timeout``), unsubscribe, and
        release the GVRs declared to the source.

        Returns the names of the controllers still alive after ``stop_timeout`` (they ignored the cancellation;
        an empty list normally). Their tasks are left running, marked ``stuck``: only the caller can end them,
        by ending the process.
        """
        if self._looping:
            await self.supervisor.cancel(self._loop_name)
            self._looping = False
        self.source.unsubscribe(self.name)
        await self._stop_all(list(self._runners.values()), "manager stopping")
        if self._unhook is not None:  # only now: an informer removed meanwhile still waits for our controllers
            self._unhook()
            self._unhook = None
        for r in self._runners.values():
            if r.retry_timer is not None:
                r.retry_timer.cancel()
        self._metrics.managers.discard(self)
        self.source.release(self.name)  # last: what it lets go of stops once nothing of ours reads it
        return self.alive()

    def alive(self) -> list[str]:
        """The names of the controllers whose instance's task has not ended (running, stopping or stuck)."""
        return [r.name for r in self._runners.values() if r.alive]

    def status(self) -> dict[str, ControllerStatus]:
        """Every controller's status."""
        return {name: r.status for name, r in self._runners.items()}

    def health(self) -> list[HealthItem]:
        """One item per controller."""
        out = []
        for r in self._runners.values():
            st = r.status
            message = st.last_error if not st.healthy else ("" if st.state == "running" else st.state)
            out.append(HealthItem(st.name, st.healthy, message))
        return out

    # -- passes ------------------------------------------------------------------------------------------
    async def _loop(self, subscription: Subscription) -> None:
        async for _ in subscription:
            self._process()

    def _process(self) -> None:
        """One pass over one snapshot of the source: cancel what must stop, start what may start. It awaits
        nothing, so nothing can change under it; an instance that ends wakes the next pass."""
        self.passes += 1
        if not self.fence.valid():
            return  # the term has ended: its controllers are being stopped, none may start
        synced, not_synced = self.source.informers()
        pending = set(not_synced)
        now = time.monotonic()
        for r in self._runners.values():
            required = r.spec.required_gvrs
            missing = [g for g in required if g not in synced]
            r.waiting_logged = {g: why for g, why in r.waiting_logged.items() if g in missing}
            r.status.missing = [self._why_missing(r, g) for g in missing if g not in pending]
            r.status.not_synced = [str(g) for g in missing if g in pending]
            if missing:
                self._cancel(r, f"required GVRs unavailable: {', '.join(map(str, missing))}")
                if not r.alive:
                    r.status.state = "waiting"
            elif r.alive:
                if r.ctx is not None and any(synced[g] is not r.ctx.informers[g] for g in required):
                    # A GVR was removed and re-added between two passes: its informer is a new one.
                    self._cancel(r, "a required GVR's informer was replaced")
            elif now < r.retry_at:
                r.status.state = "backoff"
            else:
                self._start(r, {g: synced[g] for g in required})

    def _why_missing(self, r: _Runner, gvr: GVR) -> str:
        """``gvr`` with the source's reason for not serving it (``pods.v1 (excluded: ...)``), logged once per
        reason: a controller that waits because of the configuration must say so, not wait silently."""
        why = self.source.explain(gvr) or _NOT_SERVED
        reason = r.spec.waiting_reason(gvr, why)
        if r.waiting_logged.get(gvr) != reason:
            r.waiting_logged[gvr] = reason
            # Waiting for an API that is being installed is the normal case, and so is waiting for one the plugin
            # says the user installs (the line says how): a first run before the user has applied its CRD. One
            # that nothing provides otherwise (a typo) or that the configuration keeps out (a filter,
            # permissions) is one to point at.
            self._log.log("INFO" if why in (_NOT_SERVED, NOT_SERVED_YET) or reason != why else "WARNING",
                          "controller {} waits for {}: {}", r.name, gvr, reason)
        return f"{gvr} ({reason})"

    async def _before_removal(self, gvr: GVR) -> None:
        """The source's removal hook: stop every controller requiring ``gvr`` (together, awaited up to
        ``stop_timeout``) while its informer's cache is still whole. The source no longer lists ``gvr`` by
        then, so the passes this wakes start nothing on it."""
        await self._stop_all([r for r in self._runners.values() if gvr in r.spec.required_gvrs],
                             f"{gvr} is being removed")

    # -- one controller ----------------------------------------------------------------------------------
    def _start(self, r: _Runner, informers: dict[GVR, SharedIndexInformer]) -> None:
        ctx = ControllerContext(r.name, informers, self.source, self.client, self.workers, self.resync_period,
                                fence=self.fence, reconcile_stats=r.status.reconciles, cluster=self.cluster,
                                priority_queue=self.priority_queue, read_your_writes=self.read_your_writes)
        r.ctx = ctx
        r.stopping = False
        r.status.state = "starting"
        task = r.task = asyncio.create_task(self._run(r, ctx), name=f"controller {r.name}")
        task.add_done_callback(lambda _: self._ended(r, task))

    async def _run(self, r: _Runner, ctx: ControllerContext) -> None:
        """One instance. A failure is recorded (with its backoff) before the handlers are released: the task is
        alive until then, so no pass can start the next instance early."""
        phase = "create"
        try:
            try:
                start = await self._create(r.spec, ctx)
                phase = "run"
                self._running(r)
                await start(ctx)
            except Exception as e:
                error: Exception = e
            else:
                error = RuntimeError("start returned while its GVRs are still available")
            if not r.stopping:  # returning or failing once cancelled is how a controller may end
                self._failed(r, phase, error)
        finally:
            await ctx.release()
            if phase == "run":
                r.stops += 1

    async def _create(self, spec: ManagedController, ctx: ControllerContext) -> StartFunc:
        made = spec.create(ctx)
        if inspect.isawaitable(made):
            deadline = asyncio.timeout(self.start_timeout)
            try:
                async with deadline:
                    start = await made
            except TimeoutError:
                if not deadline.expired():
                    raise  # create's own TimeoutError
                raise TimeoutError(f"create() did not return within {self.start_timeout:g}s") from None
        else:
            start = made
        if not callable(start):
            raise TypeError(f"create() returned {type(start).__name__}, not a start function")
        return start

    def _running(self, r: _Runner) -> None:
        r.status.state = "running"
        r.status.running_since = time.time()
        if r.starts:
            r.status.restarts += 1
        r.starts += 1
        self._log.info("started controller {}", r.name)

    def _failed(self, r: _Runner, phase: str, error: Exception) -> None:
        delay = r.backoff.next()
        r.retry_at = time.monotonic() + delay
        r.status.state = "backoff"
        r.status.running_since = None
        r.status.failures += 1
        r.status.last_error = f"{phase}: {type(error).__name__}: {error}"
        r.failures[phase] = r.failures.get(phase, 0) + 1
        self._log.opt(exception=error if phase == "run" else None).warning(
            "controller {} failed in {} ({}); retrying in {:.1f}s", r.name, phase, error, delay)
        if r.retry_timer is not None:
            r.retry_timer.cancel()
        r.retry_timer = asyncio.get_running_loop().call_later(delay, self._wake)

    def _cancel(self, r: _Runner, why: str) -> None:
        task = r.task
        if task is None or task.done() or r.stopping:
            return  # cancel once: a second cancel would interrupt the controller's own clean-up
        self._log.info("stopping controller {} ({})", r.name, why)
        r.stopping = True
        r.status.state = "stopping"
        r.status.running_since = None
        task.cancel()
        r.stuck_timer = asyncio.get_running_loop().call_later(self.stop_timeout, self._stuck, r, task)

    async def _stop_all(self, runners: list[_Runner], why: str) -> None:
        """Cancel the instances of ``runners`` and wait, together, up to ``stop_timeout`` for them to end."""
        for r in runners:
            self._cancel(r, why)
        tasks = [r.task for r in runners if r.task is not None and not r.task.done()]
        if tasks:
            await asyncio.wait(tasks, timeout=self.stop_timeout)
        for r in runners:
            if r.task is not None:
                self._stuck(r, r.task)

    def _stuck(self, r: _Runner, task: asyncio.Task[None]) -> None:
        if r.task is not task or task.done() or r.status.state == "stuck":
            return
        r.status.state = "stuck"
        r.status.last_error = f"did not stop within {self.stop_timeout:g}s"
        self._log.error("controller {} did not stop within {:g}s; it will not be restarted until it does",
                        r.name, self.stop_timeout)

    def _ended(self, r: _Runner, task: asyncio.Task[None]) -> None:
        if r.task is task:
            if r.stuck_timer is not None:
                r.stuck_timer.cancel()
                r.stuck_timer = None
            if r.stopping:
                r.stopping = False
                r.status.state = "waiting"
        self._wake()
