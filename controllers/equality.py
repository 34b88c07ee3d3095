"""Semantic equality of objects, and which empty fields a server leaves out.

apimachinery's ``equality.Semantic.DeepEqual`` compares typed objects, whose ``omitempty`` fields a nil and an
empty map or list encode alike (absent). On dicts the schema is missing, so: a null equals an empty map or list;
a missing key equals an empty (or null) value only at the paths where the server is known to leave empty values
out (``omitted``). The object metadata's maps and lists are always such paths (``ObjectMeta`` is typed for every
kind); others are learned from the server's answers to writes (``Omissions``), because the same ``{}`` is
dropped in one place (a ConfigMap's ``data``) and meaningful in another (a custom resource's field, a
``namespaceSelector: {}`` that selects every namespace).
"""

from __future__ import annotations

from typing import Any, Collection

Path = tuple[str, ...]  # keys from the object's root; "*" stands for any list index
_METADATA: frozenset[Path] = frozenset(("metadata", key) for key in (
    "labels", "annotations", "finalizers", "ownerReferences", "managedFields"))


def semantic_equal(a: Any, b: Any, omitted: Collection[Path] = _METADATA) -> bool:
    """Whether ``a`` and ``b`` are the same object as the server stores it: nulls equal empty maps and lists,
    and a missing key equals an empty value at the ``omitted`` paths."""
    return _equal(a, b, (), omitted)


def _empty(value: Any) -> bool:
    return value is None or value == {} or value == []


def _equal(a: Any, b: Any, path: Path, omitted: Collection[Path]) -> bool:
    if _empty(a) and _empty(b):
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        for key in a.keys() | b.keys():
            if key in a and key in b:
                if not _equal(a[key], b[key], (*path, key), omitted):
                    return False
            elif not _empty(a.get(key, b.get(key))) or (a.get(key, b.get(key)) is not None
                                                        and (*path, key) not in omitted):
                return False
        return True
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_equal(x, y, (*path, "*"), omitted) for x, y in zip(a, b))
    # JSON has one number type, so 1 equals 1.0; but true is not 1, as Python would have it.
    return bool(a == b) and isinstance(a, bool) == isinstance(b, bool)


class Omissions:
    """The paths where a server was seen to leave out an empty value it was sent, per resource."""

    def __init__(self) -> None:
        self._paths: dict[Any, set[Path]] = {}

    def of(self, resource: Any) -> frozenset[Path]:
        """The omitted paths known for ``resource`` (the metadata's included)."""
        return _METADATA | frozenset(self._paths.get(resource, ()))

    def learn(self, resource: Any, sent: Any, stored: Any) -> None:
        """Note where ``stored`` (the server's answer to a write of ``sent``) lacks an empty value ``sent`` had."""
        found = self._paths.setdefault(resource, set())
        _omissions(sent, stored, (), found)


def _omissions(sent: Any, stored: Any, path: Path, found: set[Path]) -> None:
    if isinstance(sent, dict) and isinstance(stored, dict):
        for key, value in sent.items():
            if key not in stored:
                if value == {} or value == []:
                    found.add((*path, key))
            else:
                _omissions(value, stored[key], (*path, key), found)
    elif isinstance(sent, list) and isinstance(stored, list) and len(sent) == len(stored):
        for x, y in zip(sent, stored):
            _omissions(x, y, (*path, "*"), found)
