"""Watching only what is required (``watch="required"``): the factory against a stub API server, the manager's
declarations, and both together against the real control plane."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, AsyncIterator

import pytest

from controllers import ControllerManager, ManagedController
from informers import GVR, ApiClient, GVRState, ResourceFilter
from informers.discovering_factory import DiscoveringDynamicSharedInformerFactory
from informers.discovery import DiscoveryClient
from informers.discovery_triggers import APISERVICES, CRDS
from informers.reflector import INITIAL_EVENTS_END

from tests.factories import factory
from tests.fakes import FakeSource, Probe, fast_backoff
from tests.helpers import CONFIGMAPS, eventually, settle
from tests.kube import delete_crd, post_crd, unique_group

SECRETS = GVR("", "v1", "secrets")
PODS = GVR("", "v1", "pods")
TRIGGERS = {CRDS, APISERVICES}
IDLE = "idle: not required by any controller"


class StubServer:
    """Just enough of an API server for the factory: aggregated discovery of ``served``, access reviews denied
    for ``forbidden``, and watches that stream an empty initial state and then stay open (``open`` counts them
    by resource). ``hold`` (when set) holds discovery until it is set again."""

    def __init__(self, served: set[GVR], forbidden: frozenset[GVR] = frozenset()) -> None:
        self.served = served
        self.forbidden = forbidden
        self.open: dict[str, int] = {}
        self.hold: asyncio.Event | None = None
        self.recoveries = 0

    def watched(self) -> set[str]:
        return {r for r, n in self.open.items() if n}

    async def request(self, method: str, path: str, params: Any = None, body: Any = None, headers: Any = None,
                      timeout: float | None = None) -> Any:
        if path.endswith("selfsubjectaccessreviews"):
            a = body["spec"]["resourceAttributes"]
            return {"status": {"allowed": GVR(a["group"], a["version"], a["resource"]) not in self.forbidden}}
        assert path in ("/api", "/apis"), f"unexpected request {method} {path}"
        if self.hold is not None:
            await self.hold.wait()
        groups: dict[str, list[GVR]] = {}
        for gvr in self.served:
            if (gvr.group == "") == (path == "/api"):
                groups.setdefault(gvr.group, []).append(gvr)
        return {"kind": "APIGroupDiscoveryList", "items": [
            {"metadata": {"name": g}, "versions": [{"version": "v1", "resources": [
                {"resource": gvr.resource, "scope": "Namespaced", "verbs": ["list", "watch"],
                 "responseKind": {"kind": gvr.resource.title()}} for gvr in gvrs]}]}
            for g, gvrs in groups.items()]}

    @contextlib.asynccontextmanager
    async def stream(self, path: str, params: Any, inactivity_timeout: float | None = None
                     ) -> AsyncIterator[AsyncIterator[dict[str, Any]]]:
        resource = path.rsplit("/", 1)[1]
        self.open[resource] = self.open.get(resource, 0) + 1
        try:
            yield self._events()
        finally:
            self.open[resource] -= 1

    async def _events(self) -> AsyncIterator[dict[str, Any]]:
        yield {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "1",
                                                           "annotations": {INITIAL_EVENTS_END: "true"}}}}
        await asyncio.Event().wait()


def stub_factory(server: StubServer, **kw: Any) -> DiscoveringDynamicSharedInformerFactory:
    kw.setdefault("watch", "required")
    return factory(server, min_pass_interval=0.0, **kw)  # type: ignore[arg-type]


def states(f: DiscoveringDynamicSharedInformerFactory) -> dict[GVR, str]:
    return {s.gvr: s.state for s in f.status()}


def watched(f: DiscoveringDynamicSharedInformerFactory) -> set[GVR]:
    synced, pending = f.informers()
    return {*synced, *pending}


# -- the factory, unit-level ------------------------------------------------------------------------------
async def test_only_required_gvrs_are_watched() -> None:
    server = StubServer({CONFIGMAPS, SECRETS, PODS, *TRIGGERS})
    f = stub_factory(server)
    removed: list[GVR] = []

    async def hook(gvr: GVR) -> None:
        removed.append(gvr)

    f.add_removal_hook(hook)
    f.require("early", [PODS])  # before start: the first pass reads it
    await f.start()
    try:
        # Only core resources wanted: no CRD or APIService event can change what is served, so no trigger runs.
        assert watched(f) == {PODS}
        await eventually(lambda: server.watched() == {"pods"}, 5)
        assert not f.triggers.started(CRDS) and not f._blind()
        assert states(f)[SECRETS] == GVRState.IDLE and f.explain(SECRETS) == IDLE
        assert f.explain(CONFIGMAPS) == IDLE
        f.require("a", [CONFIGMAPS])
        assert CONFIGMAPS in watched(f)  # at once: the last pass found it served and permitted
        f.require("b", [CONFIGMAPS, SECRETS])
        await eventually(lambda: {CONFIGMAPS, SECRETS} <= set(f.informers()[0]), 5, "both synced")
        assert f.explain(SECRETS) is None
        f.release("a")
        passes = f.passes
        f.trigger()
        await eventually(lambda: f.passes > passes, 5, "a pass")
        assert watched(f) == {PODS, CONFIGMAPS, SECRETS} and removed == []  # still required by b
        f.require("b", [SECRETS])  # a new declaration replaces the previous one
        f.release("early")
        await eventually(lambda: watched(f) == {SECRETS}, 5, "pods and configmaps stopped")
        assert sorted(removed) == sorted([PODS, CONFIGMAPS])  # through the removal hooks
        await eventually(lambda: "configmaps" not in server.watched(), 5, "the watch closed")
        status = {s.gvr: s for s in f.status()}
        assert (status[CONFIGMAPS].state, status[CONFIGMAPS].reason) == (GVRState.IDLE, IDLE.split(": ")[1])
        assert status[SECRETS].state == GVRState.SYNCED
        assert status[CRDS].state == GVRState.IDLE
    finally:
        await f.shutdown()


async def test_the_triggers_start_once_a_resource_outside_the_core_group_is_wanted() -> None:
    widgets = GVR("example.com", "v1", "widgets")
    server = StubServer({CONFIGMAPS, widgets, *TRIGGERS})
    f = stub_factory(server)
    f.require("a", [CONFIGMAPS])
    await f.start()
    try:
        assert not f.triggers.started(CRDS)
        f.require("b", [widgets])
        # On informers of their own (nobody requires CRDs or APIServices), without holding up the requirement.
        assert f.triggers.started(CRDS) and widgets in watched(f)
        await eventually(lambda: server.watched() == {"configmaps", "widgets", "customresourcedefinitions",
                                                      "apiservices"}, 5)
        # The stub serves widgets but has no CRD for them: an aggregated API's, so the APIService trigger too.
        await eventually(lambda: f.triggers.watching(CRDS) and f.triggers.watching(APISERVICES), 5)
        assert watched(f) == {CONFIGMAPS, widgets} and not f._blind()
        f.release("b")  # the triggers keep watching: the next requirement need not wait for them
        await eventually(lambda: watched(f) == {CONFIGMAPS}, 5, "widgets stopped")
        assert f.triggers.started(CRDS) and f.triggers.started(APISERVICES)
    finally:
        await f.shutdown()
    assert server.watched() == set()


async def test_an_explicit_request_outside_the_core_group_starts_the_triggers() -> None:
    server = StubServer({CONFIGMAPS, *TRIGGERS})
    f = stub_factory(server)
    await f.start()
    try:
        assert not f.triggers.started(CRDS)
        f.for_resource(GVR("example.com", "v1", "widgets"))
        assert f.triggers.started(CRDS)
    finally:
        await f.shutdown()


async def test_explain_says_why_a_required_gvr_is_not_watched() -> None:
    server = StubServer({CONFIGMAPS, SECRETS, PODS, *TRIGGERS}, forbidden=frozenset({PODS}))
    f = stub_factory(server, filter=ResourceFilter(exclude=["core/v1/secrets"]), check_permissions=True)
    await f.start()
    try:
        f.require("a", [SECRETS, PODS, GVR("example.com", "v1", "widgets")])
        passes = f.passes
        await eventually(lambda: f.passes > passes, 5, "a pass")
        assert watched(f) == set()
        assert f.explain(SECRETS) == "excluded: excluded by rule core/v1/secrets"
        assert (f.explain(PODS) or "").startswith("forbidden: ")
        assert f.explain(GVR("example.com", "v1", "widgets")) == "not served: no CRD or APIService provides it"
        # a near miss of a served name gets the closest ones
        assert f.explain(GVR("", "v1", "configmap")) == \
            "not served: no CRD or APIService provides it; did you mean configmaps.v1?"
        assert f.explain(GVR("", "v2", "configmaps")) == \
            "not served: no CRD or APIService provides it; did you mean configmaps.v1?"
        # Served later: the pass that finds it starts it, as it is required.
        server.served.add(GVR("example.com", "v1", "widgets"))
        f.trigger()
        await eventually(lambda: GVR("example.com", "v1", "widgets") in f.informers()[0], 5, "widgets watched")
    finally:
        await f.shutdown()


async def test_explicit_requests_are_kept_without_any_requirement() -> None:
    server = StubServer({CONFIGMAPS, SECRETS, *TRIGGERS})
    f = stub_factory(server)
    await f.start()
    try:
        f.require("a", [CONFIGMAPS])
        inf, _ = f.for_resource(SECRETS)
        f.release("a")
        await eventually(lambda: CONFIGMAPS not in watched(f), 5, "configmaps stopped")
        assert f.informers()[0].get(SECRETS) is inf and states(f)[SECRETS] == GVRState.SYNCED
    finally:
        await f.shutdown()


async def test_a_requirement_declared_during_a_pass_is_not_undone_by_it() -> None:
    server = StubServer({CONFIGMAPS, *TRIGGERS})
    f = stub_factory(server)
    removed: list[GVR] = []

    async def hook(gvr: GVR) -> None:
        removed.append(gvr)

    f.add_removal_hook(hook)
    await f.start()
    try:
        server.hold = asyncio.Event()
        passes = f.passes
        f.trigger()
        await asyncio.sleep(0.05)  # the pass waits for discovery now
        f.require("a", [CONFIGMAPS])
        assert CONFIGMAPS in watched(f)
        server.hold.set()
        await eventually(lambda: f.passes > passes + 1, 5, "that pass and the one the requirement triggered")
        assert CONFIGMAPS in f.informers()[0] and removed == []
    finally:
        await f.shutdown()


async def test_watch_all_ignores_requirements() -> None:
    server = StubServer({CONFIGMAPS, SECRETS, *TRIGGERS})
    f = stub_factory(server, watch="all")
    await f.start()
    try:
        passes = f.passes
        f.require("a", [CONFIGMAPS])
        f.release("a")
        await asyncio.sleep(0.1)
        assert f.passes == passes and watched(f) == {CONFIGMAPS, SECRETS, *TRIGGERS}
        assert all(s.state != GVRState.IDLE for s in f.status())
    finally:
        await f.shutdown()


def test_an_unknown_watch_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="'everything'"):
        stub_factory(StubServer(set()), watch="everything")


# -- the manager's declarations ---------------------------------------------------------------------------
class DeclaringSource(FakeSource):
    """A FakeSource that records ``require``/``release`` with how many controllers were running then."""

    def __init__(self, running: list[Probe]) -> None:
        super().__init__()
        self.running = running
        self.calls: list[tuple[str, str, set[GVR], int]] = []

    def require(self, owner: str, gvrs: Any) -> None:
        self.calls.append(("require", owner, set(gvrs), sum(p.running for p in self.running)))

    def release(self, owner: str) -> None:
        self.calls.append(("release", owner, set(), sum(p.running for p in self.running)))


A, B = GVR("a.example.com", "v1", "as"), GVR("b.example.com", "v1", "bs")


async def test_the_manager_declares_its_controllers_gvrs_until_they_have_stopped() -> None:
    one, two = Probe("one", stop_delay=0.05), Probe("two")
    src = DeclaringSource([one, two])
    m = ControllerManager("demand", src, {"one": ManagedController([A], one.create),
                                          "two": ManagedController([A, B], two.create)}, backoff=fast_backoff)
    await m.start()
    try:
        assert src.calls == [("require", m.name, {A, B}, 0)]
        src.add(A)
        src.add(B)
        await settle(lambda: one.running == two.running == 1)
    finally:
        assert await m.stop() == []
        await src.close()
    assert src.calls[1:] == [("release", m.name, set(), 0)]


# -- against the real control plane -----------------------------------------------------------------------
def controller(probe: Probe, *gvrs: GVR) -> ManagedController:
    return ManagedController(list(gvrs), probe.create)


async def test_a_required_mode_factory_watches_only_what_its_controllers_require(api: ApiClient) -> None:
    f = factory(api, watch="required")
    await f.start()
    cms = Probe("cms")
    m = ControllerManager("demand-it", f, {"cms": controller(cms, CONFIGMAPS)}, backoff=fast_backoff)
    try:
        assert watched(f) == set()
        assert set(f._meta.informers()) == set()  # the triggers' own: none while only core resources are wanted
        await m.start()
        await eventually(lambda: cms.running == 1, 20, "the configmaps controller running")
        assert watched(f) == {CONFIGMAPS}
        st = states(f)
        assert st[SECRETS] == st[PODS] == GVRState.IDLE and st[CONFIGMAPS] == GVRState.SYNCED
        served = len(f.status())
        print(f"\nrequired mode: {len(watched(f))} informers for {served} served GVRs")
        await m.stop()
        await eventually(lambda: watched(f) == set(), 20, "configmaps released and stopped")
        assert states(f)[CONFIGMAPS] == GVRState.IDLE
    finally:
        await m.stop()
        await f.shutdown()


async def test_a_required_custom_resource_needs_only_the_crd_trigger_while_a_crd_serves_it(api: ApiClient) -> None:
    """The APIService trigger joins once a required resource outside the core group is not a CRD's: here when its
    CRD is deleted (it might come back as an aggregated API); a CRD's own APIService stays the apiserver's."""
    group = unique_group("demand")
    widgets = GVR(group, "v1", "widgets")
    await post_crd(api, group)
    discovery = DiscoveryClient(api)

    async def served() -> bool:
        return widgets in (await discovery.discover()).resources

    await eventually(served, 20, "the CRD served")
    f = factory(api, watch="required")
    f.require("t", [CONFIGMAPS, widgets])
    await f.start()
    try:
        await eventually(lambda: {CONFIGMAPS, widgets} <= set(f.informers()[0]), 20, "both synced")
        assert f.triggers.watching(CRDS) and not f.triggers.started(APISERVICES) and not f._blind()
        assert set(f._meta.informers()) == {CRDS}
        await delete_crd(api, f"widgets.{group}")
        await eventually(lambda: widgets not in watched(f), 30, "widgets stopped with its CRD")
        await eventually(lambda: f.triggers.watching(APISERVICES), 10, "the APIService trigger begun")
        await post_crd(api, group)
        await eventually(lambda: widgets in f.informers()[0], 30, "widgets watched again with the new CRD")
        assert not f._blind()
    finally:
        await f.shutdown()
        await delete_crd(api, f"widgets.{group}")


async def test_a_required_crd_is_watched_while_it_exists_and_an_unrequired_one_only_discovered(
        api: ApiClient) -> None:
    group = unique_group("demand")
    widgets, gadgets = GVR(group, "v1", "widgets"), GVR(group, "v1", "gadgets")
    f = factory(api, filter=ResourceFilter(include=["demand-*.example.com/*", "apiextensions.k8s.io/*",
                                                    "apiregistration.k8s.io/*"]), watch="required")
    await f.start()
    probe = Probe("widgets")
    m = ControllerManager("demand-crd", f, {"widgets": controller(probe, widgets)}, backoff=fast_backoff)
    await m.start()
    try:
        # (other tests' groups on the shared server may be offered as closest names)
        await eventually(lambda: [w.startswith(f"{widgets} (not served: no CRD or APIService provides it")
                                  for w in m.status()["widgets"].missing] == [True], 10, "waiting")
        await post_crd(api, group, "gadgets", "Gadget")
        await post_crd(api, group)
        await eventually(lambda: probe.running == 1, 30, "the widgets controller running")
        assert widgets in f.informers()[0]
        await eventually(lambda: states(f).get(gadgets) == GVRState.IDLE, 20, "gadgets discovered")
        assert gadgets not in watched(f) and f.explain(gadgets) == IDLE
        await delete_crd(api, f"widgets.{group}")
        await eventually(lambda: probe.running == 0 and widgets not in watched(f), 30, "both stopped")
        assert m.status()["widgets"].state == "waiting"
    finally:
        await m.stop()
        await f.shutdown()
        await delete_crd(api, f"gadgets.{group}")
