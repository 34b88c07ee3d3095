"""Ready-made informer transforms (applied once per object before it is cached)."""

from __future__ import annotations

from .store import Obj


def drop_managed_fields(obj: Obj) -> Obj:
    """Remove ``metadata.managedFields``, usually the largest part of an object that controllers never read."""
    meta = obj.get("metadata")
    if meta is not None:
        meta.pop("managedFields", None)
    return obj
