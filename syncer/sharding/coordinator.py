"""ShardCoordinator: the replicas of one deployment share its units of work (member clusters, or managed
controllers), hashed by name into buckets, each fenced by its own Lease: coordination grows with buckets and
replicas, not units. Leader election is the one-bucket case. ``group.py`` holds the Leases as seen, ``state.py``
the buckets' states; this module decides.

- Live members are those seen renewing on this replica's clock, known for two retry periods before they count;
  owners come from rendezvous hashing with bounded loads, computed alike everywhere. While a live member uses
  another bucket count, this replica takes nothing.
- A bucket's units run only under its Lease's tenure (``fences.UnitFence``); a lapsed tenure is never revived.
  Handover stops and drains the units before releasing (multicluster-runtime releases while work is cancelled).
- Takes are decided on a Lease view at least as new as the cache; a bucket unowned for a lease duration is taken
  by any live member. Cost: ``(buckets + replicas) / retry_period`` PUTs a second, whatever the units.

Over 400 lines: one decision loop; its rules share the buckets' and members' state and must be read together.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Coroutine

from loguru import logger
from prometheus_client import CollectorRegistry

from controllers.health import HealthItem
from informers import ApiClient, ApiError, Supervisor
from informers.errors import describe_error
from informers.wait import wait_first

from ..fences import BucketTenure
from ..fences import UnitFence as UnitFence  # the type of ``fence_for``, and of what ``Units.start`` gets
from ..lease import LeaseRecord
from ..settings import Sharding
from ..workload import Stuck, StuckKind, stuck_controllers
from .group import ShardGroup, bucket_lease
from .rendezvous import assign, bucket_of
from .state import HANDOVER_SECONDS, HANDOVERS, LOST, OWNED, Bucket, Held, Prepares, ShardMetrics, Units
from .state import UnitState as UnitState  # what ``status()`` shows

# Unit starts run at most this many at once. A replica taking many buckets together (its first start, a dead
# replica's share) would otherwise connect to, discover and sync hundreds of members at once, and the event loop
# they saturate would answer no Lease renewal in time (measured: 500 member clusters at once per replica on a
# loaded 2-core machine, every renewal timed out, every bucket lost and taken again).
STARTS_AT_ONCE = 16


class ShardCoordinator:
    """Spreads ``units`` over the replicas sharing ``config.group``, by bucket; ``start()`` joins, ``stop()`` hands
    every bucket over and leaves. ``on_stuck(names)`` is called when a unit's work does not stop within
    ``stop_timeout`` (the process must exit without releasing that unit's bucket's Lease).

    The loop never waits on the network: renewals, takes and releases are tasks of their own (one at a time per
    Lease), so a slow request for one Lease delays no other Lease's renewal; so are units' starts and stops.
    """

    def __init__(self, client: ApiClient, config: Sharding, identity: str, units: Units, *,
                 supervisor: Supervisor | None = None, on_stuck: Callable[[list[Stuck]], None] = lambda _: None,
                 stop_timeout: float = 60.0, metrics_registry: CollectorRegistry | None = None) -> None:
        self.client = client
        self.config = config
        self.identity = identity
        self.units = units
        self.buckets = config.bucket_count(units.kind)
        self.stuck: list[Stuck] = []
        self._stuck_buckets: set[str] = set()
        self._on_stuck = on_stuck
        self._stop_timeout = stop_timeout
        self._supervisor = supervisor or Supervisor(f"shards {config.group}")
        self._joining = False
        self._join_after = 0.0
        self._started_at = float("inf")
        self._buckets: dict[str, Bucket] = {}
        self._bucket_of: dict[str, str] = {}
        self._grouping: tuple[frozenset[str], dict[str, set[str]]] = (frozenset(), {})
        self._disagreeing: list[str] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._requests: set[asyncio.Task[None]] = set()  # takes and joins in flight
        self._collecting: set[str] = set()
        self._wake = asyncio.Event()
        self._starts = asyncio.Semaphore(STARTS_AT_ONCE)
        self._closing = False
        self._assignment: tuple[tuple[frozenset[str], frozenset[str]], dict[str, str]] | None = None
        self._mine: frozenset[str] = frozenset()  # the units assigned here, as last told to ``units`` (Prepares)
        self._group = ShardGroup(client, config, identity, self.buckets, lambda: set(self._groups()), self._lost,
                                 self._wake)
        self._log = logger.bind(shards=config.group, identity=identity)
        ShardMetrics.for_registry(metrics_registry).coordinators.add(self)

    # -- public ------------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Join: watch the group's Leases and, once this replica has seen them all, take the member Lease and
        start assigning (deciding on a partial view would take buckets from live holders' hands)."""
        self._started_at = time.monotonic()
        self._group.informer.start()
        self._supervisor.spawn("shard coordinator", self._run)

    async def stop(self) -> None:
        """Leave: delete the member Lease, hand every bucket over (its units stopped, drained, then the Lease
        released), stop watching."""
        self._closing = True
        await self._supervisor.cancel("shard coordinator")  # it never waits on a request: nothing is cut short
        if self._group.member is not None:
            self._request(self._group.leave(self._group.member), "leave")
        # The loop's work, until every bucket is handed over: held Leases are still renewed while their units drain
        # (and takes in flight land, to be handed over in turn).
        while self._requests or any((b.held is not None or b.task is not None or b.taking or b.tasks) and
                                    b.name not in self._stuck_buckets for b in self._buckets.values()):
            self._wake.clear()
            self._tick()
            await wait_first(self._wake.wait(), timeout=self.config.retry_period / 4)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._group.informer.stop()

    def bucket(self, unit: str) -> str:
        """The bucket ``unit`` is hashed into (``unit`` itself without buckets)."""
        found = self._bucket_of.get(unit)
        return found if found is not None else bucket_of(unit, self.buckets)

    def fence_for(self, unit: str) -> UnitFence | None:
        """The fence of ``unit`` while this replica owns its bucket and runs it (starting or running), else None."""
        b = self._buckets.get(self.bucket(unit))
        if b is None or b.held is None or b.tenure is None or b.state not in OWNED or \
                b.units.get(unit) not in OWNED:
            return None
        return UnitFence(unit, b.tenure)

    def live_members(self, now: float | None = None) -> list[str]:
        """The members seen renewing within their lease duration, this replica included while it renews."""
        return self._group.live_members(time.monotonic() if now is None else now, not self._closing)

    def health(self) -> list[HealthItem]:
        """Unhealthy at once when the credentials may not list, watch or write the group's Leases (RBAC: no wait
        makes that better), and while they cannot be listed for another reason for three lease durations: this
        replica can then take no bucket, and nothing else would say why."""
        name, ns = "shard coordinator", self.config.lease_namespace
        synced = self._group.watching.has_synced()
        late = time.monotonic() - self._started_at > 3 * self.config.lease_duration
        error = self._group.informer.reflector.last_error
        if isinstance(error, ApiError) and error.status in (401, 403):
            return [HealthItem(name, False, f"cannot list or watch Leases in namespace {ns!r}: "
                                            f"{describe_error(error)}")]
        if self._group.denied:
            return [HealthItem(name, False, self._group.denied)]
        return [HealthItem(name, synced or not late, "watching the group's Leases" if synced else
                           f"cannot list Leases in namespace {ns!r}: {error or 'no answer yet'}")]

    def status(self) -> dict[str, Any]:
        """Members; every known unit (its bucket, state here, the bucket's holder and assigned member); every
        known bucket (how many units it has); the units being handed over."""
        members = self.live_members()
        groups = self._groups()
        names = set(self.units.names()).union(*(b.units for b in self._buckets.values()))
        buckets, units = [], []
        for key in sorted(set(groups) | set(self._buckets)):
            b = self._buckets.get(key)
            seen = self._group.seen.get(b.lease) if b is not None else None
            buckets.append({"bucket": key, "state": (b.state if b is not None else UnitState.ELSEWHERE).value,
                            "holder": seen.holder if seen is not None else "",
                            "transitions": seen.transitions if seen is not None else None,
                            "assigned": b.assigned if b is not None else "",
                            "units": len(groups.get(key, ()))})
        by_key = {b["bucket"]: b for b in buckets}
        for name in sorted(names):
            key = self.bucket(name)
            b, shown = self._buckets.get(key), by_key.get(key)
            state = b.unit_state(name) if b is not None else UnitState.ELSEWHERE
            units.append({"unit": name, "bucket": key, "state": state.value,
                          "holder": shown["holder"] if shown is not None else "",
                          "transitions": shown["transitions"] if shown is not None else None,
                          "assigned": shown["assigned"] if shown is not None else ""})
        return {"group": self.config.group, "kind": self.units.kind, "identity": self.identity,
                "bucket_count": self.buckets, "leases_synced": self._group.watching.has_synced(),
                "members": [{"identity": m, "self": m == self.identity} for m in members],
                "owned": sum(1 for u in units if u["state"] in OWNED),
                "units": units, "buckets": buckets,
                "handovers": [u["unit"] for u in units if u["state"] == UnitState.HANDING_OVER],
                "stuck": [str(s) for s in self.stuck]}

    def unit_view(self, name: str, now: float) -> tuple[UnitState, bool]:
        """Unit ``name``'s state here, and whether no live holder renews its bucket's Lease (for the metrics)."""
        key = self.bucket(name)
        b = self._buckets.get(key)
        seen = self._group.seen.get(b.lease if b is not None else bucket_lease(self.config.group, key, self.buckets))
        free = seen is None or not seen.holder or seen.expired(now, self.config.lease_duration)
        return (b.unit_state(name) if b is not None else UnitState.ELSEWHERE), free

    def _lost(self, lease: str) -> None:
        """A Lease was deleted while held: if ours, over now."""
        b = next((b for b in self._buckets.values() if b.lease == lease), None)
        if b is not None and b.held is not None:
            b.held.lose()

    def _groups(self) -> dict[str, set[str]]:
        """The buckets that have units, and their units, as ``units.names()`` says now (hashed again only when
        that changed, and each name once)."""
        names = frozenset(self.units.names())
        if names != self._grouping[0]:
            cache = {name: self._bucket_of.get(name) or bucket_of(name, self.buckets) for name in names}
            groups: dict[str, set[str]] = {}
            for name, key in cache.items():
                groups.setdefault(key, set()).add(name)
            self._bucket_of, self._grouping = cache, (names, groups)
        return self._grouping[1]

    # -- the loop --------------------------------------------------------------------------------------------
    async def _run(self, _: Any) -> None:
        await self._group.watching.wait_for_sync()
        self._group.listed()
        while True:
            self._wake.clear()
            self._tick()
            await wait_first(self._wake.wait(), timeout=self.config.retry_period / 4)

    def _tick(self) -> None:
        """One round of decisions; every request it makes, and every unit's start and stop, runs as a task of its
        own."""
        now = time.monotonic()
        cfg, group = self.config, self._group
        groups = self._groups()
        if not self._closing:
            if group.member is None and not self._joining and now >= self._join_after:
                self._request(self._join(), "join")
            elif group.member is not None:
                self._renew_if_due(group.member, now)
        for b in self._buckets.values():
            if b.held is not None:
                if b.state in OWNED and not b.held.fence.valid():
                    self._end(b, release=False, why=f"its Lease was not renewed within renew_deadline "
                              f"({cfg.renew_deadline:g}s) or was taken")
                else:
                    self._renew_if_due(b.held, now)
        if now < group.settled_at and not self._closing:
            return
        members = self.live_members(now)
        live = self.identity in members
        owners = self._assign(set(groups), members) if live and self._agreed(members) else {}
        self._prepare(frozenset(unit for key, owner in owners.items() if owner == self.identity
                                for unit in groups.get(key, ())))
        for key in sorted(groups.keys() | self._buckets.keys()):
            b = self._buckets.get(key) or self._buckets.setdefault(key, Bucket(key, bucket_lease(cfg.group, key,
                                                                                                self.buckets)))
            units = groups.get(key)
            if owners.get(key, "") != b.assigned:
                b.assigned, b.unowned_since = owners.get(key, ""), None  # a new assignee gets a whole chance
            if b.held is not None and b.state in OWNED:
                if b.assigned == self.identity:
                    b.rescued = False  # ours by assignment now: it moves with the assignment again
                if self._closing or not units:
                    self._end(b, release=True, why="this replica is stopping" if self._closing else "it is empty")
                elif live and b.assigned and b.assigned != self.identity and now - b.since >= cfg.min_hold and \
                        (not b.rescued or group.knows(b.assigned, set(groups))) and group.settled(b.assigned, now):
                    self._end(b, release=True, why=f"assigned to {b.assigned}")
                else:
                    self._reconcile(b, units)
            elif b.held is None and b.task is None and not b.taking:
                if self._closing or self.stuck or not units:  # stuck: the process is about to exit
                    b.state = UnitState.ELSEWHERE
                    if not units:
                        del self._buckets[key]
                    continue
                fresh, current = group.current(b.lease)
                seen = group.seen.get(b.lease)
                if b.assigned == self.identity:
                    b.state, b.unowned_since = UnitState.WAITING, None
                    if fresh and (seen is None or seen.free(self.identity, now, cfg.lease_duration)):
                        self._take_soon(b, current)
                else:
                    b.state = UnitState.ELSEWHERE
                    # Its assignee did not take it for a whole lease duration after it was seen free (or without
                    # a Lease at all): members that disagree on the buckets (a rollout adding a controller, a Secret
                    # not seen everywhere yet) could each leave it to the other. Any live member rescues it. The
                    # clock runs only once the assignee decides: a member that just joined, or came back from a
                    # pause, judges every Lease afresh and may take this one only a lease duration after that.
                    if seen is not None and seen.holder and not seen.expired(now, cfg.lease_duration) or \
                            not group.settled(b.assigned, now):
                        b.unowned_since = None
                    elif b.unowned_since is None:
                        b.unowned_since = now
                    elif live and fresh and now - b.unowned_since >= cfg.lease_duration:
                        self._take_soon(b, current, rescue=True)
        if not self._closing:
            self._collect_members(now)

    def _agreed(self, members: list[str]) -> bool:
        """Whether every live member hashes units into as many buckets as this replica (logged when that
        changes): until then this replica takes nothing, and keeps what it holds."""
        other = [m for m in members if m != self.identity and not self._group.same_buckets(m)]
        if other != self._disagreeing:
            self._disagreeing = other
            if other:
                self._log.warning("member(s) {} hash units into another number of buckets than this replica's {}: "
                                  "taking nothing until they are gone (every replica must have the same "
                                  "sharding.buckets)", ", ".join(other), self.buckets)
        return not other

    def _prepare(self, mine: frozenset[str]) -> None:
        """Tell units that prepare (``Prepares``) what is assigned here, held or not yet, when that changes."""
        if mine != self._mine:
            self._mine = mine
            if isinstance(self.units, Prepares):
                self.units.assigned(mine)

    def _assign(self, names: set[str], members: list[str]) -> dict[str, str]:
        key = (frozenset(names), frozenset(members))
        if self._assignment is None or self._assignment[0] != key:
            self._assignment = (key, assign(names, members))
        return self._assignment[1]

    def _request(self, work: Coroutine[Any, Any, None], name: str) -> None:
        task = self._spawn(work, name)
        self._requests.add(task)
        task.add_done_callback(self._requests.discard)

    def _spawn(self, work: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # -- Leases, buckets and units ---------------------------------------------------------------------------
    async def _join(self) -> None:
        self._joining = True
        try:
            joined = await self._group.join()
        finally:
            self._joining = False
        if not joined:
            self._join_after = time.monotonic() + self.config.retry_period
        self._wake.set()

    def _renew_if_due(self, held: Held, now: float) -> None:
        if not held.closed and held.renewing is None and now >= held.next_try:
            held.next_try = now + self.config.retry_period  # failed or not, the next try is one period on
            held.renewing = self._spawn(self._group.renew(held), f"renew {held.record.name}")

    def _take_soon(self, b: Bucket, current: LeaseRecord | None, rescue: bool = False) -> None:
        b.taking = True
        self._request(self._take(b, current, rescue), f"take bucket {b.name}")

    async def _take(self, b: Bucket, current: LeaseRecord | None, rescue: bool) -> None:
        """Take ``b``'s Lease, writing over exactly the ``current`` record the decision was made on; its units
        start on the next tick."""
        try:
            wrote = await self._group.take(b.lease, b.name, current)
            if wrote.record is None:
                return
            tenure = BucketTenure(b.name, self.identity, wrote.record.transitions, self.config.renew_deadline)
            tenure.renewed(wrote.sent)
            b.held, b.tenure, b.since, b.state = Held(wrote.record, tenure), tenure, wrote.sent, UnitState.STARTING
            b.rescued, b.unowned_since = rescue, None  # once handed on, it is free anew: a whole chance again
            if current is not None and not current.holder:
                HANDOVERS.labels("in").inc()
            self._log.info("took bucket {} (Lease {}, transitions {}, {} units){}", b.name, b.lease,
                           tenure.transitions, len(self._groups().get(b.name, ())),
                           f"; nobody took it for {self.config.lease_duration:g}s" if rescue else "")
        finally:
            b.taking = False
            self._wake.set()

    def _reconcile(self, b: Bucket, units: set[str]) -> None:
        """Start the units of owned bucket ``b`` not started yet, under its tenure; stop those that left it."""
        assert b.tenure is not None
        if not self.stuck:  # stuck: the process is about to exit
            for unit in sorted(units - b.units.keys()):
                b.units[unit] = UnitState.STARTING
                b.tasks[unit] = self._spawn(self._start(b, unit, UnitFence(unit, b.tenure)), f"start unit {unit}")
        for unit in sorted(b.units.keys() - units):
            if b.units[unit] is not UnitState.HANDING_OVER:
                b.units[unit] = UnitState.HANDING_OVER
                self._log.info("stopping unit {}: it is gone", unit)
                b.tasks[unit] = self._spawn(self._stop_unit(b, unit, b.tasks.pop(unit, None)), f"stop unit {unit}")
        if b.state is UnitState.STARTING and UnitState.STARTING not in b.units.values():
            b.state = UnitState.RUNNING

    async def _start(self, b: Bucket, unit: str, fence: UnitFence) -> None:
        try:
            async with self._starts:
                if not fence.valid():  # its bucket is being stopped: this task is about to be cancelled
                    return
                await self.units.start(unit, fence)
        except Exception:
            self._log.exception("unit {} failed to start; it stays here, stopped, until its bucket {} moves",
                                unit, b.name)
            if b.units.get(unit) is UnitState.STARTING:
                b.units[unit] = UnitState.FAILED
        else:
            if b.units.get(unit) is UnitState.STARTING:
                b.units[unit] = UnitState.RUNNING
        finally:
            if b.tasks.get(unit) is asyncio.current_task():
                del b.tasks[unit]
            self._wake.set()

    async def _stop_unit(self, b: Bucket, unit: str, starting: asyncio.Task[None] | None) -> None:
        """Stop ``unit``, which left owned bucket ``b`` (its bucket stays)."""
        try:
            if starting is not None:
                starting.cancel()
                await asyncio.wait({starting})
            stuck = await self._stopped(unit)
            if stuck:
                self._stuck(b, stuck)
            else:
                b.units.pop(unit, None)
        finally:
            if b.tasks.get(unit) is asyncio.current_task():
                del b.tasks[unit]
            self._wake.set()

    async def _stopped(self, unit: str) -> list[Stuck]:
        """Stop ``unit``'s work; what of it did not stop (empty when it all did)."""
        try:
            async with asyncio.timeout(self._stop_timeout):
                return stuck_controllers(await self.units.stop(unit), unit)
        except TimeoutError:
            return [Stuck(StuckKind.UNIT, unit, unit, f"did not stop within {self._stop_timeout:g}s")]
        except Exception as e:  # whether its work stopped is unknown: as unsafe as a stuck one
            self._log.opt(exception=e).error("stopping unit {} failed", unit)
            return [Stuck(StuckKind.UNIT, unit, unit, f"stopping failed: {describe_error(e)}")]

    def _stuck(self, b: Bucket, stuck: list[Stuck]) -> None:
        self.stuck += stuck
        self._stuck_buckets.add(b.name)
        self._log.error("bucket {}: {} did not stop; its Lease is kept", b.name, ", ".join(map(str, stuck)))
        self._on_stuck(stuck)

    def _end(self, b: Bucket, *, release: bool, why: str) -> None:
        """Stop every unit of ``b``; then release its Lease if ``release`` (a handover), or just forget it (a lost
        tenure)."""
        b.state = UnitState.HANDING_OVER if release else UnitState.STOPPING
        if release:
            self._log.info("handing bucket {} over ({} units): {}", b.name, len(b.units), why)
        else:
            LOST.inc()
            self._log.warning("stopping bucket {} ({} units): {}", b.name, len(b.units), why)
            if b.held is not None:
                b.held.lose()
        b.task = self._spawn(self._stop(b, release), f"stop bucket {b.name}")

    async def _stop(self, b: Bucket, release: bool) -> None:
        began = time.monotonic()
        try:
            # Starts in flight are cancelled; stops in flight (units that left the bucket) run to their end.
            for unit, task in b.tasks.items():
                if b.units.get(unit) is not UnitState.HANDING_OVER:
                    task.cancel()
            await asyncio.gather(*b.tasks.values(), return_exceptions=True)
            running = [u for u, state in b.units.items() if state is not UnitState.HANDING_OVER]
            stuck = [s for found in await asyncio.gather(*(self._stopped(u) for u in running)) for s in found]
            if stuck:
                self._stuck(b, stuck)
            if b.name in self._stuck_buckets:
                return
            held = b.held
            if held is not None:
                valid = held.fence.valid()
                await self._group.close(held)
                if release and valid:  # the work has stopped: the new owner may start now
                    await self._group.release(held)
                    HANDOVERS.labels("out").inc()
                    HANDOVER_SECONDS.observe(time.monotonic() - began)
            b.held, b.tenure, b.state = None, None, UnitState.ELSEWHERE
            b.units.clear()
        finally:
            if b.task is asyncio.current_task():
                b.task = None
            self._wake.set()

    def _collect_members(self, now: float) -> None:
        """Delete member Leases not renewed for ten lease durations (replicas that died without leaving)."""
        for record in self._group.abandoned(now):
            if record.name not in self._collecting:
                self._collecting.add(record.name)
                self._spawn(self._collect(record), f"collect {record.name}")

    async def _collect(self, record: LeaseRecord) -> None:
        try:
            await self._group.delete(record, unchanged=True)  # a replica that just resumed keeps its Lease
        finally:
            self._collecting.discard(record.name)
