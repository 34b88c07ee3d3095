"""Leases, as client-go's ``leaderelection/resourcelock`` reads and writes them: ``LeaseRecord``, ``LeaseLock`` (the
only sender of Lease requests) and ``Observation`` (what this process saw of a record, and when).

Expiry is judged from observation: a record unchanged for ``leaseDurationSeconds`` of the observer's monotonic
clock has expired, whatever the wall clocks say (multicluster-runtime's sharding compares ``renewTime`` with its
own clock, so drift moves work). Unlike client-go's ``resourcelock.Interface``, every request answers a
``LeaseResult`` (``OK``, ``CONFLICT``, ``NOT_FOUND``, ``FAILED``); one lock serves a namespace's Leases.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
import math
import os
import socket
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Mapping

from informers import GVR, ApiClient, ApiError
from informers.client import CONNECTION_ERRORS
from informers.errors import describe_error

LEASES = GVR("coordination.k8s.io", "v1", "leases")
LEASES_PATH = "/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"


def default_identity() -> str:
    """``<pod name>_<uuid>`` (``$POD_NAME``, set by the Deployment from the downward API; the host name outside a
    pod): unique per process, and ``kubectl get lease`` shows which pod leads."""
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{uuid.uuid4()}"


def now_micro() -> str:
    """The current time as a Lease's ``MicroTime``."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def lease_seconds(duration: float) -> int:
    """``leaseDurationSeconds`` for ``duration``: rounded up, so that others never wait less than configured (a
    rounded-down 2.4 s would let a taker in before a 2.2 s renew deadline has closed the holder's fence)."""
    return max(1, math.ceil(duration))


@dataclass(frozen=True)
class LeaseRecord:
    """What a Lease says (client-go's ``LeaderElectionRecord``), and ``obj``, the object it was read from (its
    metadata, resourceVersion included, and any spec field this record does not name): a write of the record
    goes over exactly that object."""

    holder: str = ""
    duration: float = 0.0  # leaseDurationSeconds; 0 when unset
    acquire_time: str | None = None
    renew_time: str | None = None
    transitions: int = 0
    obj: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def of(cls, obj: Mapping[str, Any] | None) -> "LeaseRecord":
        """The record of the Lease object ``obj`` (an empty record for None)."""
        spec = (obj or {}).get("spec") or {}
        return cls(holder=spec.get("holderIdentity") or "", duration=float(spec.get("leaseDurationSeconds") or 0),
                   acquire_time=spec.get("acquireTime"), renew_time=spec.get("renewTime"),
                   transitions=int(spec.get("leaseTransitions") or 0), obj=obj or {})

    @classmethod
    def created(cls, identity: str, duration: float, *, namespace: str = "", name: str = "",
                labels: Mapping[str, str] | None = None,
                annotations: Mapping[str, str] | None = None) -> "LeaseRecord":
        """A new Lease ``namespace/name`` held by ``identity``: no transition yet."""
        meta: dict[str, Any] = {"name": name, "namespace": namespace}
        if labels:
            meta["labels"] = dict(labels)
        if annotations:
            meta["annotations"] = dict(annotations)
        now = now_micro()
        return cls(identity, lease_seconds(duration), now, now, 0,
                   {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta})

    @property
    def metadata(self) -> Mapping[str, Any]:
        return self.obj.get("metadata") or {}

    @property
    def name(self) -> str:
        return str(self.metadata.get("name") or "")

    @property
    def version(self) -> int:
        """The resourceVersion as a number (0 when it is not one of etcd's integers: no order to rely on)."""
        try:
            return int(self.metadata.get("resourceVersion") or 0)
        except ValueError:
            return 0

    def spec(self) -> dict[str, Any]:
        """The Lease's spec: the object's, with this record's fields."""
        spec = {**(self.obj.get("spec") or {}), "holderIdentity": self.holder,
                "leaseDurationSeconds": int(self.duration), "leaseTransitions": self.transitions}
        for key, value in (("acquireTime", self.acquire_time), ("renewTime", self.renew_time)):
            if value is not None:
                spec[key] = value
        return spec

    def to_object(self) -> dict[str, Any]:
        """The Lease object that writes this record over ``obj``."""
        return {**self.obj, "spec": self.spec()}

    def taken_by(self, identity: str, duration: float) -> "LeaseRecord":
        """This record taken or renewed by ``identity``: ``acquireTime`` and ``transitions`` are kept by a renewal,
        and a change of holder (from none, too: a released Lease) counts one transition."""
        now = now_micro()
        if self.holder == identity:
            return dataclasses.replace(self, duration=lease_seconds(duration), renew_time=now,
                                       acquire_time=self.acquire_time or now)
        return dataclasses.replace(self, holder=identity, duration=lease_seconds(duration), acquire_time=now,
                                   renew_time=now, transitions=self.transitions + 1)

    def released(self) -> "LeaseRecord":
        """This record given up (client-go's release): no holder, and a one-second duration."""
        now = now_micro()
        return dataclasses.replace(self, holder="", duration=1, renew_time=now, acquire_time=now)

    def annotated(self, annotations: Mapping[str, str]) -> "LeaseRecord":
        """This record, its object carrying ``annotations`` too."""
        meta = {**self.metadata, "annotations": {**(self.metadata.get("annotations") or {}), **annotations}}
        return dataclasses.replace(self, obj={**self.obj, "metadata": meta})


class Outcome(enum.Enum):
    """How a Lease request ended."""

    OK = "ok"
    CONFLICT = "conflict"  # 409: written (or created) meanwhile; a delete's precondition failed
    NOT_FOUND = "not-found"  # 404
    FAILED = "failed"  # another answer, or none (``LeaseResult.error`` says which)


@dataclass(frozen=True)
class LeaseResult:
    """The ``outcome`` of a Lease request, the ``record`` the server answered with (``OK``), the ``error``
    otherwise, and ``sent``: when (monotonic) the request that ended so was sent."""

    outcome: Outcome
    record: LeaseRecord | None = None
    error: BaseException | None = None
    sent: float = 0.0

    @property
    def ok(self) -> bool:
        return self.outcome is Outcome.OK

    def describe(self) -> str:
        """What went wrong, for a log line."""
        return describe_error(self.error) if self.error is not None else self.outcome.value


class LeaseLock:
    """Reads and writes the Leases of ``namespace`` through ``client`` (writes carry the record's
    resourceVersion, so that a write over a Lease changed meanwhile is a ``CONFLICT``)."""

    def __init__(self, client: ApiClient, namespace: str) -> None:
        self.client = client
        self.namespace = namespace
        self.path = LEASES_PATH.format(namespace=namespace)

    async def get(self, name: str, *, timeout: float | None) -> LeaseResult:
        """Lease ``name`` as the server has it."""
        return await self._send("GET", name, None, timeout)

    async def create(self, record: LeaseRecord, *, timeout: float | None) -> LeaseResult:
        """Create the Lease ``record`` names; ``CONFLICT`` if it exists."""
        return await self._send("POST", "", record.to_object(), timeout)

    async def update(self, record: LeaseRecord, *, timeout: float | None) -> LeaseResult:
        """Write ``record`` (a take, a renewal) over the object it came from."""
        return await self._send("PUT", record.name, record.to_object(), timeout)

    async def release(self, record: LeaseRecord, identity: str, *, timeout: float | None,
                      attempts: int = 3) -> LeaseResult:
        """Give up the Lease ``record`` came from while ``identity`` holds it: written meanwhile, it is read again
        and released still if it is ours (``CONFLICT``: it is no longer ours)."""
        result = LeaseResult(Outcome.CONFLICT)
        for _ in range(attempts):
            result = await self.update(record.released(), timeout=timeout)
            if result.outcome is not Outcome.CONFLICT:
                return result
            read = await self.get(record.name, timeout=timeout)
            if read.record is None:
                return read
            if read.record.holder != identity:
                return LeaseResult(Outcome.CONFLICT, read.record, sent=read.sent)
            record = read.record
        return result

    async def delete(self, record: LeaseRecord, *, unchanged: bool = False, timeout: float | None) -> LeaseResult:
        """Delete the Lease if it is still the object ``record`` came from (by uid; ``unchanged``: not even renewed
        since, by resourceVersion): ``CONFLICT`` if it is not."""
        preconditions = {"uid": record.metadata.get("uid")}
        if unchanged:
            preconditions["resourceVersion"] = record.metadata.get("resourceVersion")
        return await self._send("DELETE", record.name, {"preconditions": preconditions}, timeout)

    async def _send(self, method: str, name: str, body: Any, timeout: float | None) -> LeaseResult:
        sent = time.monotonic()
        try:
            answer = await self.client.request(method, f"{self.path}/{name}" if name else self.path, body=body,
                                               timeout=timeout)
        except ApiError as e:
            outcome = {409: Outcome.CONFLICT, 404: Outcome.NOT_FOUND}.get(e.status, Outcome.FAILED)
            return LeaseResult(outcome, error=e, sent=sent)
        except CONNECTION_ERRORS as e:
            return LeaseResult(Outcome.FAILED, error=e, sent=sent)
        record = LeaseRecord.of(answer) if method != "DELETE" else None
        return LeaseResult(Outcome.OK, record, sent=sent)


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

    def see(self, record: LeaseRecord | None, now: float | None = None, restart_after: float = math.inf) -> bool:
        """Record ``record`` as seen now; True if it changed (only a change restarts the clock). A change after
        ``restart_after`` seconds without one also restarts ``since`` (a holder back from a pause)."""
        record = record or LeaseRecord()
        self.transitions = record.transitions
        if self.matches(record) and not self.deleted:
            return False
        now = time.monotonic() if now is None else now
        if self.since is None or now - self.at >= restart_after:
            self.since = now
        self.deleted = False
        self.holder, self.renew_time, self.duration = record.holder, record.renew_time, record.duration
        self.at = now
        return True

    def matches(self, record: LeaseRecord | None) -> bool:
        """Whether ``record`` is the one last seen (a cache may be ahead of what its handlers have told)."""
        record = record or LeaseRecord()
        return (record.holder, record.renew_time, record.duration) == (self.holder, self.renew_time, self.duration)

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
