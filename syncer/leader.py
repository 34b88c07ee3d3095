"""LeaderElector: leader election on a ``coordination.k8s.io/v1`` Lease, with client-go's rules, and a term fence.

A candidate takes the lease when free, released, or unrenewed for ``lease_duration`` on its own clock; the leader
renews every ``retry_period`` and releases on graceful shutdown. Unlike client-go, the term ends ``renew_deadline``
after the last *successful* renewal (``hold()`` returns, ``fence()`` closes, no network call), and is never revived;
``lease_duration - renew_deadline`` is the margin for the old term's controllers to stop. Lease rules are
``lease.py``'s, fences ``fences.py``'s. ``leader_election_master_status{name}`` is 1 while the fence holds.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from typing import Iterator

from loguru import logger
from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric

from informers import ApiClient
from informers.metrics import MetricSet

from .fences import TermFence
from .lease import LeaseLock, LeaseRecord, LeaseResult, Observation, Outcome, default_identity
from .settings import LeaderElection


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
        self.is_leader = False
        self._lock = LeaseLock(client, config.lease_namespace)
        self.path = f"{self._lock.path}/{config.lease_name}"  # the Lease's API path
        self._record: LeaseRecord | None = None  # the Lease as this candidate last wrote it
        self._observed = Observation()
        self.renewal = TermFence(0, config.renew_deadline)  # the current (or last) term's: none yet
        self._log = logger.bind(lease=f"{config.lease_namespace}/{config.lease_name}", identity=self.identity)
        _Collector.for_registry(REGISTRY).electors.add(self)

    @property
    def lease(self) -> str:
        """``namespace/name`` of the Lease."""
        return f"{self.config.lease_namespace}/{self.config.lease_name}"

    @property
    def observed_holder(self) -> str:
        """The holder of the lease as this candidate last saw it."""
        return self._observed.holder

    def term_valid(self) -> bool:
        """Whether this replica leads now: it holds the lease and renewed it less than ``renew_deadline`` ago."""
        return self.is_leader and self.renewal.valid()

    def fence(self) -> TermFence:
        """The fence of the current term: it stays closed once this term ends, even if a later one begins."""
        return self.renewal

    async def acquire(self) -> None:
        """Return once this candidate holds the lease (retrying every ``retry_period``); starts a new term."""
        while (sent := await self._try_acquire_or_renew()) is None:
            await asyncio.sleep(self.config.retry_period)
        term = TermFence(self.renewal.term + 1, self.config.renew_deadline)
        term.renewed(sent)
        self.renewal = term
        self._log.info("became leader ({})", self.identity)

    async def hold(self) -> None:
        """Renew until the term ends (then return): ``renew_deadline`` after the last successful renewal, or at
        once when someone else holds the lease. Cancel to stop renewing."""
        while self.term_valid():
            remaining = self.renewal.remaining()
            try:
                async with asyncio.timeout(remaining):
                    await asyncio.sleep(self.config.retry_period)
                    sent = await self._try_acquire_or_renew()
                    if sent is not None:
                        self.renewal.renewed(sent)
            except TimeoutError:
                pass
        self._lost()
        self._log.warning("lost leadership: {}", f"holder now {self.observed_holder!r}"
                          if self.observed_holder != self.identity else
                          f"not renewed within renew_deadline ({self.config.renew_deadline:g}s)")

    async def release(self) -> None:
        """Give the lease up if we hold it, so that a standby can take it at once."""
        record = self._record
        if not self.is_leader or record is None:
            return
        self._lost()
        released = await self._lock.release(record, self.identity, timeout=5)
        if released.ok:
            self._log.info("released the lease")
        elif released.outcome is Outcome.FAILED:
            self._log.warning("could not release the lease: {}", released.describe())

    def _lost(self) -> None:
        self.is_leader = False
        self.renewal.close()

    async def _try_acquire_or_renew(self) -> float | None:
        """When the successful take or renewal was sent (monotonic), or None."""
        try:
            return await self._attempt()
        except asyncio.CancelledError:
            raise
        except Exception as e:  # a bug or an odd answer must not end the election: log, and try next round
            self._log.opt(exception=e).error("lease {} attempt failed unexpectedly: {}", self.config.lease_name, e)
            return None

    async def _attempt(self) -> float | None:
        # Counted from before the read: the server may have stamped renewTime any time after that.
        now = time.monotonic()
        duration, deadline = self.config.lease_duration, self.config.renew_deadline
        read = await self._lock.get(self.config.lease_name, timeout=deadline)
        if read.outcome is Outcome.NOT_FOUND:
            # Deleted under us: whoever recreates it leads at once, so our term ends here, win or lose.
            self._lost()
            wrote = await self._lock.create(LeaseRecord.created(
                self.identity, duration, namespace=self.config.lease_namespace, name=self.config.lease_name),
                timeout=deadline)
            return self._wrote(wrote, now, "create")
        if read.record is None:
            self._warn("read", read)
            return None
        self._observed.see(read.record, now)
        if not self._observed.free(self.identity, now, duration):
            self._lost()
            return None
        return self._wrote(await self._lock.update(read.record.taken_by(self.identity, duration),
                                                   timeout=deadline), now, "update")

    def _wrote(self, wrote: LeaseResult, sent: float, verb: str) -> float | None:
        if wrote.record is None:
            if wrote.outcome is not Outcome.CONFLICT:  # a conflict: someone else wrote first; we see it next round
                self._warn(verb, wrote)
            return None
        self._record = wrote.record
        self._observed.see(wrote.record, sent)
        self.is_leader = True
        return sent

    def _warn(self, verb: str, result: LeaseResult) -> None:
        self._log.warning("cannot {} the lease: {}", verb, result.describe())
