"""Coordinator: which of the clusters the providers give this replica engages, and under which fence
(multicluster-runtime's sharded coordinator sits at the same place: between the providers and the members).

Without sharding every cluster is engaged here under one fence (``EngageAll``): the sidecar's is ``CLOSED``, and
each leadership term writes through its own view of the members (``cluster_term.py``). With sharding
(``syncer/sharding/units.py``) the shard coordinator decides, a cluster at a time, and engages a cluster under the
fence of this replica's tenure of it. The registry of members knows neither: it engages and disengages what it
is told to, so a new way of spreading clusters is one new coordinator.

One rule decides the fence of a cluster's work: the fence of the ``Cluster`` it was handed, which is the one the
coordinator engaged it with, or a term's for a term's handlers (``ClusterTerm``). Its controllers check it, and
its clients (``ClusterClients``) write through it.
"""

from __future__ import annotations

from typing import Protocol

from .fence import OPEN, Fence
from .provider import ClusterConfig


class ClusterView(Protocol):
    """The providers' current view, as one (``ProviderSet``)."""

    def get(self, cluster: str) -> ClusterConfig | None: ...

    def names(self) -> set[str]: ...


class Members(Protocol):
    """What a coordinator drives (``ClusterRegistry``): engage a config under a fence (again with a changed config:
    a rotation), or disengage a name; and wait for either to be done. ``prepare`` brings a config up ahead of its
    engagement (connected, synced, not engaged), ``unprepare`` stops that."""

    def engage(self, config: ClusterConfig, fence: Fence) -> None: ...

    def disengage(self, name: str, why: str) -> None: ...

    def prepare(self, config: ClusterConfig) -> None: ...

    def unprepare(self, name: str) -> None: ...

    async def wait_engaged(self, name: str) -> None: ...

    async def wait_gone(self, name: str) -> None: ...


class Coordinator(Protocol):
    """Told of every name whose config may have changed; engages or disengages members accordingly."""

    def attach(self, members: Members, view: ClusterView) -> None:
        """Called once by the registry, before any ``changed``."""

    def changed(self, name: str) -> None:
        """``name``'s config may differ now (or be gone)."""


class EngageAll:
    """Every cluster the providers give is engaged here, under ``fence`` (the leadership term, or OPEN)."""

    def __init__(self, fence: Fence = OPEN) -> None:
        self.fence = fence
        self._members: Members | None = None
        self._view: ClusterView | None = None

    def attach(self, members: Members, view: ClusterView) -> None:
        """Bind to the registry and the providers' view."""
        self._members, self._view = members, view

    def changed(self, name: str) -> None:
        """Engage ``name`` with its current config, or disengage it if no provider gives it any more."""
        assert self._members is not None and self._view is not None, "attach() first"
        config = self._view.get(name)
        if config is None:
            self._members.disengage(name, "no provider gives it any more")
        else:
            self._members.engage(config, self.fence)
