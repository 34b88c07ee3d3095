"""ClusterControllers: a cluster handler that runs the per-cluster controllers in every member cluster, each
cluster with its own ControllerManager over that cluster's discovering factory and client.

So a controller runs in exactly the clusters that serve its GVRs, and starts or stops in one cluster as a CRD
comes or goes there, whatever the others do (skv2 and multicluster-runtime engage every controller in every
cluster, and a controller whose kind a cluster lacks fails there). When a rotated kubeconfig brings a new
connection, the cluster's old manager is stopped before the new one starts (its informers are synced by then,
so the gap is a controller restart), never both at once: two instances of a controller acting on one cluster is
what leader election exists to prevent.
"""

from __future__ import annotations

import asyncio
from typing import Any, Mapping

from prometheus_client import CollectorRegistry

from informers import Supervisor

from .cluster import Cluster, ClusterContext, NamedLocks, display_name, qualified
from .fence import OPEN, Fence
from .health import HealthItem
from .manager import ControllerManager, ManagedController
from .read_your_writes import DEFAULT_READ_YOUR_WRITES


class ClusterControllers:
    """Runs ``controllers`` in every cluster it is told about (a ``ClusterHandler``); ``stop()`` stops them all.

    The other arguments are the ControllerManager's, applied to every cluster's manager.
    """

    def __init__(
        self, controllers: Mapping[str, ManagedController], *, name: str = "clusters", fence: Fence = OPEN,
        workers: int = 1, resync_period: float | None = None, stop_timeout: float = 30.0,
        start_timeout: float = 60.0, supervisor: Supervisor | None = None,
        metrics_registry: CollectorRegistry | None = None, priority_queue: bool = True,
        read_your_writes: float = DEFAULT_READ_YOUR_WRITES,
    ) -> None:
        self.controllers = dict(controllers)
        self.name = name
        self._options: dict[str, Any] = dict(
            fence=fence, workers=workers, resync_period=resync_period, stop_timeout=stop_timeout,
            start_timeout=start_timeout, supervisor=supervisor, metrics_registry=metrics_registry,
            priority_queue=priority_queue, read_your_writes=read_your_writes)
        self._managers: dict[str, ControllerManager] = {}
        self._stuck: dict[str, list[str]] = {}  # cluster name -> its controllers that did not stop
        self._closed = False  # stopped: a cluster engaged late gets no manager (nobody would stop it)
        # Per cluster: its managers change one at a time (rotation: stop old, start new), others never wait.
        self._lock_for = NamedLocks()

    async def add_cluster(self, ctx: ClusterContext, name: str, cluster: Cluster) -> None:
        """Start a manager for ``cluster`` (stopping the one of its previous connection first)."""
        if not self.controllers:
            return
        async with self._lock_for(name):
            if self._closed:
                return
            old = self._managers.pop(name, None)
            if old is not None:
                self._note_stuck(name, await old.stop())
            if self._closed or ctx.cancelled():  # stopped, or this connection went, while the old one stopped
                return
            options = dict(self._options)
            if cluster.fence is not OPEN:  # sharding: this replica's tenure of the cluster
                options["fence"] = cluster.fence
            manager = ControllerManager(f"{self.name}/{display_name(name)}", cluster.factory, self.controllers,
                                        client=cluster.client, cluster=name, **options)
            self._managers[name] = manager
            ctx.add_cleanup(lambda: self._stop(name, manager))
            await manager.start()  # awaits nothing: stop() sees this manager, or add_cluster sees _closed

    async def _stop(self, name: str, manager: ControllerManager) -> None:
        async with self._lock_for(name):
            if self._managers.get(name) is manager:  # a newer connection's manager is left alone
                del self._managers[name]
            self._note_stuck(name, await manager.stop())

    def _note_stuck(self, cluster: str, names: list[str]) -> None:
        if names:
            self._stuck.setdefault(cluster, []).extend(names)

    def take_stuck(self, cluster: str) -> list[str]:
        """The controllers of ``cluster`` that did not stop when it left or was replaced (qualified names), once."""
        return [qualified(n, cluster) for n in self._stuck.pop(cluster, [])]

    async def stop(self) -> list[str]:
        """Stop every cluster's manager, and start no more; the names of controllers that did not stop (see
        ``ControllerManager.stop``), including those of managers stopped before (a rotation, a cluster leaving)."""
        self._closed = True
        managers, self._managers = dict(self._managers), {}
        results = await asyncio.gather(*(m.stop() for m in managers.values()))
        for name, names in zip(managers, results):
            self._note_stuck(name, names)
        return [n for name in list(self._stuck) for n in self.take_stuck(name)]

    def status(self) -> dict[str, list[dict[str, Any]]]:
        """Every cluster's controllers, as ``ControllerStatus.as_dict()``, by cluster name."""
        return {name: [s.as_dict() for s in m.status().values()] for name, m in sorted(self._managers.items())}

    def health(self) -> list[HealthItem]:
        """One item per controller per cluster; only a stuck one is unhealthy: one failing in one member cluster
        (that cluster unreachable, say) is that cluster's problem, shown in its status, and restarting this process
        would not fix it."""
        stopped_stuck = [HealthItem(qualified(n, cluster), False, "did not stop when its cluster left or was replaced")
                         for cluster, names in self._stuck.items() for n in names]
        return stopped_stuck + [HealthItem(qualified(st.name, name), st.state != "stuck",
                                           st.last_error if st.state in ("stuck", "backoff") else st.state)
                                for name, m in sorted(self._managers.items()) for st in m.status().values()]
