"""Replication: one ClusterCachedResource's engine (kcp's "replication" controller): each source object of one GVR
matching a selector, in every source cluster, kept as a ``CachedObject`` wrapper in the cache cluster.

A ``FleetLoop`` over the source GVR plus one informer of the wrappers; source and wrapper events queue the same
``ClusterRequest``, and one reconcile converges the wrapper. Differs from kcp:

- The cache informer is filtered to this schema; the full selector is used, and a source that stops matching
  loses its wrapper.
- A hand-edited wrapper is restored even when the source's resourceVersion is unchanged.
- Wrappers of a cluster that left, or no longer serves the GVR, are swept; one that does not answer keeps them.
- Reconciles wait for the cache informer's sync, so a restart over replicated state writes nothing.
- Requests held up by an unreachable cache are all retried once it answers, not per-item backoff.
- ``purge`` reads the cache only, so it works once the source CRD is gone.
"""

from __future__ import annotations

import asyncio
from typing import Any, Iterable

from loguru import logger
from prometheus_client import CollectorRegistry

from controllers.cluster import Cluster, ClusterContext, display_name
from controllers.cluster_clients import ClusterClients
from controllers.fence import OPEN, Fence
from controllers.fleet import ClusterRequest, FleetContext, FleetController, FleetLoop
from controllers.priority import LOW_PRIORITY, add_priority, update_priority
from controllers.reconcile import Request, Result, TerminalError
from informers import (
    GVR, AlreadyExists, ApiClient, ApiError, ClusterNotFound, Conflict, DeletedFinalStateUnknown, FuncHandler,
    HandlerRegistration, InformerMetrics, LabelSelector, NotFound, ResourceClient, SharedIndexInformer, deep_copy,
    drop_managed_fields,
)
from informers.client import CONNECTION_ERRORS
from informers.store import Obj, last_state
from informers.wait import wait_first

from .naming import (
    CACHED_OBJECTS, LABEL_SCHEMA, is_wrapper_of_schema, schema, schema_selector, source_of, wrapper_for, wrapper_name,
)
from .sources import SourceClusters, SourceReport

_BY_CLUSTER = "cache.kcp.io/source-cluster"  # the cache informer's index: wrappers by source cluster
_PURGE_CONCURRENCY = 16
_STALL_RETRY = 30.0  # seconds a request held up by the cache waits at most before it is tried again anyway
_SWEEP_INTERVAL = 5.0  # seconds between sweeps when no cluster leaves (the state may have changed while we were away)
# Metadata a wrapper may carry from others (consumers, admins): an update keeps it rather than reverting it.
_KEPT_METADATA = ("finalizers", "ownerReferences")


class Replication:
    """Replicates ``gvr`` objects matching ``selector`` from every cluster it is told about (``add_cluster``: a
    ``ClusterHandler``) into ``cache`` as wrappers stamped with ``identity_hash``.

    ``cache`` is the client writes to the cache go through (the caller fences it). ``await run()`` once, until
    cancelled; ``await close()`` detaches from the clusters. A changed selector is a new Replication over the same
    cache (its reconciles delete what the old selector admitted and the new one does not), as the root controller
    does; ``purge()`` after ``close()`` removes every wrapper of the schema. With ``sources`` (the fleet's source
    clusters), the wrappers of clusters that do not serve the GVR or are no sources are swept while it runs.
    """

    def __init__(self, name: str, gvr: GVR, selector: LabelSelector, identity_hash: str, cache: ApiClient,
                 clients: ClusterClients, *, fence: Fence = OPEN, workers: int = 2,
                 metrics_registry: CollectorRegistry | None = None, sources: SourceClusters | None = None) -> None:
        self.name = name
        self.gvr = gvr
        self.selector = selector
        self.identity_hash = identity_hash
        self.cache = cache
        self._log = logger.bind(replication=name)
        self._objects = ResourceClient(cache, CACHED_OBJECTS, namespaced=False)  # no discovery needed
        # Whole source objects, not gvr.only_metadata(): a wrapper's spec.raw is the whole object, so a metadata
        # cache would cost a GET per object and per change for a fraction of the memory (bench/RESULTS-metadata.md).
        self._loop = FleetLoop(f"replication {name}", FleetController(gvr, self._create, workers), clients,
                               fence=fence, metrics_registry=metrics_registry, on_join=self._joined,
                               on_leave=lambda _: self._sweep_wanted.set())
        self._sources = sources
        self._sweep_wanted = asyncio.Event()
        # Informer series are labelled by GVR only: every replication watches CachedObjects, and a shared registry
        # would let one's informer overwrite (and, as it stops, remove) another's.
        self._wrappers = SharedIndexInformer(
            cache, CACHED_OBJECTS, label_selector=schema_selector(gvr), transform=drop_managed_fields,
            indexers={_BY_CLUSTER: _wrapper_cluster}, metrics=InformerMetrics.for_registry(CollectorRegistry()))
        self._registration: HandlerRegistration | None = None
        self._running = False
        self._stalled: set[ClusterRequest] = set()  # requests held up by an unreachable cache
        self._waiter: asyncio.Task[None] | None = None

    # -- ClusterHandler ----------------------------------------------------------------------------------
    def add_cluster(self, ctx: ClusterContext, name: str, cluster: Cluster) -> None:
        """Replicate from ``cluster`` (from when its informer of the GVR has synced until it leaves)."""
        self._loop.add_cluster(ctx, name, cluster)

    # -- lifecycle ---------------------------------------------------------------------------------------
    async def run(self) -> None:
        """Watch the schema's wrappers in the cache, and once that cache has synced, reconcile until cancelled
        (once per Replication). The wrapper informer stops on the way out (kcp's child informers outlived the
        child)."""
        if self._running:
            raise RuntimeError(f"replication {self.name} is already running")
        self._running = True
        self._wrappers.start()
        try:
            await self._wrappers.wait_for_sync()
            async with asyncio.TaskGroup() as tg:
                if self._sources is not None:
                    tg.create_task(self._sweeper(), name=f"replication {self.name} sweeper")
                await self._loop.run()
        finally:
            if self._waiter is not None:
                self._waiter.cancel()
                await asyncio.gather(self._waiter, return_exceptions=True)
            if self._registration is not None:
                await self._wrappers.remove_event_handler(self._registration)
                self._registration = None
            await self._wrappers.stop()
            self._running = False

    async def close(self) -> None:
        """Detach from every cluster (their informers leave the union; clusters added later are ignored)."""
        await self._loop.close()

    def synced(self) -> bool:
        """Whether the reconciles run: the wrappers' cache has synced and is mapped to requests, and so have the
        source caches of every cluster that has joined."""
        return self._registration is not None and self._wrappers.has_synced() and self._loop.union.has_synced()

    def counts(self) -> dict[str, int]:
        """``local``: source objects matching the selector, across the joined clusters; ``cache``: this schema's
        wrappers. Both read the informers, no request."""
        return {"local": len(self._loop.union.lister.list(label_selector=self.selector)),
                "cache": len(self._wrappers.store)}

    def status(self) -> dict[str, Any]:
        """The fleet loop's status (clusters, queue, reconciles and errors) with the counts."""
        return {**self._loop.status(), **self.counts(), "synced": self.synced()}

    def standings(self) -> dict[str, SourceReport]:
        """Where each source cluster, and each cluster some wrapper names, stands with the GVR (empty without
        ``sources``)."""
        return self._standings(self._wrappers_by_cluster())

    def _standings(self, by_cluster: dict[str, list[Obj]]) -> dict[str, SourceReport]:
        if self._sources is None:
            return {}
        return self._sources.standings(self.gvr, self._loop.status()["clusters"], by_cluster)

    def _wrappers_by_cluster(self) -> dict[str, list[Obj]]:
        out: dict[str, list[Obj]] = {}
        for wrapper in self._wrappers.store:
            request = _source_request(wrapper)
            if request is not None:
                out.setdefault(request.cluster, []).append(wrapper)
        return out

    async def _sweeper(self) -> None:
        """Sweep when a cluster leaves the replication, and every ``_SWEEP_INTERVAL`` seconds; a sweep that fails
        (the cache not answering) is simply done again."""
        while True:
            await wait_first(self._sweep_wanted.wait(), timeout=_SWEEP_INTERVAL)
            self._sweep_wanted.clear()
            try:
                await self._sweep()
            except (ApiError, *CONNECTION_ERRORS) as e:
                self._log.warning("replication {}: sweeping the cached objects of departed clusters failed ({!r}); "
                                  "trying again", self.name, e)

    async def _sweep(self) -> None:
        """Delete the wrappers of every cluster whose standing says they go (``Standing.purges``)."""
        by_cluster = self._wrappers_by_cluster()
        stale: list[Obj] = []
        for cluster, report in self._standings(by_cluster).items():
            wrappers = by_cluster.get(cluster)
            if wrappers and report.standing.purges:
                self._log.info("replication {}: removing the {} cached objects of cluster {} ({}: {})", self.name,
                               len(wrappers), display_name(cluster), report.standing, report.detail)
                stale += wrappers
        await self._delete(stale)

    async def _delete(self, wrappers: Iterable[Obj]) -> None:
        """Delete these wrappers, each only while it is still the one read (a wrapper recreated meanwhile by a
        reconcile is another object, and stays)."""
        gate = asyncio.Semaphore(_PURGE_CONCURRENCY)

        async def delete(wrapper: Obj) -> None:
            async with gate:
                try:
                    await self._objects.delete(wrapper["metadata"]["name"], uid=wrapper["metadata"].get("uid"))
                except (NotFound, Conflict):
                    pass

        await asyncio.gather(*(delete(w) for w in wrappers))

    async def purge(self) -> int:
        """Delete every wrapper of this schema in the cache (of every cluster and identity); returns how many are
        left (0: done; more when one is held by a finalizer or was created meanwhile: call again). Raises while
        the cache cannot be reached. Call it once replication has stopped, or the reconciles restore them."""
        selector = schema_selector(self.gvr)
        try:
            wrappers = await self._objects.list(label_selector=selector)
        except NotFound:
            return 0  # the CachedObject resource itself is gone from the cache: no wrapper can be left
        await self._delete(wrappers)
        left = len(await self._objects.list(label_selector=selector))
        self._log.info("replication {}: purged {} wrappers of {}, {} left", self.name, len(wrappers) - left,
                       self.gvr, left)
        return left

    # -- the reconciler ----------------------------------------------------------------------------------
    def _create(self, ctx: FleetContext) -> "_Reconciler":
        # Called by the loop's run() once its work queue exists: wrapper events queued before would be lost.
        # The registration replays every wrapper, so each maps back to its source request at start.
        if self._registration is None:
            self._registration = self._wrappers.add_event_handler(
                FuncHandler(self._map_initial, self._map_update, self._map), name=self._loop.name)
        return _Reconciler(self, ctx)

    def _map_initial(self, wrapper: Obj, is_in_initial_list: bool) -> None:
        # The union replays every source of the joined clusters right after this: a wrapper whose source is there
        # would only be reconciled twice (the second time against a cache that may not show the first's write yet,
        # a PUT bound to fail with a Conflict).
        if not (is_in_initial_list and self._source_cached(wrapper)):
            self._map(wrapper, add_priority(is_in_initial_list))

    def _map(self, wrapper: Obj | DeletedFinalStateUnknown, priority: int = 0) -> None:
        obj = last_state(wrapper)
        request = _source_request(obj)
        if request is not None:
            self._loop.enqueue(request, priority)

    def _map_update(self, old: Obj, new: Obj) -> None:
        # Both: a label edited by hand maps the new state to another source, and the wrapper's own source (the
        # old mapping) must restore it.
        before, after = _source_request(old), _source_request(new)
        for request in {before, after} - {None}:
            assert request is not None
            self._loop.enqueue(request, update_priority(old, new))

    def _joined(self, cluster: str) -> None:
        """A cluster's source informer is in the union: revisit the wrappers recorded for it, whose sources may
        have gone while it was away (no event of the cluster would name them); with the cluster's initial list,
        behind live changes."""
        for wrapper in self._wrappers.store.by_index(_BY_CLUSTER, cluster):
            if not self._source_cached(wrapper):  # the others come with the union's replay of the cluster
                self._map(wrapper, LOW_PRIORITY)

    def _source_cached(self, wrapper: Obj) -> bool:
        """Whether the wrapper's source is in its cluster's cache (False when that cluster has not joined)."""
        request = _source_request(wrapper)
        try:
            return request is not None and self._loop.context.get(request) is not None
        except ClusterNotFound:
            return False

    def _wanted(self, source: Obj | None) -> bool:
        """Whether ``source`` should have a wrapper: it exists, matches, and is not past its last finalizer."""
        if source is None:
            return False
        meta = source["metadata"]
        if not self.selector.matches(meta.get("labels")):
            return False
        return not (meta.get("deletionTimestamp") and not meta.get("finalizers"))

    async def _sync(self, ctx: FleetContext, cluster: str, request: Request) -> Result | None:
        """Make the wrapper of ``request`` in ``cluster`` what its source says (one reconcile). While the cache does
        not answer, the request waits for it to answer again (``_stall``) instead of backing off on its own."""
        since = self.cache.recoveries
        try:
            return await self._converge(ctx, cluster, request)
        except CONNECTION_ERRORS as e:
            self._stall(ClusterRequest(cluster, request.name, request.namespace), since, e)
            return None

    def _stall(self, request: ClusterRequest, since: int, error: BaseException) -> None:
        """Park ``request`` until any request to the cache succeeds again (at most ``_STALL_RETRY`` seconds): an
        outage then ends with one prompt retry of everything it held up, where per-item backoff would have left
        the items that failed most waiting about as long again, each failure logged with its traceback."""
        self._stalled.add(request)
        if self._waiter is None or self._waiter.done():
            self._log.warning("replication {}: the cache is not answering ({!r}); {} waits for it", self.name, error,
                              request)
            self._waiter = asyncio.create_task(self._resume(since), name=f"replication {self.name} resume")

    async def _resume(self, since: int) -> None:
        await wait_first(self.cache.answered_again(since), timeout=_STALL_RETRY)
        stalled, self._stalled = self._stalled, set()
        self._log.info("replication {}: retrying {} request(s) held up by the cache", self.name, len(stalled))
        for request in stalled:
            self._loop.queue.forget(request)
            self._loop.enqueue(request)

    async def _converge(self, ctx: FleetContext, cluster: str, request: Request) -> Result | None:
        source = ctx.get(ClusterRequest(cluster, request.name, request.namespace))
        name = wrapper_name(self.gvr, request.name, request.namespace, cluster)
        wrapper = self._wrappers.lister.get(name)
        if not self._wanted(source):
            if wrapper is not None:
                try:
                    await self._objects.delete(name)
                except NotFound:
                    pass
                self._log.debug("replication {}: deleted {} ({}/{})", self.name, name, display_name(cluster), request)
            return None
        assert source is not None
        desired = wrapper_for(self.gvr, source, cluster, self.identity_hash)
        if wrapper is None:
            try:
                await self._objects.create(desired)
                return None
            except AlreadyExists:
                # Not in this informer (yet): a create racing it, or a wrapper whose schema label was removed.
                try:
                    wrapper = await self._objects.get(name)
                except NotFound:
                    return Result(requeue=True)
                other = ((wrapper.get("metadata") or {}).get("labels") or {}).get(LABEL_SCHEMA)
                if other is not None and not is_wrapper_of_schema(wrapper, self.gvr):
                    # The one ambiguity of readable names (see naming): another schema's wrapper has this name. Taking
                    # it over would start a tug of war with that schema's replication.
                    raise TerminalError(f"cached object {name} belongs to schema {other}, not {schema(self.gvr)}")
        if _current(wrapper, desired):
            return None
        try:
            await self._objects.update(_updated(wrapper, desired))
        except (Conflict, NotFound):
            return Result(requeue=True)  # the wrapper changed or went meanwhile: its event is on the way
        return None


class _Reconciler:
    """The FleetReconciler: present and gone sources alike go through ``Replication._sync``."""

    def __init__(self, replication: Replication, ctx: FleetContext) -> None:
        self.replication, self.ctx = replication, ctx

    async def reconcile(self, cluster: str, request: Request) -> Result | None:
        return await self.replication._sync(self.ctx, cluster, request)

    async def reconcile_deletion(self, cluster: str, request: Request) -> Result | None:
        return await self.replication._sync(self.ctx, cluster, request)


def _source_request(wrapper: Obj) -> ClusterRequest | None:
    try:
        cluster, namespace, name = source_of(wrapper)
    except (KeyError, TypeError, ValueError):
        logger.debug("cached object {} names no source; ignored", (wrapper.get("metadata") or {}).get("name"))
        return None
    return ClusterRequest(cluster, name, namespace or None)


def _wrapper_cluster(wrapper: Obj) -> Iterable[str]:
    request = _source_request(wrapper)
    return [request.cluster] if request is not None else []


def _current(wrapper: Obj, desired: Obj) -> bool:
    """Whether ``wrapper`` already says what ``desired`` does: the same spec (the source object, whose recorded
    resourceVersion is among the annotations) and every label and annotation of ours with our value."""
    if wrapper.get("spec") != desired.get("spec"):
        return False
    have, want = wrapper.get("metadata") or {}, desired["metadata"]
    return all(_contains(have.get(field), want.get(field)) for field in ("labels", "annotations"))


def _contains(have: dict[str, str] | None, want: dict[str, str] | None) -> bool:
    have = have or {}
    return all(have.get(k) == v for k, v in (want or {}).items())


def _updated(wrapper: Obj, desired: Obj) -> Obj:
    """The PUT body: ``desired`` (ours to change) at the wrapper's resourceVersion, keeping what others added to
    its metadata."""
    body = desired
    have, meta = wrapper.get("metadata") or {}, body["metadata"]
    meta["resourceVersion"] = have["resourceVersion"]
    for field in ("labels", "annotations"):
        merged = {**(have.get(field) or {}), **(meta.get(field) or {})}
        if merged:
            meta[field] = merged
    for field in _KEPT_METADATA:
        if have.get(field):
            meta[field] = deep_copy(have[field])
    return body


__all__ = ["Replication"]
