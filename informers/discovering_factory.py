"""DiscoveringDynamicSharedInformerFactory: one running, synced informer per GVR the server serves, permits,
the filter selects and (with ``watch="required"``) somebody requires; an ``InformerSource``.

A facade over four parts: the discovery loop (when passes run), demand (who requires what), the informer set
(starting, stopping, replacing informers, removal hooks) and the status book (per-GVR state and explanations); a
pass asks discovery and the access reviews, and the wanted set (``wanted.py``) decides.

kcp watches every GVR it discovers, which a fleet multiplies by its clusters. With ``watch="required"`` the
factory still discovers everything (``status()`` shows it all) but watches only what consumers ``require`` and
what ``for_resource`` asked for (the shared CRD and APIService informers of the discovery triggers among them).
A metadata-only key (``gvr.only_metadata()``) is a cache apart, in either mode watched only when required or
asked for, while its GVR is served and permitted; discovery, filters, permissions and CRD identity are its GVR's.

With ``watch="required"`` the CRD and APIService triggers run only once something outside the legacy core group
(``/api/v1``) is wanted: a CRD's group must contain a dot and the aggregator never serves ``/api``, so no CRD or
APIService event can change whether a core resource is served; only the server itself can (an upgrade: the pass
after an outage, or the slow safety-net pass, sees it). The APIService trigger joins only once a wanted resource
outside it is not served by a CRD (not served yet, or an aggregated API's): the APIService of a CRD's group is the
apiserver's own, kept local by its autoregistration, so while every such resource is a CRD's only CRD events can
change its serving. A trigger, once begun, watches until shutdown. A fleet member whose controllers watch
ConfigMaps, Secrets or Pods thus opens one watch per required GVR and none for the triggers; one that also watches
a custom resource, one more.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Mapping, get_args

from loguru import logger
from prometheus_client import CollectorRegistry

from .access_review import AccessReviewer, AccessReviewsFailed
from .client import ApiClient
from .demand import Demand
from .discovery import DiscoveryClient, DiscoveryResult, ResourceInfo
from .discovery_loop import DiscoveryLoop
from .discovery_triggers import APISERVICES, CRDS, TRIGGERS, CRDInfo, DiscoveryTriggers, InformerProvider, trigger_view
from .factory import DynamicSharedInformerFactory
from .gvr import GVR
from .gvr_listeners import GVRHandler
from .informer_set import InformerSet
from .lister import Lister
from .reflector import ReflectorOptions
from .resource_filter import ResourceFilter
from .shared_informer import SharedIndexInformer, Transform
from .source import Notifier, RemovalHook, Subscription
from .status_book import NOT_SERVED_YET, GVRState, GVRStatus, StatusBook
from .store import IndexFunc
from .supervisor import Supervisor
from .transforms import drop_managed_fields
from .wanted import UNCHECKED, WatchMode, select, wanted_set

__all__ = ["DiscoveringDynamicSharedInformerFactory", "DiscoveryOptions", "GVRState", "GVRStatus", "NOT_SERVED_YET",
           "WatchMode"]

_PASS_SLACK = 10.0  # a pass's own work besides its bounded waits, generously
_BOTH, _CRDS_ONLY = frozenset((CRDS, APISERVICES)), frozenset((CRDS,))


@dataclass(frozen=True)
class DiscoveryOptions:
    """How a discovering factory discovers and watches.

    ``filter`` selects GVRs (with ``namespace``, cluster-scoped ones are left out); ``label_selector``,
    ``indexers``, ``transform``, ``reflector`` and ``field_selectors`` shape its informers
    (``DynamicSharedInformerFactory``); ``check_permissions`` drops GVRs the user may not list and watch
    (SelfSubjectAccessReview); ``watch_triggers`` watches CRDs and APIServices to know when to pass (with
    ``watch="required"``, only while something outside the core group is wanted); the intervals are the
    discovery loop's; ``removal_timeout`` bounds a GVR's removal hooks; ``watch`` is ``"all"`` or ``"required"``
    (module docstring).
    """

    filter: ResourceFilter = field(default_factory=ResourceFilter)
    namespace: str | None = None
    label_selector: str | None = None
    indexers: Mapping[str, IndexFunc] | None = None
    transform: Transform | None = drop_managed_fields
    reflector: ReflectorOptions | None = None
    rediscovery_interval: float = 60.0
    full_rediscovery_interval: float = 600.0
    check_permissions: bool = False
    watch_triggers: bool = True
    min_pass_interval: float = 0.1
    removal_timeout: float = 30.0
    watch: WatchMode = "all"
    field_selectors: Mapping[GVR, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.watch not in get_args(WatchMode):  # a mistyped mode from a settings file would mean "all", silently
            raise ValueError(f"watch must be one of {', '.join(get_args(WatchMode))}, not {self.watch!r}")


class DiscoveringDynamicSharedInformerFactory:
    """Keeps exactly one informer per wanted GVR (module docstring), as ``options`` say.

    ``await start()`` runs the first discovery pass (retrying until it succeeds) before returning; ``await
    shutdown()`` stops everything. The informers' metrics go to ``metrics_registry``, labelled
    ``cluster=metrics_cluster``; background tasks run under ``supervisor`` (its own if none), named after ``name``.
    """

    def __init__(self, client: ApiClient, options: DiscoveryOptions | None = None, *,
                 metrics_registry: CollectorRegistry | None = None, supervisor: Supervisor | None = None,
                 name: str = "discovery", metrics_cluster: str = "") -> None:
        o = self.options = options or DiscoveryOptions()
        self.client = client
        self.watch = o.watch
        self.namespace = o.namespace
        self.filter = o.filter.restricted_to_namespaced() if o.namespace else o.filter
        self.supervisor = supervisor or Supervisor(name)
        self.discovery = DiscoveryClient(client)
        self.access = AccessReviewer(client, o.namespace)
        self.passes = 0
        inner = DynamicSharedInformerFactory(
            client, namespace=o.namespace, label_selector=o.label_selector, indexers=o.indexers,
            transform=o.transform, options=o.reflector, metrics_registry=metrics_registry,
            field_selectors=o.field_selectors, metrics_cluster=metrics_cluster)
        self._meta = DynamicSharedInformerFactory(client, options=o.reflector, metrics_registry=metrics_registry,
                                                  metrics_cluster=metrics_cluster, transform=trigger_view)
        self._notifier = Notifier()
        self.loop = DiscoveryLoop(self._pass, client, self.supervisor, name=name,
                                  rediscovery_interval=o.rediscovery_interval,
                                  full_rediscovery_interval=o.full_rediscovery_interval,
                                  min_pass_interval=o.min_pass_interval, blind=self._blind)
        self.informer_set = InformerSet(inner, self._notifier, self.loop.trigger, o.removal_timeout, name)
        self.demand = Demand()
        # A trigger needs every object, whole: a selector or a transform of the user's would hide some. A shared
        # one is asked for with for_resource, so it is watched whether or not anybody requires it. With
        # watch="required" the factory would not watch them for anyone else: the triggers' own informers keep only
        # what they read (trigger_view: ~50 KiB less in every fleet member), at the cost of a second watch of
        # CRDs or APIServices while a consumer requires them whole.
        shareable = o.watch == "all" and o.label_selector is None and o.transform in (None, drop_managed_fields)
        providers: dict[GVR, InformerProvider] = {
            gvr: self if shareable and self._selects(gvr) and gvr not in o.field_selectors else self._meta
            for gvr in (CRDS, APISERVICES)}
        self.triggers = DiscoveryTriggers(self.loop.trigger, providers, self.supervisor, name=name,
                                          rediscovery_interval=o.rediscovery_interval)
        self.status_book = StatusBook(self.triggers)
        self._permitted: frozenset[GVR] = frozenset()  # served, selected and permitted at the last pass
        self._running = False
        self._log = logger.bind(component=name)

    def _selects(self, gvr: GVR) -> bool:
        probe = ResourceInfo(gvr, "", namespaced=False, verbs=frozenset(("list", "watch")), preferred=True)
        return self.filter.why_excluded(probe) is None

    @property
    def last_pass(self) -> DiscoveryResult | None:
        """What the last successful discovery found (None before the first pass)."""
        return self.status_book.last_pass

    # -- InformerSource ----------------------------------------------------------------------------------
    def subscribe(self, id: str) -> Subscription:
        """Subscribe to changes (set changed; an informer synced, failed or recovered); re-subscribing ``id``
        replaces it."""
        return self._notifier.subscribe(id)

    def unsubscribe(self, id: str) -> None:
        """End the subscription ``id``."""
        self._notifier.unsubscribe(id)

    def informers(self) -> tuple[dict[GVR, SharedIndexInformer], list[GVR]]:
        """``(synced informers by GVR, GVRs whose informer is not synced yet)``; one being removed is in neither."""
        return self.informer_set.informers()

    def events_received(self) -> int:
        """Watch events (bookmarks included) its running informers have received, the triggers' too: how much
        the server has said (it goes down when an informer stops)."""
        return sum(sum(inf.reflector.event_counts.values()) for factory in (self.informer_set.factory, self._meta)
                   for inf in factory.informers().values())

    def add_removal_hook(self, hook: RemovalHook) -> Callable[[], None]:
        """Await ``hook(gvr)`` before the informer of ``gvr`` is stopped and dropped; returns the unregister function.

        The hooks of one GVR run concurrently, at most ``removal_timeout`` seconds (then the informer is stopped
        anyway); while they run, the GVR is in neither list of ``informers()`` but its cache is still whole.
        """
        return self.informer_set.add_removal_hook(hook)

    def add_gvr_handler(self, handler: GVRHandler) -> None:
        """Deliver added/synced/removed events per GVR to ``handler``; current GVRs are replayed first."""
        self.informer_set.add_gvr_handler(handler)

    async def remove_gvr_handler(self, handler: GVRHandler) -> None:
        """Stop delivering GVR events to ``handler`` (a handler whose owner outlives it must; shutdown ends all)."""
        await self.informer_set.remove_gvr_handler(handler)

    def for_resource(self, gvr: GVR) -> tuple[SharedIndexInformer, Lister]:
        """The informer of ``gvr`` (discovered or not); an explicitly requested one is never dropped by a pass."""
        self.demand.explicit.add(gvr)
        inf, lister = self.informer_set.factory.for_resource(gvr)
        if self._running and gvr not in self.informer_set.adopted():
            self.informer_set.adopt(gvr)
            self._begin_triggers_if_needed()
        return inf, lister

    async def stop_resource(self, gvr: GVR) -> None:
        """Stop and drop the informer of ``gvr`` (removal hooks first); a pass starts it again if it selects it."""
        self.demand.explicit.discard(gvr)
        if gvr in self.informer_set.all():
            await self.informer_set.stop(gvr, "stopped on request")
            self._notifier.notify_all()

    def require(self, owner: str, gvrs: Iterable[GVR]) -> None:
        """Declare the GVRs ``owner`` needs watched (replacing its previous declaration). With ``watch="required"``
        a GVR served and permitted at the last pass is started at once, and a pass follows; otherwise a no-op."""
        self._required_changed(self.demand.require(owner, gvrs))

    def release(self, owner: str) -> None:
        """Drop ``owner``'s declaration; a pass then stops what nobody else requires (removal hooks first)."""
        self._required_changed(self.demand.release(owner))

    def _required_changed(self, changed: set[GVR]) -> None:
        if self.watch == "all":
            changed = {g for g in changed if g.metadata_only}  # the only ones "all" does not watch anyway
        if not self._running or not changed:
            return  # before start, the first pass reads the requirements
        self._begin_triggers_if_needed()
        # The last pass found these watchable: their consumer need not wait for the next one to say so again.
        started = {g for g in changed & self.demand.required() if g.full in self._permitted}
        started -= self.informer_set.all().keys()
        for gvr in started:
            self.informer_set.adopt(gvr)
        if started:
            self._notifier.notify_all()
        self.trigger()

    def status(self) -> list[GVRStatus]:
        """Every GVR seen by the last pass, with its current state; a watched metadata-only key follows its GVR."""
        return self.status_book.render(self.informer_set.all(), self.informer_set.adopted())

    def explain(self, gvr: GVR) -> str | None:
        """Why ``gvr`` has no informer, for whoever waits for it: ``excluded: ...``, ``forbidden: ...``, ``idle: not
        required by any controller``, ``not served yet`` (a CRD or an APIService for it is there, but does not serve
        it yet), ``not served: ...`` (nothing provides it, with the closest served names); None when it has one
        (or the first pass has not run)."""
        return None if gvr in self.informer_set.all() else self.status_book.explain(gvr)

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
            for gvr in list(self.demand.explicit):
                self.for_resource(gvr)
            # Before the first pass only the CRD trigger can be known to be needed (``_triggers_needed``).
            await self.triggers.start(self._triggers_needed(None, None))
            await self.loop.first_pass()
            # Legacy discovery is two rounds of requests; every other wait of a pass is bounded on its own.
            reviews = self.access.budget if self.options.check_permissions else 0.0
            self.loop.start(2 * self.discovery.timeout + reviews + self.options.removal_timeout + _PASS_SLACK)
        except BaseException:
            await self.shutdown()
            raise

    async def shutdown(self) -> None:
        """Stop the pass loop, the triggers, every informer and the listeners; end subscriptions. Idempotent."""
        self._running = False
        await self.loop.stop()
        await self.triggers.close()
        await self.informer_set.close()
        await self._meta.shutdown()
        self._notifier.close_all()

    def trigger(self) -> None:
        """Ask for a discovery pass soon (coalesced with other requests)."""
        self.loop.trigger()

    def _triggers_needed(self, crds: Mapping[tuple[str, str], CRDInfo] | None,
                         result: DiscoveryResult | None) -> frozenset[GVR]:
        """The triggers that can tell this factory something (module docstring): none while only core resources
        are wanted; only the CRD trigger while every wanted resource outside the core group is served by a CRD
        (``crds``, ``result``: the CRD cache and discovery, None if not known yet: the CRD trigger first);
        both with ``watch="all"`` or when something else is wanted (unserved, or not a CRD's)."""
        if not self.options.watch_triggers:
            return frozenset()
        if self.watch == "all":
            return _BOTH
        outside = {g.full for g in self.demand.wanted() if g.group}
        if not outside:
            return frozenset()
        if result is None:
            return _CRDS_ONLY
        if crds is None or any(g not in result.resources or g.version not in getattr(
                crds.get((g.group, g.resource)), "served", ()) for g in outside):
            return _BOTH
        return _CRDS_ONLY

    def _begin_triggers_if_needed(self) -> None:
        self.triggers.begin(self._triggers_needed(None, None), late=self.passes > 0)

    def _blind(self) -> bool:
        """Whether only a pass can see a change: the triggers are off, a needed one cannot watch, or a GVR is
        forbidden (RBAC is not watched)."""
        if not self.options.watch_triggers:
            return True
        watching = all(self.triggers.watching(g) for g in TRIGGERS if self.triggers.started(g))
        return not watching or self.status_book.any_forbidden()

    async def _pass(self, periodic: bool) -> AccessReviewsFailed | None:
        started = time.monotonic()
        result = await self.discovery.discover()
        self.passes += 1
        crds = self.triggers.crds()
        selection = select(result.resources, self.filter, crds, self.triggers.aggregated_group_versions(),
                           self.triggers.was_crd)
        incomplete = None
        if self.options.check_permissions:
            incomplete = await self.access.check(selection.candidates, recheck_forbidden=periodic)
        # Read the demand only now, with nothing awaited before the informer set acts on it: a require() during
        # this pass must not see its GVR stopped by a pass that did not know of it.
        wanted = wanted_set(selection, self.access if self.options.check_permissions else UNCHECKED,
                            self.demand.wanted(), self.watch)
        self.status_book.record(result, wanted.status)
        self._permitted = wanted.permitted
        changed = await self.informer_set.reconcile(wanted.desired, self.demand.explicit,
                                                    self.status_book.removal_reason)
        self._log.debug("discovery pass {} ({}): {} GVRs served, {} watched, {} requests, {:.0f} ms",
                        self.passes, "periodic" if periodic else "triggered", len(result.resources),
                        len(wanted.desired), result.requests, (time.monotonic() - started) * 1000)
        if crds is not None:
            self.triggers.after_pass(crds, result)
        # A trigger once needed keeps watching (the next requirement need not wait for it to sync).
        self.triggers.begin(self._triggers_needed(crds, result), late=True)
        if changed:
            self._notifier.notify_all()
        return incomplete
