"""CachedObjectReader: how consumers read replicated objects from the cache cluster, through an informer of
CachedObjects and the labels the wrappers carry: one object by GVR and name, or every object of a schema.

kcp's consumers read wrappers through listers and its GVR-and-cluster index. Differences, and why:

- One object is found by ``wrapper_name`` (the store's key, since wrappers are cluster-scoped), then checked
  against its labels and annotations (``is_wrapper_of``), so the one ambiguity of readable names (see ``naming``) can
  never return another resource's object.
- A schema, or a schema in one source cluster, is one index lookup (``INDEX_SCHEMA``), not a scan; ``count`` reads
  the same index, which is what the root controller's ``resourceCounts.cache`` needs without a LIST.
- What it returns is the cached ``spec.raw`` itself: read-only (frozen) like everything an informer holds;
  ``informers.deep_copy`` gives a mutable copy.
"""

from __future__ import annotations

import builtins
from typing import Any

from informers import GVR, SharedIndexInformer

from .naming import (
    CACHED_OBJECTS, LABEL_SCHEMA, is_wrapper_of, is_wrapper_of_schema, label_value, schema, source_of, wrapper_name,
)

INDEX_SCHEMA = "cache.kcp.io/schema"


def schema_index_key(gvr: GVR, cluster: str | None = None) -> str:
    """The ``INDEX_SCHEMA`` key of a schema's wrappers, or of those from one source cluster ("" = local)."""
    key = label_value(schema(gvr))
    # A label value has no "/", so "<schema>" and "<schema>/<cluster>" keys never clash.
    return key if cluster is None else f"{key}/{cluster}"


def index_by_schema(wrapper: dict[str, Any]) -> builtins.list[str]:
    """Index function: a wrapper's schema label, and that label with its source cluster (full, from
    ``source_of``); nothing for an object without the schema label."""
    labels = wrapper.get("metadata", {}).get("labels") or {}
    value = labels.get(LABEL_SCHEMA)
    if value is None:
        return []
    try:
        cluster = source_of(wrapper)[0]
    except KeyError:
        return [value]
    return [value, f"{value}/{cluster}"]


class CachedObjectReader:
    """Reads replicated objects out of a ``SharedIndexInformer`` of CACHED_OBJECTS on the cache cluster.

    The informer may be started or not (reads answer from what it holds so far; wait for its sync first for a
    complete answer) and may be filtered by a label selector (``schema_selector``). The reader adds
    ``INDEX_SCHEMA`` to it unless it is there already, so several readers can share one informer.
    """

    def __init__(self, informer: SharedIndexInformer) -> None:
        if informer.gvr != CACHED_OBJECTS:
            raise ValueError(f"CachedObjectReader needs an informer of {CACHED_OBJECTS}, not {informer.gvr}")
        self.informer = informer
        if INDEX_SCHEMA not in informer.store.indexers:
            informer.add_indexers({INDEX_SCHEMA: index_by_schema})

    def get_wrapper(self, gvr: GVR, name: str, namespace: str | None = None, cluster: str = "") -> dict[str, Any] | None:
        """The whole CachedObject replicating that object (annotations included), or None."""
        wrapper = self.informer.store.get(wrapper_name(gvr, name, namespace, cluster))
        if wrapper is None or not is_wrapper_of(wrapper, gvr, name, namespace, cluster):
            return None
        return wrapper

    def get(self, gvr: GVR, name: str, namespace: str | None = None, cluster: str = "") -> dict[str, Any] | None:
        """The replicated object (``spec.raw``) of ``gvr`` named ``name`` (in ``namespace``, from ``cluster``;
        "" is the local cluster), or None when the cache has no such wrapper."""
        wrapper = self.get_wrapper(gvr, name, namespace, cluster)
        return None if wrapper is None else _raw(wrapper)

    def _matching(self, gvr: GVR, cluster: str | None) -> builtins.list[dict[str, Any]]:
        # The schema label may be a stand-in (label_value) shared, in theory, by two schemas: check the others.
        return [w for w in self.informer.store.by_index(INDEX_SCHEMA, schema_index_key(gvr, cluster))
                if is_wrapper_of_schema(w, gvr)]

    def wrappers(self, gvr: GVR, cluster: str | None = None) -> builtins.list[dict[str, Any]]:
        """Every CachedObject of ``gvr`` (from one source cluster if ``cluster`` is given), sorted by name."""
        return sorted(self._matching(gvr, cluster), key=lambda w: str(w["metadata"]["name"]))

    def list(self, gvr: GVR, cluster: str | None = None) -> builtins.list[dict[str, Any]]:
        """Every replicated object (``spec.raw``) of ``gvr``, or of ``gvr`` from one source cluster."""
        return [raw for w in self.wrappers(gvr, cluster) if (raw := _raw(w)) is not None]

    def count(self, gvr: GVR, cluster: str | None = None) -> int:
        """How many wrappers of ``gvr`` (from ``cluster`` if given) the cache holds: an index lookup."""
        return len(self._matching(gvr, cluster))


def _raw(wrapper: dict[str, Any]) -> dict[str, Any] | None:
    raw = (wrapper.get("spec") or {}).get("raw")
    return raw if isinstance(raw, dict) else None
