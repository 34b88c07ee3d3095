"""Fleet: with ``[clusters] enabled``, a leadership term runs a ``ClusterRegistry`` of the member clusters (from the
cluster providers), a ControllerManager per member for the plugins' controllers (``ClusterControllers``), and
the plugins' fleet controllers and components over all members (``controllers/cluster_registry.py``,
``controllers/fleet.py``).

They live for the term only: standbys watch no member cluster, so a new leader connects to every member before
its controllers start there. Only the local cluster, when it is a member, is warm on a standby: its informers are
the sidecar's own, kept synced by the warm standby of ``runtime.py``.
"""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Any, Awaitable, Callable, Protocol, Sequence, runtime_checkable

from controllers import Fence
from controllers.cluster import qualified
from controllers.cluster_controllers import ClusterControllers
from controllers.cluster_registry import ClusterRegistry
from controllers.fence import fenced
from controllers.fleet import FleetComponent, FleetLoop, FleetScope
from controllers.health import HealthItem
from informers import GVR, TaskHandle

from ..plugins import Plugins
from ..workload import Lifetime, Process, RegistryMaker, Stuck, StuckKind, WorkloadStatus, stuck_controllers


@runtime_checkable
class ReportsStatus(Protocol):
    """A fleet component that says how it is: ``status()`` is shown in ``/status`` under its name."""

    def status(self) -> dict[str, Any]: ...


class Fleet:
    """A ``Workload`` for each term: the registry from ``make_registry``, the plugins' controllers in every member,
    their fleet controllers and components; everything of a term stops within ``stop_timeout``."""

    lifetime = Lifetime.TERM

    def __init__(self, process: Process, plugins: Plugins, make_registry: RegistryMaker, stop_timeout: float) -> None:
        self.process = process
        self.plugins = plugins
        self.stop_timeout = stop_timeout
        self._make_registry = make_registry
        # This term's (None, empty: between terms).
        self.registry: ClusterRegistry | None = None
        self.per_cluster: ClusterControllers | None = None
        self.loops: list[FleetLoop] = []

    def _required(self) -> set[GVR]:
        """What every member watches: the GVRs of the per-cluster controllers and of the fleet controllers."""
        plugins = self.plugins
        return {g for spec in plugins.controllers.values() for g in spec.required_gvrs} | \
            {spec.gvr for spec in plugins.fleet.values()}

    def standby_gvrs(self) -> set[GVR]:
        """The members' GVRs in the local cluster when it is a member (``include_local``); other members are not
        connected before the term, so only the local one can be warm."""
        return self._required() if self.process.settings.clusters.include_local else set()

    async def start(self, fence: Fence) -> None:
        """Build this term's registry, register the per-cluster controllers and the fleet loops with it, spawn
        the fleet controllers and components, then connect to the members."""
        p, plugins = self.process, self.plugins
        registry = self.registry = self._make_registry(self._required(), fence=fence)
        self.per_cluster = ClusterControllers(plugins.controllers, name=p.identity, fence=fence,
                                              **p.manager_options(self.stop_timeout))
        await registry.register_cluster_handler(self.per_cluster)
        self.loops = [FleetLoop(name, spec, registry.clients, management=p.client, fence=fence,
                                priority_queue=p.settings.priority_queue)
                      for name, spec in sorted(plugins.fleet.items())]
        for loop in self.loops:
            await registry.register_cluster_handler(loop)
            p.supervisor.spawn(f"fleet controller {loop.name}", _runner(loop.run))
        scope = FleetScope(registry, fenced(p.client, fence), p.factory, fence)
        for component in plugins.components:
            p.supervisor.spawn(f"fleet component {component.name}", _runner(partial(component.run, scope)))
        await registry.start()

    async def stop(self) -> list[Stuck]:
        """Stop the fleet controllers and every cluster's controllers, then the registry; what did not stop."""
        loops, self.loops = self.loops, []
        registry, self.registry = self.registry, None
        per_cluster, self.per_cluster = self.per_cluster, None
        stuck: list[Stuck] = []
        if per_cluster is not None:
            # Together, within one bound: the fleet loops and every cluster's controllers share the lease margin.
            tasks = [Stuck(StuckKind.FLEET_CONTROLLER, loop.name) for loop in loops] + \
                [Stuck(StuckKind.FLEET_COMPONENT, c.name) for c in self.plugins.components]
            ended, names = await asyncio.gather(
                asyncio.gather(*(self.process.supervisor.cancel(str(task), self.stop_timeout) for task in tasks)),
                per_cluster.stop())
            stuck = [task for task, done in zip(tasks, ended) if not done] + stuck_controllers(names)
        if registry is not None and not stuck:
            await registry.stop()
            if per_cluster is not None:  # what the members' cleanups stopped meanwhile, and did not stop
                stuck = stuck_controllers(await per_cluster.stop())
        return stuck

    def status(self) -> WorkloadStatus:
        """Every member's controllers, and the members with their conditions, conflicts and the fleet controllers."""
        return WorkloadStatus(cluster_rows(self.per_cluster),
                              clusters_doc(self.registry, self.loops, self.plugins.components))

    def health(self) -> list[HealthItem]:
        """The members' controllers (a member down is not unhealthy here, see ``ClusterControllers.health``)."""
        return self.per_cluster.health() if self.per_cluster is not None else []


def cluster_rows(per_cluster: ClusterControllers | None) -> list[dict[str, Any]] | None:
    """One ``/status`` row per controller per member cluster (its name qualified by the cluster's), or None."""
    if per_cluster is None:
        return None
    return [{**c, "name": qualified(c["name"], cluster)}
            for cluster, rows in per_cluster.status().items() for c in rows]


def clusters_doc(registry: ClusterRegistry | None, loops: Sequence[FleetLoop],
                 components: Sequence[FleetComponent]) -> dict[str, Any]:
    """The multi-cluster part of ``/status``: the members with their conditions and conflicts, the fleet
    controllers and components (a component's own ``status()`` too, if it has one)."""
    doc = registry.status() if registry is not None else {"clusters": [], "conflicts": []}
    doc["fleet_controllers"] = [loop.status() for loop in loops]
    doc["fleet_components"] = [{"name": c.name, **(c.status() if isinstance(c, ReportsStatus) else {})}
                               for c in components] if registry is not None else []
    return doc


def _runner(work: Callable[[], Awaitable[None]]) -> Callable[[TaskHandle], Awaitable[None]]:
    async def run(_: TaskHandle) -> None:
        await work()
    return run
