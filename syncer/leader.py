"""LeaderElector: leader election on a ``coordination.k8s.io/v1`` Lease, with client-go's rules.

A candidate takes the lease when it is free, released, or not renewed for ``lease_duration`` (measured on the
local clock from when this candidate last saw it change, so clock skew between replicas does not matter).
The leader renews every ``retry_period``; if it cannot renew within ``renew_deadline`` it has lost the lease.
On graceful shutdown the leader releases the lease so a standby takes over at once.
"""

from __future__ import annotations

import asyncio
import datetime
import socket
import time
import uuid
from typing import Any

from loguru import logger

from informers import ApiClient, ApiError

from .settings import LeaderElection


def default_identity() -> str:
    """``hostname_uuid``: unique per process, readable in ``kubectl get lease``."""
    return f"{socket.gethostname()}_{uuid.uuid4()}"


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Acquires, renews and releases one Lease. ``is_leader`` tells the current state."""

    def __init__(self, client: ApiClient, config: LeaderElection, identity: str | None = None) -> None:
        self.client = client
        self.config = config
        self.identity = identity or default_identity()
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{config.lease_namespace}/leases/{config.lease_name}"
        self.is_leader = False
        self.observed_holder = ""
        self._observed_record: tuple[Any, ...] | None = None
        self._observed_at = 0.0
        self._log = logger.bind(lease=f"{config.lease_namespace}/{config.lease_name}", identity=self.identity)

    async def acquire(self) -> None:
        """Return once this candidate holds the lease (retrying every ``retry_period``)."""
        while not await self._try_acquire_or_renew():
            await asyncio.sleep(self.config.retry_period)
        self._log.info("became leader ({})", self.identity)

    async def hold(self) -> None:
        """Renew until the lease is lost (then return); cancel to stop renewing."""
        last_renew = time.monotonic()
        while True:
            await asyncio.sleep(self.config.retry_period)
            try:
                async with asyncio.timeout(self.config.renew_deadline):
                    ok = await self._try_acquire_or_renew()
            except TimeoutError:
                ok = False
            if ok:
                last_renew = time.monotonic()
            elif time.monotonic() - last_renew >= self.config.renew_deadline or self.observed_holder != self.identity:
                self.is_leader = False
                self._log.warning("lost leadership (holder now {!r})", self.observed_holder)
                return

    async def release(self) -> None:
        """Give the lease up if we hold it, so that a standby can take it at once."""
        if not self.is_leader:
            return
        self.is_leader = False
        try:
            lease = await self.client.request("GET", self.path, timeout=5)
            if (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            lease["spec"].update(holderIdentity="", leaseDurationSeconds=1, renewTime=_now(), acquireTime=_now())
            await self.client.request("PUT", self.path, body=lease, timeout=5)
            self._log.info("released the lease")
        except (ApiError, OSError, TimeoutError) as e:
            self._log.warning("could not release the lease: {}", e)

    async def _try_acquire_or_renew(self) -> bool:
        now = time.monotonic()
        spec = {"holderIdentity": self.identity,
                "leaseDurationSeconds": max(1, round(self.config.lease_duration)),
                "acquireTime": _now(), "renewTime": _now(), "leaseTransitions": 0}
        try:
            lease = await self.client.request("GET", self.path, timeout=self.config.renew_deadline)
        except ApiError as e:
            if e.status != 404:
                self._log.warning("cannot read the lease: {}", e)
                return False
            try:
                ns = self.config.lease_namespace
                await self.client.request("POST", f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases", body={
                    "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.config.lease_name, "namespace": ns}, "spec": spec})
            except ApiError as e2:
                if e2.status != 409:
                    self._log.warning("cannot create the lease: {}", e2)
                return False
            self._observe(spec, now)
            self.is_leader = True
            return True
        except (OSError, TimeoutError) as e:
            self._log.warning("cannot reach the API server for the lease: {}", e)
            return False
        current = lease.get("spec") or {}
        holder = current.get("holderIdentity") or ""
        record = (holder, current.get("renewTime"), current.get("leaseDurationSeconds"))
        if record != self._observed_record:
            self._observe(current, now)
        duration = float(current.get("leaseDurationSeconds") or self.config.lease_duration)
        if holder and holder != self.identity and self._observed_at + duration > now:
            self.is_leader = False
            return False
        if holder == self.identity:
            spec["acquireTime"] = current.get("acquireTime") or spec["acquireTime"]
            spec["leaseTransitions"] = current.get("leaseTransitions") or 0
        else:
            spec["leaseTransitions"] = (current.get("leaseTransitions") or 0) + 1
        lease["spec"] = spec
        try:
            await self.client.request("PUT", self.path, body=lease, timeout=self.config.renew_deadline)
        except ApiError as e:
            if e.status != 409:  # 409: someone else wrote first; we see it next round
                self._log.warning("cannot update the lease: {}", e)
            return False
        except (OSError, TimeoutError) as e:
            self._log.warning("cannot reach the API server for the lease: {}", e)
            return False
        self._observe(spec, now)
        self.is_leader = True
        return True

    def _observe(self, spec: dict[str, Any], now: float) -> None:
        self._observed_record = (spec.get("holderIdentity") or "", spec.get("renewTime"),
                                 spec.get("leaseDurationSeconds"))
        self._observed_at = now
        self.observed_holder = spec.get("holderIdentity") or ""
