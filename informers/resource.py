"""ResourceClient: get, list, create, update, patch, apply and delete the objects of one GVR, as plain dicts.

Differs from controller-runtime's ``client.Client`` and client-go's dynamic client:

- One client per GVR: objects are dicts, so no scheme can route them.
- The patch type is always named: a dict could be any patch document, and the wrong one silently does otherwise.
- ``update`` requires ``metadata.resourceVersion`` (always optimistic); blind writes are ``apply`` or a patch.
- A namespace where the resource has none, or none where it needs one, raises ``ValueError`` before any request.
- A strategic merge patch of a resource without support raises ``UnsupportedMediaType`` saying so.
- ``list`` follows ``continue`` itself and restarts unpaginated when a token expires (410), as client-go's pager.
"""

from __future__ import annotations

from typing import Any, Literal, Protocol

from .client import ApiClient
from .errors import Gone, UnsupportedMediaType
from .gvr import GVR
from .mapper import RESTMapper

Object = dict[str, Any]
PatchType = Literal["json", "merge", "strategic", "apply"]
PropagationPolicy = Literal["Orphan", "Background", "Foreground"]

_CONTENT_TYPES: dict[str, str] = {
    "json": "application/json-patch+json",
    "merge": "application/merge-patch+json",
    "strategic": "application/strategic-merge-patch+json",
    # Server-side apply takes YAML, and JSON is YAML: the body is sent as JSON like every other.
    "apply": "application/apply-patch+yaml",
}


class WriteObserver(Protocol):
    """Told of each write a ResourceClient has made (dry runs excepted), once the server has answered it."""

    def wrote(self, gvr: GVR, answer: Object) -> None:
        """A create, update, patch or apply (of the object or its status) answered with ``answer``."""

    def deleted(self, gvr: GVR, namespace: str | None, name: str, uid: str | None, answer: Object | None) -> None:
        """A delete (of ``uid`` when it was a precondition) answered with the object, or None for a Status."""


class ResourceClient:
    """The verbs of one GVR, and of its ``status`` subresource, for namespaced and cluster-scoped resources alike.

    ``namespaced=None`` asks ``mapper`` (or a discovery pass of this client's own, on first use) whether the
    resource is namespaced; share one ``RESTMapper`` between clients to discover once. ``field_manager`` names
    this client's writes in ``managedFields`` unless a call names another. Every write takes ``dry_run=True``:
    the server validates and admits it, and answers with the result, without persisting anything.
    ``observer`` is told of every write that persisted (a controller's read-your-writes barrier).
    """

    def __init__(self, api: ApiClient, gvr: GVR, *, namespaced: bool | None = None,
                 field_manager: str | None = None, mapper: RESTMapper | None = None,
                 observer: WriteObserver | None = None) -> None:
        self.api = api
        self.gvr = gvr
        self.field_manager = field_manager
        self.observer = observer
        self._namespaced = namespaced
        self._mapper = mapper

    async def namespaced(self) -> bool:
        """Whether the resource's objects live in namespaces (asked of discovery once, if not given)."""
        if self._namespaced is None:
            mapper = self._mapper or RESTMapper(self.api)
            self._namespaced = await mapper.is_namespaced(self.gvr)
        return self._namespaced

    # -- reads -------------------------------------------------------------------------------------------
    async def get(self, name: str, namespace: str | None = None) -> Object:
        """The object ``name`` (in ``namespace``, for a namespaced resource); ``NotFound`` if there is none."""
        obj: Object = await self.api.request("GET", await self._path(namespace, name))
        return obj

    async def list(self, namespace: str | None = None, *, label_selector: str | None = None,
                   field_selector: str | None = None, limit: int | None = 500) -> list[Object]:
        """Every matching object, fetched ``limit`` at a time (``None``: in one response).

        ``namespace=None`` lists all namespaces of a namespaced resource.
        """
        path = await self._path(namespace, for_list=True)
        query = {k: v for k, v in (("labelSelector", label_selector), ("fieldSelector", field_selector)) if v}
        items: list[Object] = []
        token = ""
        while True:
            params = {**query, **({"limit": str(limit)} if limit else {}), **({"continue": token} if token else {})}
            try:
                page = await self.api.request("GET", path, params)
            except Gone:
                if not token:
                    raise
                page = await self.api.request("GET", path, query)  # the token expired: start over, unpaginated
                items = []
            items.extend(_with_type(page))
            token = (page.get("metadata") or {}).get("continue") or ""
            if not token:
                return items

    # -- writes ------------------------------------------------------------------------------------------
    async def create(self, obj: Object, *, dry_run: bool = False, field_manager: str | None = None) -> Object:
        """Create ``obj`` (in its ``metadata.namespace``); ``AlreadyExists`` if the name is taken."""
        path = await self._path(_namespace(obj))
        created: Object = await self.api.request("POST", path, self._params(dry_run, field_manager), obj)
        if self.observer is not None and not dry_run:
            self.observer.wrote(self.gvr, created)
        return created

    async def update(self, obj: Object, *, dry_run: bool = False, field_manager: str | None = None) -> Object:
        """Replace the object with ``obj``, which must carry the ``resourceVersion`` it was read at; ``Conflict`` if
        the object has changed since."""
        return await self._put(obj, None, dry_run, field_manager)

    async def update_status(self, obj: Object, *, dry_run: bool = False,
                            field_manager: str | None = None) -> Object:
        """``update`` of the status subresource: only ``obj``'s status is written."""
        return await self._put(obj, "status", dry_run, field_manager)

    async def patch(self, name: str, patch: Any, *, type: PatchType, namespace: str | None = None,
                    dry_run: bool = False, field_manager: str | None = None) -> Object:
        """Patch the object with a JSON patch (a list of ops), a JSON merge patch, a strategic merge patch
        (built-in types only) or an apply configuration (see ``apply``)."""
        return await self._patch(name, namespace, patch, type, None, False, dry_run, field_manager)

    async def patch_status(self, name: str, patch: Any, *, type: PatchType, namespace: str | None = None,
                           dry_run: bool = False, field_manager: str | None = None) -> Object:
        """``patch`` of the status subresource."""
        return await self._patch(name, namespace, patch, type, "status", False, dry_run, field_manager)

    async def apply(self, obj: Object, *, field_manager: str | None = None, force: bool = False,
                    dry_run: bool = False) -> Object:
        """Server-side apply: ``obj`` (with ``apiVersion``, ``kind`` and the fields this manager owns) becomes what
        ``field_manager`` wants; created if absent. ``Conflict`` (with ``causes``) when another manager owns a
        field with another value, unless ``force`` takes the field over."""
        return await self._patch(_name(obj), _namespace(obj), obj, "apply", None, force, dry_run, field_manager)

    async def apply_status(self, obj: Object, *, field_manager: str | None = None, force: bool = False,
                           dry_run: bool = False) -> Object:
        """``apply`` of the status subresource."""
        return await self._patch(_name(obj), _namespace(obj), obj, "apply", "status", force, dry_run,
                                 field_manager)

    async def delete(self, name: str, namespace: str | None = None, *, uid: str | None = None,
                     resource_version: str | None = None, propagation_policy: PropagationPolicy | None = None,
                     grace_period_seconds: int | None = None, dry_run: bool = False) -> Object | None:
        """Delete the object, only if it still has ``uid`` / ``resource_version`` when given (``Conflict``
        otherwise). Returns the object when the server does (still there with ``deletionTimestamp`` while
        finalizers or a grace period hold it), None when it answers with a bare Status."""
        options: Object = {"apiVersion": "v1", "kind": "DeleteOptions"}
        preconditions = {k: v for k, v in (("uid", uid), ("resourceVersion", resource_version)) if v}
        if preconditions:
            options["preconditions"] = preconditions
        if propagation_policy:
            options["propagationPolicy"] = propagation_policy
        if grace_period_seconds is not None:
            options["gracePeriodSeconds"] = grace_period_seconds
        if dry_run:
            options["dryRun"] = ["All"]
        answer = await self.api.request("DELETE", await self._path(namespace, name), body=options)
        obj = answer if isinstance(answer, dict) and answer.get("kind") != "Status" else None
        if self.observer is not None and not dry_run:
            self.observer.deleted(self.gvr, namespace, name, uid, obj)
        return obj

    # -- helpers -----------------------------------------------------------------------------------------
    async def _put(self, obj: Object, subresource: str | None, dry_run: bool, field_manager: str | None) -> Object:
        if not (obj.get("metadata") or {}).get("resourceVersion"):
            raise ValueError(f"update of {self.gvr} {_name(obj)!r} needs metadata.resourceVersion (the version it "
                             "was read at); use apply or a patch to write regardless of concurrent changes")
        path = await self._path(_namespace(obj), _name(obj), subresource)
        updated: Object = await self.api.request("PUT", path, self._params(dry_run, field_manager), obj)
        if self.observer is not None and not dry_run:
            self.observer.wrote(self.gvr, updated)
        return updated

    async def _patch(self, name: str, namespace: str | None, patch: Any, type: PatchType, subresource: str | None,
                     force: bool, dry_run: bool, field_manager: str | None) -> Object:
        if type not in _CONTENT_TYPES:
            raise ValueError(f"unknown patch type {type!r}: expected one of {', '.join(_CONTENT_TYPES)}")
        params = self._params(dry_run, field_manager)
        if type == "apply":
            if "fieldManager" not in params:
                raise ValueError(f"server-side apply of {self.gvr} {name!r} needs a field_manager")
            if force:
                params["force"] = "true"
        path = await self._path(namespace, name, subresource)
        try:
            patched: Object = await self.api.request("PATCH", path, params, patch,
                                                     headers={"Content-Type": _CONTENT_TYPES[type]})
        except UnsupportedMediaType as e:
            if type != "strategic":
                raise
            raise UnsupportedMediaType(
                e.status, e.reason, f"{self.gvr} does not support strategic merge patches (custom resources and "
                "aggregated APIs do not): use a merge, JSON or apply patch", e.body, e.retry_after) from e
        if self.observer is not None and not dry_run:
            self.observer.wrote(self.gvr, patched)
        return patched

    def _params(self, dry_run: bool, field_manager: str | None) -> dict[str, str]:
        params = {"dryRun": "All"} if dry_run else {}
        manager = field_manager or self.field_manager
        if manager:
            params["fieldManager"] = manager
        return params

    async def _path(self, namespace: str | None, name: str | None = None, subresource: str | None = None, *,
                    for_list: bool = False) -> str:
        namespaced = await self.namespaced()
        if namespace and not namespaced:
            raise ValueError(f"{self.gvr} is cluster-scoped, but namespace {namespace!r} was given")
        if namespaced and not namespace and not for_list:
            raise ValueError(f"{self.gvr} is namespaced, but no namespace was given"
                             + (f" for {name!r}" if name else ""))
        path = self.gvr.path(namespace or None, name)
        return f"{path}/{subresource}" if subresource else path


def _name(obj: Object) -> str:
    name = (obj.get("metadata") or {}).get("name")
    if not name:
        raise ValueError("the object has no metadata.name")
    return str(name)


def _namespace(obj: Object) -> str | None:
    return (obj.get("metadata") or {}).get("namespace") or None


def _with_type(page: Object) -> list[Object]:
    """A list page's items, each given the ``apiVersion`` and ``kind`` that the server leaves out of them."""
    api_version = page.get("apiVersion", "")
    kind = page.get("kind", "").removesuffix("List")
    items: list[Object] = page.get("items") or []
    for item in items:
        item.setdefault("apiVersion", api_version)
        item.setdefault("kind", kind)
    return items
