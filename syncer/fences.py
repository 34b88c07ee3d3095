"""The fences of Lease holders: ``RenewFence`` (a renewal deadline), ``TermFence`` (a leadership term),
``BucketTenure`` (a shard bucket's tenure) and ``UnitFence`` (a unit's view of it), all checked locally
(``controllers/fence.py``).

Work gets the fence of the tenure it was started under, and nothing else. A tenure begins when a Lease is taken and
lasts while each renewal succeeds within ``renew_deadline`` of when the previous successful one was sent; once
ended (deadline passed, Lease held by another or deleted, given up) it is never revived. A member Lease's
``RenewFence`` fences no write, and does revive (the replica rejoins). Unlike client-go, the deadline runs from the
last *successful* renewal, so a process resumed after a pause finds its fence closed before its queued work runs.
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
