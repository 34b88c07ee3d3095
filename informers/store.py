"""Store: the informer's indexed cache of objects keyed ``namespace/name`` (or ``name`` when cluster-scoped).

The store holds and returns the objects it is given, not copies: an informer gives it frozen ones (``frozen.py``),
so that what one reader gets cannot be changed under the others.
"""

from __future__ import annotations

import builtins

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator, Mapping

Obj = dict[str, Any]
IndexFunc = Callable[[Obj], Iterable[str]]
NAMESPACE_INDEX = "namespace"


@dataclass(frozen=True, slots=True)
class DeletedFinalStateUnknown:
    """A delete seen only through a relist: ``obj`` is the last state the cache knew, possibly stale."""

    key: str
    obj: Obj


def last_state(obj: "Obj | DeletedFinalStateUnknown") -> Obj:
    """What a delete handler got, as an object: a tombstone's last known state, or the object itself."""
    return obj.obj if isinstance(obj, DeletedFinalStateUnknown) else obj


def deleted_key(obj: "Obj | DeletedFinalStateUnknown") -> str:
    """The key of what a delete handler got (client-go's ``DeletionHandlingMetaNamespaceKeyFunc``)."""
    return obj.key if isinstance(obj, DeletedFinalStateUnknown) else object_key(obj)


def object_key(obj: Obj) -> str:
    """``namespace/name`` for namespaced objects, ``name`` for cluster-scoped ones."""
    meta = obj["metadata"]
    ns = meta.get("namespace")
    return f"{ns}/{meta['name']}" if ns else meta["name"]


def namespace_index(obj: Obj) -> builtins.list[str]:
    """The default index: an object's namespace ("" for cluster-scoped)."""
    return [obj["metadata"].get("namespace") or ""]


class Store:
    """Objects by key plus named indices ``index -> value -> keys``.

    Indexers may be added at any time: the event loop is single-threaded, so a new index is built over the
    current contents at once (client-go forbids this on a running informer; here it is safe).
    """

    def __init__(self, indexers: Mapping[str, IndexFunc] | None = None) -> None:
        self._items: dict[str, Obj] = {}
        self._indexers: dict[str, IndexFunc] = {NAMESPACE_INDEX: namespace_index}
        self._indices: dict[str, dict[str, set[str]]] = {NAMESPACE_INDEX: {}}
        if indexers:
            self.add_indexers(indexers)

    # -- indices -----------------------------------------------------------------------------------------
    def add_indexers(self, indexers: Mapping[str, IndexFunc]) -> None:
        """Add named index functions; a name already in use raises ValueError."""
        clash = set(indexers) & set(self._indexers)
        if clash:
            raise ValueError(f"indexer(s) already exist: {', '.join(sorted(clash))}")
        for name, fn in indexers.items():
            self._indexers[name] = fn
            index: dict[str, set[str]] = {}
            for key, obj in self._items.items():
                for value in fn(obj):
                    index.setdefault(value, set()).add(key)
            self._indices[name] = index

    def remove_indexers(self, names: Iterable[str]) -> None:
        """Drop named indices (an unknown name is ignored), so that a reader that added one for its own lifetime
        leaves the shared cache as it found it; the namespace index stays."""
        for name in names:
            if name != NAMESPACE_INDEX:
                self._indexers.pop(name, None)
                self._indices.pop(name, None)

    @property
    def indexers(self) -> dict[str, IndexFunc]:
        """The named index functions (a copy)."""
        return dict(self._indexers)

    def _unindex(self, key: str, obj: Obj) -> None:
        for name, fn in self._indexers.items():
            index = self._indices[name]
            for value in fn(obj):
                keys = index.get(value)
                if keys is not None:
                    keys.discard(key)
                    if not keys:
                        del index[value]

    def _index(self, key: str, obj: Obj) -> None:
        for name, fn in self._indexers.items():
            index = self._indices[name]
            for value in fn(obj):
                keys = index.get(value)
                if keys is None:
                    index[value] = {key}
                else:
                    keys.add(key)

    def by_index(self, name: str, value: str) -> builtins.list[Obj]:
        """Objects whose index function ``name`` yields ``value``; KeyError names an unknown index."""
        if name not in self._indices:
            raise KeyError(f"no index named {name!r} (have: {', '.join(sorted(self._indices))})")
        items = self._items
        return [items[k] for k in self._indices[name].get(value, ())]

    # -- objects -----------------------------------------------------------------------------------------
    def upsert(self, obj: Obj) -> Obj | None:
        """Insert or replace ``obj``; return the previous object with that key, if any."""
        key = object_key(obj)
        old = self._items.get(key)
        if old is not None:
            self._unindex(key, old)
        self._items[key] = obj
        self._index(key, obj)
        return old

    def delete(self, key: str) -> Obj | None:
        """Remove the object with ``key``; return it (None if absent)."""
        old = self._items.pop(key, None)
        if old is not None:
            self._unindex(key, old)
        return old

    def get(self, key: str) -> Obj | None:
        """The object with ``key``, or None."""
        return self._items.get(key)

    def list(self) -> builtins.list[Obj]:
        """Every object (a new list of the cached objects themselves)."""
        return list(self._items.values())

    def keys(self) -> builtins.list[str]:
        """Every key."""
        return list(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[Obj]:
        return iter(list(self._items.values()))

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def clear(self) -> None:
        """Drop every object and index entry."""
        self._items = {}
        for index in self._indices.values():
            index.clear()

    def replace(self, objs: Iterable[Obj]) -> tuple[builtins.list[tuple[Obj | None, Obj]], builtins.list[DeletedFinalStateUnknown]]:
        """Make the store hold exactly ``objs``.

        Returns ``(upserts, deletes)``: ``(old or None, new)`` for every listed object, and a tombstone for
        every object that was cached but is absent from the list (deleted while we were not watching).
        """
        old_items = self._items
        self.clear()
        upserts = []
        for obj in objs:
            key = object_key(obj)
            self._items[key] = obj
            self._index(key, obj)
            upserts.append((old_items.pop(key, None), obj))
        deletes = [DeletedFinalStateUnknown(key, obj) for key, obj in old_items.items()]
        return upserts, deletes
