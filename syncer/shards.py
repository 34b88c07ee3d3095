"""ShardCoordinator: the replicas of one deployment share its units of work (member clusters, or managed
controllers), each unit fenced by its own ``coordination.k8s.io`` Lease. Leader election is the one-unit case of
the same rules (``leader.py``, ``lease.py``, ``fences.py``). The group's Leases as this replica sees and writes
them are ``shard_group.py``'s, the units' states and metrics ``shard_state.py``'s; this module decides.

- Membership: each replica holds a member Lease (``<group>-member-<hash>``, holder = its identity, pod name +
  uuid); the live members are those seen renewing on this replica's own monotonic clock since its first list of
  the Leases (``shard_group.py`` says how). A replica decides nothing for two retry periods after that first
  list (or its return from lapsed renewals), and the others hand it units only once they have known it that
  long.
- Assignment: rendezvous hashing with bounded loads over the live members (``rendezvous.py``): every replica
  computes the same owner for every unit without talking to the others.
- Fencing: a replica starts a unit only after taking the unit's Lease, and its fence (``fences.UnitFence``:
  valid while the last successful renewal is less than ``renew_deadline`` old, checked locally) goes to the
  unit's controllers and clients. A unit whose Lease is not renewed in time, or is taken or deleted, is stopped,
  and not released; a tenure that lapsed is never revived. A deleted Lease counts, until what it said expires,
  as if it were still there.
- Handover: a unit assigned elsewhere (and held at least ``min_hold``, so a member that blips does not make
  units flap) is stopped, its queue drained, and only then its Lease released; the new owner sees the release
  through its Lease watch and takes it at once. multicluster-runtime releases the fence while the old work is
  still being cancelled. A graceful stop deletes the member Lease first (the others re-assign at once), then
  hands every unit over the same way.
- Takes are decided only on a view of the Lease that is as new as the cached object written over (the cache
  is filled before its handlers run), and only once the first list has been seen: a decision made on an older
  view would pass the resourceVersion check and take a unit from a live holder's hands.
- No unit is left unowned: one free for a whole lease duration while assigned to the same member, counted from
  when that member decides (members that disagree on the set of units, as during a rollout that adds a
  controller, could each leave it to the other), is taken by any live member. It keeps the unit until its
  assigned member's Lease shows the same unit set (then it is handed over as any other: that member takes it).
  Member Leases of replicas that died are deleted after ten lease durations.
- Cost: one watch of the group's Leases per replica (holders, releases and expiry are seen there, not polled),
  and one PUT per held Lease per ``retry_period``: ``(units + replicas) / retry_period`` requests per second for
  the whole deployment at steady state.
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

from .fences import UnitFence as UnitFence  # the type of ``fence_for``, and of what ``Units.start`` gets
from .lease import LeaseRecord
from .rendezvous import assign
from .settings import Sharding
from .shard_group import ShardGroup, unit_lease
from .shard_state import HANDOVER_SECONDS, HANDOVERS, LOST, OWNED, Held, Prepares, ShardMetrics, Unit, Units
from .shard_state import UnitState as UnitState  # what ``status()`` shows


class ShardCoordinator:
    """Spreads ``units`` over the replicas sharing ``config.group``; ``start()`` joins, ``stop()`` hands every unit
    over and leaves. ``on_stuck(names)`` is called when a unit's work does not stop within ``stop_timeout`` (the
    process must exit without releasing that unit's Lease).

    The loop never waits on the network: renewals, takes and releases are tasks of their own (one at a time per
    Lease), so a slow request for one Lease delays no other Lease's renewal.
    """

    def __init__(self, client: ApiClient, config: Sharding, identity: str, units: Units, *,
                 supervisor: Supervisor | None = None, on_stuck: Callable[[list[str]], None] = lambda _: None,
                 stop_timeout: float = 60.0, metrics_registry: CollectorRegistry | None = None) -> None:
        self.client = client
        self.config = config
        self.identity = identity
        self.units = units
        self.stuck: list[str] = []
        self._stuck_units: set[str] = set()
        self._on_stuck = on_stuck
        self._stop_timeout = stop_timeout
        self._supervisor = supervisor or Supervisor(f"shards {config.group}")
        self._joining = False
        self._join_after = 0.0
        self._started_at = float("inf")
        self._units: dict[str, Unit] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._requests: set[asyncio.Task[None]] = set()  # takes and joins in flight
        self._collecting: set[str] = set()
        self._wake = asyncio.Event()
        self._closing = False
        self._assignment: tuple[tuple[frozenset[str], frozenset[str]], dict[str, str]] | None = None
        self._mine: frozenset[str] = frozenset()  # the units assigned here, as last told to ``units`` (Prepares)
        self._group = ShardGroup(client, config, identity, units.names, self._lost, self._wake)
        self._log = logger.bind(shards=config.group, identity=identity)
        ShardMetrics.for_registry(metrics_registry).coordinators.add(self)

    # -- public ------------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Join: watch the group's Leases and, once this replica has seen them all, take the member Lease and
        start assigning (deciding on a partial view would take units from live holders' hands)."""
        self._started_at = time.monotonic()
        self._group.informer.start()
        self._supervisor.spawn("shard coordinator", self._run)

    async def stop(self) -> None:
        """Leave: delete the member Lease, hand every unit over (stopped, drained, released), stop watching."""
        self._closing = True
        await self._supervisor.cancel("shard coordinator")  # it never waits on a request: nothing is cut short
        if self._group.member is not None:
            self._request(self._group.leave(self._group.member), "leave")
        # The loop's work, until every unit is handed over: held Leases are still renewed while their units drain
        # (and takes in flight land, to be handed over in turn).
        while self._requests or any((u.held is not None or u.task is not None or u.taking) and
                                    u.name not in self._stuck_units for u in self._units.values()):
            self._wake.clear()
            self._tick()
            await wait_first(self._wake.wait(), timeout=self.config.retry_period / 4)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._group.informer.stop()

    def fence_for(self, unit: str) -> UnitFence | None:
        """The fence of ``unit`` while this replica owns it (taken, starting or running), else None."""
        u = self._units.get(unit)
        if u is None or u.held is None or u.state not in OWNED:
            return None
        fence = u.held.fence
        return fence if isinstance(fence, UnitFence) else None

    def live_members(self, now: float | None = None) -> list[str]:
        """The members seen renewing within their lease duration, this replica included while it renews."""
        return self._group.live_members(time.monotonic() if now is None else now, not self._closing)

    def health(self) -> list[HealthItem]:
        """Unhealthy at once when the credentials may not list, watch or write the group's Leases (RBAC: no wait
        makes that better), and while they cannot be listed for another reason for three lease durations: this
        replica can then take no unit, and nothing else would say why."""
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
        """Members, every known unit (state here, holder seen, assigned member), and handovers in progress."""
        members = self.live_members()
        units = []
        for name in sorted(set(self.units.names()) | set(self._units)):
            u = self._units.get(name)
            seen = self._group.seen.get(u.lease) if u is not None else None
            state = u.state if u is not None else UnitState.ELSEWHERE
            if u is not None and state in OWNED and (u.held is None or not u.held.fence.valid()):
                state = UnitState.STOPPING  # its fence has closed: the next tick stops it
            units.append({"unit": name, "state": state.value,
                          "holder": seen.holder if seen is not None else "",
                          "transitions": seen.transitions if seen is not None else None,
                          "assigned": u.assigned if u is not None else ""})
        return {"group": self.config.group, "kind": self.units.kind, "identity": self.identity,
                "leases_synced": self._group.watching.has_synced(),
                "members": [{"identity": m, "self": m == self.identity} for m in members],
                "owned": sum(1 for u in units if u["state"] in OWNED),
                "units": units,
                "handovers": [u["unit"] for u in units if u["state"] == UnitState.HANDING_OVER],
                "stuck": list(self.stuck)}

    def unit_view(self, name: str, now: float) -> tuple[UnitState, bool]:
        """Unit ``name``'s state here, and whether no live holder renews its Lease (for the metrics)."""
        u = self._units.get(name)
        seen = self._group.seen.get(u.lease if u is not None else unit_lease(self.config.group, name))
        free = seen is None or not seen.holder or seen.expired(now, self.config.lease_duration)
        return (u.state if u is not None else UnitState.ELSEWHERE), free

    def _lost(self, lease: str) -> None:
        """A Lease was deleted while held: if ours, over now."""
        unit = next((u for u in self._units.values() if u.lease == lease), None)
        if unit is not None and unit.held is not None:
            unit.held.lose()

    # -- the loop --------------------------------------------------------------------------------------------
    async def _run(self, _: Any) -> None:
        await self._group.watching.wait_for_sync()
        self._group.listed()
        while True:
            self._wake.clear()
            self._tick()
            await wait_first(self._wake.wait(), timeout=self.config.retry_period / 4)

    def _tick(self) -> None:
        """One round of decisions; every request it makes runs as a task of its own."""
        now = time.monotonic()
        cfg, group = self.config, self._group
        if not self._closing:
            if group.member is None and not self._joining and now >= self._join_after:
                self._request(self._join(), "join")
            elif group.member is not None:
                self._renew_if_due(group.member, now)
        for u in self._units.values():
            if u.held is not None:
                if u.state in OWNED and not u.held.fence.valid():
                    self._end(u, release=False, why=f"its Lease was not renewed within renew_deadline "
                              f"({cfg.renew_deadline:g}s) or was taken")
                else:
                    self._renew_if_due(u.held, now)
        if now < group.settled_at and not self._closing:
            return
        names = self.units.names()
        members = self.live_members(now)
        live = self.identity in members
        owners = self._assign(names, members) if live else {}
        self._prepare(frozenset(n for n, owner in owners.items() if owner == self.identity))
        for name in sorted(names | set(self._units)):
            u = self._units.get(name) or self._units.setdefault(name, Unit(name, unit_lease(cfg.group, name)))
            if owners.get(name, "") != u.assigned:
                u.assigned, u.unowned_since = owners.get(name, ""), None  # a new assignee gets a whole chance
            if u.held is not None and u.state in OWNED:
                if u.assigned == self.identity:
                    u.rescued = False  # ours by assignment now: it moves with the assignment again
                if self._closing or name not in names:
                    self._end(u, release=True, why="this replica is stopping" if self._closing else "it is gone")
                elif live and u.assigned and u.assigned != self.identity and now - u.since >= cfg.min_hold and \
                        (not u.rescued or group.knows(u.assigned, names)) and group.settled(u.assigned, now):
                    self._end(u, release=True, why=f"assigned to {u.assigned}")
            elif u.held is None and u.task is None and not u.taking:
                if self._closing or self.stuck or name not in names:  # stuck: the process is about to exit
                    u.state = UnitState.ELSEWHERE
                    if name not in names:
                        del self._units[name]
                    continue
                fresh, current = group.current(u.lease)
                seen = group.seen.get(u.lease)
                if u.assigned == self.identity:
                    u.state, u.unowned_since = UnitState.WAITING, None
                    if fresh and (seen is None or seen.free(self.identity, now, cfg.lease_duration)):
                        self._take_soon(u, current)
                else:
                    u.state = UnitState.ELSEWHERE
                    # Its assignee did not take it for a whole lease duration after it was seen free (or without
                    # a Lease at all): members that disagree on the units (a rollout adding a controller, a Secret
                    # not seen everywhere yet) could each leave it to the other. Any live member rescues it. The
                    # clock runs only once the assignee decides: a member that just joined, or came back from a
                    # pause, judges every Lease afresh and may take this one only a lease duration after that.
                    if seen is not None and seen.holder and not seen.expired(now, cfg.lease_duration) or \
                            not group.settled(u.assigned, now):
                        u.unowned_since = None
                    elif u.unowned_since is None:
                        u.unowned_since = now
                    elif live and fresh and now - u.unowned_since >= cfg.lease_duration:
                        self._take_soon(u, current, rescue=True)
        if not self._closing:
            self._collect_members(now)

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

    # -- Leases and units ------------------------------------------------------------------------------------
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

    def _take_soon(self, u: Unit, current: LeaseRecord | None, rescue: bool = False) -> None:
        u.taking = True
        self._request(self._take(u, current, rescue), f"take unit {u.name}")

    async def _take(self, u: Unit, current: LeaseRecord | None, rescue: bool) -> None:
        """Take ``u``'s Lease, writing over exactly the ``current`` record the decision was made on."""
        try:
            wrote = await self._group.take(u.lease, u.name, current)
            if wrote.record is None:
                return
            fence = UnitFence(u.name, self.identity, wrote.record.transitions, self.config.renew_deadline)
            fence.renewed(wrote.sent)
            u.held, u.since, u.state, u.rescued = Held(wrote.record, fence), wrote.sent, UnitState.STARTING, rescue
            u.unowned_since = None  # once handed on, it is free anew: its next assignee gets a whole chance
            if current is not None and not current.holder:
                HANDOVERS.labels("in").inc()
            self._log.info("took unit {} (Lease {}, transitions {}){}", u.name, u.lease, fence.transitions,
                           f"; nobody took it for {self.config.lease_duration:g}s" if rescue else "")
            u.task = self._spawn(self._start(u, fence), f"start unit {u.name}")
        finally:
            u.taking = False
            self._wake.set()

    async def _start(self, u: Unit, fence: UnitFence) -> None:
        try:
            await self.units.start(u.name, fence)
        except Exception:
            self._log.exception("unit {} failed to start; it stays here, stopped, until it is handed over", u.name)
            if u.state == UnitState.STARTING:
                u.state = UnitState.FAILED
        else:
            if u.state == UnitState.STARTING:
                u.state = UnitState.RUNNING
        finally:
            if u.task is asyncio.current_task():
                u.task = None

    def _end(self, u: Unit, *, release: bool, why: str) -> None:
        """Stop ``u``; then release its Lease if ``release`` (a handover), or just forget it (a lost tenure)."""
        u.state = UnitState.HANDING_OVER if release else UnitState.STOPPING
        if release:
            self._log.info("handing unit {} over: {}", u.name, why)
        else:
            LOST.inc()
            self._log.warning("stopping unit {}: {}", u.name, why)
            if u.held is not None:
                u.held.lose()
        starting, u.task = u.task, None
        u.task = self._spawn(self._stop(u, starting, release), f"stop unit {u.name}")

    async def _stop(self, u: Unit, starting: asyncio.Task[None] | None, release: bool) -> None:
        began = time.monotonic()
        try:
            if starting is not None:
                starting.cancel()
                await asyncio.wait({starting})
            try:
                async with asyncio.timeout(self._stop_timeout):
                    stuck = await self.units.stop(u.name)
            except TimeoutError:
                stuck = [f"unit {u.name} (did not stop within {self._stop_timeout:g}s)"]
            except Exception as e:  # whether its work stopped is unknown: as unsafe as a stuck one
                self._log.opt(exception=e).error("stopping unit {} failed", u.name)
                stuck = [f"unit {u.name} (stopping failed: {describe_error(e)})"]
            if stuck:
                self.stuck += stuck
                self._stuck_units.add(u.name)
                self._log.error("unit {}: {} did not stop; its Lease is kept", u.name, ", ".join(stuck))
                self._on_stuck(stuck)
                return
            held = u.held
            if held is not None:
                valid = held.fence.valid()
                await self._group.close(held)
                if release and valid:  # the work has stopped: the new owner may start now
                    await self._group.release(held)
                    HANDOVERS.labels("out").inc()
                    HANDOVER_SECONDS.observe(time.monotonic() - began)
            u.held, u.state = None, UnitState.ELSEWHERE
        finally:
            if u.task is asyncio.current_task():
                u.task = None
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
