"""The two kinds of unit the shard coordinator spreads: a managed controller (single-cluster mode) and a member
cluster with all its controllers (multi-cluster mode). Each starts its work under the unit's fence (its bucket's
tenure) and stops it drained, so that the coordinator releases the bucket's Lease only after nothing of it runs.
"""

from __future__ import annotations

from typing import Any, Callable

from controllers import ControllerManager, Fence
from controllers.health import HealthItem
from controllers.cluster_controllers import ClusterControllers
from controllers.coordinator import ClusterView, Members

from ..fences import UnitFence
from ..settings import UnitKind

ManagerMaker = Callable[[str, Fence], ControllerManager]


class ControllerUnits:
    """Each managed controller is a unit, run by a ControllerManager of its own (``make_manager(name, fence)``)
    over the process's shared informer factory. ``prepare``, if given, is told the units assigned to this replica
    (``Prepares``): the warm standby has their GVRs watched before their Leases are taken."""

    kind = UnitKind.CONTROLLERS

    def __init__(self, names: list[str], make_manager: ManagerMaker,
                 prepare: Callable[[frozenset[str]], None] | None = None) -> None:
        self._names = set(names)
        self._make = make_manager
        self._prepare = prepare
        self.managers: dict[str, ControllerManager] = {}

    def names(self) -> set[str]:
        return self._names

    def assigned(self, units: frozenset[str]) -> None:
        """The units assigned here now (``Prepares``): handed to ``prepare``."""
        if self._prepare is not None:
            self._prepare(units)

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
    """Each member cluster is a unit, and this is the registry's coordinator: a cluster is engaged (its controllers
    start, through ``ClusterControllers``) only while this replica holds its unit, under the unit's fence.

    With ``warm`` (the warm standby, ``Prepares``): a cluster assigned here and not held yet is brought up ahead
    (``Members.prepare``: connected, its required informers synced, nothing engaged), so that once its Lease is
    taken the member adopts that connection and starts its controllers without listing; one no longer assigned
    here (or gone) is stopped, one whose config changes is brought up anew."""

    kind = UnitKind.CLUSTERS

    def __init__(self, per_cluster: ClusterControllers, warm: bool = False) -> None:
        self.per_cluster = per_cluster
        self._warm = warm
        self._members: Members | None = None
        self._view: ClusterView | None = None
        self._fences: dict[str, UnitFence] = {}  # the units this replica holds
        self._assigned: frozenset[str] = frozenset()

    def attach(self, members: Members, view: ClusterView) -> None:
        self._members, self._view = members, view

    def changed(self, name: str) -> None:
        """A held cluster's new config rotates it; one no provider gives any more leaves by its unit's stop (the
        shard coordinator sees it gone from ``names()``); another replica's is none of this one's business, but
        for one assigned here, brought up ahead."""
        fence = self._fences.get(name)
        config = self._view.get(name) if self._view is not None else None
        if fence is not None and config is not None and self._members is not None:
            self._members.engage(config, fence)
        self._prepare(name)

    def names(self) -> set[str]:
        return self._view.names() if self._view is not None else set()

    def assigned(self, units: frozenset[str]) -> None:
        """The units assigned here now (``Prepares``): with ``warm``, those not held are brought up ahead, those
        no longer assigned stopped."""
        before, self._assigned = self._assigned, units
        for name in before | units:
            self._prepare(name)

    def _prepare(self, name: str) -> None:
        """Keep cluster ``name`` brought up ahead while it is assigned here, given, and not held (a held one's
        member has adopted it, or is about to: left alone)."""
        if not self._warm or self._members is None or self._view is None or name in self._fences:
            return
        config = self._view.get(name) if name in self._assigned else None
        if config is None:
            self._members.unprepare(name)
        else:
            self._members.prepare(config)

    async def start(self, unit: str, fence: UnitFence) -> None:
        assert self._members is not None and self._view is not None, "the registry attaches first"
        self._fences[unit] = fence
        config = self._view.get(unit)
        if config is not None:
            self._members.engage(config, fence)
            await self._members.wait_engaged(unit)

    async def stop(self, unit: str) -> list[str]:
        assert self._members is not None
        self._fences.pop(unit, None)
        self._members.disengage(unit, "another replica runs it now")
        await self._members.wait_gone(unit)
        self._prepare(unit)  # still assigned here (its Lease lost, say): ready for its next take
        return self.per_cluster.take_stuck(unit)
