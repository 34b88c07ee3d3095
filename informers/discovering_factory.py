"""DiscoveringDynamicSharedInformerFactory: one running, synced informer per GVR the server serves.

Discovery passes run at start, whenever a CRD or APIService changes (``discovery_triggers``), when an
informer's watch answers 404, when the server answers again after an outage (it may have been upgraded, and
serve other built-in APIs), and periodically. The period is short (``rediscovery_interval``) while a pass is the
only way to see a change: a trigger cannot watch (no permission), or ``check_permissions`` found a GVR forbidden
(RBAC is not watched). Otherwise the events say when to look, and the periodic pass is only a slow safety net
(``full_rediscovery_interval``, jittered so that a fleet's members do not pass together): an idle member costs
no discovery requests. Each pass starts informers for new GVRs, stops those whose GVR vanished, and replaces an
informer whose CRD was deleted and recreated (new uid) between passes. Subscribers are notified on every
change of the set and whenever an informer becomes synced; GVR handlers (``gvr_listeners``) get precise
per-GVR events; ``check_permissions`` asks ``access_review`` before watching.

kcp's update loop logs a failed update and runs again at its next tick; an asyncio task that raises just
dies, silently (one ServerDisconnectedError used to freeze the informer set for good). So the passes run
under a ``Supervisor``: every failed pass (an API error, a cut connection, a bug) is logged with its cause
and retried with backoff, and a pass that hangs shows as wedged in ``supervisor.problems()``. The first
pass is retried the same way inside ``start()``, except when the server refuses discovery to this user
(``DiscoveryForbidden``), which no retry fixes. And kcp stops a vanished GVR's informer at once, while
controllers may still read its cache; here removal hooks (``add_removal_hook``) are awaited first, so the
controllers using a GVR stop while its cache is still whole.

kcp watches every GVR it discovers, which a fleet multiplies by its clusters (50 clusters x 70 GVRs: 3,500
watches, each holding a connection and a cache). With ``watch="required"`` a factory still discovers
everything (``status()`` shows it all) but starts informers only for the GVRs some consumer declared with
``require(owner, gvrs)`` (the controller manager declares its controllers'), plus those asked for with
``for_resource``, which include the shared CRD and APIService informers of the discovery triggers. A GVR
nobody requires any more is stopped like a vanished one (removal hooks first) by the pass its ``release``
triggers; a newly required GVR that the last pass found served and permitted is started at once, so its
consumer does not wait for that pass. ``watch="all"`` (the default) accepts the same calls and ignores them.

A metadata-only informer (key ``gvr.only_metadata()``) is a cache apart from its GVR's, in either mode started
only when required or asked for, while its GVR is served and permitted, and stopped with it (removal hooks
first, under its own key). Discovery, filters, permissions and CRD identity are its GVR's.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import itertools
import random
import time
from dataclasses import dataclass, replace
from typing import Any, Awaitable, Callable, Iterable, Literal, Mapping, get_args

from loguru import logger
from prometheus_client import CollectorRegistry

from .access_review import AccessReviewer, AccessReviewsFailed
from .backoff import Backoff
from .client import CONNECTION_ERRORS, ApiClient
from .discovery import DiscoveryClient, DiscoveryForbidden, DiscoveryResult, ResourceInfo, not_served
from .discovery_triggers import APISERVICES, CRDS, DiscoveryTriggers, InformerProvider, trigger_view
from .errors import ApiError
from .factory import DynamicSharedInformerFactory
from .gvr import GVR
from .gvr_listeners import GVRHandler, GVRListeners
from .lister import Lister
from .reflector import ReflectorOptions
from .resource_filter import ResourceFilter
from .shared_informer import SharedIndexInformer, Transform
from .source import Notifier, RemovalHook, Subscription
from .store import IndexFunc
from .supervisor import Supervisor, TaskHandle
from .transforms import drop_managed_fields
from .wait import wait_first

WatchMode = Literal["all", "required"]
_EXPECTED_ERRORS = (ApiError, *CONNECTION_ERRORS)
_PASS_SLACK = 10.0  # a pass's own work besides its bounded waits, generously
_NOT_REQUIRED = "not required by any controller"
_JITTER = 0.2  # a periodic pass waits its interval plus up to this fraction of it (client-go's wait.Jitter)
# ``explain``'s answer for a GVR that a CRD or an APIService is about to serve: waiting for it is normal.
NOT_SERVED_YET = "not served yet: its CRD or APIService does not serve it yet"


class GVRState(enum.StrEnum):
    """Where a GVR is: seen by discovery, left out (filter, permissions), idle (could be watched, but nobody
    requires it), or watched (and how that goes)."""

    DISCOVERED = "discovered"
    EXCLUDED = "excluded"
    FORBIDDEN = "forbidden"
    IDLE = "idle"
    STARTING = "starting"
    SYNCED = "synced"
    STALE = "stale"
    ERROR = "error"


@functools.lru_cache(maxsize=256)
def _sorted(verbs: frozenset[str]) -> tuple[str, ...]:
    """A verb set as the status shows it, one tuple per distinct set (every member's statuses share them)."""
    return tuple(sorted(verbs))


@dataclass(slots=True)
class GVRStatus:
    """One GVR's state (with ``reason`` when it is not watched or not well)."""

    gvr: GVR
    state: GVRState
    reason: str = ""
    kind: str = ""
    namespaced: bool = False
    verbs: tuple[str, ...] = ()
    source: str = "builtin"

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"gvr": str(self.gvr), "state": self.state.value, "reason": self.reason, "kind": self.kind,
                "namespaced": self.namespaced, "verbs": list(self.verbs), "source": self.source}


class DiscoveringDynamicSharedInformerFactory:
    """Keeps exactly one informer per served, permitted, filtered GVR (with ``watch="required"``: per such GVR
    that is also required); an ``InformerSource``.

    ``await start()`` runs the first discovery pass (retrying until it succeeds) before returning; ``await
    shutdown()`` stops everything. ``filter`` selects GVRs; ``check_permissions`` drops GVRs the user may not
    list+watch (via SelfSubjectAccessReview); ``rediscovery_interval`` is the period of passes while only a pass
    can see a change, ``full_rediscovery_interval`` the safety net's otherwise (module docstring; the longer of
    the two); the informers' metrics are labelled ``cluster=metrics_cluster``;
    ``field_selectors`` has the server filter the informer of a GVR (``DynamicSharedInformerFactory``). Background
    tasks run under ``supervisor`` (its own if none is given), named after ``name``.
    """

    def __init__(
        self, client: ApiClient, *, filter: ResourceFilter | None = None, namespace: str | None = None,
        label_selector: str | None = None, indexers: Mapping[str, IndexFunc] | None = None,
        transform: Transform | None = drop_managed_fields, options: ReflectorOptions | None = None,
        rediscovery_interval: float = 60.0, full_rediscovery_interval: float = 600.0,
        check_permissions: bool = False, watch_triggers: bool = True,
        min_pass_interval: float = 0.1, metrics_registry: CollectorRegistry | None = None,
        supervisor: Supervisor | None = None, removal_timeout: float = 30.0, name: str = "discovery",
        watch: WatchMode = "all", field_selectors: Mapping[GVR, str] | None = None, metrics_cluster: str = "",
    ) -> None:
        if watch not in get_args(WatchMode):  # a mistyped mode from a settings file would mean "all", silently
            raise ValueError(f"watch must be one of {', '.join(get_args(WatchMode))}, not {watch!r}")
        self.client = client
        self.watch = watch
        self.filter = filter or ResourceFilter()
        if namespace:
            self.filter.namespaced_only = True
        self.namespace = namespace
        self.rediscovery_interval = rediscovery_interval
        self.full_rediscovery_interval = max(full_rediscovery_interval, rediscovery_interval)
        self.check_permissions = check_permissions
        self.watch_triggers = watch_triggers
        self.min_pass_interval = min_pass_interval
        self.removal_timeout = removal_timeout
        self.supervisor = supervisor or Supervisor(name)
        self.discovery = DiscoveryClient(client)
        self.access = AccessReviewer(client, namespace)
        self.passes = 0
        self.last_pass: DiscoveryResult | None = None
        self._inner = DynamicSharedInformerFactory(
            client, namespace=namespace, label_selector=label_selector, indexers=indexers, transform=transform,
            options=options, metrics_registry=metrics_registry, field_selectors=field_selectors,
            metrics_cluster=metrics_cluster)
        self._meta = DynamicSharedInformerFactory(client, options=options, metrics_registry=metrics_registry,
                                                  metrics_cluster=metrics_cluster, transform=trigger_view)
        # A trigger needs every object, whole: a selector or a transform of the user's would hide some. A shared
        # one is asked for with for_resource, so it is watched whether or not anybody requires it. With
        # watch="required" the factory would not watch them for anyone else: the triggers' own informers keep only
        # what they read (trigger_view: ~50 KiB less in every fleet member), at the cost of a second watch of
        # CRDs or APIServices while a consumer requires them whole.
        shareable = watch == "all" and label_selector is None and transform in (None, drop_managed_fields)
        providers: dict[GVR, InformerProvider] = {
            gvr: self if shareable and self._selects(gvr) and gvr not in (field_selectors or {}) else self._meta
            for gvr in (CRDS, APISERVICES)}
        self.triggers = DiscoveryTriggers(self.trigger, providers, self.supervisor, name=name,
                                          rediscovery_interval=rediscovery_interval)
        self._loop_name = f"{name} passes"
        self._recoveries_name = f"{name} recoveries"
        self._notifier = Notifier()
        self._listeners = GVRListeners()
        self._removal_hooks: list[RemovalHook] = []
        self._identity: dict[GVR, str] = {}  # GVR -> CRD uid ("" for non-CRD resources, or not known yet)
        self._explicit: set[GVR] = set()
        self._requirements: dict[str, frozenset[GVR]] = {}  # owner -> the GVRs it requires
        self._adopted: dict[GVR, asyncio.Task[None]] = {}  # started informers -> their sync announcement
        self._removing: set[GVR] = set()
        self._status: dict[GVR, GVRStatus] = {}
        self._permitted: set[GVR] = set()  # served, selected and permitted at the last pass
        self._wake = asyncio.Event()
        self._running = False
        self._last_pass_started = 0.0
        self._log = logger.bind(component=name)

    def _selects(self, gvr: GVR) -> bool:
        probe = ResourceInfo(gvr, "", namespaced=False, verbs=frozenset(("list", "watch")), preferred=True)
        return self.filter.why_excluded(probe) is None

    # -- InformerSource ----------------------------------------------------------------------------------
    def subscribe(self, id: str) -> Subscription:
        """Subscribe to changes (set changed, informer synced); re-subscribing ``id`` replaces it."""
        return self._notifier.subscribe(id)

    def unsubscribe(self, id: str) -> None:
        """End the subscription ``id``."""
        self._notifier.unsubscribe(id)

    def informers(self) -> tuple[dict[GVR, SharedIndexInformer], list[GVR]]:
        """``(synced informers by GVR, GVRs whose informer is not synced yet)``; one being removed is in neither."""
        synced: dict[GVR, SharedIndexInformer] = {}
        not_synced: list[GVR] = []
        for gvr, inf in self._inner.informers().items():
            if gvr in self._removing:
                continue
            if inf.has_synced():
                synced[gvr] = inf
            else:
                not_synced.append(gvr)
        return synced, not_synced

    def events_received(self) -> int:
        """Watch events (bookmarks included) its running informers have received, the triggers' too: how much
        the server has said (it goes down when an informer stops)."""
        return sum(sum(inf.reflector.event_counts.values()) for factory in (self._inner, self._meta)
                   for inf in factory.informers().values())

    def add_removal_hook(self, hook: RemovalHook) -> Callable[[], None]:
        """Await ``hook(gvr)`` before the informer of ``gvr`` is stopped and dropped; returns the unregister function.

        The hooks of one GVR run concurrently, at most ``removal_timeout`` seconds (then the informer is stopped
        anyway); while they run, the GVR is in neither list of ``informers()`` but its cache is still whole.
        """
        self._removal_hooks.append(hook)

        def remove() -> None:
            if hook in self._removal_hooks:
                self._removal_hooks.remove(hook)

        return remove

    def add_gvr_handler(self, handler: GVRHandler) -> None:
        """Deliver added/synced/removed events per GVR to ``handler``; current GVRs are replayed first."""
        informers = self._inner.informers()
        self._listeners.add(handler, {gvr: informers[gvr] for gvr in self._adopted if gvr in informers})

    async def remove_gvr_handler(self, handler: GVRHandler) -> None:
        """Stop delivering GVR events to ``handler`` (a handler whose owner outlives it must; shutdown ends all)."""
        await self._listeners.remove(handler)

    def for_resource(self, gvr: GVR) -> tuple[SharedIndexInformer, Lister]:
        """The informer of ``gvr`` (discovered or not); an explicitly requested one is never dropped by a pass."""
        self._explicit.add(gvr)
        inf, lister = self._inner.for_resource(gvr)
        if self._running and gvr not in self._adopted:
            self._adopt(gvr)
        return inf, lister

    async def stop_resource(self, gvr: GVR) -> None:
        """Stop and drop the informer of ``gvr`` (removal hooks first); a pass starts it again if it selects it."""
        self._explicit.discard(gvr)
        if gvr in self._inner.informers():
            await self._stop_informer(gvr, "stopped on request")
            self._notifier.notify_all()

    def require(self, owner: str, gvrs: Iterable[GVR]) -> None:
        """Declare the GVRs ``owner`` needs watched (replacing its previous declaration). With ``watch="required"``
        a GVR served and permitted at the last pass is started at once, and a pass follows; otherwise a no-op."""
        before = self._required()
        self._requirements[owner] = frozenset(gvrs)
        self._required_changed(before)

    def release(self, owner: str) -> None:
        """Drop ``owner``'s declaration; a pass then stops what nobody else requires (removal hooks first)."""
        before = self._required()
        self._requirements.pop(owner, None)
        self._required_changed(before)

    def _required(self) -> set[GVR]:
        return set().union(*self._requirements.values())

    def _required_changed(self, before: set[GVR]) -> None:
        required = self._required()
        changed = required ^ before
        if self.watch == "all":
            changed = {g for g in changed if g.metadata_only}  # the only ones "all" does not watch anyway
        if not self._running or not changed:
            return  # before start, the first pass reads the requirements
        # The last pass found these watchable: their consumer need not wait for the next one to say so again.
        started = {g for g in changed & required if g.full in self._permitted} - self._inner.informers().keys()
        for gvr in started:
            self._adopt(gvr)
        if started:
            self._notifier.notify_all()
        self.trigger()

    def status(self) -> list[GVRStatus]:
        """Every GVR seen by the last pass, with its current state; a watched metadata-only key follows its GVR."""
        out = []
        informers = self._inner.informers()
        stale = self.last_pass.stale_group_versions if self.last_pass else set()
        entries = [*self._status.items(), *((g, replace(self._status[g.full], gvr=g))
                                            for g in self._adopted if g.metadata_only and g.full in self._status)]
        for gvr, st in sorted(entries, key=lambda e: (e[0], e[0].metadata_only)):
            inf = informers.get(gvr)
            if inf is not None and gvr in self._adopted:
                if gvr.group_version in stale:
                    st.state, st.reason = GVRState.STALE, "its API is unavailable; serving the last known cache"
                elif inf.last_error is not None:
                    st.state, st.reason = GVRState.ERROR, str(inf.last_error)
                else:
                    st.state, st.reason = (GVRState.SYNCED if inf.has_synced() else GVRState.STARTING), ""
            out.append(st)
        return out

    def explain(self, gvr: GVR) -> str | None:
        """Why ``gvr`` has no informer, for whoever waits for it: ``excluded: ...``, ``forbidden: ...``, ``idle: not
        required by any controller``, ``not served yet`` (a CRD or an APIService for it is there, but does not serve
        it yet), ``not served: ...`` (nothing provides it, with the closest served names); None when it has one
        (or the first pass has not run)."""
        if self.last_pass is None or gvr in self._inner.informers():
            return None
        st = self._status.get(gvr.full)
        if st is None:
            crd = (self.triggers.crds() or {}).get((gvr.group, gvr.resource))
            if crd is not None and (not crd.established or gvr.version in crd.served) or \
                    gvr.group_version in self.triggers.aggregated_group_versions():
                return NOT_SERVED_YET
            return not_served(gvr.full, self.last_pass.resources)
        if st.state in (GVRState.EXCLUDED, GVRState.FORBIDDEN, GVRState.IDLE):
            return f"{st.state.value}: {st.reason}"
        return None

    # -- lifecycle ---------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the triggers, run the first discovery pass, and keep passing in the background.

        The first pass is retried with backoff until it succeeds (or this call is cancelled);
        ``DiscoveryForbidden`` is raised at once. If this call fails, everything it started is stopped.
        """
        if self._running:
            return
        self._running = True
        try:
            for gvr in list(self._explicit):
                self.for_resource(gvr)
            if self.watch_triggers:
                await self.triggers.start()
            await self._first_pass()
            self.supervisor.spawn(self._loop_name, self._loop, wedge_after=self._wedge_after())
            self.supervisor.spawn(self._recoveries_name, self._after_outages)
        except BaseException:
            await self.shutdown()
            raise

    def _wedge_after(self) -> float:
        # Legacy discovery is two rounds of requests; every other wait of a pass is bounded on its own.
        reviews = self.access.budget if self.check_permissions else 0.0
        return 2 * self.discovery.timeout + reviews + self.removal_timeout + _PASS_SLACK

    async def shutdown(self) -> None:
        """Stop the pass loop, the triggers, every informer and the listeners; end subscriptions. Idempotent."""
        self._running = False
        await self.supervisor.cancel(self._loop_name)
        await self.supervisor.cancel(self._recoveries_name)
        await self.triggers.close()
        tasks = list(self._adopted.values())
        self._adopted.clear()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self._listeners.close()
        await asyncio.gather(self._inner.shutdown(), self._meta.shutdown())
        self._identity.clear()
        self._notifier.close_all()

    def trigger(self) -> None:
        """Ask for a discovery pass soon (coalesced with other requests)."""
        self._wake.set()

    async def _first_pass(self) -> None:
        backoff = Backoff()
        for attempt in itertools.count(1):
            error = await self._attempt_pass(periodic=True)
            if error is None:
                return
            if isinstance(error, AccessReviewsFailed):
                self._log.warning("first discovery pass incomplete ({}); asking again shortly", error)
                self.trigger()  # the loop asks again, with its backoff if need be
                return
            if isinstance(error, DiscoveryForbidden):
                raise error
            delay = backoff.next()
            self._log_failure(f"first discovery pass (attempt {attempt})", error, delay)
            await asyncio.sleep(delay)

    def _period(self) -> float:
        """How long the loop waits for a trigger before a periodic pass (module docstring)."""
        blind = not all(self.watch_triggers and self.triggers.watching(g) for g in (CRDS, APISERVICES)) or \
            any(st.state is GVRState.FORBIDDEN for st in self._status.values())
        interval = self.rediscovery_interval if blind else self.full_rediscovery_interval
        return interval * (1 + random.uniform(0, _JITTER))

    async def _after_outages(self, _: TaskHandle) -> None:
        """Ask for a pass each time the server answers again after it could not be reached."""
        while True:
            await self.client.answered_again(self.client.recoveries)
            self.trigger()

    async def _loop(self, handle: TaskHandle) -> None:
        backoff = Backoff()
        while True:
            periodic = False
            try:
                async with asyncio.timeout(self._period()):
                    await self._wake.wait()
            except TimeoutError:
                periodic = True
            wait = self._last_pass_started + self.min_pass_interval - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)  # a burst of triggers becomes one pass
            self._wake.clear()
            with handle.busy():
                error = await self._attempt_pass(periodic)
            if error is None:
                handle.succeeded()
                backoff.reset()
                continue
            handle.failed(error)
            delay = backoff.next()
            self._log_failure("discovery pass", error, delay)
            await asyncio.sleep(delay)
            self._wake.set()

    async def _attempt_pass(self, periodic: bool) -> Exception | None:
        """One pass; what made it fail (or left it incomplete), if anything."""
        try:
            return await self._pass(periodic)
        except Exception as e:  # every failure is retried: a dead pass loop would freeze the informer set
            return e

    def _log_failure(self, what: str, error: Exception, delay: float) -> None:
        if isinstance(error, (*_EXPECTED_ERRORS, AccessReviewsFailed)):
            self._log.warning("{} failed ({!r}); retrying in {:.1f}s", what, error, delay)
        else:
            self._log.opt(exception=error).error("{} failed unexpectedly ({!r}); retrying in {:.1f}s", what, error,
                                                 delay)

    # -- the pass ----------------------------------------------------------------------------------------
    async def _pass(self, periodic: bool) -> AccessReviewsFailed | None:
        self._last_pass_started = time.monotonic()
        result = await self.discovery.discover()
        self.passes += 1
        self.last_pass = result
        crds = self.triggers.crds()
        aggregated = self.triggers.aggregated_group_versions()
        status: dict[GVR, GVRStatus] = {}
        candidates: list[GVR] = []
        for gvr, info in result.resources.items():
            crd = crds.get((gvr.group, gvr.resource)) if crds is not None else None
            st = status[gvr] = GVRStatus(gvr, GVRState.DISCOVERED, kind=info.kind, namespaced=info.namespaced,
                                         verbs=_sorted(info.verbs),
                                         source="crd" if crd else
                                         "aggregated" if gvr.group_version in aggregated else "builtin")
            if crds is not None and crd is None and self.triggers.was_crd(gvr):
                # Discovery can lag behind a CRD deletion; the CRD cache is the authority.
                st.state, st.reason = GVRState.EXCLUDED, "its CRD was deleted"
                continue
            why = self.filter.why_excluded(info)
            if why:
                st.state, st.reason = GVRState.EXCLUDED, why
                continue
            candidates.append(gvr)
        incomplete = await self.access.check(candidates, recheck_forbidden=periodic) if self.check_permissions \
            else None
        permitted: dict[GVR, str] = {}
        for gvr in candidates:
            if self.check_permissions:
                if not self.access.decided(gvr):
                    status[gvr].state, status[gvr].reason = GVRState.ERROR, "access review failed; asking again"
                    continue
                denied = self.access.denied(gvr)
                if denied:
                    status[gvr].state, status[gvr].reason = GVRState.FORBIDDEN, denied
                    continue
            crd = crds.get((gvr.group, gvr.resource)) if crds is not None else None
            permitted[gvr] = crd.uid if crd else ""
        # Read the requirements only now, with nothing awaited before the reconciliation decides: a require()
        # during this pass must not see its GVR stopped by a pass that did not know of it.
        wanted = self._explicit | self._required()
        desired = permitted if self.watch == "all" else {g: uid for g, uid in permitted.items() if g in wanted}
        for gvr in permitted.keys() - desired.keys():
            status[gvr].state, status[gvr].reason = GVRState.IDLE, _NOT_REQUIRED
        desired = desired | {g: permitted[g.full] for g in wanted if g.metadata_only and g.full in permitted}
        self._status = status
        self._permitted = set(permitted)
        changed = await self._reconcile(desired)
        self._log.debug("discovery pass {} ({}): {} GVRs served, {} watched, {} requests, {:.0f} ms",
                        self.passes, "periodic" if periodic else "triggered", len(result.resources), len(desired),
                        result.requests, (time.monotonic() - self._last_pass_started) * 1000)
        if crds is not None:
            self.triggers.after_pass(crds, result)
        if changed:
            self._notifier.notify_all()
        return incomplete

    async def _reconcile(self, desired: dict[GVR, str]) -> bool:
        removals: dict[GVR, str] = {}
        for gvr in self._inner.informers():
            if gvr in self._explicit:
                continue
            if gvr not in desired:
                st = self._status.get(gvr.full)
                removals[gvr] = st.reason if st is not None and st.reason else "no longer served"
            elif desired[gvr] and self._identity.get(gvr) not in ("", None, desired[gvr]):
                removals[gvr] = "its CRD was recreated with a new uid"
        async with asyncio.TaskGroup() as tg:
            for gvr, reason in removals.items():
                tg.create_task(self._stop_informer(gvr, reason))
        changed = bool(removals)
        for gvr, identity in desired.items():
            # The CRD cache may learn a uid after discovery showed the GVR: same informer, now identified.
            self._identity[gvr] = self._identity.get(gvr) or identity
            if gvr not in self._adopted:
                self._adopt(gvr)
                changed = True
        return changed

    def _adopt(self, gvr: GVR) -> None:
        inf, _ = self._inner.for_resource(gvr)
        inf.add_error_listener(lambda e: self.trigger() if isinstance(e, ApiError) and e.status == 404 else None)
        inf.start()
        self._adopted[gvr] = asyncio.create_task(self._announce_sync(gvr, inf), name=f"sync watch {gvr}")
        self._listeners.emit("on_gvr_added", gvr, inf)

    async def _announce_sync(self, gvr: GVR, inf: SharedIndexInformer) -> None:
        await inf.wait_for_sync()
        self._notifier.notify_all()
        self._listeners.emit("on_gvr_synced", gvr, inf)

    async def _stop_informer(self, gvr: GVR, reason: str) -> None:
        self._log.info("stopping informer for {} ({})", gvr, reason)
        adopted = gvr in self._adopted
        self._removing.add(gvr)
        try:
            await self._await_removal_hooks(gvr)
            self._identity.pop(gvr, None)
            task = self._adopted.pop(gvr, None)
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            await self._inner.stop_resource(gvr)
        finally:
            self._removing.discard(gvr)
        if adopted:
            self._listeners.emit("on_gvr_removed", gvr)

    async def _await_removal_hooks(self, gvr: GVR) -> None:
        hooks = list(self._removal_hooks)
        if not hooks:
            return
        calls = asyncio.gather(*(self._call_hook(hook, gvr) for hook in hooks))
        if await wait_first(calls, timeout=self.removal_timeout) is None:
            self._log.warning("removal hooks for {} did not finish within {:g}s; stopping its informer anyway", gvr,
                              self.removal_timeout)

    async def _call_hook(self, hook: RemovalHook, gvr: GVR) -> None:
        try:
            await hook(gvr)
        except Exception:
            self._log.exception("removal hook {} failed for {}", getattr(hook, "__qualname__", hook), gvr)

