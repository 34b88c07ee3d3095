"""ShardCoordinator: the replicas of one deployment share its units of work (member clusters, or managed
controllers), each unit fenced by its own ``coordination.k8s.io`` Lease. Leader election is the one-unit case of
the same rules (``leader.py``, ``lease.py``).

- Membership: each replica holds a member Lease (``<group>-member-<hash>``, holder = its identity, pod name +
  uuid). The live members are those whose Lease record this replica has seen change within its duration, on its
  own monotonic clock, and since its first list of the Leases (one that died just before this replica started
  is not live); this replica counts itself while its own member Lease is renewed in time. A replica decides
  nothing for two retry periods after that first list, and the others hand it units only once they have known
  it that long. After its own renewals lapsed (an outage, a pause) a replica judges every Lease afresh the same
  way, so the first one back does not take every unit whose holder it could not see renewing; the others, once
  they have not seen its member Lease change for ``renew_deadline``, count it as new again when it does. Each
  member Lease carries a digest of the unit set its replica sees (``kube-syncer.io/shard-units``).
- Assignment: rendezvous hashing with bounded loads over the live members (``rendezvous.py``): every replica
  computes the same owner for every unit without talking to the others.
- Fencing: a replica starts a unit only after taking the unit's Lease, and its fence (``lease.RenewFence``:
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
import enum
import hashlib
import math
import re
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Protocol

from loguru import logger
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric

from informers import GVR, ApiClient, ApiError, FuncHandler, SharedIndexInformer, Supervisor
from informers.client import CONNECTION_ERRORS
from informers.errors import describe_error
from informers.metrics import MetricSet
from informers.store import DeletedFinalStateUnknown, Obj
from informers.wait import wait_first

from .lease import (
    LEASES_PATH, Observation, RenewFence, holder_spec, lease_body, lease_seconds, now_micro, released_spec,
)
from .rendezvous import assign
from .settings import Sharding, UnitKind

LEASES = GVR("coordination.k8s.io", "v1", "leases")
GROUP_LABEL = "kube-syncer.io/shard-group"
ROLE_LABEL = "kube-syncer.io/shard-role"
UNIT_ANNOTATION = "kube-syncer.io/shard-unit"
UNITS_ANNOTATION = "kube-syncer.io/shard-units"  # on a member Lease: a digest of the unit set that member sees
# How RBAC words a refusal ('User "x" cannot create resource "leases" in API group ...'): the verb it names.
_RBAC_DENIAL = re.compile(r'cannot (\w+) resource "leases"')
_HANDOVERS = Counter("syncer_shard_handovers_total", "Units this replica handed over (out) or took from a "
                     "release (in).", ["direction"])
_LOST = Counter("syncer_shard_units_lost_total", "Units this replica stopped because their Lease was not renewed "
                "in time or was taken.")
_HANDOVER_SECONDS = Histogram("syncer_shard_handover_seconds", "From deciding to hand a unit over to releasing "
                              "its Lease (stop and drain included).", buckets=(.05, .1, .25, .5, 1, 2.5, 5, 10, 30))


class UnitState(enum.StrEnum):
    """A unit as this replica sees it."""

    ELSEWHERE = "elsewhere"  # assigned to another member
    WAITING = "waiting"  # assigned here; its Lease still held by another (not yet released or expired)
    STARTING = "starting"  # its Lease taken here, its work starting
    RUNNING = "running"
    FAILED = "failed"  # its Lease taken here, its start raised (see the log); it is handed over like any other
    HANDING_OVER = "handing-over"  # assigned elsewhere or gone: stopping, then the Lease is released
    STOPPING = "stopping"  # its Lease not renewed in time: stopping, nothing released


_OWNED = (UnitState.STARTING, UnitState.RUNNING, UnitState.FAILED)


class Units(Protocol):
    """What is spread: ``names()`` now, and how one is started (under its fence) and stopped."""

    kind: UnitKind

    def names(self) -> set[str]: ...

    async def start(self, unit: str, fence: "UnitFence") -> None: ...

    async def stop(self, unit: str) -> list[str]:
        """Stop the unit's work (drained); the names of controllers that did not stop in time."""
        ...


class UnitFence(RenewFence):
    """The fence of one tenure of a unit: ``unit``, the ``holder`` identity and the Lease's ``transitions`` when
    it was taken (so a write can carry which tenure made it)."""

    def __init__(self, unit: str, holder: str, transitions: int, renew_deadline: float) -> None:
        super().__init__(renew_deadline)
        self.unit, self.holder, self.transitions = unit, holder, transitions


@dataclass
class _Held:
    """A Lease this replica holds: the object as last written, and its fence. ``closed``: renewed no more (its
    tenure was lost, or it is about to be released)."""

    obj: Obj
    fence: RenewFence
    renewing: asyncio.Task[None] | None = None
    closed: bool = False
    next_try: float = 0.0


@dataclass
class _Unit:
    name: str
    lease: str
    state: UnitState = UnitState.ELSEWHERE
    assigned: str = ""
    held: _Held | None = None
    since: float = 0.0  # when this replica took it
    task: asyncio.Task[None] | None = None  # its start or stop
    taking: bool = field(default=False)
    unowned_since: float | None = None  # since when it is free here, assigned to one settled member elsewhere
    rescued: bool = False  # taken while assigned elsewhere: kept until its assignee is seen to know the units


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
        self._ns = config.lease_namespace
        self._path = LEASES_PATH.format(namespace=self._ns)
        self._member_lease = _member_lease(config.group, identity)
        self._member: _Held | None = None
        self._joining = False
        self._join_after = 0.0
        self._denied = ""  # why the credentials may not write Leases (401, RBAC's 403), until a Lease write succeeds
        self._started_at = float("inf")
        self._seen: dict[str, Observation] = {}  # Lease name -> what this replica saw of it
        self._units: dict[str, _Unit] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._requests: set[asyncio.Task[None]] = set()  # takes and joins in flight
        self._collecting: set[str] = set()
        self._wake = asyncio.Event()
        self._closing = False
        self._listed_at = float("inf")  # when the first list of the Leases had been seen
        self._settled_at = float("inf")  # from then on, this replica decides
        self._assignment: tuple[tuple[frozenset[str], frozenset[str]], dict[str, str]] | None = None
        self._informer = SharedIndexInformer(client, LEASES, namespace=self._ns,
                                             label_selector=f"{GROUP_LABEL}={config.group}")
        self._watching = self._informer.add_event_handler(FuncHandler(
            lambda o, _i: self._saw(o), lambda _o, n: self._saw(n), self._gone), name="shards")
        self._log = logger.bind(shards=config.group, identity=identity)
        _Collector.for_registry(metrics_registry).coordinators.add(self)

    # -- public ------------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Join: watch the group's Leases and, once this replica has seen them all, take the member Lease and
        start assigning (deciding on a partial view would take units from live holders' hands)."""
        self._started_at = time.monotonic()
        self._informer.start()
        self._supervisor.spawn("shard coordinator", self._run)

    async def stop(self) -> None:
        """Leave: delete the member Lease, hand every unit over (stopped, drained, released), stop watching."""
        self._closing = True
        await self._supervisor.cancel("shard coordinator")  # it never waits on a request: nothing is cut short
        if self._member is not None:
            self._request(self._leave(self._member), "leave")
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
        await self._informer.stop()

    def fence_for(self, unit: str) -> UnitFence | None:
        """The fence of ``unit`` while this replica owns it (taken, starting or running), else None."""
        u = self._units.get(unit)
        if u is None or u.held is None or u.state not in _OWNED:
            return None
        fence = u.held.fence
        return fence if isinstance(fence, UnitFence) else None

    def live_members(self, now: float | None = None) -> list[str]:
        """The members seen renewing within their lease duration, this replica included while it renews."""
        now = time.monotonic() if now is None else now
        # Only a record seen to change since the first list proves a member alive: one that died shortly before
        # this replica started would otherwise count for a whole lease duration, and get units nobody takes.
        members = {o.holder for name, o in self._seen.items() if self._is_member(name) and o.holder and
                   o.at > self._listed_at and not o.expired(now, self.config.lease_duration)}
        members.discard(self.identity)
        if self._member is not None and self._member.fence.valid() and not self._closing:
            members.add(self.identity)
        return sorted(members)

    def health(self) -> list[dict[str, Any]]:
        """``{name, healthy, message}``: unhealthy at once when the credentials may not list, watch or write the
        group's Leases (RBAC: no wait makes that better), and while they cannot be listed for another reason for
        three lease durations: this replica can then take no unit, and nothing else would say why."""
        synced = self._watching.has_synced()
        late = time.monotonic() - self._started_at > 3 * self.config.lease_duration
        error = self._informer.reflector.last_error
        if isinstance(error, ApiError) and error.status in (401, 403):
            return [{"name": "shard coordinator", "healthy": False,
                     "message": f"cannot list or watch Leases in namespace {self._ns!r}: {describe_error(error)}"}]
        if self._denied:
            return [{"name": "shard coordinator", "healthy": False, "message": self._denied}]
        return [{"name": "shard coordinator", "healthy": synced or not late,
                 "message": "watching the group's Leases" if synced else
                 f"cannot list Leases in namespace {self._ns!r}: {error or 'no answer yet'}"}]

    def _refused(self, e: BaseException | None) -> None:
        """Note the outcome of a Lease write: a refusal for the credentials (401, or RBAC's 403, which names the
        verb; a quota's or an admission policy's 403 is not about them), or a success (``e`` None), which clears it:
        any write that goes through shows the credentials work."""
        if e is None:
            self._denied = ""
        elif isinstance(e, ApiError) and (e.status == 401 or e.status == 403 and _RBAC_DENIAL.search(e.message)):
            found = _RBAC_DENIAL.search(e.message)
            verb = found.group(1) if found else "write"
            self._denied = f"cannot {verb} Leases in namespace {self._ns!r}: {describe_error(e)}"

    def status(self) -> dict[str, Any]:
        """Members, every known unit (state here, holder seen, assigned member), and handovers in progress."""
        members = self.live_members()
        units = []
        for name in sorted(set(self.units.names()) | set(self._units)):
            u = self._units.get(name)
            seen = self._seen.get(u.lease) if u is not None else None
            state = u.state if u is not None else UnitState.ELSEWHERE
            if u is not None and state in _OWNED and (u.held is None or not u.held.fence.valid()):
                state = UnitState.STOPPING  # its fence has closed: the next tick stops it
            units.append({"unit": name, "state": state.value,
                          "holder": seen.holder if seen is not None else "",
                          "transitions": seen.transitions if seen is not None else None,
                          "assigned": u.assigned if u is not None else ""})
        return {"group": self.config.group, "kind": self.units.kind, "identity": self.identity,
                "leases_synced": self._watching.has_synced(),
                "members": [{"identity": m, "self": m == self.identity} for m in members],
                "owned": sum(1 for u in units if u["state"] in _OWNED),
                "units": units,
                "handovers": [u["unit"] for u in units if u["state"] == UnitState.HANDING_OVER],
                "stuck": list(self.stuck)}

    # -- observing -------------------------------------------------------------------------------------------
    def _is_member(self, lease: str) -> bool:
        return lease.startswith(f"{self.config.group}-member-")

    def _saw(self, obj: Obj) -> None:
        name = obj["metadata"]["name"]
        seen = self._seen.setdefault(name, Observation())
        holder, member = seen.holder, self._is_member(name)
        # A member not seen renewing for renew_deadline has (most likely) let its own fence lapse: back, it judges
        # every Lease afresh, as a new member does, and is settled only two retry periods later.
        if seen.see(obj.get("spec"), restart_after=self.config.renew_deadline if member else math.inf) and \
                (seen.holder != holder or member) or not holder:
            self._wake.set()  # a holder changed, a member renewed: not every unit renewal wakes the loop

    def _gone(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        name = (obj.key if isinstance(obj, DeletedFinalStateUnknown) else
                f"{self._ns}/{obj['metadata']['name']}").rpartition("/")[2]
        seen = self._seen.get(name)
        if self._is_member(name) or seen is None or not seen.holder:
            self._seen.pop(name, None)
        else:
            # Deleted while held (a cleanup, kubectl): its holder may still work until it notices, so whoever
            # recreates it waits for what it said to expire, as if it were still there.
            seen.deleted, seen.at = True, time.monotonic()
            unit = next((u for u in self._units.values() if u.lease == name), None)
            if unit is not None and unit.held is not None:  # ours: over now
                unit.held.closed, unit.held.fence.held = True, False
        self._wake.set()

    def _current(self, lease: str) -> tuple[bool, Obj | None]:
        """Whether this replica's view of ``lease`` is up to date with its cache, and the cached object. A take is
        only decided on a view that is (the cache is filled before its handlers run: a decision made on the older
        view and written over the newer object would pass the resourceVersion check)."""
        current = self._informer.lister.get(lease, self._ns)
        seen = self._seen.get(lease)
        if current is None:
            return seen is None or seen.deleted, None
        return seen is not None and not seen.deleted and seen.matches(current.get("spec")), current

    # -- the loop --------------------------------------------------------------------------------------------
    async def _run(self, _: Any) -> None:
        await self._watching.wait_for_sync()
        if self._listed_at == float("inf"):
            self._listed_at = time.monotonic()
            # Live members renew every retry_period: after two, every live one has shown itself.
            self._settled_at = self._listed_at + 2 * self.config.retry_period
        while True:
            self._wake.clear()
            self._tick()
            await wait_first(self._wake.wait(), timeout=self.config.retry_period / 4)

    def _tick(self) -> None:
        """One round of decisions; every request it makes runs as a task of its own."""
        now = time.monotonic()
        cfg = self.config
        if not self._closing:
            if self._member is None and not self._joining and now >= self._join_after:
                self._request(self._join(), "join")
            elif self._member is not None:
                self._renew_if_due(self._member_lease, self._member, None, now)
        for u in self._units.values():
            if u.held is not None:
                if u.state in _OWNED and not u.held.fence.valid():
                    self._end(u, release=False, why=f"its Lease was not renewed within renew_deadline "
                              f"({cfg.renew_deadline:g}s) or was taken")
                else:
                    self._renew_if_due(u.lease, u.held, u, now)
        if now < self._settled_at and not self._closing:
            return
        names = self.units.names()
        members = self.live_members(now)
        live = self.identity in members
        owners = self._assign(names, members) if live else {}
        for name in sorted(names | set(self._units)):
            u = self._units.get(name) or self._units.setdefault(name, _Unit(name, _unit_lease(cfg.group, name)))
            if owners.get(name, "") != u.assigned:
                u.assigned, u.unowned_since = owners.get(name, ""), None  # a new assignee gets a whole chance
            if u.held is not None and u.state in _OWNED:
                if u.assigned == self.identity:
                    u.rescued = False  # ours by assignment now: it moves with the assignment again
                if self._closing or name not in names:
                    self._end(u, release=True, why="this replica is stopping" if self._closing else "it is gone")
                elif live and u.assigned and u.assigned != self.identity and now - u.since >= cfg.min_hold and \
                        (not u.rescued or self._knows(u.assigned, names)) and self._settled(u.assigned, now):
                    self._end(u, release=True, why=f"assigned to {u.assigned}")
            elif u.held is None and u.task is None and not u.taking:
                if self._closing or self.stuck or name not in names:  # stuck: the process is about to exit
                    u.state = UnitState.ELSEWHERE
                    if name not in names:
                        del self._units[name]
                    continue
                fresh, current = self._current(u.lease)
                seen = self._seen.get(u.lease)
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
                            not self._settled(u.assigned, now):
                        u.unowned_since = None
                    elif u.unowned_since is None:
                        u.unowned_since = now
                    elif live and fresh and now - u.unowned_since >= cfg.lease_duration:
                        self._take_soon(u, current, rescue=True)
        if not self._closing:
            self._collect_members(now)

    def _settled(self, member: str, now: float) -> bool:
        """Whether ``member`` has been a member long enough to decide, hence to take what is handed to it (a new
        replica, or one whose renewals lapsed, decides nothing for two retry periods after its first list of the
        Leases or its return; until then a unit released to it would run nowhere)."""
        seen = self._seen.get(_member_lease(self.config.group, member))
        return seen is not None and seen.since is not None and now - seen.since >= 2 * self.config.retry_period

    def _knows(self, member: str, names: set[str]) -> bool:
        """Whether ``member``'s Lease says it sees the same units as this replica: then it computes the same
        assignment, and takes a unit handed to it. A rescued unit goes back only then (handing it to a member
        that does not know it would leave it unowned again)."""
        lease = self._informer.lister.get(_member_lease(self.config.group, member), self._ns)
        annotations = (lease or {}).get("metadata", {}).get("annotations") or {}
        return annotations.get(UNITS_ANNOTATION) == _units_digest(names)

    def _advertised(self, obj: Obj) -> Obj:
        """``obj``, this replica's member Lease, saying which units this replica sees (``_knows``)."""
        meta = obj["metadata"]
        annotations = {**(meta.get("annotations") or {}), UNITS_ANNOTATION: _units_digest(self.units.names())}
        return {**obj, "metadata": {**meta, "annotations": annotations}}

    def _assign(self, names: set[str], members: list[str]) -> dict[str, str]:
        key = (frozenset(names), frozenset(members))
        if self._assignment is None or self._assignment[0] != key:
            self._assignment = (key, assign(names, members))
        return self._assignment[1]

    def _request(self, work: Any, name: str) -> None:
        task = self._spawn(work, name)
        self._requests.add(task)
        task.add_done_callback(self._requests.discard)

    # -- Leases ----------------------------------------------------------------------------------------------
    async def _join(self) -> None:
        self._joining = True
        try:
            spec = holder_spec(None, self.identity, self.config.lease_duration)
            sent = time.monotonic()
            body = self._advertised(lease_body(self._ns, self._member_lease, spec, {
                GROUP_LABEL: self.config.group, ROLE_LABEL: "member"}))
            try:
                obj = await self.client.request("POST", self._path, timeout=self.config.renew_deadline, body=body)
            except ApiError as e:
                if e.status != 409:
                    raise
                # Ours already (a create whose answer was lost, a Lease someone else wrote to): take it over.
                current = await self.client.request("GET", f"{self._path}/{self._member_lease}",
                                                    timeout=self.config.renew_deadline)
                sent = time.monotonic()
                obj = await self.client.request("PUT", f"{self._path}/{self._member_lease}", body=self._advertised({
                    **current, "spec": holder_spec(current.get("spec"), self.identity, self.config.lease_duration)}),
                    timeout=self.config.renew_deadline)
        except (ApiError, *CONNECTION_ERRORS) as e:
            self._log.warning("cannot create member Lease {}/{}: {}", self._ns, self._member_lease, describe_error(e))
            self._refused(e)
            self._join_after = time.monotonic() + self.config.retry_period
            return
        finally:
            self._joining = False
        self._refused(None)
        fence = RenewFence(self.config.renew_deadline)
        fence.renewed(sent)
        self._member = _Held(obj, fence)
        self._log.info("joined shard group {} as {}", self.config.group, self.identity)
        self._wake.set()

    def _renew_if_due(self, name: str, held: _Held, unit: _Unit | None, now: float) -> None:
        if not held.closed and held.renewing is None and now >= held.next_try:
            held.next_try = now + self.config.retry_period  # failed or not, the next try is one period on
            held.renewing = self._spawn(self._renew(name, held, unit), f"renew {name}")

    async def _renew(self, name: str, held: _Held, unit: _Unit | None) -> None:
        try:
            spec = {**held.obj["spec"], "renewTime": now_micro(),
                    "leaseDurationSeconds": lease_seconds(self.config.lease_duration)}
            sent = time.monotonic()
            # Bounded by what the fence has left (an answer after that cannot keep it), but never so short that
            # a slow server cannot answer at all.
            timeout = min(self.config.renew_deadline, max(held.fence.remaining(), self.config.retry_period))
            try:
                body = {**held.obj, "spec": spec}
                obj = await self.client.request("PUT", f"{self._path}/{name}", timeout=timeout,
                                                body=self._advertised(body) if unit is None else body)
            except ApiError as e:
                current = self._informer.lister.get(name, self._ns)
                if e.status in (404, 409) and (current is None or (current.get("spec") or {}).get(
                        "holderIdentity") != self.identity):
                    held.closed, held.fence.held = True, False  # taken or deleted: over now, not at the deadline
                    if unit is None and held is self._member:
                        self._member = None  # rejoin, on a fresh view (ours was not renewed: others moved on)
                        self._restart_clocks(time.monotonic())
                    self._wake.set()
                elif e.status == 409 and current is not None:
                    held.obj = current  # still ours, a stale resourceVersion: the next round writes over it
                else:
                    self._log.warning("cannot renew Lease {}: {}", name, e)
                    self._refused(e)
                return
            except CONNECTION_ERRORS as e:
                self._log.warning("cannot reach the API server to renew Lease {}: {}", name, describe_error(e))
                return
            self._refused(None)
            held.obj = obj
            lapsed = not held.fence.valid()
            if unit is None and not held.closed:  # membership goes on, on a fresh view if it had lapsed
                held.fence.renewed(sent)
                if lapsed:
                    self._restart_clocks(time.monotonic())
            elif not held.closed and not lapsed:
                held.fence.renewed(sent)
            # A unit's tenure that lapsed is never revived: its workers have parked, and the loop stops it.
            self._saw_own(name, obj, sent)
        finally:
            held.renewing = None

    def _saw_own(self, name: str, obj: Obj, at: float) -> None:
        """Record a Lease as this replica wrote it, unless the watch already brought a newer version."""
        cached = self._informer.lister.get(name, self._ns)
        if cached is not None and _version(cached) > _version(obj):
            return
        self._seen.setdefault(name, Observation()).see(obj.get("spec"), at)

    def _restart_clocks(self, now: float) -> None:
        """This replica could not renew (nor, likely, watch) for longer than ``renew_deadline``: what it saw before
        says nothing about who renewed meanwhile. Every Lease counts as just seen, as at a first list, so that the
        first replica back does not take every unit whose holder it could not see renewing."""
        self._log.warning("could not renew its member Lease for over {:g}s: judging every Lease afresh",
                          self.config.renew_deadline)
        for seen in self._seen.values():
            seen.at = max(seen.at, now)
        self._listed_at = now
        self._settled_at = now + 2 * self.config.retry_period

    def _take_soon(self, u: _Unit, current: Obj | None, rescue: bool = False) -> None:
        u.taking = True
        self._request(self._take(u, current, rescue), f"take unit {u.name}")

    async def _take(self, u: _Unit, current: Obj | None, rescue: bool) -> None:
        """Take ``u``'s Lease, writing over exactly the ``current`` object the decision was made on."""
        try:
            seen = self._seen.get(u.lease)
            previous = current.get("spec") if current is not None else (
                {"holderIdentity": seen.holder, "leaseTransitions": seen.transitions} if seen is not None else None)
            spec = holder_spec(previous, self.identity, self.config.lease_duration)
            released = current is not None and not (current.get("spec") or {}).get("holderIdentity")
            sent = time.monotonic()
            try:
                if current is None:
                    obj = await self.client.request("POST", self._path, timeout=self.config.renew_deadline,
                                                    body=lease_body(self._ns, u.lease, spec, {
                                                        GROUP_LABEL: self.config.group, ROLE_LABEL: "unit"},
                                                        {UNIT_ANNOTATION: u.name}))
                else:
                    obj = await self.client.request("PUT", f"{self._path}/{u.lease}", body={**current, "spec": spec},
                                                    timeout=self.config.renew_deadline)
            except ApiError as e:
                if e.status != 409:  # 409: another replica wrote first (or our cache is behind); the watch tells
                    self._log.warning("cannot take Lease {} of unit {}: {}", u.lease, u.name, e)
                    self._refused(e)
                return
            except CONNECTION_ERRORS as e:
                self._log.warning("cannot reach the API server to take unit {}: {}", u.name, describe_error(e))
                return
            self._refused(None)
            fence = UnitFence(u.name, self.identity, int(obj["spec"].get("leaseTransitions") or 0),
                              self.config.renew_deadline)
            fence.renewed(sent)
            self._saw_own(u.lease, obj, sent)
            u.held, u.since, u.state, u.rescued = _Held(obj, fence), sent, UnitState.STARTING, rescue
            u.unowned_since = None  # once handed on, it is free anew: its next assignee gets a whole chance
            if released:
                _HANDOVERS.labels("in").inc()
            self._log.info("took unit {} (Lease {}, transitions {}){}", u.name, u.lease, fence.transitions,
                           f"; nobody took it for {self.config.lease_duration:g}s" if rescue else "")
            u.task = self._spawn(self._start(u, fence), f"start unit {u.name}")
        finally:
            u.taking = False
            self._wake.set()

    async def _start(self, u: _Unit, fence: UnitFence) -> None:
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

    def _end(self, u: _Unit, *, release: bool, why: str) -> None:
        """Stop ``u``; then release its Lease if ``release`` (a handover), or just forget it (a lost tenure)."""
        u.state = UnitState.HANDING_OVER if release else UnitState.STOPPING
        if release:
            self._log.info("handing unit {} over: {}", u.name, why)
        else:
            _LOST.inc()
            self._log.warning("stopping unit {}: {}", u.name, why)
            if u.held is not None:
                u.held.closed, u.held.fence.held = True, False
        starting, u.task = u.task, None
        u.task = self._spawn(self._stop(u, starting, release), f"stop unit {u.name}")

    async def _stop(self, u: _Unit, starting: asyncio.Task[None] | None, release: bool) -> None:
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
                await self._close(held)
                if release and valid:  # the work has stopped: the new owner may start now
                    await self._release(u.lease, held)
                    _HANDOVERS.labels("out").inc()
                    _HANDOVER_SECONDS.observe(time.monotonic() - began)
            u.held, u.state = None, UnitState.ELSEWHERE
        finally:
            if u.task is asyncio.current_task():
                u.task = None
            self._wake.set()

    async def _leave(self, member: _Held) -> None:
        await self._close(member)
        await self._delete(self._member_lease, member.obj)

    async def _close(self, held: _Held) -> None:
        """No more renewals of ``held`` (one in flight is awaited: it must not write after a release)."""
        held.closed = True
        if held.renewing is not None:
            await asyncio.wait({held.renewing})
        held.fence.held = False

    async def _release(self, name: str, held: _Held) -> None:
        obj = held.obj
        for _ in range(3):
            try:
                obj = await self.client.request("PUT", f"{self._path}/{name}", timeout=self.config.renew_deadline,
                                                body={**obj, "spec": released_spec(obj["spec"])})
                self._saw_own(name, obj, time.monotonic())
                return
            except ApiError as e:
                if e.status != 409:
                    self._log.warning("cannot release Lease {}: {}", name, e)
                    return
                try:  # written meanwhile: release it still if it is ours
                    obj = await self.client.request("GET", f"{self._path}/{name}", timeout=self.config.renew_deadline)
                except (ApiError, *CONNECTION_ERRORS) as e2:
                    self._log.warning("cannot release Lease {}: {}", name, describe_error(e2))
                    return
                if (obj.get("spec") or {}).get("holderIdentity") != self.identity:
                    return
            except CONNECTION_ERRORS as e:  # its new owner takes it once it expires
                self._log.warning("cannot release Lease {}: {}", name, describe_error(e))
                return

    async def _delete(self, name: str, obj: Obj, *, unchanged: bool = False) -> None:
        """Delete Lease ``name`` if it is still the object ``obj`` (by uid; ``unchanged``: not even renewed since)."""
        preconditions = {"uid": obj["metadata"].get("uid")}
        if unchanged:
            preconditions["resourceVersion"] = obj["metadata"].get("resourceVersion")
        try:
            await self.client.request("DELETE", f"{self._path}/{name}", timeout=self.config.renew_deadline, body={
                "preconditions": preconditions})
        except ApiError as e:
            if e.status not in (404, 409):
                self._log.warning("cannot delete Lease {}: {}", name, e)
        except CONNECTION_ERRORS as e:
            self._log.warning("cannot delete Lease {}: {}", name, describe_error(e))

    def _collect_members(self, now: float) -> None:
        """Delete member Leases not renewed for ten lease durations (replicas that died without leaving)."""
        for name, seen in list(self._seen.items()):
            if self._is_member(name) and name != self._member_lease and name not in self._collecting and \
                    seen.free_for(now, self.config.lease_duration) >= 10 * self.config.lease_duration:
                current = self._informer.lister.get(name, self._ns)
                if current is not None and seen.matches(current.get("spec")):
                    self._collecting.add(name)
                    self._spawn(self._collect(name, current), f"collect {name}")

    async def _collect(self, name: str, obj: Obj) -> None:
        try:
            await self._delete(name, obj, unchanged=True)  # a replica that just resumed keeps its Lease
        finally:
            self._collecting.discard(name)

    def _spawn(self, work: Any, name: str) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task


def _version(obj: Obj) -> int:
    try:
        return int(obj["metadata"].get("resourceVersion") or 0)
    except ValueError:  # not etcd's integers: no order to rely on
        return 0


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def _units_digest(names: set[str]) -> str:
    return _digest("\0".join(sorted(names)))


def _member_lease(group: str, identity: str) -> str:
    return f"{group}-member-{_digest(identity)}"


def _unit_lease(group: str, unit: str) -> str:
    """The Lease name of ``unit``: readable, and unique by the hash whatever the unit is called."""
    slug = re.sub(r"[^a-z0-9.-]+", "-", unit.lower()).strip("-.")[:40].strip("-.")
    return f"{group}-unit-{slug + '-' if slug else ''}{_digest(unit)}"



class _Collector(MetricSet):
    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.coordinators: "weakref.WeakSet[ShardCoordinator]" = weakref.WeakSet()
        registry.register(self)

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
                u = c._units.get(name)
                counts[(u.state if u is not None else UnitState.ELSEWHERE).value] += 1
                seen = c._seen.get(u.lease if u is not None else _unit_lease(c.config.group, name))
                free += seen is None or not seen.holder or seen.expired(now, c.config.lease_duration)
        for state, n in counts.items():
            units.add_metric([state], n)
        unowned.add_metric([], free)
        members.add_metric([], live)
        yield from (units, unowned, members)
