"""ClusterRegistry: the fleet's members, kept in step with what the cluster providers give (skv2's ClusterWatcher and
ManagerSet, multicluster-runtime's manager of engaged clusters).

Providers -> ``ProviderSet`` (precedence, conflicts) -> a ``Coordinator`` (which names this replica engages, under
which fence) -> one ``Member`` per engaged name (``member.py``) -> the cluster handlers. Unlike skv2: a removal is
guarded by identity (an old connection never removes its replacement), a changed config brings the new connection
up and synced before the handlers are told and the old one stops (no gap in reconciling), and one cluster's
handler calls run in order without making another cluster's wait.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from functools import partial
from typing import Any, Iterable, Sequence

from loguru import logger
from prometheus_client import CollectorRegistry

from informers import GVR, ApiClient, DiscoveringDynamicSharedInformerFactory, DiscoveryOptions, Supervisor
from informers.union_lister import ClusterNotFound
from informers.wait import wait_first

from .cluster import (
    Cluster, ClusterContext, ClusterHandler, ClusterRemovedHandler, ConditionType, NamedLocks, display_name, finish,
)
from .cluster_clients import ClusterClients
from .cluster_metrics import track
from .coordinator import Coordinator, EngageAll
from .fence import OPEN, Fence
from .member import FactoryMaker, Member, MemberEnv, MemberOptions, MemberState
from .provider import ClusterConfig, ClusterProvider
from .provider_set import ProviderSet
from .warm_members import WarmMembers


class ClusterRegistry:
    """The members of the fleet, from ``providers`` (in precedence order), as ``coordinator`` engages them (by
    default: all of them, under ``fence``).

    ``required``: the GVRs some controller needs in every cluster (each member's factory watches those, see the
    factory's ``watch="required"``); ``make_factory(client, name)`` builds a member's factory (by default one
    watching only what is required); ``local_factory`` is the management cluster's own, reused for the local
    member.
    """

    def __init__(
        self, management: ApiClient, providers: Sequence[ClusterProvider], options: MemberOptions = MemberOptions(),
        *, coordinator: Coordinator | None = None, fence: Fence = OPEN, required: Iterable[GVR] = (),
        make_factory: FactoryMaker | None = None, local_factory: DiscoveringDynamicSharedInformerFactory | None = None,
        supervisor: Supervisor | None = None, metrics_registry: CollectorRegistry | None = None,
        name: str = "clusters",
    ) -> None:
        self.management = management
        self.options = options
        self.required = frozenset(required)
        self.name = name
        self._supervisor = supervisor or Supervisor(name)
        self.providers = ProviderSet(providers, sync_timeout=options.sync_timeout, name=name,
                                     supervisor=self._supervisor)
        self.coordinator = coordinator or EngageAll(fence)
        self.clients = ClusterClients(self)
        env = MemberEnv(management, options, self.required,
                        make_factory or partial(_default_factory, metrics_registry), local_factory, name)
        self.warm = WarmMembers(env)  # brought up ahead by ``prepare``: what a new member adopts
        self._env = replace(env, take_warm=self.warm.take)
        self._handlers: list[ClusterHandler] = []
        self._members: dict[str, Member] = {}  # cluster name -> its current member
        self._tasks: set[asyncio.Task[None]] = set()
        self._leaving: dict[str, set[asyncio.Task[None]]] = {}  # cluster name -> its cancelled members' tasks
        self._lock_for = NamedLocks()
        self._log = logger.bind(component=name)
        self.coordinator.attach(self, self.providers)
        track(self, metrics_registry)

    # -- handlers ----------------------------------------------------------------------------------------
    async def register_cluster_handler(self, handler: ClusterHandler) -> None:
        """``handler.add_cluster`` for every member now engaged, then for every future one."""
        self._handlers.append(handler)
        for name in list(self._members):
            async with self._lock_for(name):  # decided under the lock: an engagement may be finishing
                m = self._members.get(name)
                serving = m.serving if m is not None else None
                if serving is not None:
                    await self._tell(serving, handler)

    def unregister_cluster_handler(self, handler: ClusterHandler) -> None:
        """Tell ``handler`` about no more clusters (its cleanups already registered still run when their cluster
        goes; a handler that leaves earlier detaches itself, as ``FleetLoop.close`` does)."""
        if handler in self._handlers:
            self._handlers.remove(handler)

    async def _tell(self, m: Member, handler: ClusterHandler) -> None:
        """``add_cluster`` on ``handler`` for the engaged ``m``, once (under the member's name lock)."""
        if not m.engaged or handler in m.told or m.ctx is None or m.cluster is None:
            return
        m.told.append(handler)
        await call_handler(handler.add_cluster, m.ctx, m.name, m.cluster)

    # -- views -------------------------------------------------------------------------------------------
    def cluster(self, name: str) -> Cluster:
        """The cluster ``name`` as engaged now; ClusterNotFound if it is not registered or not up yet."""
        member = self._members.get(name)
        serving = member.serving if member is not None else None
        if serving is None or not serving.engaged or serving.cluster is None:
            raise ClusterNotFound(f"no cluster {display_name(name)!r} is registered and up (registered: "
                                  f"{', '.join(map(display_name, self.list_clusters())) or 'none'})")
        return serving.cluster

    def list_clusters(self) -> list[str]:
        """The names of the members that are up (engaged), sorted."""
        return sorted(name for name, m in self._members.items() if (s := m.serving) is not None and s.engaged)

    def synced(self) -> bool:
        """True once every provider has listed and every cluster they gave has been settled once (skv2's users
        asked for "all initial clusters are registered"; members may still be connecting)."""
        return self.providers.synced()

    def members(self) -> dict[str, Member]:
        """The current member of each registered name (read-only use: status, metrics)."""
        return dict(self._members)

    def status(self) -> dict[str, Any]:
        """``{"clusters": [...], "conflicts": [...], "providers": {...}}``: every member with its state and
        conditions, and under ``rotation`` those of the new connection a changed config is bringing up."""
        clusters = []
        for name, m in sorted(self._members.items()):
            # While a new connection comes up, the old one still serves: the cluster is what the old one is.
            serving = m.serving or m
            doc = serving.status()
            doc["rotation"] = m.status() if serving is not m else None
            clusters.append({"name": name, "display_name": display_name(name), **doc})
        conflicts = [c.as_dict() for c in sorted(self.providers.conflicts(), key=lambda c: c.key)]
        return {"clusters": clusters, "conflicts": conflicts, "providers": self.providers.status()}

    # -- lifecycle ---------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the providers; members follow what they give, as the coordinator engages them."""
        await self.providers.start(self.coordinator.changed)

    async def stop(self) -> None:
        """Stop the providers, then every member (handlers' cleanups, informers, connections) and every warm one,
        awaited."""
        await self.providers.stop()
        for m in list(self._members.values()):
            self._remove(m, "the registry is stopping")
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        await self.warm.stop()

    # -- what coordinators call --------------------------------------------------------------------------
    def engage(self, config: ClusterConfig, fence: Fence) -> None:
        """Register ``config`` under ``fence``: a new member, nothing (the same config), or a rotation (a new
        connection comes up, then replaces the serving one)."""
        name = config.name
        member = self._members.get(name)
        if member is None:
            self._log.info("cluster {} registered from {}", display_name(name), config.source)
            self._add(Member(config, fence))
            return
        if member.config.source == config.source and member.config.digest == config.digest:
            return
        if member.config.source == config.source:
            self._log.info("cluster {}: config changed; connecting anew before replacing the connection",
                           display_name(name))
        else:
            self._log.warning("cluster {}: {} holds it now (was {}); connecting with its config before replacing the "
                              "connection", display_name(name), config.source, member.config.source)
        # The serving member stays until the new one is up; a pending replacement is dropped for the newest,
        # detached first so that cancelling it does not reach the serving one.
        serving = member.serving
        if member is not serving:
            member.predecessor = None
            self._cancel(member)
            if serving is not None and serving.config.source == config.source and \
                    serving.config.digest == config.digest:
                self._members[name] = serving  # back to what is running: nothing to connect
                return
        self._add(Member(config, fence, predecessor=serving))

    def disengage(self, name: str, why: str) -> None:
        """Stop cluster ``name`` here (in the background; ``wait_gone`` awaits it)."""
        member = self._members.get(name)
        if member is not None:
            self._remove(member, why)

    def prepare(self, config: ClusterConfig) -> None:
        """Bring ``config`` up ahead, not engaged: a member engaged later with it adopts its connection and synced
        informers (``WarmMembers``)."""
        self.warm.prepare(config)

    def unprepare(self, name: str) -> None:
        """Stop bringing cluster ``name`` up ahead (what is engaged stays)."""
        self.warm.drop(name)

    async def wait_engaged(self, name: str) -> None:
        """Return once the member registered under ``name`` has been engaged (one replacing it meanwhile counts),
        or none is registered."""
        while (member := self._members.get(name)) is not None and not member.settled.is_set():
            await wait_first(member.settled.wait(), timeout=1.0)

    async def wait_gone(self, name: str) -> None:
        """Return once every member of ``name`` that was cancelled has stopped."""
        leaving = self._leaving.get(name)
        if leaving:
            await asyncio.wait(set(leaving))

    # -- members -----------------------------------------------------------------------------------------
    def _add(self, m: Member) -> None:
        self._members[m.name] = m
        task: asyncio.Task[None] = asyncio.create_task(m.run(self._env, self._engaged, self._teardown),
                                                       name=f"cluster {display_name(m.name)}")
        m.task = task
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _remove(self, m: Member, why: str) -> None:
        """Drop ``m`` (and the member it was replacing) if it is still the one registered under its name."""
        if self._members.get(m.name) is not m:
            return
        del self._members[m.name]
        self._log.info("cluster {} leaves ({})", display_name(m.name), why)
        self._cancel(m)

    def _cancel(self, m: Member) -> None:
        """Cancel ``m`` and every member it is still replacing, each once."""
        member: Member | None = m
        while member is not None and not member.ending:
            member.to(MemberState.STOPPING)
            if member.task is not None and not member.task.done():
                member.task.cancel()
                leaving = self._leaving.setdefault(member.name, set())
                leaving.add(member.task)
                member.task.add_done_callback(partial(self._left, member.name))
            member = member.predecessor

    def _left(self, name: str, task: asyncio.Task[None]) -> None:
        leaving = self._leaving.get(name)
        if leaving is not None:
            leaving.discard(task)
            if not leaving:
                del self._leaving[name]

    async def _engaged(self, m: Member) -> None:
        """Tell the handlers (the member becomes the cluster), then stop the member it replaces."""
        async with self._lock_for(m.name):
            old = m.predecessor
            if old is not None and old.state is MemberState.READY:
                old.to(MemberState.SUPERSEDED)  # from here on the handlers hear of m: the old one gets no remove
                old.successor = m
            m.ctx = ClusterContext(m.name)
            m.to(MemberState.READY)
            for handler in list(self._handlers):  # one registered meanwhile is told by its registration
                await self._tell(m, handler)
            m.predecessor = None
            if old is not None:
                self._cancel(old)
        self._log.info("cluster {} is up ({})", display_name(m.name), m.conditions[ConditionType.CONNECTED].message)
        if old is not None and old.task is not None:
            await asyncio.wait({old.task})  # a cancellation of ours must not reach the old member's teardown

    async def _teardown(self, m: Member) -> None:
        if not m.ending:
            m.to(MemberState.STOPPING)
        try:
            if m.ctx is not None:
                m.ctx.cancel()  # at once: whatever waits for the lock already sees the cluster gone
                async with self._lock_for(m.name):
                    await m.ctx.run_cleanups(self.options.cleanup_timeout)
                    if m.successor is None:
                        for handler in m.told:
                            if handler in self._handlers and isinstance(handler, ClusterRemovedHandler):
                                await finish(bounded_call(self.options.cleanup_timeout, handler.remove_cluster,
                                                           m.name))
        finally:
            await m.release(self._env)
            m.to(MemberState.STOPPED)
            self._log.debug("cluster {}: member from {} stopped", display_name(m.name), m.config.source)


def _default_factory(metrics_registry: CollectorRegistry | None, client: ApiClient,
                     name: str) -> DiscoveringDynamicSharedInformerFactory:
    return DiscoveringDynamicSharedInformerFactory(client, DiscoveryOptions(watch="required"),
                                                   name=f"discovery {display_name(name)}",
                                                   metrics_registry=metrics_registry, metrics_cluster=name)


async def bounded_call(timeout: float, fn: Any, *args: Any) -> None:
    """``call_handler`` within ``timeout`` (logged if it does not return in time)."""
    try:
        async with asyncio.timeout(timeout):
            await call_handler(fn, *args)
    except TimeoutError:
        logger.error("cluster handler {} did not return within {:g}s", getattr(fn, "__qualname__", fn), timeout)


async def call_handler(fn: Any, *args: Any) -> None:
    """Call a handler method (sync or async); a failure is logged, never raised into the registry."""
    try:
        result = fn(*args)
        if asyncio.iscoroutine(result):
            await result
    except Exception:
        logger.exception("cluster handler {} failed", getattr(fn, "__qualname__", fn))
