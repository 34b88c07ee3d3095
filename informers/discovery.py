"""Discovery: which resources (GVRs) the API server serves.

Uses aggregated discovery (``apidiscovery.k8s.io/v2``: two requests for the whole server) and falls back to
legacy per-group-version discovery on servers without it. A group-version whose aggregated API is unavailable
(stale in aggregated discovery, 503 or a time-out in legacy discovery) keeps its last known resources, marked
stale, and never holds up the rest.

What discovery found is interned: equal ``ResourceInfo`` are one object in the process, whichever client found
them. A fleet's members mostly run the same Kubernetes version with the same CRDs, and each member's own copy of
~70 of them (with their strings and verb sets) was most of its memory outside the caches. For the same reason
each distinct aggregated discovery document is parsed once per process: the members' ``/api`` and ``/apis``
answers are usually byte-identical, and parsing them was most of a member's discovery CPU (``_parsed``).

Unlike client-go, whose ``ServerGroupsAndResources`` returns one aggregate error the caller must pick apart,
a refusal of ``/api`` or ``/apis`` itself (401/403: the credentials or RBAC are wrong) is raised as its own
type, ``DiscoveryForbidden``: retrying it changes nothing, so a caller that retries transport errors forever
must be able to tell it apart and say so.
"""

from __future__ import annotations

import asyncio
import difflib
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any, Awaitable, Callable, Iterable, TypeVar

import orjson
from loguru import logger

from .client import CONNECTION_ERRORS, ApiClient
from .errors import ApiError
from .gvr import GVR

_T = TypeVar("_T")

_AGGREGATED = (
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,"
    "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json"
)


class DiscoveryForbidden(ApiError):
    """The API server refused ``/api`` or ``/apis`` to this user (401 or 403); retrying will not help."""

    def __init__(self, error: ApiError) -> None:
        super().__init__(error.status, error.reason, error.message, error.body, error.retry_after)
        reason = error.reason or HTTPStatus(error.status).phrase
        self.args = (f"the API server refused discovery for this user ({error.status} {reason}): "
                     f"{error.message or 'no message'}",)


@dataclass(frozen=True)
class ResourceInfo:
    """What discovery says about one GVR."""

    gvr: GVR
    kind: str
    namespaced: bool
    verbs: frozenset[str]
    preferred: bool
    stale: bool = False

    @property
    def listable(self) -> bool:
        """Supports both list and watch (what an informer needs)."""
        return "list" in self.verbs and "watch" in self.verbs


@dataclass
class DiscoveryResult:
    """Served GVRs, the group-versions reported stale, and how many requests the pass made."""

    resources: dict[GVR, ResourceInfo] = field(default_factory=dict)
    stale_group_versions: set[str] = field(default_factory=set)
    requests: int = 0
    aggregated: bool = True


NOTHING_PROVIDES = "not served: no CRD or APIService provides it"


def not_served(gvr: GVR, served: Iterable[GVR]) -> str:
    """Why nobody will serve ``gvr`` soon, for a user who asked for it: nothing provides it (``NOTHING_PROVIDES``),
    and the served GVRs closest to it (a typo in the resource, the wrong version or group), to fix the name."""
    served = list(served)
    names = [str(g) for g in served]
    close = difflib.get_close_matches(str(gvr), names, n=3, cutoff=0.7)
    close += [str(g) for g in served if g.resource == gvr.resource and g.group == gvr.group and str(g) not in close]
    hint = f"; did you mean {' or '.join(close[:3])}?" if close else ""
    return f"{NOTHING_PROVIDES}{hint}"


# Every ResourceInfo some client holds, by value: a new equal one is replaced by it (``_interned``).
_INTERNED: "weakref.WeakValueDictionary[tuple[Any, ...], ResourceInfo]" = weakref.WeakValueDictionary()


def _interned(gvr: GVR, kind: str, namespaced: bool, verbs: Iterable[str], preferred: bool,
              stale: bool = False) -> ResourceInfo:
    key = (gvr, kind, namespaced, frozenset(verbs), preferred, stale)
    info = _INTERNED.get(key)
    if info is None:
        info = _INTERNED[key] = ResourceInfo(*key)
    return info


def _add(result: DiscoveryResult, info: ResourceInfo) -> None:
    # Keyed by the interned info's GVR: the one just parsed (and its strings) is then not kept by every member.
    result.resources[info.gvr] = info


class DiscoveryClient:
    """Discovers served resources; remembers the last result so unavailable group-versions keep their GVRs."""

    def __init__(self, client: ApiClient, timeout: float = 10.0) -> None:
        self.client = client
        self.timeout = timeout
        self.aggregated: bool | None = None  # None until the server has been asked
        self._last: dict[GVR, ResourceInfo] = {}
        self._log = logger.bind(component="discovery")

    async def discover(self) -> DiscoveryResult:
        """One discovery pass over ``/api`` and ``/apis``."""
        result = DiscoveryResult()
        if self.aggregated is not False:
            docs = await _all(*(self._get_aggregated(p, result) for p in ("/api", "/apis")))
            read = [d for d in docs if d is not None]
            if len(read) == len(docs):
                self.aggregated = True
                for doc in read:
                    for info in doc.resources:
                        _add(result, info)
                    result.stale_group_versions.update(doc.stale_group_versions)
            else:
                self._log.info("server has no aggregated discovery; using per-group-version discovery")
                self.aggregated = False
        if self.aggregated is False:
            result.aggregated = False
            await self._legacy(result)
        # Unavailable group-versions keep what was last known of them.
        for gvr, info in self._last.items():
            if gvr.group_version in result.stale_group_versions and gvr not in result.resources:
                _add(result, _interned(gvr, info.kind, info.namespaced, info.verbs, info.preferred, True))
        self._last = result.resources
        return result

    async def _get(self, path: str, result: DiscoveryResult, accept: str = "application/json") -> dict:  # type: ignore[type-arg]
        doc = await self._ask(self.client.request, path, result, accept)
        return doc if isinstance(doc, dict) else {}

    async def _get_aggregated(self, path: str, result: DiscoveryResult) -> "_Aggregated | None":
        """``path``'s aggregated document, read (None: the server answered with something else). Through
        ``ApiClient``'s own ``request`` the raw bytes are looked up in ``_PARSED`` first; a client whose ``request``
        is another (a test double, a wrapper) is asked through it."""
        if getattr(self.client.request, "__func__", None) is not ApiClient.request:
            return _read_aggregated(await self._get(path, result, _AGGREGATED))
        return _parsed(await self._ask(self.client.request_bytes, path, result, _AGGREGATED))

    async def _ask(self, fetch: Callable[..., Awaitable[_T]], path: str, result: DiscoveryResult, accept: str) -> _T:
        result.requests += 1
        try:
            return await fetch("GET", path, headers={"Accept": accept}, timeout=self.timeout)
        except ApiError as e:
            if path in ("/api", "/apis") and e.status in (401, 403):
                raise DiscoveryForbidden(e) from e
            raise

    async def _legacy(self, result: DiscoveryResult) -> None:
        core, groups = await _all(self._get("/api", result), self._get("/apis", result))
        gvs: list[tuple[str, str, bool]] = [("", v, i == 0) for i, v in enumerate(core.get("versions") or ())]
        for g in groups.get("groups") or ():
            preferred = (g.get("preferredVersion") or {}).get("version")
            gvs.extend((g["name"], v["version"], v["version"] == preferred) for v in g.get("versions") or ())
        await _all(*(self._legacy_gv(result, *gv) for gv in gvs))

    async def _legacy_gv(self, result: DiscoveryResult, group: str, version: str, preferred: bool) -> None:
        gv = f"{group}/{version}" if group else version
        path = f"/apis/{gv}" if group else f"/api/{version}"
        try:
            doc = await self._get(path, result)
        except (ApiError, *CONNECTION_ERRORS) as e:
            self._log.warning("discovery of {} failed ({!r}); keeping its last known resources as stale", gv, e)
            result.stale_group_versions.add(gv)
            return
        for res in doc.get("resources") or ():
            if "/" in res["name"]:
                continue  # subresource
            gvr = GVR(group, version, res["name"])
            _add(result, _interned(gvr, res.get("kind", ""), bool(res.get("namespaced")), res.get("verbs") or (),
                                   preferred))


@dataclass(frozen=True, slots=True)
class _Aggregated:
    """One aggregated discovery document, read: immutable, so every member that got the same bytes shares it."""

    resources: tuple[ResourceInfo, ...]
    stale_group_versions: frozenset[str]


def _read_aggregated(doc: Any) -> _Aggregated | None:
    if not isinstance(doc, dict) or doc.get("kind") != "APIGroupDiscoveryList":
        return None
    resources: list[ResourceInfo] = []
    stale: set[str] = set()
    for group in doc.get("items") or ():
        gname = (group.get("metadata") or {}).get("name", "")
        for i, version in enumerate(group.get("versions") or ()):
            v = version["version"]
            if version.get("freshness") == "Stale":
                stale.add(f"{gname}/{v}" if gname else v)
                continue
            for res in version.get("resources") or ():
                kind = (res.get("responseKind") or {}).get("kind", "")
                resources.append(_interned(GVR(gname, v, res["resource"]), kind, res.get("scope") == "Namespaced",
                                           res.get("verbs") or (), i == 0))
    return _Aggregated(tuple(resources), frozenset(stale))


# The last few distinct documents, by their bytes. 8: a process's members rarely run more than a few distinct
# server versions and CRD sets at once; a fleet of all-different servers just parses every time, as before.
_PARSED: "OrderedDict[bytes, _Aggregated | None]" = OrderedDict()
_PARSED_MAX = 8


def _parsed(raw: bytes) -> _Aggregated | None:
    """``raw`` read, from ``_PARSED`` if the same bytes were read lately."""
    try:
        doc = _PARSED[raw]
    except KeyError:
        doc = _PARSED[raw] = _read_aggregated(orjson.loads(raw) if raw else None)
        if len(_PARSED) > _PARSED_MAX:
            _PARSED.popitem(last=False)
    else:
        _PARSED.move_to_end(raw)
    return doc


async def _all(*aws: Awaitable[_T]) -> list[_T]:
    """Await every one, then raise the first failure: plain ``gather`` would leave the others running unowned."""
    results = await asyncio.gather(*aws, return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results  # type: ignore[return-value]
