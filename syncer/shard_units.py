"""The two kinds of unit the shard coordinator spreads: a managed controller (single-cluster mode) and a member
cluster with all its controllers (multi-cluster mode). Each starts its work under the unit's fence and stops it
drained, so that the coordinator releases the unit's Lease only after nothing of it runs.
"""

from __future__ import annotations

from typing import Any, Callable

from controllers import ControllerManager, Fence
from controllers.health import HealthItem
from controllers.cluster_controllers import ClusterControllers
from controllers.cluster_registry import ClusterRegistry

from .shards import UnitFence

ManagerMaker = Callable[[str, Fence], ControllerManager]


class ControllerUnits:
    """Each managed controller is a unit, run by a ControllerManager of its own (``make_manager(name, fence)``)
    over the process's shared informer factory."""

    kind = "controllers"  # the values of settings.UnitKind

    def __init__(self, names: list[str], make_manager: ManagerMaker) -> None:
        self._names = set(names)
        self._make = make_manager
        self.managers: dict[str, ControllerManager] = {}

    def names(self) -> set[str]:
        return self._names

    async def start(self, unit: str, fence: UnitFence) -> None:
        manager = self.managers[unit] = self._make(unit, fence)
        await manager.start()

    async def stop(self, unit: str) -> list[str]:
        manager = self.managers.pop(unit, None)
        return await manager.stop() if manager is not None else []

    def status(self) -> list[dict[str, Any]]:
        """The running controllers, as ``ControllerStatus.as_dict()``."""
        return [s.as_dict() for _, m in sorted(self.managers.items()) for s in m.status().values()]

    def health(self) -> list[HealthItem]:
        """The managers' health items."""
        return [item for m in self.managers.values() for item in m.health()]


class ClusterUnits:
    """Each member cluster is a unit: the registry connects to it (and its controllers start, through
    ``ClusterControllers``) only while this replica owns it."""

    kind = "clusters"

    def __init__(self, registry: ClusterRegistry, per_cluster: ClusterControllers) -> None:
        self.registry = registry
        self.per_cluster = per_cluster

    def names(self) -> set[str]:
        return self.registry.candidates()

    async def start(self, unit: str, fence: UnitFence) -> None:
        await self.registry.engage(unit)

    async def stop(self, unit: str) -> list[str]:
        await self.registry.disengage(unit)
        return self.per_cluster.take_stuck(unit)
