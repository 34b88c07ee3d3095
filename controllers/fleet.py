"""Fleet controllers: one reconcile loop over a GVR in every member cluster that serves it (skv2's multicluster
``Loop`` / ``Reconciler`` / ``DeletionReconciler``).

A ``FleetLoop``'s informer is a ``UnionInformer`` of each cluster's informer of the GVR, joining once synced and
leaving when the cluster stops serving the GVR or leaves; one work queue of ``ClusterRequest(cluster, name,
namespace)`` calls ``reconcile``, or ``reconcile_deletion`` once the object is gone. Unlike the anchors: requests
of a cluster that has left are dropped, not retried forever (multicluster-runtime's "cluster not found" loop), subs
come and go by identity, and ``reconcile`` must be a coroutine.
"""

from __future__ import annotations

import asyncio
import inspect
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Protocol, runtime_checkable

from loguru import logger
from prometheus_client import CollectorRegistry

from informers import (
    GVR, ApiClient, Backoff, DiscoveringDynamicSharedInformerFactory, SharedIndexInformer, UnionInformer,
)
from informers.store import DeletedFinalStateUnknown, Obj, last_state
from informers.union_lister import UnionLister

from .cluster import Cluster, ClusterContext, display_name
from .cluster_clients import ClusterClients
from .cluster_registry import ClusterRegistry
from .cluster_term import ClusterTerm
from .context import ReconcileStats
from .fence import OPEN, Fence, fenced
from .keyed_loop import KeyedLoop, still_in_term
from .tracing import current_tracing
from .metrics import reconcile_metrics
from .priority import add_priority, update_priority
from .ratelimiter import RateLimiter
from .reconcile import Request, Result
from .workqueue import WorkQueue


@dataclass(frozen=True, slots=True)
class ClusterRequest:
    """A request in one cluster: the fleet work queue's key."""

    cluster: str
    name: str
    namespace: str | None = None

    @property
    def request(self) -> Request:
        """The request without its cluster."""
        return Request(self.name, self.namespace)

    def __str__(self) -> str:
        return f"{display_name(self.cluster)}/{self.request.key}"


@runtime_checkable
class FleetReconciler(Protocol):
    """``async reconcile(cluster, request) -> Result | None``; one that is also a ``DeletionReconciler`` is called
    once the object is gone from that cluster."""

    async def reconcile(self, cluster: str, request: Request) -> Result | None: ...


@runtime_checkable
class DeletionReconciler(Protocol):
    """A fleet reconciler that also handles deletions (skv2's ``DeletionReconciler``): ``async
    reconcile_deletion(cluster, request) -> Result | None``."""

    async def reconcile_deletion(self, cluster: str, request: Request) -> Result | None: ...


class FleetContext:
    """What ``FleetController.create`` gets: the union informer and its lister (objects of every cluster), the
    multi-cluster ``clients``, the management cluster's ``management`` client (all fenced by the term), the
    ``fence`` itself and a logger."""

    def __init__(self, name: str, gvr: GVR, union: UnionInformer, clients: ClusterClients,
                 management: ApiClient | None, fence: Fence = OPEN) -> None:
        self.name = name
        self.gvr = gvr
        self.union = union
        self.clients = clients
        self.fence = fence
        self.management = fenced(management, fence) if management is not None else None
        self.log = logger.bind(controller=name)

    @property
    def lister(self) -> UnionLister:
        """Reads across the clusters' caches of the GVR (``get_for_cluster``, ``list_for_cluster``, ...); the local
        cluster is ``LOCAL_CLUSTER`` (``""``) there too."""
        return self.union.lister

    def get(self, request: ClusterRequest) -> Obj | None:
        """The object of ``request`` in its cluster's cache, or None."""
        return self.union.lister.get_for_cluster(request.cluster, request.name, request.namespace)


CreateReconciler = Callable[[FleetContext], FleetReconciler | Awaitable[FleetReconciler]]


@dataclass(frozen=True)
class FleetScope:
    """What a fleet component gets for one leadership term: the ``registry`` of member clusters (register cluster
    handlers on it; ``registry.clients`` writes to members; in the sidecar, the term's view of the members,
    ``ClusterTerm``), the management cluster's ``management`` client (fenced by the term) and its discovering
    ``management_factory``, and the ``fence``."""

    registry: ClusterRegistry | ClusterTerm
    management: ApiClient
    management_factory: DiscoveringDynamicSharedInformerFactory
    fence: Fence


@runtime_checkable
class FleetComponent(Protocol):
    """Fleet-wide work that is more than one reconcile loop (a plugin's ``syncer_fleet_components`` hook):
    ``await run(scope)`` once per leadership term, until cancelled; it owns whatever it starts."""

    name: str

    async def run(self, scope: FleetScope) -> None: ...


@dataclass(frozen=True)
class FleetController:
    """A plugin's fleet-wide controller: ``create(ctx)`` (sync or async) returns the reconciler, once per
    leadership term; ``workers`` reconcile concurrently."""

    gvr: GVR
    create: CreateReconciler
    workers: int = 2


class FleetLoop:
    """Runs one FleetController over the clusters it is told about (a ``ClusterHandler``): ``await run()``
    until cancelled."""

    def __init__(
        self, name: str, spec: FleetController, clients: ClusterClients, *, management: ApiClient | None = None,
        fence: Fence = OPEN, rate_limiter: RateLimiter | None = None,
        metrics_registry: CollectorRegistry | None = None, on_join: Callable[[str], None] | None = None,
        on_leave: Callable[[str], None] | None = None, priority_queue: bool = True,
    ) -> None:
        """``on_join(cluster)`` is called once a cluster's informer is in the union (requests for it are served
        from then on): for work that depends on the cluster's cache, beyond the events of its objects.
        ``on_leave(cluster)`` once it is out (its requests still queued are dropped from then on): for what
        those requests would have done. ``priority_queue``: the work queue serves live changes before the
        objects of a cluster joining and resyncs (False: client-go's FIFO queue)."""
        self.name = name
        self.spec = spec
        self._on_join, self._on_leave = on_join, on_leave
        self.fence = fence
        self.union = UnionInformer(name, metrics_registry=metrics_registry)
        self.context = FleetContext(name, spec.gvr, self.union, clients, management, fence)
        self.stats = ReconcileStats()
        self.queue: WorkQueue[ClusterRequest] = WorkQueue()
        self._rate_limiter = rate_limiter
        self._metrics_registry = metrics_registry
        self._prioritized = priority_queue
        self._subs: dict[str, SharedIndexInformer] = {}  # cluster -> the informer it joined with
        self._detaches: dict[int, Callable[[], Awaitable[None]]] = {}  # feed -> its cleanup, until it has run
        self._closed = False
        self._lock = asyncio.Lock()  # union changes in the order they were decided
        self._log = logger.bind(controller=name)

    # -- ClusterHandler ----------------------------------------------------------------------------------
    def add_cluster(self, ctx: ClusterContext, name: str, cluster: Cluster) -> None:
        """Follow ``cluster``'s informer of the GVR: it joins the union when synced and leaves before the factory
        stops it (while its cache is still whole: a request read from an emptied cache would look like a
        deletion), or when the cluster goes."""
        if self._closed:
            return
        feed = _Feed(self, ctx, name, self.spec.gvr)
        factory = cluster.factory
        owner = f"fleet controller {self.name}"
        factory.require(owner, [self.spec.gvr])  # a factory watching only what is required must watch it
        factory.add_gvr_handler(feed)
        unhook = factory.add_removal_hook(feed.before_removal)

        async def cleanup() -> None:
            if self._detaches.pop(id(feed), None) is None:
                return  # done already (by close)
            unhook()
            await feed.leave()
            # The local cluster's factory outlives this loop: it must forget the loop's handler and needs.
            await factory.remove_gvr_handler(feed)
            factory.release(owner)

        self._detaches[id(feed)] = cleanup
        ctx.add_cleanup(cleanup)

    async def close(self) -> None:
        """Detach from every cluster now (the loop ends before its clusters do: its resource is no longer wanted),
        and ignore clusters added later."""
        self._closed = True
        for cleanup in list(self._detaches.values()):
            await cleanup()

    def enqueue(self, request: ClusterRequest, priority: int = 0) -> None:
        """Queue ``request`` from elsewhere than the union's events (another informer whose objects map to it), at
        ``priority`` (``priority.py``)."""
        self.queue.add(request, priority)

    async def _join(self, feed: "_Feed", informer: SharedIndexInformer) -> None:
        async with self._lock:
            if feed.ctx.cancelled():  # decided while the cluster (or this connection of it) was still there
                return
            feed.informer = informer  # before awaiting: a leave() from now on knows what to take out
            await self.union.add(feed.cluster, informer)
            self._subs[feed.cluster] = informer
        self._log.info("cluster {} joins fleet controller {} ({} served there)", display_name(feed.cluster),
                       self.name, self.spec.gvr)
        if self._on_join is not None:
            self._on_join(feed.cluster)

    async def _leave(self, name: str, informer: SharedIndexInformer) -> None:
        """Remove cluster ``name``'s sub, if it is still ``informer``."""
        async with self._lock:
            if self._subs.get(name) is not informer:
                return
            del self._subs[name]
            await self.union.remove(name)
        self._log.info("cluster {} leaves fleet controller {}", display_name(name), self.name)
        if self._on_leave is not None:
            self._on_leave(name)

    # -- running -----------------------------------------------------------------------------------------
    async def run(self) -> None:
        """Create the reconciler (retried with backoff while ``create`` fails), then reconcile until cancelled. The
        union keeps its subs (the clusters' cleanups remove them), so a run that follows sees them at once."""
        self.queue = WorkQueue(self.name, self._rate_limiter, self._metrics_registry, prioritized=self._prioritized)
        reconciler = await self._create()
        reconcile = reconciler.reconcile
        deletion = reconciler.reconcile_deletion if isinstance(reconciler, DeletionReconciler) else None

        async def handle(item: ClusterRequest) -> Result | None:
            still_in_term(self.fence)
            if self.context.get(item) is not None:
                result: Result | None = await reconcile(item.cluster, item.request)
            else:
                result = await deletion(item.cluster, item.request) if deletion is not None else None
            return result

        tracing = current_tracing()
        loop = KeyedLoop(self.name, self.queue, handle, workers=self.spec.workers, fence=self.fence, stats=self.stats,
                         metrics=reconcile_metrics(self.name, self._metrics_registry), log=self._log, skip=self._gone,
                         span=lambda item: tracing.reconcile(self.name, item.cluster, self.spec.gvr, item.request))
        registration = self.union.add_event_handler(_Enqueuer(self.queue), name=self.name)
        try:
            await loop.run()
        finally:
            await self.union.remove_event_handler(registration)

    async def _create(self) -> FleetReconciler:
        backoff = Backoff(initial=1.0, cap=60.0)
        while True:
            try:
                made = self.spec.create(self.context)
                reconciler = await made if inspect.isawaitable(made) else made
                if not inspect.iscoroutinefunction(getattr(reconciler, "reconcile", None)):
                    raise TypeError(f"create() returned {type(reconciler).__name__}, which has no async "
                                    "reconcile(cluster, request)")
                return reconciler
            except Exception as e:
                delay = backoff.next()
                self.stats.record_error(e)
                self._log.opt(exception=e).error("fleet controller {}: create failed ({}); retrying in {:.1f}s",
                                                 self.name, e, delay)
                await asyncio.sleep(delay)

    def _gone(self, item: ClusterRequest) -> str | None:
        if item.cluster not in self._subs:
            return f"cluster {display_name(item.cluster)} has left fleet controller {self.name}"
        return None

    def status(self) -> dict[str, Any]:
        """The clusters in the union and the reconcile counts."""
        return {"name": self.name, "gvr": str(self.spec.gvr), "clusters": sorted(self._subs),
                "queue": len(self.queue), "reconciles": self.stats.total, "reconcile_errors": self.stats.errors,
                "last_reconcile_error": self.stats.last_error}


class _Feed:
    """The GVR handler on one cluster's factory: its informer of the fleet GVR joins and leaves the union."""

    def __init__(self, loop: FleetLoop, ctx: ClusterContext, cluster: str, gvr: GVR) -> None:
        self.loop, self.ctx, self.cluster, self.gvr = loop, ctx, cluster, gvr
        self.informer: SharedIndexInformer | None = None

    def on_gvr_added(self, gvr: GVR, informer: SharedIndexInformer) -> None:
        """Nothing yet: a cluster joins once its informer has synced."""

    async def on_gvr_synced(self, gvr: GVR, informer: SharedIndexInformer) -> None:
        if gvr == self.gvr:
            await self.loop._join(self, informer)

    async def on_gvr_removed(self, gvr: GVR) -> None:
        if gvr == self.gvr:  # normally gone already, by the removal hook
            await self.leave()

    async def before_removal(self, gvr: GVR) -> None:
        """The factory's removal hook: leave while the informer's cache is still whole."""
        if gvr == self.gvr:
            await self.leave()

    async def leave(self) -> None:
        """Take this feed's informer out of the union (if it is still the cluster's sub)."""
        informer, self.informer = self.informer, None
        if informer is not None:
            await self.loop._leave(self.cluster, informer)


class _Enqueuer:
    """Union handler: every event queues its object's ClusterRequest, at the event's priority (``priority.py``: the
    objects of a cluster joining, its initial list, wait behind the live changes of the clusters already in)."""

    def __init__(self, queue: WorkQueue[ClusterRequest]) -> None:
        self.queue = queue

    def _add(self, obj: Any, cluster: str, priority: int) -> None:
        obj = last_state(obj)
        meta = obj["metadata"]
        self.queue.add(ClusterRequest(cluster, meta["name"], meta.get("namespace") or None), priority)

    def on_add(self, obj: Obj, is_in_initial_list: bool, cluster: str) -> None:
        self._add(obj, cluster, add_priority(is_in_initial_list))

    def on_update(self, old: Obj, new: Obj, cluster: str) -> None:
        self._add(new, cluster, update_priority(old, new))

    def on_delete(self, obj: Obj | DeletedFinalStateUnknown, cluster: str) -> None:
        self._add(obj, cluster, 0)
