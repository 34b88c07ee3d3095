"""The units of a shard group as one replica sees them: what is spread (``Units``), the buckets they are hashed
into and each one's state here, and its units' (``UnitState``, ``Bucket``), the Leases this replica holds
(``Held``), and the ``syncer_shard_*`` metrics.

multicluster-runtime's sharded coordinator keeps a set of owned clusters; here a bucket's state is explicit, so
that one being handed over (its units stopping, its Lease still held) or stopping after a lost tenure (its Lease
no longer ours, nothing released) is never mistaken for one owned or one free.
"""

from __future__ import annotations

import asyncio
import enum
import time
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator, Protocol, runtime_checkable

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

from informers.metrics import MetricSet

from ..fences import BucketTenure, RenewFence, UnitFence
from ..lease import LeaseRecord
from ..settings import UnitKind

if TYPE_CHECKING:
    from .coordinator import ShardCoordinator

HANDOVERS = Counter("syncer_shard_handovers_total", "Buckets (of units) this replica handed over (out) or took "
                    "from a release (in).", ["direction"])
LOST = Counter("syncer_shard_units_lost_total", "Buckets (of units) this replica stopped because their Lease was "
               "not renewed in time or was taken.")
HANDOVER_SECONDS = Histogram("syncer_shard_handover_seconds", "From deciding to hand a bucket over to releasing "
                             "its Lease (every unit's stop and drain included).",
                             buckets=(.05, .1, .25, .5, 1, 2.5, 5, 10, 30))


class UnitState(enum.StrEnum):
    """A bucket, or a unit (by its bucket's state, and its own while the bucket is owned), as this replica sees
    it."""

    ELSEWHERE = "elsewhere"  # assigned to another member
    WAITING = "waiting"  # assigned here; its Lease still held by another (not yet released or expired)
    STARTING = "starting"  # its Lease taken here, its work starting
    RUNNING = "running"
    FAILED = "failed"  # a unit whose start raised (see the log); it stays stopped until its bucket moves
    HANDING_OVER = "handing-over"  # assigned elsewhere or gone: stopping, then the Lease is released (a unit: gone
    # from its bucket, stopping)
    STOPPING = "stopping"  # its Lease not renewed in time: stopping, nothing released


OWNED = (UnitState.STARTING, UnitState.RUNNING, UnitState.FAILED)


class Units(Protocol):
    """What is spread: ``names()`` now, and how one is started (under its fence) and stopped."""

    kind: UnitKind

    def names(self) -> set[str]: ...

    async def start(self, unit: str, fence: UnitFence) -> None: ...

    async def stop(self, unit: str) -> list[str]:
        """Stop the unit's work (drained); the names of controllers that did not stop in time."""
        ...


@runtime_checkable
class Prepares(Protocol):
    """Units that get ready for the ones assigned to this replica before it holds them (the warm standby):
    ``assigned(units)`` is called with every change of that set (empty once this replica is not a live member)."""

    def assigned(self, units: frozenset[str]) -> None: ...


@dataclass
class Held:
    """A Lease this replica holds: its record as last written, and its fence. ``closed``: renewed no more (its
    tenure was lost, or it is about to be released)."""

    record: LeaseRecord
    fence: RenewFence
    renewing: asyncio.Task[None] | None = None
    closed: bool = False
    next_try: float = 0.0

    def lose(self) -> None:
        """Taken, deleted, or not renewed in time: over now, not at the deadline."""
        self.closed = True
        self.fence.close()


@dataclass
class Bucket:
    """One bucket of units (a single unit without buckets), its Lease's name, and what this replica is doing with
    it. While it is owned, ``units`` are its units started here under ``tenure`` (starting, running, failed, or
    handing-over: gone from the bucket and stopping), ``tasks`` their starts and stops in flight."""

    name: str
    lease: str
    state: UnitState = UnitState.ELSEWHERE
    assigned: str = ""
    held: Held | None = None
    tenure: BucketTenure | None = None
    since: float = 0.0  # when this replica took it
    task: asyncio.Task[None] | None = None  # its stop
    taking: bool = False
    unowned_since: float | None = None  # since when it is free here, assigned to one settled member elsewhere
    rescued: bool = False  # taken while assigned elsewhere: kept until its assignee is seen to know the buckets
    units: dict[str, UnitState] = field(default_factory=dict)
    tasks: dict[str, asyncio.Task[None]] = field(default_factory=dict)

    def unit_state(self, unit: str) -> UnitState:
        """``unit``'s state here (it is in this bucket): the bucket's, or its own while the bucket is owned."""
        if self.state not in OWNED:
            return self.state
        if self.tenure is None or not self.tenure.valid():
            return UnitState.STOPPING  # its fence has closed: the next tick stops it
        return self.units.get(unit, UnitState.STARTING)


class ShardMetrics(MetricSet):
    """The gauges of every coordinator of a registry, read when the metrics are collected."""

    def collect(self) -> Iterator[Metric]:
        units = GaugeMetricFamily("syncer_shard_units", "Units by state as this replica sees them (owned: starting, "
                                  "running or failed here).", labels=["state"])
        unowned = GaugeMetricFamily("syncer_shard_units_unowned", "Units whose Lease no live holder renews, as "
                                    "this replica sees them.")
        members = GaugeMetricFamily("syncer_shard_members", "Live members of the shard group, as this replica sees "
                                    "them.")
        counts = dict.fromkeys((s.value for s in UnitState), 0)
        free = live = 0
        for c in list(self.coordinators):
            now = time.monotonic()
            live += len(c.live_members(now))
            for name in c.units.names():
                shown, unowned_here = c.unit_view(name, now)
                counts[shown.value] += 1
                free += unowned_here
        for state, n in counts.items():
            units.add_metric([state], n)
        unowned.add_metric([], free)
        members.add_metric([], live)
        yield from (units, unowned, members)

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.coordinators: "weakref.WeakSet[ShardCoordinator]" = weakref.WeakSet()
        registry.register(self)
