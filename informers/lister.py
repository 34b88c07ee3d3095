"""Lister: read-only queries over an informer's store.

What it returns are the cached objects themselves, not copies (as in client-go), and an informer's are frozen: a
change raises ``ReadOnlyError`` instead of altering what every other reader sees (``frozen.py``). Take a mutable
copy with ``deep_copy(obj)`` to build an update.
"""

from __future__ import annotations

import builtins

from .selector import LabelSelector
from .store import NAMESPACE_INDEX, Obj, Store


class Lister:
    """``get`` by name and ``list`` by namespace and label selector, served from the cache."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def get(self, name: str, namespace: str | None = None) -> Obj | None:
        """The cached object (read-only; ``deep_copy`` it to change it), or None."""
        return self._store.get(f"{namespace}/{name}" if namespace else name)

    def list(self, namespace: str | None = None, label_selector: str | LabelSelector | None = None) -> builtins.list[Obj]:
        """Cached objects, optionally of one namespace and matching a label selector (SelectorError if malformed)."""
        objs = self._store.by_index(NAMESPACE_INDEX, namespace) if namespace else self._store.list()
        selector = label_selector if isinstance(label_selector, LabelSelector) else LabelSelector.parse(label_selector)
        if not selector:
            return objs
        return [o for o in objs if selector.matches(o["metadata"].get("labels"))]

    def by_index(self, index: str, value: str) -> builtins.list[Obj]:
        """Cached objects whose index function ``index`` yields ``value``."""
        return self._store.by_index(index, value)
