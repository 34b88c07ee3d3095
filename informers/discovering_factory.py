"""DiscoveringDynamicSharedInformerFactory: one running, synced informer per GVR the server serves.

Discovery passes run at start, whenever a CRD or APIService changes (watched through our own informers,
coalesced), when an informer's watch answers 404, and periodically as a safety net (the only trigger when the
user may not watch CRDs/APIServices). Each pass starts informers for new GVRs, stops those whose GVR vanished,
and replaces an informer whose CRD was deleted and recreated (new uid) between passes. Subscribers are
notified on every change of the set and whenever an informer becomes synced.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Mapping, Protocol

from loguru import logger
from prometheus_client import CollectorRegistry

from .backoff import Backoff
from .client import ApiClient
from .discovery import DiscoveryClient, DiscoveryResult, ResourceInfo
from .errors import ApiError
from .factory import DynamicSharedInformerFactory
from .gvr import GVR
from .lister import Lister
from .reflector import ReflectorOptions
from .resource_filter import ResourceFilter
from .shared_informer import SharedIndexInformer, Transform
from .source import Notifier, Subscription
from .store import IndexFunc, Obj
from .transforms import drop_managed_fields

CRDS = GVR("apiextensions.k8s.io", "v1", "customresourcedefinitions")
APISERVICES = GVR("apiregistration.k8s.io", "v1", "apiservices")
_CRD_RETRY_DELAY = 0.2
_CRD_RETRY_LIMIT = 50


class GVRHandler(Protocol):
    """Receives precise GVR lifecycle events (any method may be missing, sync or async)."""

    def on_gvr_added(self, gvr: GVR, informer: SharedIndexInformer) -> Any: ...

    def on_gvr_synced(self, gvr: GVR, informer: SharedIndexInformer) -> Any: ...

    def on_gvr_removed(self, gvr: GVR) -> Any: ...


@dataclass
class GVRStatus:
    """One GVR's state: discovered, excluded, forbidden, starting, synced, stale or error (with ``reason``)."""

    gvr: GVR
    state: str
    reason: str = ""
    kind: str = ""
    namespaced: bool = False
    verbs: tuple[str, ...] = ()
    source: str = "builtin"

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"gvr": str(self.gvr), "state": self.state, "reason": self.reason, "kind": self.kind,
                "namespaced": self.namespaced, "verbs": list(self.verbs), "source": self.source}


class _Listener:
    """Delivers lifecycle events to one GVRHandler in order, on its own task."""

    def __init__(self, handler: Any) -> None:
        self.handler = handler
        self.queue: asyncio.Queue[tuple[str, tuple[Any, ...]]] = asyncio.Queue()
        self.task = asyncio.create_task(self._run(), name=f"gvr-listener {type(handler).__name__}")

    async def _run(self) -> None:
        while True:
            method, args = await self.queue.get()
            fn = getattr(self.handler, method, None)
            if fn is None:
                continue
            try:
                result = fn(*args)
                if asyncio.iscoroutine(result):
                    await result
            except Exception:
                logger.exception("GVR handler {} failed in {}{}", type(self.handler).__name__, method, args[:1])


class _Trigger:
    """Event handler on CRDs/APIServices that asks for a discovery pass when serving may have changed.

    ``serves(obj)`` says whether an object can make the server serve something now: a new CRD is not served
    before it is Established, and the local APIService created for a new CRD group changes nothing the CRD's
    own events do not already announce. A pass for those would find nothing and delay the useful one.
    """

    def __init__(self, fire: Any, changed: Any, serves: Any) -> None:
        self.fire, self.changed, self.serves = fire, changed, serves

    def on_add(self, obj: Obj, is_in_initial_list: bool) -> None:
        if not is_in_initial_list and self.serves(obj):
            self.fire()

    def on_update(self, old: Obj, new: Obj) -> None:
        if self.changed(old, new):
            self.fire()

    def on_delete(self, obj: Any) -> None:
        if self.serves(getattr(obj, "obj", obj)) or _is_crd(getattr(obj, "obj", obj)):
            self.fire()


class DiscoveringDynamicSharedInformerFactory:
    """Keeps exactly one informer per served, permitted, filtered GVR; an ``InformerSource``.

    ``await start()`` runs the first discovery pass before returning; ``await shutdown()`` stops everything.
    ``filter`` selects GVRs; ``check_permissions`` drops GVRs the user may not list+watch (via
    SelfSubjectAccessReview); ``rediscovery_interval`` is the periodic safety net.
    """

    def __init__(
        self, client: ApiClient, *, filter: ResourceFilter | None = None, namespace: str | None = None,
        label_selector: str | None = None, indexers: Mapping[str, IndexFunc] | None = None,
        transform: Transform | None = drop_managed_fields, options: ReflectorOptions | None = None,
        rediscovery_interval: float = 60.0, check_permissions: bool = False, watch_triggers: bool = True,
        min_pass_interval: float = 0.1, metrics_registry: CollectorRegistry | None = None,
    ) -> None:
        self.client = client
        self.filter = filter or ResourceFilter()
        if namespace:
            self.filter.namespaced_only = True
        self.namespace = namespace
        self.rediscovery_interval = rediscovery_interval
        self.check_permissions = check_permissions
        self.watch_triggers = watch_triggers
        self.min_pass_interval = min_pass_interval
        self.discovery = DiscoveryClient(client)
        self.passes = 0
        self.last_pass: DiscoveryResult | None = None
        self._inner = DynamicSharedInformerFactory(
            client, namespace=namespace, label_selector=label_selector, indexers=indexers, transform=transform,
            options=options, metrics_registry=metrics_registry)
        self._meta = DynamicSharedInformerFactory(client, options=options, metrics_registry=metrics_registry)
        self._notifier = Notifier()
        self._managed: dict[GVR, str] = {}  # GVR -> identity (CRD uid, or "" for non-CRD resources)
        self._explicit: set[GVR] = set()
        self._status: dict[GVR, GVRStatus] = {}
        self._permission: dict[GVR, str | None] = {}  # GVR -> None (allowed) or the reason it is forbidden
        self._sync_tasks: dict[GVR, asyncio.Task[None]] = {}
        self._listeners: list[_Listener] = []
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        self._crd_retries = 0
        self._crd_backed: set[tuple[str, str]] = set()
        self._retry_timer: asyncio.TimerHandle | None = None
        self._last_pass_started = 0.0
        self._log = logger.bind(component="discovering-factory")

    # -- InformerSource ----------------------------------------------------------------------------------
    def subscribe(self, id: str) -> Subscription:
        """Subscribe to changes (set changed, informer synced); re-subscribing ``id`` replaces it."""
        return self._notifier.subscribe(id)

    def unsubscribe(self, id: str) -> None:
        """End the subscription ``id``."""
        self._notifier.unsubscribe(id)

    def informers(self) -> tuple[dict[GVR, SharedIndexInformer], list[GVR]]:
        """``(synced informers by GVR, GVRs whose informer is not synced yet)``."""
        synced: dict[GVR, SharedIndexInformer] = {}
        not_synced: list[GVR] = []
        for gvr, inf in self._inner.informers().items():
            if inf.has_synced():
                synced[gvr] = inf
            else:
                not_synced.append(gvr)
        return synced, not_synced

    def add_gvr_handler(self, handler: GVRHandler) -> None:
        """Deliver added/synced/removed events per GVR to ``handler``; current GVRs are replayed first."""
        listener = _Listener(handler)
        for gvr, inf in self._inner.informers().items():
            listener.queue.put_nowait(("on_gvr_added", (gvr, inf)))
            if inf.has_synced():
                listener.queue.put_nowait(("on_gvr_synced", (gvr, inf)))
        self._listeners.append(listener)

    def _emit(self, method: str, *args: Any) -> None:
        for listener in self._listeners:
            listener.queue.put_nowait((method, args))

    def for_resource(self, gvr: GVR) -> tuple[SharedIndexInformer, Lister]:
        """The informer of ``gvr`` (discovered or not); an explicitly requested one is never dropped by a pass."""
        self._explicit.add(gvr)
        inf, lister = self._inner.for_resource(gvr)
        if self._loop_task is not None and not inf.started:
            self._start_informer(gvr, inf)
        return inf, lister

    def status(self) -> list[GVRStatus]:
        """Every GVR seen by the last pass, with its current state."""
        out = []
        informers = self._inner.informers()
        stale = self.last_pass.stale_group_versions if self.last_pass else set()
        for gvr, st in sorted(self._status.items()):
            inf = informers.get(gvr)
            if inf is not None:
                if gvr.group_version in stale:
                    st.state, st.reason = "stale", "its API is unavailable; serving the last known cache"
                elif inf.last_error is not None:
                    st.state, st.reason = "error", str(inf.last_error)
                else:
                    st.state, st.reason = ("synced", "") if inf.has_synced() else ("starting", "")
            out.append(st)
        return out

    # -- lifecycle ---------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the triggers, run the first discovery pass, and keep passing in the background."""
        if self._loop_task is not None:
            return
        if self.watch_triggers:
            await self._start_triggers()
        await self._pass(periodic=True)
        self._loop_task = asyncio.create_task(self._loop(), name="discovery passes")

    async def shutdown(self) -> None:
        """Stop the pass loop, every informer, the triggers and the listeners; end subscriptions."""
        tasks = [t for t in (self._loop_task, *self._sync_tasks.values(), *(lst.task for lst in self._listeners))
                 if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._loop_task = None
        if self._retry_timer is not None:
            self._retry_timer.cancel()
        self._sync_tasks.clear()
        self._listeners.clear()
        await asyncio.gather(self._inner.shutdown(), self._meta.shutdown())
        self._managed.clear()
        self._notifier.close_all()

    def trigger(self) -> None:
        """Ask for a discovery pass soon (coalesced with other requests)."""
        self._wake.set()

    async def _loop(self) -> None:
        backoff = Backoff()
        while True:
            periodic = False
            try:
                async with asyncio.timeout(self.rediscovery_interval):
                    await self._wake.wait()
            except TimeoutError:
                periodic = True
            wait = self._last_pass_started + self.min_pass_interval - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)  # a burst of triggers becomes one pass
            self._wake.clear()
            try:
                await self._pass(periodic)
                backoff.reset()
            except (ApiError, OSError, TimeoutError) as e:
                delay = backoff.next()
                self._log.warning("discovery pass failed ({}); retrying in {:.1f}s", e, delay)
                await asyncio.sleep(delay)
                self._wake.set()

    # -- triggers ----------------------------------------------------------------------------------------
    async def _start_triggers(self) -> None:
        await asyncio.gather(self._start_trigger(CRDS, _crd_changed, _established),
                             self._start_trigger(APISERVICES, _apiservice_changed, _aggregated))

    async def _start_trigger(self, gvr: GVR, changed: Any, serves: Any) -> None:
        inf, _ = self._meta.for_resource(gvr)
        inf.add_event_handler(_Trigger(self.trigger, changed, serves), name=f"rediscovery trigger {gvr.resource}")
        denied = asyncio.Event()
        inf.add_error_listener(lambda e: denied.set() if isinstance(e, ApiError) and e.status in (401, 403, 404)
                               else None)
        inf.start()
        waiters = [asyncio.create_task(inf.wait_for_sync()), asyncio.create_task(denied.wait())]
        await asyncio.wait(waiters, timeout=30, return_when=asyncio.FIRST_COMPLETED)
        for t in waiters:
            t.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
        if not inf.has_synced():
            self._log.warning("cannot watch {} ({}); relying on rediscovery every {:g}s", gvr.resource,
                              inf.last_error, self.rediscovery_interval)
            await self._meta.stop_resource(gvr)

    def _crd_identities(self) -> dict[tuple[str, str], tuple[str, bool, set[str]]] | None:
        """(group, plural) -> (uid, established, served versions) from the CRD cache; None if not watched."""
        inf = self._meta.informers().get(CRDS)
        if inf is None or not inf.has_synced():
            return None
        out = {}
        for crd in inf.store:
            spec = crd.get("spec") or {}
            out[(spec.get("group", ""), (spec.get("names") or {}).get("plural", ""))] = (
                crd["metadata"].get("uid", ""), _established(crd), _served(crd))
        self._crd_backed.update(out)
        return out

    # -- the pass ----------------------------------------------------------------------------------------
    async def _pass(self, periodic: bool) -> None:
        self._last_pass_started = time.monotonic()
        result = await self.discovery.discover()
        self.passes += 1
        self.last_pass = result
        crds = self._crd_identities()
        aggregated = self._aggregated_group_versions()
        status: dict[GVR, GVRStatus] = {}
        desired: dict[GVR, str] = {}
        candidates: list[ResourceInfo] = []
        for gvr, info in result.resources.items():
            identity = crds.get((gvr.group, gvr.resource)) if crds is not None else None
            st = status[gvr] = GVRStatus(gvr, "discovered", kind=info.kind, namespaced=info.namespaced,
                                         verbs=tuple(sorted(info.verbs)),
                                         source="crd" if identity else
                                         "aggregated" if gvr.group_version in aggregated else "builtin")
            if crds is not None and identity is None and (gvr.group, gvr.resource) in self._crd_backed:
                # Discovery can lag behind a CRD deletion; the CRD cache is the authority.
                st.state, st.reason = "excluded", "its CRD was deleted"
                continue
            why = self.filter.why_excluded(info)
            if why:
                st.state, st.reason = "excluded", why
                continue
            candidates.append(info)
        if self.check_permissions:
            await self._check_permissions(candidates, periodic)
        for info in candidates:
            denied = self._permission.get(info.gvr) if self.check_permissions else None
            if denied:
                status[info.gvr].state, status[info.gvr].reason = "forbidden", denied
                continue
            identity = crds.get((info.gvr.group, info.gvr.resource)) if crds is not None else None
            desired[info.gvr] = identity[0] if identity else ""
        self._status = status
        changed = await self._reconcile(desired)
        self._log.debug("discovery pass {} ({}): {} GVRs served, {} watched, {} requests, {:.0f} ms",
                        self.passes, "periodic" if periodic else "triggered", len(result.resources), len(desired),
                        result.requests, (time.monotonic() - self._last_pass_started) * 1000)
        if crds is not None:
            self._retry_missing_crds(crds, result)
        if changed:
            self._notifier.notify_all()

    def _aggregated_group_versions(self) -> set[str]:
        """Group-versions served through an APIService with a backing service (one look per pass)."""
        inf = self._meta.informers().get(APISERVICES)
        if inf is None:
            return set()
        return {f"{svc['spec'].get('group') or ''}/{svc['spec'].get('version', '')}".lstrip("/")
                for svc in inf.store if _aggregated(svc)}

    def _retry_missing_crds(self, crds: dict[tuple[str, str], tuple[str, bool, set[str]]],
                            result: DiscoveryResult) -> None:
        # Discovery lags a moment behind a CRD becoming Established: look again shortly instead of waiting
        # for the periodic pass.
        missing = any(GVR(g, v, r) not in result.resources
                      for (g, r), (_, established, served) in crds.items() if established for v in served)
        if missing and self._crd_retries < _CRD_RETRY_LIMIT:
            self._crd_retries += 1
            if self._retry_timer is not None:
                self._retry_timer.cancel()
            self._retry_timer = asyncio.get_running_loop().call_later(_CRD_RETRY_DELAY, self.trigger)
        elif not missing:
            self._crd_retries = 0

    async def _reconcile(self, desired: dict[GVR, str]) -> bool:
        changed = False
        for gvr, identity in list(self._managed.items()):
            if gvr in self._explicit:
                continue
            if gvr not in desired or (identity and desired[gvr] != identity):
                reason = "gone" if gvr not in desired else "recreated with a new uid"
                self._log.info("stopping informer for {} ({})", gvr, reason)
                await self._stop_informer(gvr)
                changed = True
        for gvr, identity in desired.items():
            if gvr in self._managed:
                # The CRD cache may learn a uid after discovery showed the GVR: same informer, now identified.
                self._managed[gvr] = self._managed[gvr] or identity
                continue
            self._managed[gvr] = identity
            inf, _ = self._inner.for_resource(gvr)
            if not inf.started:
                self._start_informer(gvr, inf)
            changed = True
        return changed

    def _start_informer(self, gvr: GVR, inf: SharedIndexInformer) -> None:
        inf.add_error_listener(lambda e: self.trigger() if isinstance(e, ApiError) and e.status == 404 else None)
        inf.start()
        self._sync_tasks[gvr] = asyncio.create_task(self._announce_sync(gvr, inf), name=f"sync watch {gvr}")
        self._emit("on_gvr_added", gvr, inf)

    async def _announce_sync(self, gvr: GVR, inf: SharedIndexInformer) -> None:
        await inf.wait_for_sync()
        self._notifier.notify_all()
        self._emit("on_gvr_synced", gvr, inf)

    async def _stop_informer(self, gvr: GVR) -> None:
        self._managed.pop(gvr, None)
        task = self._sync_tasks.pop(gvr, None)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await self._inner.stop_resource(gvr)
        self._emit("on_gvr_removed", gvr)

    async def _check_permissions(self, candidates: list[ResourceInfo], recheck_forbidden: bool) -> None:
        todo = [i.gvr for i in candidates
                if i.gvr not in self._permission or (recheck_forbidden and self._permission[i.gvr])]
        sem = asyncio.Semaphore(16)

        async def check(gvr: GVR) -> None:
            async with sem:
                denied = [verb for verb in ("list", "watch") if not await self._allowed(gvr, verb)]
            reason = f"user may not {' or '.join(denied)} {gvr}" if denied else None
            if reason and self._permission.get(gvr) != reason:
                self._log.warning("not watching {}: {}", gvr, reason)
            self._permission[gvr] = reason

        await asyncio.gather(*(check(g) for g in todo))

    async def _allowed(self, gvr: GVR, verb: str) -> bool:
        attrs = {"verb": verb, "group": gvr.group, "version": gvr.version, "resource": gvr.resource}
        if self.namespace:
            attrs["namespace"] = self.namespace
        review = await self.client.request(
            "POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
            body={"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                  "spec": {"resourceAttributes": attrs}})
        return bool((review.get("status") or {}).get("allowed"))


def _established(crd: Obj) -> bool:
    return any(c.get("type") == "Established" and c.get("status") == "True"
               for c in (crd.get("status") or {}).get("conditions") or ())


def _served(crd: Obj) -> set[str]:
    return {v["name"] for v in (crd.get("spec") or {}).get("versions") or () if v.get("served")}


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

