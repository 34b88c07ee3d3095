"""ShardGroup: the Leases of one shard group as a replica sees and writes them: one watch of them all, what was
observed of each and when, the membership that follows, and every Lease write of the coordinator.

- Names: ``<group>-member-<hash>``, ``<group>-bucket-<NN>-of-<MM>`` (Knative's), or ``<group>-unit-<slug>-<hash>``.
  A member Lease carries a digest of the buckets its replica sees and its bucket count, so replicas that disagree
  never both take.
- Live members: Lease records seen changing within their duration on this replica's monotonic clock, since its
  first list. After its own renewals lapsed a replica judges every Lease afresh, and the others count it as new.
- A deleted Lease counts until what it said expires; dead members' Leases are deleted after ten durations.
- Credentials refused Lease writes (401/403) are remembered for health until a write succeeds.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import re
import time
from typing import Callable

from loguru import logger

from informers import ApiClient, ApiError, FuncHandler, SharedIndexInformer
from informers.errors import describe_error
from informers.store import DeletedFinalStateUnknown, Obj, deleted_key

from ..fences import RenewFence
from ..lease import LEASES, LeaseLock, LeaseRecord, LeaseResult, Observation, Outcome
from ..settings import Sharding
from .state import Held

GROUP_LABEL = "kube-syncer.io/shard-group"
ROLE_LABEL = "kube-syncer.io/shard-role"
UNIT_ANNOTATION = "kube-syncer.io/shard-unit"
UNITS_ANNOTATION = "kube-syncer.io/shard-units"  # on a member Lease: a digest of the buckets that member sees
BUCKETS_ANNOTATION = "kube-syncer.io/shard-buckets"  # on a member Lease: into how many buckets it hashes units
# How RBAC words a refusal ('User "x" cannot create resource "leases" in API group ...'): the verb it names.
_RBAC_DENIAL = re.compile(r'cannot (\w+) resource "leases"')


def digest(text: str) -> str:
    """A short stable hash of ``text``, as Lease names carry it."""
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def units_digest(names: set[str]) -> str:
    return digest("\0".join(sorted(names)))


def member_lease(group: str, identity: str) -> str:
    return f"{group}-member-{digest(identity)}"


def bucket_lease(group: str, bucket: str, count: int) -> str:
    """The Lease name of ``bucket`` (``rendezvous.bucket_of(unit, count)``); with no buckets (``count`` 0), of the
    unit it names: readable, and unique by the hash whatever the unit is called."""
    if count:
        return f"{group}-bucket-{bucket}"
    unit = bucket
    slug = re.sub(r"[^a-z0-9.-]+", "-", unit.lower()).strip("-.")[:40].strip("-.")
    return f"{group}-unit-{slug + '-' if slug else ''}{digest(unit)}"


class ShardGroup:
    """The group ``config.group``'s Leases for replica ``identity``, which hashes units into ``buckets`` (0: a
    Lease per unit). ``bucket_names()`` is the bucket set it advertises; ``on_lost(lease)`` is told when a Lease
    it holds is deleted; ``wake`` is set whenever something the coordinator decides on has changed. Its coroutines
    are run as tasks by the coordinator."""

    def __init__(self, client: ApiClient, config: Sharding, identity: str, buckets: int,
                 bucket_names: Callable[[], set[str]], on_lost: Callable[[str], None], wake: asyncio.Event) -> None:
        self.config = config
        self.identity = identity
        self.namespace = config.lease_namespace
        self.member_lease = member_lease(config.group, identity)
        self.buckets = buckets
        self.member: Held | None = None
        self.denied = ""  # why the credentials may not write Leases, until a Lease write succeeds
        self.seen: dict[str, Observation] = {}  # Lease name -> what this replica saw of it
        self.listed_at = float("inf")  # when the first list of the Leases had been seen
        self.settled_at = float("inf")  # from then on, this replica decides
        self._lock = LeaseLock(client, self.namespace)
        self._bucket_names = bucket_names
        self._on_lost = on_lost
        self._wake = wake
        self.informer = SharedIndexInformer(client, LEASES, namespace=self.namespace,
                                            label_selector=f"{GROUP_LABEL}={config.group}")
        self.watching = self.informer.add_event_handler(FuncHandler(
            lambda o, _i: self._saw(o), lambda _o, n: self._saw(n), self._gone), name="shards")
        self._log = logger.bind(shards=config.group, identity=identity)

    # -- observing -------------------------------------------------------------------------------------------
    def is_member(self, lease: str) -> bool:
        return lease.startswith(f"{self.config.group}-member-")

    def listed(self) -> None:
        """The first list of the Leases has been seen: live members renew every retry_period, so after two
        every live one has shown itself."""
        if self.listed_at == float("inf"):
            self.listed_at = time.monotonic()
            self.settled_at = self.listed_at + 2 * self.config.retry_period

    def _saw(self, obj: Obj) -> None:
        name = obj["metadata"]["name"]
        seen = self.seen.setdefault(name, Observation())
        holder, member = seen.holder, self.is_member(name)
        # A member not seen renewing for renew_deadline has (most likely) let its own fence lapse: back, it judges
        # every Lease afresh, as a new member does, and is settled only two retry periods later.
        if seen.see(LeaseRecord.of(obj), restart_after=self.config.renew_deadline if member else math.inf) and \
                (seen.holder != holder or member) or not holder:
            self._wake.set()  # a holder changed, a member renewed: not every unit renewal wakes the loop

    def _gone(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        name = deleted_key(obj).rpartition("/")[2]
        seen = self.seen.get(name)
        if self.is_member(name) or seen is None or not seen.holder:
            self.seen.pop(name, None)
        else:
            # Deleted while held (a cleanup, kubectl): its holder may still work until it notices, so whoever
            # recreates it waits for what it said to expire, as if it were still there.
            seen.deleted, seen.at = True, time.monotonic()
            self._on_lost(name)
        self._wake.set()

    def cached(self, lease: str) -> LeaseRecord | None:
        obj = self.informer.lister.get(lease, self.namespace)
        return LeaseRecord.of(obj) if obj is not None else None

    def current(self, lease: str) -> tuple[bool, LeaseRecord | None]:
        """Whether this replica's view of ``lease`` is up to date with its cache, and the cached record. A take is
        only decided on a view that is (the cache is filled before its handlers run: a decision made on the older
        view and written over the newer object would pass the resourceVersion check)."""
        current = self.cached(lease)
        seen = self.seen.get(lease)
        if current is None:
            return seen is None or seen.deleted, None
        return seen is not None and not seen.deleted and seen.matches(current), current

    def _saw_own(self, record: LeaseRecord, at: float) -> None:
        """Record a Lease as this replica wrote it, unless the watch already brought a newer version."""
        cached = self.cached(record.name)
        if cached is not None and cached.version > record.version:
            return
        self.seen.setdefault(record.name, Observation()).see(record, at)

    # -- membership ------------------------------------------------------------------------------------------
    def live_members(self, now: float, counting_self: bool) -> list[str]:
        """The members seen renewing within their lease duration; this replica too if ``counting_self`` and its
        member Lease is renewed in time."""
        # Only a record seen to change since the first list proves a member alive: one that died shortly before
        # this replica started would otherwise count for a whole lease duration, and get units nobody takes.
        members = {o.holder for name, o in self.seen.items() if self.is_member(name) and o.holder and
                   o.at > self.listed_at and not o.expired(now, self.config.lease_duration)}
        members.discard(self.identity)
        if counting_self and self.member is not None and self.member.fence.valid():
            members.add(self.identity)
        return sorted(members)

    def settled(self, member: str, now: float) -> bool:
        """Whether ``member`` has been a member long enough to decide, hence to take what is handed to it (a new
        replica, or one whose renewals lapsed, decides nothing for two retry periods after its first list of the
        Leases or its return; until then a unit released to it would run nowhere)."""
        seen = self.seen.get(member_lease(self.config.group, member))
        return seen is not None and seen.since is not None and now - seen.since >= 2 * self.config.retry_period

    def knows(self, member: str, names: set[str]) -> bool:
        """Whether ``member``'s Lease says it sees the same buckets as this replica: then it computes the same
        assignment, and takes a bucket handed to it. A rescued bucket goes back only then (handing it to a member
        that does not know it would leave it unowned again)."""
        return self._annotation(member, UNITS_ANNOTATION) == units_digest(names)

    def same_buckets(self, member: str) -> bool:
        """Whether ``member``'s Lease says it hashes units into as many buckets as this replica (one that does not,
        as during a rollout that changes ``buckets``, fences a unit with another Lease)."""
        return (self._annotation(member, BUCKETS_ANNOTATION) or "0") == str(self.buckets)

    def _annotation(self, member: str, key: str) -> str | None:
        lease = self.cached(member_lease(self.config.group, member))
        annotations = (lease.metadata.get("annotations") if lease is not None else None) or {}
        value = annotations.get(key)
        return value if isinstance(value, str) else None

    def _advertised(self, record: LeaseRecord) -> LeaseRecord:
        """``record``, this replica's member Lease, saying which buckets this replica sees (``knows``), and how
        many it hashes units into (``same_buckets``)."""
        return record.annotated({UNITS_ANNOTATION: units_digest(self._bucket_names()),
                                 BUCKETS_ANNOTATION: str(self.buckets)})

    def _restart_clocks(self, now: float) -> None:
        """This replica could not renew (nor, likely, watch) for longer than ``renew_deadline``: what it saw before
        says nothing about who renewed meanwhile. Every Lease counts as just seen, as at a first list, so that the
        first replica back does not take every unit whose holder it could not see renewing."""
        self._log.warning("could not renew its member Lease for over {:g}s: judging every Lease afresh",
                          self.config.renew_deadline)
        for seen in self.seen.values():
            seen.at = max(seen.at, now)
        self.listed_at = now
        self.settled_at = now + 2 * self.config.retry_period

    def abandoned(self, now: float) -> list[LeaseRecord]:
        """Member Leases not renewed for ten lease durations (replicas that died without leaving)."""
        found = []
        for name, seen in self.seen.items():
            if self.is_member(name) and name != self.member_lease and \
                    seen.free_for(now, self.config.lease_duration) >= 10 * self.config.lease_duration:
                current = self.cached(name)
                if current is not None and seen.matches(current):
                    found.append(current)
        return found

    # -- writing ---------------------------------------------------------------------------------------------
    def _noted(self, result: LeaseResult) -> LeaseResult:
        """Note the outcome of a Lease write: a refusal for the credentials (401, or RBAC's 403, which names the
        verb; a quota's or an admission policy's 403 is not about them), or a success, which clears it: any
        write that goes through shows the credentials work."""
        e = result.error
        if result.ok:
            self.denied = ""
        elif isinstance(e, ApiError) and (e.status == 401 or e.status == 403 and _RBAC_DENIAL.search(e.message)):
            found = _RBAC_DENIAL.search(e.message)
            verb = found.group(1) if found else "write"
            self.denied = f"cannot {verb} Leases in namespace {self.namespace!r}: {describe_error(e)}"
        return result

    async def join(self) -> bool:
        """Create (or take over) this replica's member Lease; False if that failed (logged)."""
        timeout = self.config.renew_deadline
        wrote = self._noted(await self._lock.create(self._advertised(LeaseRecord.created(
            self.identity, self.config.lease_duration, namespace=self.namespace, name=self.member_lease,
            labels={GROUP_LABEL: self.config.group, ROLE_LABEL: "member"})), timeout=timeout))
        if wrote.outcome is Outcome.CONFLICT:
            # Ours already (a create whose answer was lost, a Lease someone else wrote to): take it over.
            read = await self._lock.get(self.member_lease, timeout=timeout)
            wrote = self._noted(read if read.record is None else await self._lock.update(self._advertised(
                read.record.taken_by(self.identity, self.config.lease_duration)), timeout=timeout))
        if wrote.record is None:
            self._log.warning("cannot create member Lease {}/{}: {}", self.namespace, self.member_lease,
                              wrote.describe())
            return False
        fence = RenewFence(self.config.renew_deadline)
        fence.renewed(wrote.sent)
        self.member = Held(wrote.record, fence)
        self._log.info("joined shard group {} as {}", self.config.group, self.identity)
        return True

    async def renew(self, held: Held) -> None:
        """Renew ``held`` (this replica's member Lease, or a bucket's), once."""
        try:
            member = held is self.member
            record = held.record.taken_by(self.identity, self.config.lease_duration)
            # Bounded by what the fence has left (an answer after that cannot keep it), but never so short that
            # a slow server cannot answer at all.
            timeout = min(self.config.renew_deadline, max(held.fence.remaining(), self.config.retry_period))
            wrote = self._noted(await self._lock.update(self._advertised(record) if member else record,
                                                        timeout=timeout))
            if wrote.record is None:
                current = self.cached(held.record.name)
                if wrote.outcome in (Outcome.CONFLICT, Outcome.NOT_FOUND) and (
                        current is None or current.holder != self.identity):
                    held.lose()
                    if member:
                        self.member = None  # rejoin, on a fresh view (ours was not renewed: others moved on)
                        self._restart_clocks(time.monotonic())
                    self._wake.set()
                elif wrote.outcome is Outcome.CONFLICT and current is not None:
                    held.record = current  # still ours, a stale resourceVersion: the next round writes over it
                else:
                    self._log.warning("cannot renew Lease {}: {}", held.record.name, wrote.describe())
                return
            held.record = wrote.record
            lapsed = not held.fence.valid()
            if not held.closed:
                # Membership goes on, on a fresh view if it had lapsed; a bucket's tenure that lapsed is never
                # revived (``BucketTenure``): its units' workers have parked, and the loop stops them.
                held.fence.renewed(wrote.sent)
                if member and lapsed:
                    self._restart_clocks(time.monotonic())
            self._saw_own(wrote.record, wrote.sent)
        finally:
            held.renewing = None

    async def take(self, lease: str, bucket: str, current: LeaseRecord | None) -> LeaseResult:
        """Take ``lease`` (of ``bucket``), writing over exactly the ``current`` record the decision was made on
        (None: there is no Lease; create it, counting a transition from what a deleted one said)."""
        timeout = self.config.renew_deadline
        if current is not None:
            wrote = await self._lock.update(current.taken_by(self.identity, self.config.lease_duration),
                                            timeout=timeout)
        else:
            new = LeaseRecord.created(self.identity, self.config.lease_duration, namespace=self.namespace,
                                      name=lease, labels={GROUP_LABEL: self.config.group,
                                                          ROLE_LABEL: "bucket" if self.buckets else "unit"},
                                      annotations={UNIT_ANNOTATION: bucket})
            seen = self.seen.get(lease)
            if seen is not None:
                new = LeaseRecord(seen.holder, transitions=seen.transitions, obj=new.obj).taken_by(
                    self.identity, self.config.lease_duration)
            wrote = await self._lock.create(new, timeout=timeout)
        self._noted(wrote)
        if wrote.record is not None:
            self._saw_own(wrote.record, wrote.sent)
        elif wrote.outcome is not Outcome.CONFLICT:  # another replica wrote first (or our cache is behind)
            self._log.warning("cannot take Lease {} of bucket {}: {}", lease, bucket, wrote.describe())
        return wrote

    async def close(self, held: Held) -> None:
        """No more renewals of ``held`` (one in flight is awaited: it must not write after a release)."""
        held.closed = True
        if held.renewing is not None:
            await asyncio.wait({held.renewing})
        held.fence.close()

    async def release(self, held: Held) -> None:
        """Give ``held`` up (closed first), so that the bucket's next owner takes it at once."""
        released = await self._lock.release(held.record, self.identity, timeout=self.config.renew_deadline)
        if released.record is not None:
            self._saw_own(released.record, time.monotonic())
        elif released.outcome is Outcome.FAILED:  # its new owner takes it once it expires
            self._log.warning("cannot release Lease {}: {}", held.record.name, released.describe())

    async def leave(self, member: Held) -> None:
        """Delete this replica's member Lease (the others re-assign at once)."""
        await self.close(member)
        await self.delete(member.record)

    async def delete(self, record: LeaseRecord, *, unchanged: bool = False) -> None:
        """Delete the Lease if it is still ``record``'s object (``unchanged``: not even renewed since)."""
        deleted = await self._lock.delete(record, unchanged=unchanged, timeout=self.config.renew_deadline)
        if deleted.outcome is Outcome.FAILED:
            self._log.warning("cannot delete Lease {}: {}", record.name, deleted.describe())
