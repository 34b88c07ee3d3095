"""The fences of Lease holders: ``RenewFence`` (a renewal deadline), ``TermFence`` (a leadership term),
``BucketTenure`` (a shard bucket's tenure) and ``UnitFence`` (a unit's view of its bucket's), all checked
locally, without a network call (``controllers/fence.py``).

One rule decides which fence applies where: **work gets the fence of the tenure it was started under, and
nothing else.** A tenure begins when this process takes a Lease (creates it, or writes itself over it as holder)
and lasts while each renewal succeeds within ``renew_deadline`` of when the previous successful one was *sent*
(the server may have stamped ``renewTime`` any time after). It ends for good when that deadline passes, when the
Lease is seen held by another or deleted, or when it is given up; a renewal that succeeds after that does not
revive it, the next take is a new tenure and a new fence. So:

- leader election (``leader.py``): each term is a ``TermFence``, handed to every controller and client the term
  starts (``LeaderElector.fence()``);
- sharding (``sharding/coordinator.py``): each tenure of a bucket Lease is a ``BucketTenure``, and each unit of the bucket gets
  a ``UnitFence`` that holds exactly while it does, handed to that unit's controllers and clients only (what
  ``Units.start`` gets; a member cluster is engaged under it, ``sharding.units.ClusterUnits``, and one held by
  another replica is not engaged here at all). A replica's member Lease has a plain ``RenewFence``, which
  fences no write: it says whether this replica counts itself a member, and a renewal after a lapse does revive
  it (the replica rejoins, judging every Lease afresh);
- neither: ``controllers.fence.OPEN``.

client-go's elector gives each renew attempt a fresh ``renew_deadline``; here the deadline runs from the last
*successful* renewal, whatever the attempts in between are doing, so a process resumed after a pause past it
(SIGSTOP, a VM freeze, a blocked loop) finds its fence closed before any of its queued work runs.
"""

from __future__ import annotations

import time


class RenewFence:
    """Valid from the first successful take (``renewed``) while the last one was sent less than ``renew_deadline``
    ago, until ``close()``."""

    def __init__(self, renew_deadline: float) -> None:
        self.renew_deadline = renew_deadline
        self.last_renew = float("-inf")
        self.closed = False

    def renewed(self, sent_at: float) -> None:
        """A take or renewal sent at ``sent_at`` (monotonic) succeeded."""
        if not self.closed:
            self.last_renew = max(self.last_renew, sent_at)

    def close(self) -> None:
        """Over now (taken, deleted, given up), whatever the deadline says."""
        self.closed = True

    def valid(self) -> bool:
        return not self.closed and time.monotonic() - self.last_renew < self.renew_deadline

    def remaining(self) -> float:
        """Seconds it still holds (0 once it has closed)."""
        return max(0.0, self.last_renew + self.renew_deadline - time.monotonic()) if not self.closed else 0.0


class _Tenure(RenewFence):
    """A ``RenewFence`` that a lapse closes for good: a renewal answered after the deadline does not revive it."""

    def renewed(self, sent_at: float) -> None:
        if self.last_renew == float("-inf") or self.valid():
            super().renewed(sent_at)
        else:
            self.close()


class TermFence(_Tenure):
    """The fence of leadership term ``term`` (1, 2, ... in this process; 0: none yet, never valid)."""

    def __init__(self, term: int, renew_deadline: float) -> None:
        super().__init__(renew_deadline)
        self.term = term


class BucketTenure(_Tenure):
    """One tenure of a shard bucket's Lease: ``bucket``, the ``holder`` identity and the Lease's ``transitions``
    when it was taken."""

    def __init__(self, bucket: str, holder: str, transitions: int, renew_deadline: float) -> None:
        super().__init__(renew_deadline)
        self.bucket, self.holder, self.transitions = bucket, holder, transitions


class UnitFence:
    """The fence of a unit of work: valid exactly while the ``tenure`` of its bucket is. It names the ``unit``,
    the ``holder`` identity and the bucket Lease's ``transitions`` when it was taken (so a write can carry which
    tenure made it); every unit of a bucket shares that tenure, and its count."""

    def __init__(self, unit: str, tenure: BucketTenure) -> None:
        self.unit, self.tenure = unit, tenure
        self.bucket, self.holder, self.transitions = tenure.bucket, tenure.holder, tenure.transitions

    def valid(self) -> bool:
        return self.tenure.valid()

    def remaining(self) -> float:
        """Seconds it still holds (0 once its bucket's tenure has closed)."""
        return self.tenure.remaining()
