"""UnionLister: read-only queries across the caches of every cluster of a union informer.

Differs from ARO-HCP's union listers:

- A view over the union informer's members, not a second registry, so it reads exactly the wired clusters.
- Objects come as ``ClusterObject(cluster, obj)``: the cluster is told without copying the cached dict.
- Clusters are read in a stable order (case-folded name), so ``get`` gives the same hit on every replica.
- None or ``NotFound`` from a sub lister tries the next cluster; other errors propagate.
- A cluster not in the union raises ``ClusterNotFound`` rather than giving an empty result.
"""

from __future__ import annotations

import builtins
from typing import NamedTuple, Protocol, Sequence

from .errors import NotFound
from .selector import LabelSelector
from .store import Obj


class ClusterNotFound(LookupError):
    """The union has no cluster of that name."""


class ClusterObject(NamedTuple):
    """An object read from one cluster's cache (``obj`` is the cached dict: do not mutate it)."""

    cluster: str
    obj: Obj


class SubLister(Protocol):
    """What the union reads from each cluster: ``informers.Lister`` satisfies it."""

    def get(self, name: str, namespace: str | None = None) -> Obj | None: ...

    def list(self, namespace: str | None = None,
             label_selector: str | LabelSelector | None = None) -> builtins.list[Obj]: ...


class ListerSource(Protocol):
    """The clusters to read: ``UnionInformer`` provides them."""

    def sub_listers(self) -> Sequence[tuple[str, SubLister]]:
        """``(cluster, lister)`` of every cluster, in the union's stable order."""
        ...

    def sub_lister(self, cluster: str) -> tuple[str, SubLister]:
        """``(cluster as spelled in the union, lister)``; ClusterNotFound if absent."""
        ...


class UnionLister:
    """``get``/``list`` across every cluster of a union, or of one cluster (``*_for_cluster``)."""

    def __init__(self, source: ListerSource) -> None:
        self._source = source

    def get(self, name: str, namespace: str | None = None) -> ClusterObject | None:
        """The object from the first cluster (in the union's order) that has it, or None."""
        for cluster, lister in self._source.sub_listers():
            obj = _get(lister, name, namespace)
            if obj is not None:
                return ClusterObject(cluster, obj)
        return None

    def get_for_cluster(self, cluster: str, name: str, namespace: str | None = None) -> Obj | None:
        """The object in one cluster's cache, or None; ClusterNotFound if the union has no such cluster."""
        return _get(self._source.sub_lister(cluster)[1], name, namespace)

    def list(self, namespace: str | None = None,
             label_selector: str | LabelSelector | None = None) -> builtins.list[ClusterObject]:
        """Every cluster's matching objects, cluster after cluster (SelectorError if the selector is malformed)."""
        selector = _parse(label_selector)
        return [ClusterObject(cluster, obj) for cluster, lister in self._source.sub_listers()
                for obj in lister.list(namespace, selector)]

    def list_for_cluster(self, cluster: str, namespace: str | None = None,
                         label_selector: str | LabelSelector | None = None) -> builtins.list[Obj]:
        """One cluster's matching objects; ClusterNotFound if the union has no such cluster."""
        return self._source.sub_lister(cluster)[1].list(namespace, _parse(label_selector))


def _parse(selector: str | LabelSelector | None) -> LabelSelector:
    # Parsed once, not once per cluster; a malformed selector fails before any cluster is read.
    return selector if isinstance(selector, LabelSelector) else LabelSelector.parse(selector)


def _get(lister: SubLister, name: str, namespace: str | None) -> Obj | None:
    try:
        return lister.get(name, namespace)
    except NotFound:
        return None
