"""Lease records, as client-go's ``leaderelection/resourcelock`` reads and writes them, shared by the leader
elector (one Lease) and the shard coordinator (a Lease per member and per unit of work).

What a candidate may do with a Lease is decided from what it has *observed*, never from the holder's
``renewTime`` compared with its own wall clock: a record (holder, renewTime, duration) that has not changed for
``leaseDurationSeconds`` of the observer's monotonic clock has expired, whatever the clocks of the two machines
say. multicluster-runtime's sharded coordinator compares ``renewTime`` with ``time.Now()`` and so moves work away
from a live holder (or leaves it with a dead one) when clocks drift.
"""

from __future__ import annotations

import datetime
import math
import os
import socket
import time
import uuid
from dataclasses import dataclass
from typing import Any

LEASES_PATH = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"


def default_identity() -> str:
    """``<pod name>_<uuid>`` (``$POD_NAME``, set by the Deployment from the downward API; the host name outside a
    pod): unique per process, and ``kubectl get lease`` shows which pod leads."""
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4()}"


def now_micro() -> str:
    """The current time as a Lease's ``MicroTime``."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def holder_spec(current: dict[str, Any] | None, identity: str, duration: float) -> dict[str, Any]:
    """The spec ``identity`` writes to take or renew a Lease whose spec is ``current`` (None: a new Lease):
    ``acquireTime`` and ``leaseTransitions`` are kept by a renewal, and a change of holder counts one transition."""
    current = current or {}
    now = now_micro()
    transitions = int(current.get("leaseTransitions") or 0)
    acquired = now
    if current and current.get("holderIdentity") == identity:
        acquired = current.get("acquireTime") or now
    elif current:
        transitions += 1
    return {"holderIdentity": identity, "leaseDurationSeconds": lease_seconds(duration), "acquireTime": acquired,
            "renewTime": now, "leaseTransitions": transitions}


def lease_seconds(duration: float) -> int:
    """``leaseDurationSeconds`` for ``duration``: rounded up, so that others never wait less than configured (a
    rounded-down 2.4 s would let a taker in before a 2.2 s renew deadline has closed the holder's fence)."""
    return max(1, math.ceil(duration))


def released_spec(current: dict[str, Any]) -> dict[str, Any]:
    """``current`` given up (client-go's release): no holder, and a one-second duration."""
    now = now_micro()
    return {**current, "holderIdentity": "", "leaseDurationSeconds": 1, "renewTime": now, "acquireTime": now}


def lease_body(namespace: str, name: str, spec: dict[str, Any], labels: dict[str, str] | None = None,
               annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A new Lease object."""
    meta: dict[str, Any] = {"name": name, "namespace": namespace}
    if labels:
        meta["labels"] = labels
    if annotations:
        meta["annotations"] = annotations
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}


@dataclass
class Observation:
    """A Lease record as this process last saw it change, and when (on this process's monotonic clock)."""

    holder: str = ""
    renew_time: str | None = None
    duration: float = 0.0
    transitions: int = 0
    at: float = float("-inf")
    deleted: bool = False  # the Lease was deleted: what it said last still counts until it expires
    since: float | None = None  # when this process first saw the Lease, or saw it change after a long quiet

    def see(self, spec: dict[str, Any] | None, now: float | None = None, restart_after: float = math.inf) -> bool:
        """Record ``spec`` as seen now; True if the record changed (only a change restarts the clock). A change
        after ``restart_after`` seconds without one also restarts ``since`` (a holder back from a pause)."""
        record = _record(spec)
        self.transitions = int((spec or {}).get("leaseTransitions") or 0)
        if self.matches(spec) and not self.deleted:
            return False
        now = time.monotonic() if now is None else now
        if self.since is None or now - self.at >= restart_after:
            self.since = now
        self.deleted = False
        self.holder, self.renew_time, self.duration = record
        self.at = now
        return True

    def matches(self, spec: dict[str, Any] | None) -> bool:
        """Whether ``spec`` is the record last seen (a cache may be ahead of what its handlers have told)."""
        return _record(spec) == (self.holder, self.renew_time, self.duration)

    def expired(self, now: float | None = None, default_duration: float = 15.0) -> bool:
        """Whether the holder has not renewed for its lease duration, as this process saw it."""
        now = time.monotonic() if now is None else now
        return self.at + (self.duration or default_duration) <= now

    def free(self, identity: str, now: float | None = None, default_duration: float = 15.0) -> bool:
        """Whether ``identity`` may take the Lease now: nobody holds it, its holder let it expire, or it is ours."""
        return not self.holder or self.holder == identity or self.expired(now, default_duration)

    def free_for(self, now: float | None = None, default_duration: float = 15.0) -> float:
        """For how long the Lease has been free (released, or its holder's duration passed); negative if not."""
        now = time.monotonic() if now is None else now
        return now - self.at - (self.duration or default_duration if self.holder else 0.0)


def _record(spec: dict[str, Any] | None) -> tuple[str, str | None, float]:
    spec = spec or {}
    return spec.get("holderIdentity") or "", spec.get("renewTime"), float(spec.get("leaseDurationSeconds") or 0)


class RenewFence:
    """Valid while a Lease is held and was renewed less than ``renew_deadline`` ago (counted from when the
    successful request was *sent*): checked locally, without a network call (see ``controllers/fence.py``)."""

    def __init__(self, renew_deadline: float) -> None:
        self.renew_deadline = renew_deadline
        self.held = False
        self.last_renew = float("-inf")

    def renewed(self, sent_at: float) -> None:
        """A take or renewal sent at ``sent_at`` (monotonic) succeeded."""
        self.held = True
        self.last_renew = sent_at

    def valid(self) -> bool:
        return self.held and time.monotonic() - self.last_renew < self.renew_deadline

    def remaining(self) -> float:
        """Seconds it still holds (0 once it has closed)."""
        return max(0.0, self.last_renew + self.renew_deadline - time.monotonic()) if self.held else 0.0
