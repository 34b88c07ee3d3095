"""Rediscovery triggers: CRD and APIService events that ask for a discovery pass when serving may change.

As in kcp, a CRD asks for a pass when it is added Established, when Established changes and when it is
deleted. Unlike kcp, a change of its served versions triggers too (each served version is a GVR), so do
aggregated APIServices (an aggregated API coming or going changes what is served, and no CRD event says so),
and the CRD cache is the authority on CRD identity: its uid tells a CRD deleted and recreated between two
passes from the one an informer was started for, and it outruns discovery when a CRD is deleted.

The informers come from a provider: the factory's own (shared) informer when it watches CRDs or APIServices
anyway (``watch="all"`` and its filter selects them), so each is cached once, else a private one holding
``trigger_view``s. Without permission to watch them the factory relies on its periodic pass, at its short
period; a trigger that cannot watch yet because the server is unreachable does not hold up the start, keeps
trying, and asks for a pass once it has synced.
"""

from __future__ import annotations

import asyncio
import sys
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Protocol

from loguru import logger

from .client import CONNECTION_ERRORS
from .discovery import DiscoveryResult
from .errors import ApiError
from .gvr import GVR
from .lister import Lister
from .shared_informer import SharedIndexInformer
from .store import Obj, last_state
from .supervisor import Supervisor, TaskHandle
from .wait import wait_first

CRDS = GVR("apiextensions.k8s.io", "v1", "customresourcedefinitions")
APISERVICES = GVR("apiregistration.k8s.io", "v1", "apiservices")
TRIGGERS = (CRDS, APISERVICES)
# Discovery lags a moment behind a CRD becoming Established: look again this soon, this many times in a row.
_CRD_RETRY_DELAY = 0.2
_CRD_RETRY_LIMIT = 50


class InformerProvider(Protocol):
    """Where a trigger gets its informer (created on first use) and how it gives it back."""

    def for_resource(self, gvr: GVR) -> tuple[SharedIndexInformer, Lister]: ...

    async def stop_resource(self, gvr: GVR) -> None: ...


class CRDInfo(NamedTuple):
    """What the CRD cache says about one (group, plural)."""

    uid: str
    established: bool
    served: frozenset[str]


class _Handler:
    """Event handler on CRDs/APIServices that asks for a discovery pass when serving may have changed.

    ``serves(obj)`` says whether an object can make the server serve something now: a new CRD is not served
    before it is Established, and the local APIService created for a new CRD group changes nothing the CRD's
    own events do not already announce. A pass for those would find nothing and delay the useful one.
    """

    def __init__(self, fire: Callable[[], None], changed: Callable[[Obj, Obj], bool],
                 serves: Callable[[Obj], bool]) -> None:
        self.fire, self.changed, self.serves = fire, changed, serves

    def on_add(self, obj: Obj, is_in_initial_list: bool) -> None:
        if not is_in_initial_list and self.serves(obj):
            self.fire()

    def on_update(self, old: Obj, new: Obj) -> None:
        if self.changed(old, new):
            self.fire()

    def on_delete(self, obj: Any) -> None:
        if self.serves(last_state(obj)) or _is_crd(last_state(obj)):
            self.fire()


@dataclass
class _Watch:
    gvr: GVR
    provider: InformerProvider
    informer: SharedIndexInformer
    denied: asyncio.Event = field(default_factory=asyncio.Event)
    answered: asyncio.Event = field(default_factory=asyncio.Event)  # synced, denied, or the server unreachable
    missed: bool = False  # a pass went without this cache
    late: bool = False  # begun after a pass: its initial list, which fires nothing, may hold what that pass missed

    def synced_cache(self) -> SharedIndexInformer | None:
        """The informer, if synced; else None, remembering that a pass went without it."""
        if self.informer.has_synced():
            return self.informer
        self.missed = True
        return None

    def on_error(self, e: Exception) -> None:
        if isinstance(e, ApiError) and e.status in (401, 403, 404):
            self.denied.set()
            self.answered.set()
        elif isinstance(e, CONNECTION_ERRORS):
            self.answered.set()


class DiscoveryTriggers:
    """The CRD and APIService triggers of one factory, and what their caches tell a discovery pass."""

    def __init__(self, fire: Callable[[], None], providers: Mapping[GVR, InformerProvider], supervisor: Supervisor,
                 *, name: str = "discovery", rediscovery_interval: float = 60.0) -> None:
        self.fire = fire
        self.providers = dict(providers)
        self.supervisor = supervisor
        self.name = name
        self.rediscovery_interval = rediscovery_interval
        self._watches: dict[GVR, _Watch] = {}
        self._tasks: list[str] = []
        self._begun: set[GVR] = set()
        self._crd_backed: set[tuple[str, str]] = set()
        self._crd_retries = 0
        self._retry_timer: asyncio.TimerHandle | None = None
        self._log = logger.bind(component=name)

    def started(self, gvr: GVR) -> bool:
        """Whether the trigger on ``gvr`` (``CRDS`` or ``APISERVICES``) has begun (it may have been refused since)."""
        return gvr in self._begun

    async def start(self, gvrs: Iterable[GVR] = TRIGGERS, timeout: float = 30.0) -> None:
        """Start the triggers on ``gvrs``; return once each has synced, been refused, or met an unreachable server
        (or after ``timeout``). Those not synced yet keep trying and ask for a pass when they sync."""
        gvrs = tuple(gvrs)
        self.begin(gvrs)
        await wait_first(asyncio.gather(*(w.answered.wait() for g, w in self._watches.items() if g in gvrs)),
                         timeout=timeout)

    def begin(self, gvrs: Iterable[GVR] = TRIGGERS, *, late: bool = False) -> None:
        """Start the triggers on ``gvrs`` not started yet, without waiting: a pass before a trigger has synced
        goes without its cache, and the trigger asks for another once it has (as it does when ``late``: begun
        after a pass, which could not see what its initial list holds)."""
        for gvr in gvrs:
            if gvr in self._begun:
                continue
            self._begun.add(gvr)  # first: a provider's for_resource may call back here
            changed, serves = _RULES[gvr]
            provider = self.providers[gvr]
            inf, _ = provider.for_resource(gvr)
            w = self._watches[gvr] = _Watch(gvr, provider, inf, late=late)
            inf.add_event_handler(_Handler(self.fire, changed, serves), name=f"rediscovery trigger {gvr.resource}")
            inf.add_error_listener(w.on_error)
            inf.start()
            task = f"{self.name} trigger {gvr.resource}"
            self.supervisor.spawn(task, partial(self._settle, w), restart=False)
            self._tasks.append(task)

    async def _settle(self, w: _Watch, handle: TaskHandle) -> None:
        if await wait_first(w.informer.wait_for_sync(), w.denied.wait()) == 1:
            self._log.warning("cannot watch {} ({}); relying on rediscovery every {:g}s", w.gvr.resource,
                              w.informer.last_error, self.rediscovery_interval)
            del self._watches[w.gvr]
            await w.provider.stop_resource(w.gvr)
            self.fire()  # the pass loop waits the short period from now on
            return
        w.answered.set()
        if w.late and not w.missed:
            self.fire()
        elif w.missed:
            self._log.info("now watching {}: rediscovering with its cache", w.gvr.resource)
            self.fire()

    def watching(self, gvr: GVR) -> bool:
        """Whether the trigger on ``gvr`` is watching (or still trying to)."""
        return gvr in self._watches

    async def close(self) -> None:
        """Cancel and await the triggers' tasks and timer (the informers belong to their providers)."""
        if self._retry_timer is not None:
            self._retry_timer.cancel()
        for task in self._tasks:
            await self.supervisor.cancel(task)
        self._tasks.clear()
        self._watches.clear()
        self._begun.clear()

    # -- what the caches say -----------------------------------------------------------------------------
    def crds(self) -> dict[tuple[str, str], CRDInfo] | None:
        """(group, plural) -> CRDInfo from the CRD cache; None if it is not watched or not synced."""
        w = self._watches.get(CRDS)
        inf = w.synced_cache() if w is not None else None
        if inf is None:
            return None
        out = {}
        for crd in inf.store:
            spec = crd.get("spec") or {}
            out[(spec.get("group", ""), (spec.get("names") or {}).get("plural", ""))] = CRDInfo(
                crd["metadata"].get("uid", ""), _established(crd), _served(crd))
        self._crd_backed.update(out)
        return out

    def was_crd(self, gvr: GVR) -> bool:
        """Whether a CRD ever defined ``gvr``'s group and resource."""
        return (gvr.group, gvr.resource) in self._crd_backed

    def aggregated_group_versions(self) -> set[str]:
        """Group-versions served through an APIService with a backing service."""
        w = self._watches.get(APISERVICES)
        inf = w.synced_cache() if w is not None else None
        if inf is None:
            return set()
        return {f"{svc['spec'].get('group') or ''}/{svc['spec'].get('version', '')}".lstrip("/")
                for svc in inf.store if _aggregated(svc)}

    def after_pass(self, crds: Mapping[tuple[str, str], CRDInfo], result: DiscoveryResult) -> None:
        """Ask for another pass shortly if an Established CRD's versions were not served yet."""
        missing = any(GVR(g, v, r) not in result.resources
                      for (g, r), info in crds.items() if info.established for v in info.served)
        if missing and self._crd_retries < _CRD_RETRY_LIMIT:
            self._crd_retries += 1
            if self._retry_timer is not None:
                self._retry_timer.cancel()
            self._retry_timer = asyncio.get_running_loop().call_later(_CRD_RETRY_DELAY, self.fire)
        elif not missing:
            self._crd_retries = 0


def trigger_view(obj: Obj) -> Obj:
    """A CRD or APIService cut down to what the triggers read: name, uid and resourceVersion; a CRD's group,
    plural and versions' ``name``/``served`` (not its schemas, often most of a cluster's CRD bytes); an aggregated
    APIService's spec; the conditions' type and status. A local APIService (no ``spec.service``: a group the
    server itself serves, ~20 in every cluster) keeps only its name and resourceVersion: the triggers only
    watch for it to become aggregated (its spec then differs from none), and its conditions, uid and spec were
    ~2 KiB a piece in every fleet member. The transform of the triggers' private informers, so a fleet member's
    CRD and APIService caches cost a few hundred bytes per CRD instead of its whole OpenAPI schema."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    if "names" not in spec and not spec.get("service"):  # a local APIService
        view: Obj = {"metadata": {k: meta[k] for k in ("name", "resourceVersion") if k in meta}}
        if "name" in view["metadata"]:
            view["metadata"]["name"] = sys.intern(view["metadata"]["name"])  # the same few in every member
    else:
        if "versions" in spec and "names" in spec:  # a CRD (list items carry no kind)
            spec = {"group": spec.get("group", ""),
                    "names": {"plural": (spec.get("names") or {}).get("plural", "")},
                    "versions": [{"name": v.get("name", ""), "served": v.get("served", False)}
                                 for v in spec.get("versions") or ()]}
        conditions = [{"type": c.get("type"), "status": c.get("status")}
                      for c in (obj.get("status") or {}).get("conditions") or ()]
        view = {"metadata": {k: meta[k] for k in ("name", "uid", "resourceVersion") if k in meta},
                "spec": spec, "status": {"conditions": conditions}}
    if "kind" in obj:
        view["kind"] = obj["kind"]
    return view


def _established(crd: Obj) -> bool:
    return any(c.get("type") == "Established" and c.get("status") == "True"
               for c in (crd.get("status") or {}).get("conditions") or ())


def _served(crd: Obj) -> frozenset[str]:
    return frozenset(v["name"] for v in (crd.get("spec") or {}).get("versions") or () if v.get("served"))


def _crd_changed(old: Obj, new: Obj) -> bool:
    return _established(old) != _established(new) or _served(old) != _served(new)


def _available(svc: Obj) -> bool:
    return any(c.get("type") == "Available" and c.get("status") == "True"
               for c in (svc.get("status") or {}).get("conditions") or ())


def _is_crd(obj: Obj) -> bool:
    return obj.get("kind") == "CustomResourceDefinition"


def _aggregated(svc: Obj) -> bool:
    return bool((svc.get("spec") or {}).get("service"))


def _apiservice_changed(old: Obj, new: Obj) -> bool:
    if not (_aggregated(old) or _aggregated(new)):
        return False  # a local group's APIService follows its CRDs, whose events already trigger passes
    return _available(old) != _available(new) or old.get("spec") != new.get("spec")


# What makes each trigger fire: (has an update changed serving, can an object serve something now).
_RULES: dict[GVR, tuple[Callable[[Obj, Obj], bool], Callable[[Obj], bool]]] = {
    CRDS: (_crd_changed, _established), APISERVICES: (_apiservice_changed, _aggregated)}
