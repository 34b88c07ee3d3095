"""UnionInformer: register handlers once, receive events from the informers of every cluster, present and future.

One sub informer per cluster (``add``/``remove``); a handler added to the union is installed on every sub, present
and future. The union never starts or stops a sub: whoever adds it owns it. A handler method with a ``cluster``
parameter (or ``**kwargs``) gets ``cluster=<name>``; any other gets exactly what a single informer gives.
Differs from ARO-HCP's union informers:

- Replacing a sub whose handler install fails rolls the new sub back and keeps the old one wired
  (``HandlerInstallError``); on success the old sub's handlers stop as the new sub's start: never interleaved.
- No lock: each mutation is one synchronous step on the event loop, so reads never wait. Loop thread only.
- An empty name, a None sub or one without a lister raises: a cluster must not silently fail to join.
- ``cluster_ready(name)`` tells one cluster's live state; ``has_synced()`` stays true once all synced, as client-go.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping, Protocol, Sequence

from loguru import logger
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from .metrics import MetricSet
from .shared_informer import EventHandler, FuncHandler, HandlerRegistration, optional_method
from .store import DeletedFinalStateUnknown, Obj
from .union_lister import ClusterNotFound, SubLister, UnionLister
from .wait import wait_first

_METHODS = ("on_add", "on_update", "on_delete")


class ClusterEventHandler(Protocol):
    """A handler that is told the cluster of each event (keyword ``cluster``); methods may be sync or async."""

    def on_add(self, obj: Obj, is_in_initial_list: bool, cluster: str) -> Any: ...

    def on_update(self, old: Obj, new: Obj, cluster: str) -> Any: ...

    def on_delete(self, obj: Obj | DeletedFinalStateUnknown, cluster: str) -> Any: ...


Handler = EventHandler | FuncHandler | ClusterEventHandler


class _EventCounts(Protocol):
    @property
    def event_counts(self) -> Mapping[str, int]: ...


class SubInformer(Protocol):
    """What the union needs of a cluster's informer: ``SharedIndexInformer`` satisfies it."""

    @property
    def lister(self) -> SubLister: ...

    @property
    def reflector(self) -> _EventCounts: ...

    @property
    def last_error(self) -> Exception | None: ...

    def has_synced(self) -> bool: ...

    def add_event_handler(self, handler: EventHandler | FuncHandler, resync_period: float | None = None,
                          name: str | None = None) -> HandlerRegistration: ...

    async def remove_event_handler(self, registration: HandlerRegistration) -> None: ...


class HandlerInstallError(RuntimeError):
    """Installing a union handler on a cluster's informer failed; the union is as it was before the call."""


def _takes_cluster(fn: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature: it cannot be asking for the cluster
        return False
    p = params.get("cluster")
    return (p is not None and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)) or any(
        q.kind is q.VAR_KEYWORD for q in params.values())


def _bind_cluster(method: str, fn: Callable[..., Any], cluster: str) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(fn):
        # A partial still reads as a coroutine function, so the informer awaits what it returns; next to the
        # await, its cost does not matter.
        return functools.partial(fn, cluster=cluster)
    # A closure of the method's own arity adds about 40 ns a call, a keyword partial about 115 ns (on a path of
    # about 2 us per event: bench/RESULTS-union.md).
    if method == "on_delete":
        return lambda obj: fn(obj, cluster=cluster)
    return lambda a, b: fn(a, b, cluster=cluster)


def _for_cluster(handler: Handler, cluster: str) -> EventHandler | FuncHandler:
    """``handler`` itself if no method asks for the cluster, else a FuncHandler with ``cluster`` bound in."""
    fns: list[Callable[..., Any] | None] = [optional_method(handler, m) for m in _METHODS]
    bound = [_bind_cluster(m, fn, cluster) if fn is not None and _takes_cluster(fn) else fn
             for m, fn in zip(_METHODS, fns)]
    if bound == fns:
        return handler  # type: ignore[return-value]  # no method takes `cluster`: it is a plain EventHandler
    add, update, delete = bound
    return FuncHandler(add, update, delete)


class UnionRegistration:
    """One handler on a union: its installs on every current sub, and on subs added later."""

    def __init__(self, union: "UnionInformer", handler: Handler, name: str, resync_period: float | None) -> None:
        self.informer = union  # as on HandlerRegistration: ``reg.informer.remove_event_handler(reg)`` works
        self.handler = handler
        self.name = name
        self.resync_period = resync_period

    def has_synced(self) -> bool:
        """True while registered and every current sub has synced and given this handler its initial list."""
        return self.informer._synced(self)

    async def wait_for_sync(self, timeout: float | None = None) -> bool:
        """Wait until ``has_synced()`` (subs joining meanwhile included); False on timeout or once removed."""
        union = self.informer
        try:
            async with asyncio.timeout(timeout):
                while self in union._registrations:
                    pending = [r for m in union._order if not (r := m.installs[self]).has_synced()]
                    if not pending:
                        return True
                    await wait_first(union._changed.wait(), *(r.wait_for_sync() for r in pending))
        except TimeoutError:
            pass
        return False

    def _install(self, cluster: str, sub: SubInformer) -> HandlerRegistration:
        # The cluster in the registration's name tells the sub's per-handler metrics and failure logs apart.
        return sub.add_event_handler(_for_cluster(self.handler, cluster), self.resync_period,
                                     f"{self.name}@{cluster}")


@dataclass(eq=False)
class _Member:
    cluster: str  # as spelled in the latest add
    sub: SubInformer
    installs: dict[UnionRegistration, HandlerRegistration]


class UnionInformer:
    """Sub-informers keyed by cluster name (case-insensitive), with handlers fanned out to all of them.

    ``name`` labels the union's metrics (none without a name) on ``metrics_registry`` (default: the global one);
    ``installs`` and ``install_failures`` count the handler installs on subs, and the failed ones.
    """

    def __init__(self, name: str = "", *, metrics_registry: CollectorRegistry | None = None) -> None:
        self.name = name
        self.lister = UnionLister(self)
        self._members: dict[str, _Member] = {}
        # Snapshots rebuilt on every change, in the stable order (by case-folded name) that readers see.
        self._order: tuple[_Member, ...] = ()
        self._listers: tuple[tuple[str, SubLister], ...] = ()
        self._registrations: dict[UnionRegistration, None] = {}  # an ordered set: installed in this order
        self._changed = asyncio.Event()  # set and replaced whenever members or handlers change
        self._cleanups: set[asyncio.Task[None]] = set()
        self.installs = 0
        self.install_failures = 0
        if name:
            _Collector.for_registry(metrics_registry).unions.add(self)

    # -- clusters ----------------------------------------------------------------------------------------
    async def add(self, cluster: str, sub: SubInformer) -> None:
        """Add ``sub`` as cluster ``cluster`` with every union handler installed on it, replacing (and detaching
        the union's handlers from) a sub already under that name. On HandlerInstallError nothing changed."""
        key = _key(cluster)
        if getattr(sub, "lister", None) is None:
            raise ValueError(f"union {self.name!r}: the informer of cluster {cluster!r} has no lister")
        old = self._members.get(key)
        if old is not None and old.sub is sub and old.cluster == cluster:
            return
        installs: dict[UnionRegistration, HandlerRegistration] = {}
        try:
            for reg in self._registrations:
                installs[reg] = reg._install(cluster, sub)
        except Exception as e:
            self.install_failures += 1
            await _settle(self._detach(sub, installs))
            raise HandlerInstallError(f"union {self.name!r}: installing a handler on cluster {cluster!r} failed: "
                                      f"{e}") from e
        self.installs += len(installs)
        self._members[key] = _Member(cluster, sub, installs)
        self._after_change()
        if old is not None:
            # Started in the same synchronous step as the installs: the old sub's handler tasks are cancelled
            # in the loop iteration in which the new sub's first run, so their events never interleave.
            await _settle(self._detach(old.sub, old.installs))

    async def remove(self, cluster: str) -> None:
        """Detach every union handler from the cluster's sub and drop it (no-op if absent). The handlers stay
        remembered for subs added later; the sub itself keeps running (its owner stops it)."""
        member = self._members.pop(_key(cluster), None)
        if member is not None:
            self._after_change()
            await _settle(self._detach(member.sub, member.installs))

    def clusters(self) -> list[str]:
        """The clusters' names as added, in the stable order (by case-folded name)."""
        return [m.cluster for m in self._order]

    def sub_listers(self) -> Sequence[tuple[str, SubLister]]:
        """``(cluster, lister)`` of every cluster, in the stable order."""
        return self._listers

    def sub_lister(self, cluster: str) -> tuple[str, SubLister]:
        """``(cluster as added, its lister)``; ClusterNotFound if the union has no such cluster."""
        member = self._members.get(_key(cluster))
        if member is None:
            raise ClusterNotFound(f"union {self.name!r} has no cluster {cluster!r}")
        return member.cluster, member.sub.lister

    # -- handlers ----------------------------------------------------------------------------------------
    def add_event_handler(self, handler: Handler, resync_period: float | None = None, *,
                          name: str | None = None) -> UnionRegistration:
        """Install ``handler`` on every sub (a sub that has synced first replays its cache to it as initial adds)
        and remember it, with ``resync_period`` and ``name``, for subs added later.

        If one install fails, the others are rolled back, the handler is not remembered, and HandlerInstallError
        is raised."""
        reg = UnionRegistration(self, handler, name or getattr(handler, "name", None) or type(handler).__qualname__,
                                resync_period)
        done: list[tuple[_Member, HandlerRegistration]] = []
        try:
            for m in self._order:
                done.append((m, reg._install(m.cluster, m.sub)))
        except Exception as e:
            self.install_failures += 1
            for m, r in done:
                self._cleanups.update(self._detach(m.sub, {reg: r}))
            cluster = self._order[len(done)].cluster
            raise HandlerInstallError(f"union {self.name!r}: installing handler {reg.name!r} on cluster {cluster!r}"
                                      f" failed: {e}") from e
        for m, r in done:
            m.installs[reg] = r
        self.installs += len(done)
        self._registrations[reg] = None
        self._after_change()
        return reg

    async def remove_event_handler(self, registration: UnionRegistration | HandlerRegistration) -> None:
        """Forget the handler, then remove it from every sub; a registration that is not (or no longer) this
        union's is a no-op."""
        if not isinstance(registration, UnionRegistration) or registration not in self._registrations:
            return
        del self._registrations[registration]
        self._after_change()
        tasks: list[asyncio.Task[None]] = []
        for m in self._order:
            tasks += self._detach(m.sub, {registration: m.installs.pop(registration)})
        await _settle(tasks)

    @property
    def registrations(self) -> list[UnionRegistration]:
        """The handlers registered on the union."""
        return list(self._registrations)

    async def settle(self) -> None:
        """Wait until the rollbacks started by failed ``add_event_handler`` calls have finished."""
        await _settle(list(self._cleanups))

    # -- state -------------------------------------------------------------------------------------------
    def has_synced(self) -> bool:
        """True when every current sub has synced (vacuously true for an empty union)."""
        return all(m.sub.has_synced() for m in self._order)

    def has_synced_clusters(self, expected: Iterable[str]) -> bool:
        """The readiness gate: every expected cluster has a sub, and it has synced."""
        members = self._members
        return all((m := members.get(_key(c))) is not None and m.sub.has_synced() for c in expected)

    def cluster_ready(self, cluster: str) -> bool:
        """Whether the cluster has a sub that has synced and whose reflector reports no current error."""
        m = self._members.get(_key(cluster))
        return m is not None and m.sub.has_synced() and m.sub.last_error is None

    def _synced(self, reg: UnionRegistration) -> bool:
        # Every member holds an install of every remembered handler: both change in one synchronous step.
        return reg in self._registrations and all(m.installs[reg].has_synced() for m in self._order)

    # -- internals ---------------------------------------------------------------------------------------
    def _after_change(self) -> None:
        self._order = tuple(m for _, m in sorted(self._members.items()))
        self._listers = tuple((m.cluster, m.sub.lister) for m in self._order)
        self._changed.set()
        self._changed = asyncio.Event()

    def _detach(self, sub: SubInformer,
                installs: Mapping[UnionRegistration, HandlerRegistration]) -> list[asyncio.Task[None]]:
        """Start removing ``installs`` from ``sub``; the caller (or ``settle``) awaits the tasks."""
        tasks = [asyncio.ensure_future(sub.remove_event_handler(r)) for r in installs.values()]
        for t in tasks:
            t.add_done_callback(self._cleanups.discard)
        return tasks


async def _settle(tasks: list[asyncio.Task[None]]) -> None:
    """Await ``tasks`` to the end, even if the caller is cancelled meanwhile (a handler half removed from an
    informer would keep its task), then re-raise the cancellation; failures are logged."""
    if not tasks:
        return
    gathered = asyncio.gather(*tasks, return_exceptions=True)
    try:
        results = await asyncio.shield(gathered)
    except asyncio.CancelledError:
        await gathered
        raise
    for r in results:
        if isinstance(r, Exception):
            logger.opt(exception=r).error("removing a union handler from an informer failed: {!r}", r)


def _key(cluster: str) -> str:
    if not isinstance(cluster, str):  # "" is a name (the fleet's local cluster)
        raise ValueError(f"a cluster name must be a string, not {cluster!r}")
    return cluster.casefold()


class _Collector(MetricSet):
    """Exposes every live named union of a registry; unions sharing a name are summed."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.unions: "weakref.WeakSet[UnionInformer]" = weakref.WeakSet()
        registry.register(self)

    def collect(self) -> Iterator[Metric]:
        subs = GaugeMetricFamily("union_informer_subs", "Cluster informers in the union.", labels=["union"])
        events = CounterMetricFamily("union_informer_events_total", "Watch events (ADDED, MODIFIED, DELETED) "
                                     "received by each cluster's informer.", labels=["union", "cluster"])
        installs = CounterMetricFamily("union_informer_handler_installs_total", "Union handlers installed on "
                                       "cluster informers.", labels=["union"])
        failures = CounterMetricFamily("union_informer_handler_install_failures_total", "Failed installs of "
                                       "union handlers (each rolled back).", labels=["union"])
        per_union: dict[str, list[int]] = {}
        per_cluster: dict[tuple[str, str], int] = {}
        for u in list(self.unions):
            totals = per_union.setdefault(u.name, [0, 0, 0])
            totals[0] += len(u._order)
            totals[1] += u.installs
            totals[2] += u.install_failures
            for m in u._order:
                counts = m.sub.reflector.event_counts
                key = (u.name, m.cluster)
                per_cluster[key] = per_cluster.get(key, 0) + sum(n for t, n in counts.items() if t != "BOOKMARK")
        for name, (n_subs, n_installs, n_failures) in sorted(per_union.items()):
            subs.add_metric([name], n_subs)
            installs.add_metric([name], n_installs)
            failures.add_metric([name], n_failures)
        for labels, n in sorted(per_cluster.items()):
            events.add_metric(list(labels), n)
        yield from (subs, events, installs, failures)
