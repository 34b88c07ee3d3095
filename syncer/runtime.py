"""Syncer: the sidecar process — connect, discover, elect a leader, run the managed controllers, serve probes.

Order: HTTP endpoints first (so probes answer), then the API server connection (retried with backoff while
``/readyz`` says not ready), then discovery (``/readyz`` turns ready, on standby replicas too), then, on the
leader only, the ControllerManager. A stop request (SIGTERM/SIGINT) stops controllers, releases the lease and
shuts informers down.

Each leadership term is a fence (see ``leader.py``): controllers get it in their context, check it before every
work item and write through a client that refuses writes once it is closed. When the term ends, the controllers
are stopped, and the replica rejoins the election only once every one of them has stopped. A controller still
running ``stop_timeout`` later (it swallowed the cancellation) makes the process exit with code 1 and a line
naming it, without releasing the lease, as controller-runtime does after ``gracefulShutdownTimeout``: a restart
is the only way to be sure nothing of the old term acts next to the new leader. (With election off there is no
lease; the line says so.) Whatever ends ``run()``, that exit included, the webhook configurations this process
wrote are deleted first (within 5 s): they point at a server that dies with the process. Background tasks run under a
Supervisor; ``/healthz`` fails naming any that died or is wedged.

A leadership term runs in seed 001's order: the plugins' stores recover (each retried with backoff until it
does, see ``runnables.py``), then their runnables and the controllers start; a term that ends first cancels the
recovery. At the end of a term, controllers and runnables stop together, within the same bound. The admission
webhook server (``webhook/``) runs on every replica from the start, leader or not, and ``/readyz`` waits for it.

With ``[clusters] enabled`` a term runs, instead of the one ControllerManager, a ``ClusterRegistry`` of the member
clusters (from kubeconfig Secrets), a ControllerManager per member for the plugins' controllers, and the plugins'
fleet controllers over all members (``controllers/cluster_registry.py``, ``fleet.py``). They live for the term only:
standbys watch no member cluster, so a new leader connects to every member before its controllers start there. A
member that is down shows in ``/status`` but does not fail ``/healthz``: restarting this process would not help it.

With ``[sharding] enabled`` the controllers (or, in multi-cluster mode, the member clusters) are instead spread
over every replica, each unit under its own Lease (``shards.py``); the coordinator joins once discovery is done, on
every replica, and a stop request hands every unit over before anything else stops. Leader election, if on, still
decides where the singleton work (stores, runnables) runs. Fleet controllers and components need every cluster in
one process, so they are refused in this mode.
"""

from __future__ import annotations

import asyncio
import asyncio.sslproto
from functools import partial
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from loguru import logger
from prometheus_client import Counter, Gauge

from controllers import OPEN, ControllerManager, Fence, ManagedController
from controllers.cluster import display_name, qualified
from controllers.cluster_controllers import ClusterControllers
from controllers.cluster_registry import ClusterRegistry, RegistryOptions
from controllers.fence import fenced
from controllers.fleet import FleetLoop, FleetScope
from informers import (
    GVR, ApiClient, ApiError, CredentialError, DiscoveringDynamicSharedInformerFactory, DiscoveryForbidden,
    ResourceFilter, Supervisor, TaskHandle,
)
from informers.client import CONNECTION_ERRORS
from informers.errors import describe_error
from informers.wait import wait_first

from .lease import default_identity
from .plugins import Plugins
from .runnables import Runnables, Stores
from .settings import Settings

if TYPE_CHECKING:
    # Imported where their mode starts (election on, webhooks declared, sharding on, the server started): a
    # process that runs none of them does not pay for them (bench/RESULTS-imports.md).
    from .leader import LeaderElector
    from .shard_units import ClusterUnits, ControllerUnits
    from .shards import ShardCoordinator
    from .webhook.service import WebhookService

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

    def __init__(self, settings: Settings, client: ApiClient, controllers: dict[str, ManagedController],
                 identity: str | None = None) -> None:
        """``controllers``: as ``load_plugins`` returns them, a ``Plugins`` with webhooks, stores and runnables too."""
        self.settings = settings
        self.client = client
        self.controllers = controllers
        plugins = controllers if isinstance(controllers, Plugins) else Plugins(controllers)
        self.identity = identity or default_identity()
        self.ready = False
        self.factory: DiscoveringDynamicSharedInformerFactory | None = None
        self.manager: ControllerManager | None = None
        self.elector: LeaderElector | None = None
        if settings.leader_election.enabled:
            from .leader import LeaderElector

            self.elector = LeaderElector(client, settings.leader_election, self.identity)
        self.supervisor = Supervisor("syncer")
        self.stores = Stores(plugins.stores, settings.start_timeout)
        self.runnables = Runnables(plugins.runnables)
        self.webhooks: WebhookService | None = None
        if plugins.webhooks or plugins.conversions:
            from .webhook.service import WebhookService

            self.webhooks = WebhookService(settings.webhooks, plugins.webhooks, client, self.identity,
                                           self.supervisor, plugins.conversions)
        self.fleet = plugins.fleet
        self.components = plugins.components
        self.registry: ClusterRegistry | None = None
        self.cluster_controllers: ClusterControllers | None = None
        self.fleet_loops: list[FleetLoop] = []
        fleet_level = sorted([*self.fleet, *(c.name for c in self.components)])
        if fleet_level and not settings.clusters.enabled:
            logger.warning("fleet controller(s) {} run only in multi-cluster mode; set [clusters] enabled = true",
                           ", ".join(fleet_level))
        self.shards: ShardCoordinator | None = None
        self.unit_controllers: ControllerUnits | None = None
        from .http import StatusServer  # aiohttp's server, which the library parts never need

        self.http = StatusServer(settings.http_bind, self.status, self.health, self.not_ready,
                                 debug=settings.debug_endpoints)
        self._leading = False
        self._stuck: list[str] = []
        self._log = logger.bind(identity=self.identity)

    # -- views -------------------------------------------------------------------------------------------
    @property
    def leading(self) -> bool:
        """Whether this replica holds the leadership term now (always, once started, with election off)."""
        return self._leading

    def status(self) -> dict[str, Any]:
        """The ``/status`` document."""
        manager = self.manager
        return {
            "identity": self.identity,
            "ready": self.ready,
            "leader": self.leading,
            "leader_election": self.settings.leader_election.enabled,
            "lease_holder": self.elector.observed_holder if self.elector else None,
            "gvrs": [s.as_dict() for s in self.factory.status()] if self.factory else [],
            "controllers": self._controllers_status(),
            "clusters": self._clusters_status(),
            "sharding": self.shards.status() if self.shards is not None else None,
            "tasks": [h.as_dict() for h in self.supervisor.health()],
            "stores": self.stores.status(),
            "runnables": self.runnables.status(),
            "webhooks": self.webhooks.status() if self.webhooks else None,
        }

    def _controllers_status(self) -> list[dict[str, Any]]:
        if self.manager is not None:
            return [s.as_dict() for s in self.manager.status().values()]
        if self.unit_controllers is not None:
            return self.unit_controllers.status()
        if self.cluster_controllers is not None:  # one row per controller per cluster
            return [{**c, "name": qualified(c["name"], cluster)}
                    for cluster, rows in self.cluster_controllers.status().items() for c in rows]
        return [{"name": n, "state": "standby" if self.ready else "starting"} for n in self.controllers]

    def _clusters_status(self) -> dict[str, Any] | None:
        """Multi-cluster mode: the members with their conditions, conflicts and the fleet controllers."""
        if not self.settings.clusters.enabled:
            return None
        doc = self.registry.status() if self.registry is not None else {"clusters": [], "conflicts": []}
        doc["fleet_controllers"] = [loop.status() for loop in self.fleet_loops]
        doc["fleet_components"] = [_component_status(c) for c in self.components] if self.registry is not None else []
        return doc

    def not_ready(self) -> str | None:
        """Why ``/readyz`` fails, or None once discovery has run and the webhooks (if any) are being called."""
        if not self.ready:
            return "API discovery not done"
        if self.webhooks is not None and not self.webhooks.ready:
            return "the API server has not called the admission webhooks yet"
        return None

    def health(self) -> tuple[bool, list[dict[str, Any]]]:
        """Liveness: unhealthy if a controller, store, runnable or the webhook server is stuck or failing, or a
        background task died or is wedged."""
        items = [{"name": f"task {h.name}", "healthy": False,
                  "message": "wedged" if h.wedged else f"{h.state.value}: {h.last_error}"}
                 for h in self.supervisor.problems()]
        if self.manager is not None:
            items += self.manager.health()
        if self.cluster_controllers is not None:
            items += self.cluster_controllers.health()
        if self.unit_controllers is not None:
            items += self.unit_controllers.health()
        if self.shards is not None:
            items += [h.as_dict() for h in self.shards.health()]
        items += self.stores.health() + self.runnables.health() + (self.webhooks.health() if self.webhooks else [])
        return all(i["healthy"] for i in items), items

    # -- run ---------------------------------------------------------------------------------------------
    async def run(self, stop: asyncio.Event) -> None:
        """Run until ``stop`` is set; then shut down within ``shutdown_timeout``."""
        small_tls_read_buffers()
        refused = sharding_refusal(self.settings, self.controllers)
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
                if self.ready and self.settings.sharding.enabled:
                    await self._start_shards(stop)
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
            raise ControllersStuck(f"{', '.join(self._stuck)} did not stop within {self._stop_timeout():g}s at "
                                   f"shutdown; exiting without waiting for them ({self._kept_at_exit()})")

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
        s = self.settings
        self.factory = discovering_factory(s, self.client, supervisor=self.supervisor,
                                           watch=s.clusters.watch if s.clusters.enabled else s.watch)
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
        """How long the controllers of an ended term may take to stop: with election, no longer than the margin
        before a standby may take the lease (``lease_duration - renew_deadline``)."""
        timeout = self.settings.shutdown_timeout / 2
        if self.elector is not None:
            le = self.settings.leader_election
            timeout = min(timeout, le.lease_duration - le.renew_deadline)
        return timeout

    async def _lead_while(self, stop: asyncio.Event) -> None:
        assert self.factory is not None
        while not stop.is_set():
            fence: Fence = OPEN
            if self.elector is not None:
                self._log.info("waiting to become leader of lease {}/{}", self.settings.leader_election.lease_namespace,
                               self.settings.leader_election.lease_name)
                if not await _until(stop, self.elector.acquire()):
                    return
                fence = self.elector.fence()
            try:
                # The term's work runs beside the lease renewal: a term that ends first cancels it, recovery too.
                holding = [self.elector.hold()] if self.elector is not None else []
                await wait_first(stop.wait(), *holding, self._lead(fence))
            finally:
                _LEADER.set(0)
                stuck = await self._end_term()
                if stuck:
                    self._stuck = stuck
                    if self.elector is not None:
                        message = (f"{', '.join(stuck)} did not stop within {self._stop_timeout():g}s of the end of "
                                   f"the leadership term; exiting so that no two leaders act ({self._kept_at_exit()})")
                    else:
                        message = (f"{', '.join(stuck)} did not stop within {self._stop_timeout():g}s of being "
                                   f"stopped; exiting without waiting for them ({self._kept_at_exit()})")
                    self._log.error(message)
                    raise ControllersStuck(message)

    def _kept_at_exit(self) -> str:
        """What an exit with stuck work leaves behind on purpose, and what it cleans up, for its error line."""
        kept = []
        if self.elector is not None:
            le = self.settings.leader_election
            kept.append(f"the lease {le.lease_namespace}/{le.lease_name} is not released")
        if any(name.startswith("unit ") for name in self._stuck):
            kept.append("the Leases of the stuck shard units are not released")
        if not kept:
            kept.append("leader election is off: no lease is held")
        if self.webhooks is not None and self.webhooks.configurations is not None:
            kept.append("the webhook configurations it wrote are deleted first")
        return "; ".join(kept)

    async def _lead(self, fence: Fence) -> None:
        """One term's work (seed 001's order): recover the stores, start the runnables, then the controllers;
        then wait to be cancelled at the end of the term."""
        assert self.factory is not None
        await self.stores.recover()
        self.runnables.start()
        if self.settings.sharding.enabled:
            pass  # the shard coordinator runs the controllers
        elif self.settings.clusters.enabled:
            await self._lead_fleet(fence)
        else:
            manager = ControllerManager(
                self.identity, self.factory, self.controllers, client=self.client, workers=self.settings.workers,
                resync_period=self.settings.resync or None, stop_timeout=self._stop_timeout(), fence=fence,
                start_timeout=self.settings.start_timeout, supervisor=self.supervisor)
            await manager.start()
            self.manager = manager
        self._leading = True
        _LEADER.set(1)
        _LEADERSHIPS.inc()
        await asyncio.Future()  # never done: the term's end cancels it

    async def _lead_fleet(self, fence: Fence) -> None:
        """Multi-cluster mode: the cluster registry, the per-cluster controllers and the fleet controllers, for
        this term (a standby watches no member cluster)."""
        assert self.factory is not None
        required = {g for spec in self.controllers.values() for g in spec.required_gvrs}
        required |= {spec.gvr for spec in self.fleet.values()}
        registry = self.registry = ClusterRegistry(
            self.client, registry_options(self.settings), required=required,
            make_factory=partial(member_factory, self.settings),
            local_factory=self.factory, fence=fence, supervisor=self.supervisor)
        self.cluster_controllers = ClusterControllers(
            self.controllers, name=self.identity, fence=fence, workers=self.settings.workers,
            resync_period=self.settings.resync or None, stop_timeout=self._stop_timeout(),
            start_timeout=self.settings.start_timeout, supervisor=self.supervisor)
        await registry.register_cluster_handler(self.cluster_controllers)
        self.fleet_loops = [FleetLoop(name, spec, registry.clients, management=self.client, fence=fence)
                            for name, spec in sorted(self.fleet.items())]
        for loop in self.fleet_loops:
            await registry.register_cluster_handler(loop)
            self.supervisor.spawn(f"fleet controller {loop.name}", _runner(loop.run))
        scope = FleetScope(registry, fenced(self.client, fence), self.factory, fence)
        for component in self.components:
            self.supervisor.spawn(f"fleet component {component.name}", _runner(partial(component.run, scope)))
        await registry.start()

    async def _start_shards(self, stop: asyncio.Event) -> None:
        """Join the shard group: from now on this replica runs the units (controllers, or member clusters with
        theirs) the group assigns it, each under its own Lease."""
        from .shard_units import ClusterUnits, ControllerUnits
        from .shards import ShardCoordinator

        assert self.factory is not None
        s = self.settings
        units: ClusterUnits | ControllerUnits
        if s.sharding.unit_kind(s.clusters.enabled) == "clusters":
            self.registry = ClusterRegistry(
                self.client, registry_options(s),
                required={g for spec in self.controllers.values() for g in spec.required_gvrs},
                make_factory=partial(member_factory, s), local_factory=self.factory, supervisor=self.supervisor,
                gate=lambda name: self.shards.fence_for(name) if self.shards is not None else None)
            self.cluster_controllers = ClusterControllers(
                self.controllers, name=self.identity, workers=s.workers, resync_period=s.resync or None,
                stop_timeout=self._shard_stop_timeout(), start_timeout=s.start_timeout, supervisor=self.supervisor)
            await self.registry.register_cluster_handler(self.cluster_controllers)
            units = ClusterUnits(self.registry, self.cluster_controllers)
        else:
            units = self.unit_controllers = ControllerUnits(sorted(self.controllers), self._unit_manager)

        def stuck(names: list[str]) -> None:
            self._stuck += names
            stop.set()

        self.shards = ShardCoordinator(self.client, s.sharding, self.identity, units, supervisor=self.supervisor,
                                       on_stuck=stuck, stop_timeout=s.shutdown_timeout / 2)
        await self.shards.start()
        if self.registry is not None:
            await self.registry.start()

    def _unit_manager(self, name: str, fence: Fence) -> ControllerManager:
        s = self.settings
        return ControllerManager(
            f"{self.identity}/{name}", self.factory, {name: self.controllers[name]},  # type: ignore[arg-type]
            client=self.client, workers=s.workers, resync_period=s.resync or None,
            stop_timeout=self._shard_stop_timeout(), fence=fence, start_timeout=s.start_timeout,
            supervisor=self.supervisor)

    def _shard_stop_timeout(self) -> float:
        """How long a unit's controllers may take to stop: within the margin before another replica may take
        its Lease."""
        sh = self.settings.sharding
        return min(self.settings.shutdown_timeout / 2, sh.lease_duration - sh.renew_deadline)

    async def _stop_shards(self) -> None:
        """Hand every unit over, then stop the registry of member clusters (sharded multi-cluster mode)."""
        shards = self.shards
        if shards is not None:
            await shards.stop()  # /status shows the handovers meanwhile
            self.shards = None
            self._stuck += [n for n in shards.stuck if n not in self._stuck]
        if self.registry is not None and not self._stuck:
            registry, self.registry = self.registry, None
            await registry.stop()
            if self.cluster_controllers is not None:
                self._stuck += [f"controller {n}" for n in await self.cluster_controllers.stop()]
                self.cluster_controllers = None

    async def _end_term(self) -> list[str]:
        """Stop the term's controllers and runnables together; the names of those still running."""
        self._leading = False
        manager, self.manager = self.manager, None
        self.stores.standby()
        async with asyncio.TaskGroup() as group:
            controllers = group.create_task(manager.stop()) if manager is not None else None
            fleet = group.create_task(self._end_fleet())
            runnables = group.create_task(self.runnables.stop(self._stop_timeout()))
        return ([f"controller {n}" for n in (controllers.result() if controllers else [])] + fleet.result() +
                [f"runnable {n}" for n in runnables.result()])

    async def _end_fleet(self) -> list[str]:
        """Stop the fleet controllers and every cluster's controllers, then the registry; the stuck names."""
        if self.settings.sharding.enabled:
            return []  # the registry and the clusters' controllers are the shard coordinator's
        loops, self.fleet_loops = self.fleet_loops, []
        registry, self.registry = self.registry, None
        per_cluster, self.cluster_controllers = self.cluster_controllers, None
        stuck: list[str] = []
        if per_cluster is not None:
            # Together, within one bound: the fleet loops and every cluster's controllers share the lease margin.
            timeout = self._stop_timeout()
            tasks = [f"fleet controller {loop.name}" for loop in loops] + \
                [f"fleet component {c.name}" for c in self.components]
            ended, stuck = await asyncio.gather(
                asyncio.gather(*(self.supervisor.cancel(task, timeout) for task in tasks)), per_cluster.stop())
            stuck = [task for task, done in zip(tasks, ended) if not done] + [f"controller {n}" for n in stuck]
        if registry is not None and not stuck:
            await registry.stop()
            if per_cluster is not None:  # what the members' cleanups stopped meanwhile, and did not stop
                stuck = [f"controller {n}" for n in await per_cluster.stop()]
        return stuck

    async def _shutdown(self) -> None:
        await self._stop_shards()
        self._stuck += await self._end_term()
        if self.elector is not None and not self._stuck:
            await self.elector.release()
        if self.webhooks is not None:
            await self.webhooks.stop()
        if self.factory is not None:
            await self.factory.shutdown()
        await self.client.close()
        self._log.info("stopped")


def registry_options(settings: Settings) -> RegistryOptions:
    """The cluster registry's options, from ``[clusters]``."""
    c = settings.clusters
    return RegistryOptions(namespaces=c.namespaces, label_selectors=c.label_selectors, secret_types=c.secret_types,
                           include_local=c.include_local, allowed_exec_commands=c.allowed_exec_commands,
                           sync_timeout=c.sync_timeout, probe_interval=c.probe_interval)


def member_factory(settings: Settings, client: ApiClient, name: str) -> DiscoveringDynamicSharedInformerFactory:
    """The discovering factory of member cluster ``name`` (multi-cluster mode)."""
    return discovering_factory(settings, client, watch=settings.clusters.watch,
                               name=f"discovery {display_name(name)}", metrics_cluster=name)


def discovering_factory(settings: Settings, client: ApiClient,
                        **kwargs: Any) -> DiscoveringDynamicSharedInformerFactory:
    """A discovering factory over ``client`` with the settings' filter, namespace, passes and field selectors (the
    local cluster's and every member's alike)."""
    s = settings
    return DiscoveringDynamicSharedInformerFactory(
        client, filter=ResourceFilter(s.include, s.exclude, preferred_version_only=s.preferred_version_only),
        namespace=s.namespace or None, rediscovery_interval=s.rediscovery_interval,
        full_rediscovery_interval=s.full_rediscovery_interval, check_permissions=s.check_permissions,
        field_selectors={GVR.parse(g): selector for g, selector in s.field_selectors.items()}, **kwargs)


def sharding_refusal(settings: Settings, plugins: Any) -> str | None:
    """Why these plugins cannot run with these settings' sharding (fleet-level work needs every cluster), or None."""
    fleet = sorted([*getattr(plugins, "fleet", {}), *(c.name for c in getattr(plugins, "components", ()))])
    if fleet and settings.sharding.enabled:
        return (f"fleet controller(s) {', '.join(fleet)} need every member cluster in one process: they cannot "
                "run with [sharding] enabled (turn it off, or remove their plugin)")
    return None


def _component_status(component: Any) -> dict[str, Any]:
    """A fleet component's ``status()`` (optional) under its name."""
    status = getattr(component, "status", None)
    return {"name": component.name, **(status() if callable(status) else {})}


def _runner(work: Callable[[], Awaitable[None]]) -> Callable[[TaskHandle], Awaitable[None]]:
    async def run(_: TaskHandle) -> None:
        await work()
    return run


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
