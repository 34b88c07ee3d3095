"""UnionLister: read-only queries across the caches of every cluster of a union informer.

ARO-HCP's union listers return bare objects from ``List``, so a caller cannot tell which cluster an object came
from, and they are registered separately from the union informers (a reader may see a cluster on one surface and
not yet on the other). Here, and why:

- The lister is a view over the union informer's members, not a second registry: it always reads exactly the
  clusters whose handlers are wired, so the two can never disagree.
- Every object read across clusters comes as a ``ClusterObject(cluster, obj)``: the cluster is told without
  copying or mutating the cached dict (a shared cache must stay read-only, and copying every object of every
  cluster on each ``list`` would cost more than the read itself).
- Clusters are read in a documented, stable order (by case-folded name, whatever order they joined in), so
  ``get`` returns the same hit on every call and every replica.
- A sub lister that returns None or raises ``NotFound`` does not have the object: the next cluster is tried. Any
  other exception ends the read and propagates (as in ARO-HCP's union listers).
- A cluster that is not in the union is ``ClusterNotFound``, not an empty result: a request for a removed
  cluster is then told apart from an object that was deleted.
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
