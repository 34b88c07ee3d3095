"""Syncer: the sidecar process — connect, discover, elect a leader, run the workload, serve probes.

Order: HTTP endpoints (probes answer), the API server connection (retried; ``/readyz`` not ready meanwhile),
discovery (``/readyz`` ready, standbys too), then the workload (``wiring.py``): a process-long one on every
replica at once, a per-term one on the leader for each term, under the term's fence. A term recovers the
plugins' stores, then starts their runnables and the workload; at its end they stop together. Work still running
``stop_timeout`` after its term ended makes the process exit 1 without releasing the lease (as controller-runtime
after ``gracefulShutdownTimeout``): only a restart guarantees nothing of the old term acts beside the new leader.
Whatever ends ``run()``, the webhook configurations this process wrote are deleted first.

Warm standby (``warm_standby``): from discovery on, a replica keeps synced the informers its next term reads
(``standby_gvrs``; a ``Standby`` workload warms its members too), so a new leader lists nothing. Unlike
controller-runtime's ``EnableWarmup``, controllers are created only when the term starts (``create`` is plugin
code, which may act); their handlers replay the synced cache from memory.
"""

from __future__ import annotations

import asyncio
import asyncio.sslproto
from typing import TYPE_CHECKING, Any, Mapping

from loguru import logger
from prometheus_client import Counter, Gauge

from controllers import OPEN, Fence, ManagedController
from controllers.health import HealthItem
from informers import ApiClient, ApiError, CredentialError, DiscoveryForbidden, Supervisor
from informers.client import CONNECTION_ERRORS
from informers.errors import describe_error
from informers.wait import wait_first

from .leadership import Leadership, NoElection
from .lease import default_identity
from .plugins import Plugins
from .runnables import Runnables, Stores
from .settings import Settings
from .wiring import build_workload, local_factory, sharding_refusal, term_stop_timeout
from .workload import WARM_STANDBY, Lifetime, Process, Standby, Stuck, StuckKind

if TYPE_CHECKING:
    # Imported where their mode starts (election on, webhooks declared, the server started): a process that
    # runs none of them does not pay for them (bench/RESULTS-imports.md).
    from .webhook.service import WebhookService

__all__ = ["ControllersStuck", "StartupError", "Syncer", "sharding_refusal", "small_tls_read_buffers"]

_LEADER = Gauge("syncer_is_leader", "1 while this replica holds the lease (or election is off).")
_LEADERSHIPS = Counter("syncer_leadership_acquired_total", "Times this replica became leader.")
_CONNECT_ERRORS = (*CONNECTION_ERRORS, ApiError)
# asyncio gives every TLS connection a 256 KiB read buffer, and every watch is one connection: with hundreds of
# informers that buffer is most of their memory (335 KiB per idle informer measured, 91 KiB with 16 KiB buffers;
# bench/RESULTS-discovery.md). 16 KiB is the largest TLS record, so reads lose nothing that matters. The setting
# is process-wide, which only the process owner may decide: the sidecar does, the informers library does not.
# uvloop (the sidecar's default loop) has its own TLS protocol with a fixed buffer this cannot change: a watch
# that has carried a burst keeps about 240 KiB more there (bench/RESULTS-uvloop.md); `uvloop = false` if that matters.
TLS_READ_BUFFER = 16 * 1024


def small_tls_read_buffers() -> None:
    """Shrink asyncio's per-connection TLS read buffer for this process (see TLS_READ_BUFFER)."""
    if asyncio.sslproto.SSLProtocol.max_size > TLS_READ_BUFFER:
        asyncio.sslproto.SSLProtocol.max_size = TLS_READ_BUFFER


class StartupError(Exception):
    """The process cannot start (e.g. its HTTP address is taken); the message says which setting to fix."""


class ControllersStuck(Exception):
    """Controllers of an ended term did not stop in time: the process must exit (the message names them)."""



class Syncer:
    """One sidecar process: ``await run(stop)`` returns when ``stop`` is set and everything is shut down."""

    def __init__(self, settings: Settings, client: ApiClient, plugins: Plugins | Mapping[str, ManagedController],
                 identity: str | None = None) -> None:
        """``plugins``: as ``load_plugins`` returns them (a plain dict of controllers is taken as their only part)."""
        self.settings = settings
        self.client = client
        self.plugins = plugins = Plugins.of(plugins)
        self.identity = identity or default_identity()
        self.ready = False
        self.leadership: Leadership = NoElection()
        if settings.leader_election.enabled:
            from .leader import LeaderElector

            self.leadership = LeaderElector(client, settings.leader_election, self.identity)
        self.supervisor = Supervisor("syncer")
        self.factory = local_factory(settings, client, self.supervisor)
        self.workload = build_workload(Process(settings, client, self.identity, self.supervisor, self.factory),
                                       plugins, self._unit_stuck)
        # Declared before discovery: its first pass starts them (the workload's own declaration comes per term).
        self.warm = self.workload.standby_gvrs() if settings.leader_election.enabled and settings.warm_standby \
            else set()
        if self.warm:
            self.factory.require(WARM_STANDBY, self.warm)
        self.stores = Stores(plugins.stores, settings.start_timeout)
        self.runnables = Runnables(plugins.runnables)
        self.webhooks: WebhookService | None = None
        if plugins.webhooks or plugins.conversions:
            from .webhook.service import WebhookService

            self.webhooks = WebhookService(settings.webhooks, plugins.webhooks, client, self.identity,
                                           self.supervisor, plugins.conversions)
        from .http import StatusServer  # the HTTP endpoints, which the library parts never need

        self.http = StatusServer(settings.http_bind, self.status, self.health, self.not_ready,
                                 debug=settings.debug_endpoints)
        self._leading = False
        self._stuck: list[Stuck] = []
        self._stop = asyncio.Event()  # run()'s: a stuck unit sets it, as a stop request would
        self._log = logger.bind(identity=self.identity)

    # -- views -------------------------------------------------------------------------------------------
    @property
    def leading(self) -> bool:
        """Whether this replica holds the leadership term now (always, once started, with election off)."""
        return self._leading

    def status(self) -> dict[str, Any]:
        """The ``/status`` document."""
        work = self.workload.status()
        return {
            "identity": self.identity,
            "ready": self.ready,
            "leader": self.leading,
            "leader_election": self.settings.leader_election.enabled,
            "lease_holder": self.leadership.observed_holder,
            "warm_standby": sorted(map(str, self.warm)),
            "gvrs": [s.as_dict() for s in self.factory.status()],
            "controllers": work.controllers if work.controllers is not None else
            [{"name": n, "state": "standby" if self.ready else "starting"} for n in self.plugins.controllers],
            "clusters": work.clusters,
            "sharding": work.sharding,
            "tasks": [h.as_dict() for h in self.supervisor.health()],
            "stores": self.stores.status(),
            "runnables": self.runnables.status(),
            "webhooks": self.webhooks.status() if self.webhooks else None,
        }

    def not_ready(self) -> str | None:
        """Why ``/readyz`` fails, or None once discovery has run and the webhooks (if any) are being called."""
        if not self.ready:
            return "API discovery not done"
        if self.webhooks is not None and not self.webhooks.ready:
            return "the API server has not called the admission webhooks yet"
        return None

    def health(self) -> tuple[bool, list[HealthItem]]:
        """Liveness: unhealthy if a controller, store, runnable or the webhook server is stuck or failing, or a
        background task died or is wedged."""
        items = [HealthItem(f"task {h.name}", False, "wedged" if h.wedged else f"{h.state.value}: {h.last_error}")
                 for h in self.supervisor.problems()]
        items += self.workload.health() + self.stores.health() + self.runnables.health()
        items += self.webhooks.health() if self.webhooks else []
        return all(i.healthy for i in items), items

    # -- run ---------------------------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set; then shut down within ``shutdown_timeout``."""
        self._stop = stop
        small_tls_read_buffers()
        refused = sharding_refusal(self.settings, self.plugins)
        if refused:
            raise StartupError(refused)
        try:
            await self.http.start()
        except OSError as e:
            raise StartupError(f"setting 'http_bind': cannot listen on {self.settings.http_bind}: {e.strerror or e}")\
                from None
        self._log.info("serving /healthz /readyz /metrics /status on {}", self.settings.http_bind)
        try:
            if self.webhooks is not None:
                await self._start_webhooks()
            if await _until(stop, self._connect()):
                await _until(stop, self._discover())
                if self.ready and self.workload.lifetime is Lifetime.PROCESS:
                    await self.workload.start(OPEN)  # each of its units has a fence of its own
                if self.ready and isinstance(self.workload, Standby):
                    await _until(stop, self.workload.warm())
                if self.ready:
                    await self._lead_while(stop)
        finally:
            try:
                # With controllers of an ended term still running, every second counts: no graceful shutdown (it
                # could take shutdown_timeout while they act next to the new leader); the caller exits at once.
                if not self._stuck:
                    try:
                        async with asyncio.timeout(self.settings.shutdown_timeout):
                            await self._shutdown()
                            await self.supervisor.stop()
                    except TimeoutError:
                        self._log.error("shutdown did not finish within {:g}s", self.settings.shutdown_timeout)
                    await self.http.stop()
            finally:
                # Whatever ended the run (a stuck exit, a shutdown cut short, an error), the webhook configurations
                # this process wrote go first: the server they point at dies with the process.
                if self.webhooks is not None:
                    await self.webhooks.withdraw()
        if self._stuck:
            what = ", ".join(map(str, self._stuck))
            raise ControllersStuck(f"{what} did not stop within {self._stop_timeout():g}s at shutdown; exiting "
                                   f"without waiting for them ({self._kept_at_exit()})")
    async def _start_webhooks(self) -> None:
        from .webhook.certificates import CertificateError

        assert self.webhooks is not None
        try:
            await self.webhooks.start()
        except OSError as e:
            raise StartupError(f"setting 'webhooks.bind': cannot listen on {self.settings.webhooks.bind}: "
                               f"{e.strerror or e}") from None
        except CertificateError as e:
            raise StartupError(str(e)) from None

    async def _connect(self) -> None:
        import tenacity

        async for attempt in tenacity.AsyncRetrying(
            retry=tenacity.retry_if_exception_type(_CONNECT_ERRORS),
            wait=tenacity.wait_exponential_jitter(multiplier=0.5, max=30),
            before_sleep=lambda rs: self._log.warning(
                "API server {} not reachable (attempt {}: {}); retrying in {:.1f}s", self.client.host,
                rs.attempt_number, _reason(rs.outcome.exception() if rs.outcome else None),
                rs.next_action.sleep if rs.next_action else 0),
        ):
            with attempt:
                try:
                    version = await self.client.request("GET", "/version", timeout=10)
                except CredentialError as e:  # retrying a failing or hanging credential plugin helps nobody
                    raise StartupError(f"{e}; check the 'kubeconfig' / 'context' settings") from None
                except ApiError as e:
                    if e.status in (401, 403):
                        raise StartupError(_refused(self.client.host, e)) from None
                    raise
        self._log.info("connected to {} (Kubernetes {})", self.client.host, version.get("gitVersion", "?"))

    async def _discover(self) -> None:
        try:
            await self.factory.start()
        except DiscoveryForbidden as e:
            raise StartupError(f"{e}; check the 'kubeconfig' / 'context' / 'in_cluster' settings") from None
        except CredentialError as e:
            raise StartupError(f"{e}; check the 'kubeconfig' / 'context' settings") from None
        synced, pending = self.factory.informers()
        self.ready = True
        self._log.info("discovery done: {} informers ({} synced); ready", len(synced) + len(pending), len(synced))

    def _stop_timeout(self) -> float:
        return term_stop_timeout(self.settings)

    def _unit_stuck(self, stuck: list[Stuck]) -> None:
        """A sharded unit's work did not stop: note it and stop the process (it exits keeping that unit's Lease)."""
        self._stuck += stuck
        self._stop.set()

    async def _lead_while(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            leadership = self.leadership
            if leadership.lease is not None:
                self._log.info("waiting to become leader of lease {}", leadership.lease)
            if not await _until(stop, leadership.acquire()):
                return
            try:
                # The term's work runs beside the lease renewal: a term that ends first cancels it, recovery too.
                await wait_first(stop.wait(), leadership.hold(), self._lead(leadership.fence()))
            finally:
                _LEADER.set(0)
                stuck = await self._end_term()
                if stuck:
                    self._stuck = stuck
                    what = ", ".join(map(str, stuck))
                    if self.leadership.lease is not None:
                        message = (f"{what} did not stop within {self._stop_timeout():g}s of the end of the leadership "
                                   f"term; exiting so that no two leaders act ({self._kept_at_exit()})")
                    else:
                        message = (f"{what} did not stop within {self._stop_timeout():g}s of being stopped; exiting "
                                   f"without waiting for them ({self._kept_at_exit()})")
                    self._log.error(message)
                    raise ControllersStuck(message)

    def _kept_at_exit(self) -> str:
        """What an exit with stuck work leaves behind on purpose, and what it cleans up, for its error line."""
        kept = []
        if self.leadership.lease is not None:
            kept.append(f"the lease {self.leadership.lease} is not released")
        if any(s.unit for s in self._stuck):
            kept.append("the Leases of the stuck shard units are not released")
        if not kept:
            kept.append("leader election is off: no lease is held")
        if self.webhooks is not None and self.webhooks.configurations is not None:
            kept.append("the webhook configurations it wrote are deleted first")
        return "; ".join(kept)

    async def _lead(self, fence: Fence) -> None:
        """One term's work (seed 001's order): recover the stores, start the runnables, then the workload (if it
        runs per term); then wait to be cancelled at the end of the term."""
        await self.stores.recover()
        self.runnables.start()
        if self.workload.lifetime is Lifetime.TERM:
            await self.workload.start(fence)
        self._leading = True
        _LEADER.set(1)
        _LEADERSHIPS.inc()
        await asyncio.Future()  # never done: the term's end cancels it

    async def _end_term(self) -> list[Stuck]:
        """Stop the term's workload and runnables together; what of them is still running."""
        self._leading = False
        self.stores.standby()
        per_term = self.workload.lifetime is Lifetime.TERM
        async with asyncio.TaskGroup() as group:
            work = group.create_task(self.workload.stop()) if per_term else None
            runnables = group.create_task(self.runnables.stop(self._stop_timeout()))
        return (work.result() if work is not None else []) + \
            [Stuck(StuckKind.RUNNABLE, n) for n in runnables.result()]

    async def _shutdown(self) -> None:
        if self.workload.lifetime is Lifetime.PROCESS:  # first: every unit is handed over before anything stops
            self._stuck += [n for n in await self.workload.stop() if n not in self._stuck]
        self._stuck += await self._end_term()
        if not self._stuck:
            await self.leadership.release()
        if self.webhooks is not None:
            await self.webhooks.stop()
        if not self._stuck and isinstance(self.workload, Standby):
            await self.workload.cool()
        await self.factory.shutdown()
        await self.client.close()
        self._log.info("stopped")


def _refused(host: str, e: ApiError) -> str:
    return (f"the API server {host} refused these credentials ({e.status} {e.reason or ''}".rstrip() +
            f"): {e.message}; check the 'kubeconfig' / 'context' / 'in_cluster' settings")


def _reason(e: BaseException | None) -> str:
    if e is None:
        return "unknown"
    return describe_error(e)


async def _until(stop: asyncio.Event, work: Any) -> bool:
    """Run ``work`` until it finishes (True) or ``stop`` is set first (False, work cancelled)."""
    return await wait_first(work, stop.wait()) == 0
