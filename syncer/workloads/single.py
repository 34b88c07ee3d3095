"""SingleCluster: the plugins' controllers in the local cluster, one ControllerManager per leadership term.

The manager gets the term's fence: controllers check it before every work item and write through a client that
refuses writes once it is closed (``controllers/fence.py``).
"""

from __future__ import annotations

from controllers import ControllerManager, Fence, ManagedController
from controllers.health import HealthItem
from informers import GVR

from ..workload import Lifetime, Process, Stuck, WorkloadStatus, stuck_controllers


class SingleCluster:
    """A ``Workload`` for each term: ``controllers`` under a ControllerManager over the local factory, each given
    ``stop_timeout`` to stop."""

    lifetime = Lifetime.TERM

    def __init__(self, process: Process, controllers: dict[str, ManagedController], stop_timeout: float) -> None:
        self.process = process
        self.controllers = controllers
        self.stop_timeout = stop_timeout
        self.manager: ControllerManager | None = None  # this term's

    def standby_gvrs(self) -> set[GVR]:
        """Every GVR the controllers require."""
        return {g for spec in self.controllers.values() for g in spec.required_gvrs}

    async def start(self, fence: Fence) -> None:
        """Start this term's manager."""
        p = self.process
        manager = ControllerManager(p.identity, p.factory, self.controllers, client=p.client, fence=fence,
                                    **p.manager_options(self.stop_timeout))
        await manager.start()
        self.manager = manager

    async def stop(self) -> list[Stuck]:
        """Stop this term's manager; the controllers that did not stop."""
        manager, self.manager = self.manager, None
        return stuck_controllers(await manager.stop()) if manager is not None else []

    def status(self) -> WorkloadStatus:
        """The manager's controllers, while a term runs."""
        manager = self.manager
        return WorkloadStatus([s.as_dict() for s in manager.status().values()] if manager is not None else None)

    def health(self) -> list[HealthItem]:
        """The manager's controllers, while a term runs."""
        return self.manager.health() if self.manager is not None else []
