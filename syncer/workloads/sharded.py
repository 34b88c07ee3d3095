"""Sharded: with ``[sharding] enabled`` the controllers (or, in multi-cluster mode, the member clusters) are
spread over every replica, hashed into buckets each under its own Lease (``syncer/sharding/``).

The coordinator runs for the whole process on every replica, whatever the election says, and a stop hands every
unit over first; leader election, if on, still places stores and runnables. Fleet controllers and components
need every cluster in one process, so they are refused. ``warm_standby``: a replica gets ready for the units
assigned to it before taking their Leases, so a handed-over unit starts on synced caches: it watches the GVRs of
those controllers, or brings those member clusters up ahead (connected, their required informers synced, no
controller told), each engaged on that connection once its Lease is taken and stopped once assigned elsewhere.
"""

from __future__ import annotations

from typing import Any

from controllers import ControllerManager, Fence, ManagedController
from controllers.cluster_controllers import ClusterControllers
from controllers.cluster_registry import ClusterRegistry
from controllers.health import HealthItem
from informers import GVR

from ..settings import Settings
from ..sharding.units import ClusterUnits, ControllerUnits
from ..sharding.coordinator import ShardCoordinator
from ..workload import WARM_STANDBY, Lifetime, OnStuck, Process, RegistryMaker, Stuck, WorkloadStatus, stuck_controllers
from .fleet import cluster_rows, clusters_doc


def unit_stop_timeout(settings: Settings) -> float:
    """How long a unit's controllers may take to stop: within the margin before another replica may take its
    Lease."""
    sh = settings.sharding
    return min(settings.shutdown_timeout / 2, sh.lease_duration - sh.renew_deadline)


class _Sharded:
    """The coordinator's part of both kinds: join with the units, hand them all over at ``stop()``. A unit whose
    work does not stop is reported to ``on_stuck`` at once (the process must exit, keeping its Lease)."""

    lifetime = Lifetime.PROCESS

    def __init__(self, process: Process, controllers: dict[str, ManagedController], on_stuck: OnStuck) -> None:
        self.process = process
        self.controllers = controllers
        self._on_stuck = on_stuck
        self.shards: ShardCoordinator | None = None  # from start() to stop()

    def standby_gvrs(self) -> set[GVR]:
        """None: a process-long workload runs on every replica, there is no standby."""
        return set()

    async def _join(self, units: ClusterUnits | ControllerUnits) -> None:
        p = self.process
        self.shards = ShardCoordinator(p.client, p.settings.sharding, p.identity, units, supervisor=p.supervisor,
                                       on_stuck=self._on_stuck, stop_timeout=p.settings.shutdown_timeout / 2)
        await self.shards.start()

    async def _leave(self) -> list[Stuck]:
        """Hand every unit over (``/status`` shows the handovers meanwhile); the units that did not stop."""
        shards, self.shards = self.shards, None
        if shards is None:
            return []
        await shards.stop()
        return list(shards.stuck)

    def _sharding(self) -> dict[str, Any] | None:
        return self.shards.status() if self.shards is not None else None

    def _coordinator_health(self) -> list[HealthItem]:
        return self.shards.health() if self.shards is not None else []


class ShardedControllers(_Sharded):
    """Each managed controller is a unit, run here by a ControllerManager of its own while this replica holds the
    unit's Lease, under that Lease's fence."""

    def __init__(self, process: Process, controllers: dict[str, ManagedController], on_stuck: OnStuck) -> None:
        super().__init__(process, controllers, on_stuck)
        self.units: ControllerUnits | None = None

    async def start(self, fence: Fence) -> None:
        """Join the shard group with the controllers as units (``fence``: each unit has its own instead)."""
        warm = self.process.settings.warm_standby
        self.units = ControllerUnits(sorted(self.controllers), self._unit_manager, self._warm if warm else None)
        await self._join(self.units)

    def _warm(self, units: frozenset[str]) -> None:
        """Keep the GVRs of the controllers assigned here watched, held or not yet: a unit this replica is to take
        (from a replica handing it over, or whose Lease is about to expire) starts on synced caches."""
        self.process.factory.require(WARM_STANDBY, {g for n in units for g in self.controllers[n].required_gvrs})

    def _unit_manager(self, name: str, fence: Fence) -> ControllerManager:
        p = self.process
        return ControllerManager(f"{p.identity}/{name}", p.factory, {name: self.controllers[name]}, client=p.client,
                                 fence=fence, **p.manager_options(unit_stop_timeout(p.settings)))

    async def stop(self) -> list[Stuck]:
        """Hand every unit over; what of the units did not stop."""
        return await self._leave()

    def status(self) -> WorkloadStatus:
        """The controllers running here, and the shard group."""
        return WorkloadStatus(self.units.status() if self.units is not None else None, sharding=self._sharding())

    def health(self) -> list[HealthItem]:
        """The controllers running here, and the coordinator."""
        return (self.units.health() if self.units is not None else []) + self._coordinator_health()


class ShardedClusters(_Sharded):
    """Each member cluster is a unit: the registry (from ``make_registry``) knows every cluster its providers give,
    and engages a member (its controllers starting there, under the unit's fence) only while this replica holds
    the member's Lease; with ``warm_standby`` it connects to those assigned here before that."""

    def __init__(self, process: Process, controllers: dict[str, ManagedController], make_registry: RegistryMaker,
                 on_stuck: OnStuck) -> None:
        super().__init__(process, controllers, on_stuck)
        self._make_registry = make_registry
        self.registry: ClusterRegistry | None = None
        self.per_cluster: ClusterControllers | None = None

    async def start(self, fence: Fence) -> None:
        """Join the shard group with the member clusters as units, then start the cluster providers."""
        p = self.process
        self.per_cluster = ClusterControllers(self.controllers, name=p.identity,
                                              **p.manager_options(unit_stop_timeout(p.settings)))
        # The registry's coordinator: it engages what this replica holds (and warms what is assigned here).
        units = ClusterUnits(self.per_cluster, warm=p.settings.warm_standby)
        self.registry = self._make_registry({g for spec in self.controllers.values() for g in spec.required_gvrs},
                                            coordinator=units)
        await self.registry.register_cluster_handler(self.per_cluster)
        await self._join(units)
        await self.registry.start()

    async def stop(self) -> list[Stuck]:
        """Hand every unit over, then stop the registry of member clusters, unless a unit did not stop (its
        controllers may still act: the process exits as it is); what did not stop."""
        stuck = await self._leave()
        if self.registry is not None and not stuck:
            registry, self.registry = self.registry, None
            await registry.stop()
            if self.per_cluster is not None:
                stuck += stuck_controllers(await self.per_cluster.stop())
                self.per_cluster = None
        return stuck

    def status(self) -> WorkloadStatus:
        """The controllers of the members held here, the members, and the shard group."""
        return WorkloadStatus(cluster_rows(self.per_cluster), clusters_doc(self.registry, (), ()), self._sharding())

    def health(self) -> list[HealthItem]:
        """The controllers of the members held here, and the coordinator."""
        return (self.per_cluster.health() if self.per_cluster is not None else []) + self._coordinator_health()
