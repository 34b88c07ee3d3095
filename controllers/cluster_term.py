"""ClusterTerm: the members of a registry as one leadership term sees them, so that the registry may outlive the
term (the fleet's warm standby: a standby keeps the members connected, discovered and their informers synced, and
a new leader's controllers start on those caches).

A term's handlers (per-cluster controllers, fleet loops, fleet components) register here instead of on the
registry. Each engaged member reaches them as a ``Cluster`` over the member's client and factory but under the
term's fence, with a context of the term's own, cancelled (its cleanups awaited) when the member leaves or is
replaced, or when the term ends, whichever comes first. So what a term hands out writes through that term's fence
however long the connection lives (``clients``; a client of term N refuses writes once N has ended, in term N+1
too), and ``stop()`` returns once every cleanup of the term's handlers has run (their controllers stopped, their
handlers and needs taken off the members' factories), the members themselves untouched. multicluster-runtime
engages clusters on the leader only, so it has no such split: its standbys hold nothing of the members.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from informers.union_lister import ClusterNotFound

from .cluster import (
    Cleanup, Cluster, ClusterContext, ClusterHandler, ClusterRemovedHandler, NamedLocks, display_name, finish,
)
from .cluster_clients import ClusterClients
from .cluster_registry import ClusterRegistry, bounded_call, call_handler
from .fence import Fence
from .provider_set import ProviderSet


@dataclass(eq=False)
class _Engagement:
    """One engaged member as the term knows it: the registry's context of it (``parent``), the term's own and
    the term's ``Cluster``, and the term's handlers told of it, in order."""

    parent: ClusterContext
    ctx: ClusterContext
    cluster: Cluster
    cleanup: Cleanup | None = None  # on ``parent``: ends the engagement when the member leaves or is replaced
    told: list[ClusterHandler] = field(default_factory=list)


class ClusterTerm:
    """The engaged members of ``registry`` under ``fence`` (a term's), for the term's handlers.

    It is a cluster handler on ``registry`` from ``start()`` to ``stop()``, and to the term's handlers what a
    registry is: ``register_cluster_handler``, ``clients``, ``cluster``, ``list_clusters`` (this term's
    view), and ``providers``, ``synced``, ``status`` (the registry's).
    """

    def __init__(self, registry: ClusterRegistry, fence: Fence) -> None:
        self.registry = registry
        self.fence = fence
        self.clients = ClusterClients(self)
        self._handlers: list[ClusterHandler] = []
        self._current: dict[str, _Engagement] = {}  # cluster name -> what this term's handlers know as it
        self._live: dict[int, _Engagement] = {}  # every engagement not ended (a replaced one until its parent ends)
        self._lock_for = NamedLocks()
        self._closed = False

    # -- the registry's handler --------------------------------------------------------------------------
    async def add_cluster(self, ctx: ClusterContext, name: str, cluster: Cluster) -> None:
        """The registry engaged ``cluster`` (new, or a new connection of it): tell the term's handlers."""
        async with self._lock_for(name):
            if self._closed or ctx.cancelled():
                return
            e = _Engagement(ctx, ClusterContext(name),
                            Cluster(name, cluster.source, cluster.client, cluster.factory, self.fence))
            e.cleanup = partial(self._end, e)
            ctx.add_cleanup(e.cleanup)
            self._current[name] = self._live[id(e)] = e
            for handler in list(self._handlers):
                await self._tell(e, handler)

    async def remove_cluster(self, name: str) -> None:
        """The registry's member ``name`` left for good (its context's cleanups, ours included, have run): pass it
        on to the handlers told of it."""
        async with self._lock_for(name):
            e = self._current.get(name)
            if e is not None and e.ctx.cancelled():
                del self._current[name]
                await self._removed(e)

    # -- the term's handlers -----------------------------------------------------------------------------
    async def register_cluster_handler(self, handler: ClusterHandler) -> None:
        """``handler.add_cluster`` for every member this term has now, then for every later one."""
        self._handlers.append(handler)
        for name in list(self._current):
            async with self._lock_for(name):
                e = self._current.get(name)
                if e is not None:
                    await self._tell(e, handler)

    def unregister_cluster_handler(self, handler: ClusterHandler) -> None:
        """Tell ``handler`` about no more clusters (its cleanups already registered still run)."""
        if handler in self._handlers:
            self._handlers.remove(handler)

    async def _tell(self, e: _Engagement, handler: ClusterHandler) -> None:
        if self._closed or e.ctx.cancelled() or handler in e.told:
            return
        e.told.append(handler)
        await call_handler(handler.add_cluster, e.ctx, e.cluster.name, e.cluster)

    # -- views -------------------------------------------------------------------------------------------
    def cluster(self, name: str) -> Cluster:
        """Cluster ``name`` as this term has it (under the term's fence); ClusterNotFound if it is not engaged."""
        e = self._current.get(name)
        if e is None or e.ctx.cancelled():
            raise ClusterNotFound(f"no cluster {display_name(name)!r} is registered and up in this term "
                                  f"(up: {', '.join(map(display_name, self.list_clusters())) or 'none'})")
        return e.cluster

    def list_clusters(self) -> list[str]:
        """The names of the members engaged in this term, sorted."""
        return sorted(name for name, e in self._current.items() if not e.ctx.cancelled())

    @property
    def providers(self) -> ProviderSet:
        """The registry's cluster providers."""
        return self.registry.providers

    def synced(self) -> bool:
        """The registry's ``synced()``."""
        return self.registry.synced()

    def status(self) -> dict[str, Any]:
        """The registry's ``status()``."""
        return self.registry.status()

    # -- lifecycle ---------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Join the registry: every member engaged now, then every later one, reaches the term's handlers."""
        await self.registry.register_cluster_handler(self)

    async def stop(self) -> None:
        """End the term here: leave the registry, run every cleanup of the term's handlers (each bounded by the
        registry's ``cleanup_timeout``), then their ``remove_cluster`` for every member, as a registry stopping
        would; the members stay."""
        self._closed = True
        self.registry.unregister_cluster_handler(self)
        live = list(self._live.values())
        for e in live:
            if e.cleanup is not None:
                e.parent.remove_cleanup(e.cleanup)
        await finish(self._stop(live))

    async def _stop(self, live: list[_Engagement]) -> None:
        await asyncio.gather(*(self._end(e) for e in live))
        current, self._current = self._current, {}
        for e in current.values():
            await self._removed(e)

    async def _end(self, e: _Engagement) -> None:
        """End ``e`` once: its term context's cleanups, awaited (a second caller waits for the first)."""
        async with self._lock_for(e.cluster.name):
            if self._live.pop(id(e), None) is not None:
                await e.ctx.run_cleanups(self.registry.options.cleanup_timeout)

    async def _removed(self, e: _Engagement) -> None:
        for handler in e.told:
            if handler in self._handlers and isinstance(handler, ClusterRemovedHandler):
                await finish(bounded_call(self.registry.options.cleanup_timeout, handler.remove_cluster,
                                          e.cluster.name))
