"""Cluster: one member of a fleet (its API client and discovering informer factory), its conditions, the context
handed to cluster handlers, and the handler protocols (skv2's ClusterHandler / ClusterRemovedHandler).

skv2 hands a handler a ``context.Context`` that is cancelled when the cluster goes; teardown then runs in the
handler's own goroutines, which nobody waits for, so "the cluster is gone" says nothing about whether its
informers and handlers have stopped. Here a handler registers its teardown on the ``ClusterContext``
(``add_cleanup``) and the registry awaits it (bounded) before it stops the cluster's informers and closes its
connections: when a removal returns, everything of the cluster has stopped.
"""

from __future__ import annotations

import asyncio
import enum
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterable, Protocol, runtime_checkable

from loguru import logger

from informers import GVR, ApiClient, ClusterSource
from informers.client import CONNECTION_ERRORS

from .fence import OPEN, Fence

LOCAL_CLUSTER = ""
"""The name of the management cluster itself (skv2's ``LocalCluster``), a member when ``include_local`` is set.

One rule for how it appears: where a cluster *name* goes (status ``name``, metric label ``cluster``, a request's
cluster) it is this empty name, as the sidecar's own informers are labelled in single-cluster mode too; where
a cluster is *shown* to a person (logs, status ``display_name``, status rows, union names) it is
``display_name``'s ``(local)``, which no valid cluster name can be."""

Cleanup = Callable[[], Awaitable[None]]


def display_name(cluster: str) -> str:
    """How a cluster is shown to a person: its name, or ``(local)`` for the local cluster (see LOCAL_CLUSTER)."""
    return cluster if cluster != LOCAL_CLUSTER else "(local)"


def qualified(controller: str, cluster: str) -> str:
    """A per-cluster controller's name in status rows: ``name (cluster c1)``, ``name (cluster (local))``."""
    return f"{controller} (cluster {display_name(cluster)})"


class ConditionType(enum.StrEnum):
    """A cluster goes through these in order; each is true, false (with the last error) or not known yet."""

    CONNECTED = "Connected"
    DISCOVERED = "Discovered"
    SYNCED = "Synced"


@dataclass
class Condition:
    """One condition: ``status`` None while unknown; ``reason`` a word, ``message`` the last error or detail."""

    type: ConditionType
    status: bool | None = None
    reason: str = ""
    message: str = ""
    since: float = field(default_factory=time.time)

    def set(self, status: bool | None, reason: str = "", message: str = "") -> None:
        """Update, keeping ``since`` unless the status changes."""
        if status != self.status:
            self.since = time.time()
        self.status, self.reason, self.message = status, reason, message

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"type": self.type.value, "status": {None: "Unknown", True: "True", False: "False"}[self.status],
                "reason": self.reason, "message": self.message, "since": self.since}


class Cluster:
    """A connected member cluster: ``client`` (owned by the registry: do not close it), ``factory`` (its own
    API discovery, or its namespace's view of a shared one; informers run for the GVRs that some controller
    requires) and ``fence``, under which work in
    it runs (the leadership term, or with sharding this replica's tenure of the cluster)."""

    def __init__(self, name: str, source: str, client: ApiClient, factory: ClusterSource,
                 fence: Fence = OPEN) -> None:
        self.name = name
        self.source = source
        self.client = client
        self.factory = factory
        self.fence = fence

    def not_synced(self, required: Iterable[GVR]) -> list[GVR]:
        """The ``required`` GVRs this cluster serves whose informers have not synced (or report an error)."""
        synced, pending = self.factory.informers()
        waiting = set(pending)
        return sorted(g for g in required if g in waiting or (g in synced and synced[g].last_error is not None))

    def unreachable(self) -> tuple[GVR, Exception] | None:
        """A synced informer whose last list or watch failed to reach the server, with that error (the first by
        GVR), or None: the cluster's connection as its watches see it, as soon as they see it."""
        synced, _ = self.factory.informers()
        for gvr, inf in sorted(synced.items()):
            if isinstance(inf.last_error, CONNECTION_ERRORS):
                return gvr, inf.last_error
        return None

    def __repr__(self) -> str:
        return f"Cluster({display_name(self.name)!r} from {self.source})"


class ClusterContext:
    """Handed to ``add_cluster``: cancelled when its cluster leaves or is replaced by a new connection (a rotated
    kubeconfig). Teardown registered with ``add_cleanup`` is awaited by the registry, in reverse order."""

    def __init__(self, cluster: str) -> None:
        self.cluster = cluster
        self._cancelled = asyncio.Event()
        self._cleanups: list[Cleanup] = []

    def cancelled(self) -> bool:
        """Whether the cluster has gone (or been replaced)."""
        return self._cancelled.is_set()

    async def wait(self) -> None:
        """Return once cancelled."""
        await self._cancelled.wait()

    def add_cleanup(self, cleanup: Cleanup) -> None:
        """Await ``cleanup()`` when the context is cancelled; RuntimeError once it is (the cluster is gone)."""
        if self.cancelled():
            raise RuntimeError(f"cluster {display_name(self.cluster)} has already gone")
        self._cleanups.append(cleanup)

    def remove_cleanup(self, cleanup: Cleanup) -> None:
        """Forget ``cleanup`` (its handler leaves before the cluster does, and has run it itself)."""
        if cleanup in self._cleanups:
            self._cleanups.remove(cleanup)

    def cancel(self) -> None:
        """Mark the cluster gone: from now on ``cancelled()`` is True and ``wait()`` returns."""
        self._cancelled.set()

    async def run_cleanups(self, timeout: float) -> None:
        """Cancel, then await every cleanup in turn, each bounded by ``timeout`` (a failing one is logged). A
        cancellation meanwhile does not cut them short: it is re-raised once they all have run, since a skipped
        cleanup would leave the cluster's controllers running."""
        self.cancel()
        cleanups, self._cleanups = self._cleanups[::-1], []

        async def run_all() -> None:
            for cleanup in cleanups:
                await _bounded(cleanup, timeout, self.cluster)

        await finish(run_all())


async def finish(work: Awaitable[None]) -> None:
    """Await ``work`` to its end even if this task is cancelled meanwhile; then re-raise that cancellation. For
    teardown that must not stop halfway (a cleanup skipped, a factory left running)."""
    task = asyncio.ensure_future(work)
    interrupted = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            interrupted = True
    if interrupted:
        raise asyncio.CancelledError


async def _bounded(cleanup: Cleanup, timeout: float, cluster: str) -> None:
    try:
        async with asyncio.timeout(timeout):
            await cleanup()
    except TimeoutError:
        logger.error("cluster {}: a cleanup did not finish within {:g}s", display_name(cluster), timeout)
    except Exception:
        logger.exception("cluster {}: a cleanup failed", display_name(cluster))


class NamedLocks:
    """One asyncio.Lock per cluster name, made on demand and dropped once nobody holds or awaits it: work on one
    cluster is ordered while no other cluster waits for it."""

    def __init__(self) -> None:
        self._locks: "weakref.WeakValueDictionary[str, asyncio.Lock]" = weakref.WeakValueDictionary()

    def __call__(self, name: str) -> asyncio.Lock:
        lock = self._locks.get(name)
        if lock is None:
            lock = self._locks[name] = asyncio.Lock()
        return lock


@runtime_checkable
class ClusterHandler(Protocol):
    """Told about every cluster, present and future: ``add_cluster(ctx, name, cluster)`` (sync or async). It is
    called again for the same name when a rotated kubeconfig brings a new connection, before the old
    context is cancelled, so a handler can swap without a gap."""

    def add_cluster(self, ctx: ClusterContext, name: str, cluster: Cluster) -> Any: ...


@runtime_checkable
class ClusterRemovedHandler(Protocol):
    """A handler that also wants ``remove_cluster(name)`` (sync or async) when a cluster leaves for good (not
    when it is replaced by a rotation); most teardown belongs in the context's cleanups instead."""

    def remove_cluster(self, name: str) -> Any: ...
