"""Read-only cached objects: an informer freezes each object once, as it enters the cache.

client-go only asks callers not to mutate cached objects (an opt-in detector notices after the fact); in Python,
editing a listed dict is the natural mistake and would change what every other reader sees. Here every dict of a
cached object is a ``FrozenDict`` and every list a ``FrozenList``, whose mutating methods raise ``ReadOnlyError``.
They override only mutators, so reads, ``isinstance(obj, dict)`` and JSON encoding are the built-in code;
``deep_copy(obj)`` gives a mutable copy. Cost: one copy of the containers at decode (bench/RESULTS-readonly.md).
``KUBE_SYNCER_READONLY_CACHE=0`` turns freezing off for informers created afterwards.
This guards against mistakes, not intent (``dict.__setitem__`` still writes).
"""

from __future__ import annotations

import os
from typing import Any, Callable, NoReturn, overload

READ_ONLY_ENV = "KUBE_SYNCER_READONLY_CACHE"
# Mutating methods whose first argument is a key worth naming in the error.
_KEYED = frozenset({"__setitem__", "__delitem__", "pop", "setdefault"})


class ReadOnlyError(TypeError):
    """An object from an informer's cache (or a part of one) was about to be changed."""


def _refuse(method: str) -> Callable[..., NoReturn]:
    def refuse(self: object, *args: Any, **kwargs: Any) -> NoReturn:
        key = f"({args[0]!r})" if args and method in _KEYED and isinstance(args[0], (str, int)) else ""
        raise ReadOnlyError(
            f"{type(self).__name__}.{method}{key} refused: objects from an informer's cache are read-only (every "
            "lister, handler and reconciler shares them); take a mutable copy with informers.deep_copy(obj)")
    return refuse


class FrozenDict(dict[str, Any]):
    """A dict of a cached object: reads as a dict, refuses every change (``ReadOnlyError``)."""

    __slots__ = ()  # no per-instance __dict__: as small as a dict

    __setitem__ = _refuse("__setitem__")
    __delitem__ = _refuse("__delitem__")
    __ior__ = _refuse("__ior__")
    clear = _refuse("clear")
    pop = _refuse("pop")
    popitem = _refuse("popitem")
    setdefault = _refuse("setdefault")
    update = _refuse("update")

    def __copy__(self) -> dict[str, Any]:
        return dict(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[str, Any]:
        return deep_copy(self)

    def __reduce__(self) -> tuple[type[FrozenDict], tuple[dict[str, Any]]]:
        # The default protocol rebuilds a dict subclass item by item through __setitem__.
        return FrozenDict, (dict(self),)


class FrozenList(list[Any]):
    """A list of a cached object: reads as a list, refuses every change (``ReadOnlyError``)."""

    __slots__ = ()

    __setitem__ = _refuse("__setitem__")
    __delitem__ = _refuse("__delitem__")
    __iadd__ = _refuse("__iadd__")
    __imul__ = _refuse("__imul__")
    append = _refuse("append")
    clear = _refuse("clear")
    extend = _refuse("extend")
    insert = _refuse("insert")
    pop = _refuse("pop")
    remove = _refuse("remove")
    reverse = _refuse("reverse")
    sort = _refuse("sort")

    def __copy__(self) -> list[Any]:
        return list(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> list[Any]:
        return deep_copy(self)

    def __reduce__(self) -> tuple[type[FrozenList], tuple[list[Any]]]:
        return FrozenList, (list(self),)


_set_item = dict.__setitem__  # FrozenDict's own refuses; freezing fills a new one through the built-in


def freeze(obj: dict[str, Any]) -> FrozenDict:
    """``obj`` with each of its dicts and lists replaced by a frozen copy (scalars are shared); a FrozenDict as is."""
    return obj if type(obj) is FrozenDict else _freeze_dict(obj)


def _freeze_dict(d: dict[str, Any]) -> FrozenDict:
    # Copy first (one C-level copy), then replace the few values that are containers: most values are scalars.
    out = FrozenDict(d)
    for k, v in d.items():
        t = type(v)
        if t is dict:
            _set_item(out, k, _freeze_dict(v))
        elif t is list:
            _set_item(out, k, _freeze_list(v))
    return out


def _freeze_list(items: list[Any]) -> FrozenList:
    return FrozenList([_freeze_dict(v) if type(v) is dict else _freeze_list(v) if type(v) is list else v
                       for v in items])


@overload
def deep_copy(obj: dict[str, Any]) -> dict[str, Any]: ...
@overload
def deep_copy(obj: list[Any]) -> list[Any]: ...
def deep_copy(obj: Any) -> Any:
    """A mutable copy of a cached object (or of any part of it): each dict and list, frozen or not, copied."""
    if isinstance(obj, dict):
        return {k: deep_copy(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [deep_copy(v) for v in obj]
    return obj


def read_only_cache() -> bool:
    """Whether informers created now freeze their objects: unless ``KUBE_SYNCER_READONLY_CACHE`` is 0/false/no/off."""
    return os.environ.get(READ_ONLY_ENV, "1").strip().lower() not in ("0", "false", "no", "off")
