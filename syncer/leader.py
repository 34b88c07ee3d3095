"""LeaderElector: leader election on a ``coordination.k8s.io/v1`` Lease, with client-go's rules, and a term fence.

A candidate takes the lease when it is free, released, or not renewed for ``lease_duration`` (measured on the
local clock from when this candidate last saw it change, so clock skew between replicas does not matter).
The leader renews every ``retry_period``; on graceful shutdown it releases the lease so a standby takes over
at once.

Unlike client-go, where each renew attempt gets a fresh ``renew_deadline``, the term ends ``renew_deadline``
after the last *successful* renewal (counted from when that request was sent), whatever the attempts in
between are doing: ``hold()`` returns then, and ``fence()`` says so locally, without a network call, to
whoever asks first. A process resumed after a pause past that point (SIGSTOP, a VM freeze, a blocked loop)
finds its fence closed before any of its queued work runs. The standby cannot take the lease before
``lease_duration`` has passed on its own clock, so ``lease_duration - renew_deadline`` is the margin in which
the old term's controllers must stop.

The Lease rules (what was observed when, transitions, the renewal deadline) are ``lease.py``'s, shared with the
shard coordinator (``shards.py``), for which a leadership term is the one-unit case.

``leader_election_master_status{name}`` (client-go's gauge, ``name`` the Lease's) is 1 while the term's fence
holds, read when the metrics are collected.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from typing import Iterator

from loguru import logger
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric

from informers import ApiClient, ApiError
from informers.client import CONNECTION_ERRORS
from informers.errors import describe_error
from informers.metrics import MetricSet

from .lease import LEASES_PATH, Observation, RenewFence, default_identity, holder_spec, lease_body, released_spec
from .settings import LeaderElection


class _TermFence:
    """The fence of one leadership term: valid while renewals keep succeeding within ``renew_deadline``."""

    def __init__(self, elector: "LeaderElector", term: int) -> None:
        self._elector, self._term = elector, term

    def valid(self) -> bool:
        return self._elector._term == self._term and self._elector.term_valid()

    def remaining(self) -> float:
        """Seconds this term still holds (0 once it has ended)."""
        if not self.valid():
            return 0.0
        return self._elector.renewal.remaining()


class _Collector(MetricSet):
    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.electors: "weakref.WeakSet[LeaderElector]" = weakref.WeakSet()
        registry.register(self)

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily("leader_election_master_status", "Gauge of if the reporting system is master of "
                                   "the relevant lease, 0 indicates backup, 1 indicates master. 'name' is the "
                                   "string used to identify the lease.", labels=["name"])
        for elector in sorted(self.electors, key=lambda e: e.config.lease_name):
            family.add_metric([elector.config.lease_name], 1.0 if elector.term_valid() else 0.0)
        yield family


class LeaderElector:
    """Acquires, renews and releases one Lease. ``is_leader`` tells the current state, ``fence()`` the term's."""

    def __init__(self, client: ApiClient, config: LeaderElection, identity: str | None = None) -> None:
        self.client = client
        self.config = config
        self.identity = identity or default_identity()
        self.path = f"/apis/coordination.k8s.io/v1/namespaces/{config.lease_namespace}/leases/{config.lease_name}"
        self.is_leader = False
        self._observed = Observation()
        self.renewal = RenewFence(config.renew_deadline)  # when the last successful acquire/renew was sent
        self._term = 0
        self._log = logger.bind(lease=f"{config.lease_namespace}/{config.lease_name}", identity=self.identity)
        _Collector.for_registry(REGISTRY).electors.add(self)

    @property
    def observed_holder(self) -> str:
        """The holder of the lease as this candidate last saw it."""
        return self._observed.holder

    def term_valid(self) -> bool:
        """Whether this replica leads now: it holds the lease and renewed it less than ``renew_deadline`` ago."""
        return self.is_leader and self.renewal.valid()

    def fence(self) -> _TermFence:
        """The fence of the current term: it stays closed once this term ends, even if a later one begins."""
        return _TermFence(self, self._term)

    async def acquire(self) -> None:
        """Return once this candidate holds the lease (retrying every ``retry_period``); starts a new term."""
        while not await self._try_acquire_or_renew():
            await asyncio.sleep(self.config.retry_period)
        self._term += 1
        self._log.info("became leader ({})", self.identity)

    async def hold(self) -> None:
        """Renew until the term ends (then return): ``renew_deadline`` after the last successful renewal, or at
        once when someone else holds the lease. Cancel to stop renewing."""
        while self.term_valid():
            remaining = self.renewal.remaining()
            try:
                async with asyncio.timeout(remaining):
                    await asyncio.sleep(self.config.retry_period)
                    await self._try_acquire_or_renew()
            except TimeoutError:
                pass
        self.is_leader = False
        self._log.warning("lost leadership: {}", f"holder now {self.observed_holder!r}"
                          if self.observed_holder != self.identity else
                          f"not renewed within renew_deadline ({self.config.renew_deadline:g}s)")

    async def release(self) -> None:
        """Give the lease up if we hold it, so that a standby can take it at once."""
        if not self.is_leader:
            return
        self.is_leader = False
        try:
            lease = await self.client.request("GET", self.path, timeout=5)
            if (lease.get("spec") or {}).get("holderIdentity") != self.identity:
                return
            lease["spec"] = released_spec(lease["spec"])
            await self.client.request("PUT", self.path, body=lease, timeout=5)
            self._log.info("released the lease")
        except (ApiError, *CONNECTION_ERRORS) as e:
            self._log.warning("could not release the lease: {}", e)

    async def _try_acquire_or_renew(self) -> bool:
        try:
            return await self._attempt()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a bug or an odd answer must not end the election: log, and try next round
            self._log.opt(exception=e).error("lease {} attempt failed unexpectedly: {}", self.path, e)
            return False

    async def _attempt(self) -> bool:
        now = time.monotonic()
        duration = self.config.lease_duration
        try:
            lease = await self.client.request("GET", self.path, timeout=self.config.renew_deadline)
        except ApiError as e:
            if e.status != 404:
                self._log.warning("cannot read the lease: {}", e)
                return False
            # Deleted under us: whoever recreates it leads at once, so our term ends here, win or lose.
            self.is_leader = False
            spec = holder_spec(None, self.identity, duration)
            try:
                ns = self.config.lease_namespace
                await self.client.request("POST", LEASES_PATH.format(namespace=ns),
                                          body=lease_body(ns, self.config.lease_name, spec))
            except ApiError as e2:
                if e2.status != 409:
                    self._log.warning("cannot create the lease: {}", e2)
                return False
            self._observed.see(spec, now)
            self._renewed(now)
            return True
        except CONNECTION_ERRORS as e:
            self._log.warning("cannot reach the API server for the lease: {}", describe_error(e))
            return False
        current = lease.get("spec") or {}
        self._observed.see(current, now)
        if not self._observed.free(self.identity, now, self.config.lease_duration):
            self.is_leader = False
            return False
        lease["spec"] = spec = holder_spec(current, self.identity, duration)
        try:
            await self.client.request("PUT", self.path, body=lease, timeout=self.config.renew_deadline)
        except ApiError as e:
            if e.status != 409:  # 409: someone else wrote first; we see it next round
                self._log.warning("cannot update the lease: {}", e)
            return False
        except CONNECTION_ERRORS as e:
            self._log.warning("cannot reach the API server for the lease: {}", describe_error(e))
            return False
        self._observed.see(spec, now)
        self._renewed(now)
        return True

    def _renewed(self, sent_at: float) -> None:
        # Counted from when the request was sent: the server may have stamped renewTime any time after that.
        self.renewal.renewed(sent_at)
        self.is_leader = True

