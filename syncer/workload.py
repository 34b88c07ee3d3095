"""Workload: what the sidecar runs over the local cluster's informers, one shape for every mode.

The sidecar (``runtime.py``) owns the process: HTTP, the connection, discovery, the election, stores and
runnables, webhooks, the exit. What it runs besides is one workload, built once by ``wiring.py`` from the
settings: the controllers of one cluster (``workloads/single.py``), a fleet of member clusters
(``workloads/fleet.py``), or a share of either spread over the replicas (``workloads/sharded.py``). As
controller-runtime's manager starts its runnables by group (those needing leader election, the others), a
workload says when it runs (``Lifetime``): for each leadership term, under that term's fence, or for the whole
process, from discovery on, on every replica. A per-term workload also says which of the local cluster's GVRs a
standby keeps watched (``standby_gvrs``, the warm standby of ``runtime.py``), and may keep a part running between
terms (``Standby``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Protocol, runtime_checkable

from controllers import Fence
from controllers.health import HealthItem
from informers import ApiClient, DiscoveringDynamicSharedInformerFactory, GVR, Supervisor

from .settings import Settings

if TYPE_CHECKING:
    from controllers.cluster_registry import ClusterRegistry
    from controllers.coordinator import Coordinator


WARM_STANDBY = "syncer-warm-standby"  # the local factory's owner of what is kept watched for work not running yet


class Lifetime(enum.Enum):
    """When a workload runs."""

    TERM = "term"  # started at each leadership term under its fence, stopped when the term ends
    PROCESS = "process"  # started once discovery is done, on every replica; stopped first at shutdown


@dataclass(frozen=True)
class WorkloadStatus:
    """A workload's part of ``/status``: its ``controllers`` rows (None while it runs none: the sidecar lists the
    plugins' controllers as standing by), the multi-cluster document and the sharding document (None outside
    those modes)."""

    controllers: list[dict[str, Any]] | None
    clusters: dict[str, Any] | None = None
    sharding: dict[str, Any] | None = None


class StuckKind(enum.StrEnum):
    """What kind of work did not stop."""

    CONTROLLER = "controller"
    FLEET_CONTROLLER = "fleet controller"
    FLEET_COMPONENT = "fleet component"
    RUNNABLE = "runnable"
    UNIT = "unit"  # a shard unit whose stop timed out or failed: whether its work stopped is unknown


@dataclass(frozen=True)
class Stuck:
    """Work that did not stop in time: the process must exit. ``unit``: the shard unit it ran in (its Lease is
    kept at exit, so no other replica takes the unit while it may still act); ``detail``: how it failed."""

    kind: StuckKind
    name: str
    unit: str = ""
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.kind} {self.name}" + (f" ({self.detail})" if self.detail else "")


def stuck_controllers(names: Iterable[str], unit: str = "") -> list[Stuck]:
    """The controllers ``names`` (a manager's ``stop()`` answer) as stuck work."""
    return [Stuck(StuckKind.CONTROLLER, name, unit) for name in names]


class Workload(Protocol):
    """One mode's work. ``start(fence)`` returns once it is started (``fence``: the term's, or ``OPEN`` for a
    process-long one); ``stop()`` stops it, drained, and returns what did not stop in time (the process must then
    exit); both may be called again (a new term), and ``stop()`` without a ``start()``.
    ``standby_gvrs()``: the local factory's GVRs its next term will read, which a standby keeps synced (empty for
    a process-long workload)."""

    lifetime: Lifetime

    def standby_gvrs(self) -> set[GVR]: ...

    async def start(self, fence: Fence) -> None: ...

    async def stop(self) -> list[Stuck]: ...

    def status(self) -> WorkloadStatus: ...

    def health(self) -> list[HealthItem]: ...


@runtime_checkable
class Standby(Protocol):
    """A per-term workload with a part that outlives its terms (the fleet's registry of members, with warm standby):
    ``warm()`` once discovery is done, on every replica, leader or not; ``cool()`` at shutdown, once no term runs."""

    async def warm(self) -> None: ...

    async def cool(self) -> None: ...


class RegistryMaker(Protocol):
    """Builds the registry of member clusters over the process's parts (``wiring.py``): ``required`` GVRs in every
    member, all engaged under ``fence`` (``CLOSED`` for a fleet, whose terms write through a ``ClusterTerm``), or as
    ``coordinator`` engages them (sharded)."""

    def __call__(self, required: set[GVR], *, fence: Fence = ...,
                 coordinator: Coordinator | None = None) -> ClusterRegistry: ...


OnStuck = Callable[[list[Stuck]], None]


@dataclass(frozen=True)
class Process:
    """The parts of the process every workload runs over: its settings, the local cluster's client and discovering
    factory, this replica's identity, and the supervisor of its background tasks."""

    settings: Settings
    client: ApiClient
    identity: str
    supervisor: Supervisor
    factory: DiscoveringDynamicSharedInformerFactory

    def manager_options(self, stop_timeout: float) -> dict[str, Any]:
        """The keyword arguments every ControllerManager (and ClusterControllers) of the process takes."""
        s = self.settings
        return dict(workers=s.workers, resync_period=s.resync or None, start_timeout=s.start_timeout,
                    stop_timeout=stop_timeout, supervisor=self.supervisor, priority_queue=s.priority_queue,
                    read_your_writes=s.read_your_writes)
