"""Owner references: declare that an object belongs to another (for garbage collection and ``watch`` mapping).

controllerutil's ``SetControllerReference`` / ``SetOwnerReference`` rules, on dicts: at most one controller
owner; a namespaced owner only for an object of its own namespace, never for a cluster-scoped one; a reference to
an owner already listed (same API group, kind and name) is replaced in place, so calling again is harmless and
picks up a new version or uid. The owner's ``apiVersion`` and ``kind`` come from the owner dict itself (no scheme
to ask), so it must carry them, as objects from ``ResourceClient`` and informers do. ``owner_requests`` is
controller-runtime's ``EnqueueRequestForOwner`` as a plain function for ``Controller.watch(map_fn=...)``; a
``namespaced`` flag replaces its RESTMapper lookup because a map function runs synchronously in event handlers.
"""

from __future__ import annotations

from typing import Any

from informers.resource import Object

from .reconcile import Request


class AlreadyOwnedError(ValueError):
    """The object already has a different controller owner; ``owner`` is that owner's reference."""

    def __init__(self, obj: Object, owner: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        super().__init__(f"{obj.get('kind', 'object')} {meta.get('name')!r} is already controlled by "
                         f"{owner.get('kind')} {owner.get('name')!r} (uid {owner.get('uid')})")
        self.owner = owner


def set_controller_reference(owner: Object, obj: Object) -> None:
    """Make ``owner`` the controller of ``obj`` (in place): a reference with ``controller`` and
    ``blockOwnerDeletion`` true. AlreadyOwnedError if another object controls ``obj``; ValueError on a scope
    mismatch."""
    ref = _reference(owner, obj) | {"controller": True, "blockOwnerDeletion": True}
    for existing in (obj.get("metadata") or {}).get("ownerReferences") or ():
        if existing.get("controller") and not _same_owner(existing, ref):
            raise AlreadyOwnedError(obj, existing)
    _upsert(obj, ref)


def set_owner_reference(owner: Object, obj: Object) -> None:
    """Add ``owner`` to the owners of ``obj`` (in place), as a plain (non-controller) reference; ValueError on a
    scope mismatch. Like controllerutil, it replaces a controller reference to the same owner."""
    _upsert(obj, _reference(owner, obj))


def owner_requests(obj: Object, owner_api_version: str, owner_kind: str, *, controller_only: bool = False,
                   namespaced: bool = True) -> list[Request]:
    """The requests of ``obj``'s owners of one kind (only its controller if ``controller_only``).

    Only the API group of ``owner_api_version`` is compared, so a reference written at another version of the
    kind still counts. ``namespaced=False`` for a cluster-scoped owner kind: its requests have no namespace.
    """
    group = _group(owner_api_version)
    meta = obj.get("metadata") or {}
    namespace = meta.get("namespace") if namespaced else None
    return [Request(ref["name"], namespace or None) for ref in meta.get("ownerReferences") or ()
            if ref.get("kind") == owner_kind and _group(ref.get("apiVersion", "")) == group
            and (ref.get("controller") or not controller_only)]


def _reference(owner: Object, obj: Object) -> dict[str, Any]:
    """The owner reference to ``owner``, after checking that it may own ``obj``."""
    meta = owner.get("metadata") or {}
    if not owner.get("apiVersion") or not owner.get("kind") or not meta.get("name") or not meta.get("uid"):
        raise ValueError("an owner needs apiVersion, kind, metadata.name and metadata.uid (read it from the server)")
    owner_ns = meta.get("namespace")
    obj_ns = (obj.get("metadata") or {}).get("namespace")
    if owner_ns and not obj_ns:
        raise ValueError(f"a cluster-scoped object cannot have a namespaced owner ({owner['kind']} "
                         f"{owner_ns}/{meta['name']})")
    if owner_ns and owner_ns != obj_ns:
        raise ValueError(f"an owner must be in the object's namespace: owner {owner['kind']} {owner_ns}/"
                         f"{meta['name']}, object in {obj_ns}")
    return {"apiVersion": owner["apiVersion"], "kind": owner["kind"], "name": meta["name"], "uid": meta["uid"]}


def _upsert(obj: Object, ref: dict[str, Any]) -> None:
    refs = obj.setdefault("metadata", {}).setdefault("ownerReferences", [])
    for i, existing in enumerate(refs):
        if _same_owner(existing, ref):
            refs[i] = ref
            return
    refs.append(ref)


def _same_owner(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return (_group(a.get("apiVersion", "")), a.get("kind"), a.get("name")) == \
        (_group(b.get("apiVersion", "")), b.get("kind"), b.get("name"))


def _group(api_version: str) -> str:
    return api_version.rpartition("/")[0]
