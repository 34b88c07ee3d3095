"""Discovery pieces that need no API server: subscriptions, the resource filter, access-review verdicts, states."""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from typing import Any

import pytest
from kubernetes.client import Configuration

from informers import (
    GVR, ApiClient, ApiError, DiscoveryClient, DiscoveryForbidden, GVRState, GVRStatus, Notifier, ResourceFilter,
    ResourceInfo,
)
from informers import discovery_loop
from informers.access_review import AccessReviewer
from informers.transport import TransportError

from tests.helpers import eventually

WIDGETS = GVR("example.com", "v1", "widgets")
GADGETS = GVR("example.com", "v1", "gadgets")


async def test_a_pending_tick_is_delivered_before_the_subscription_ends() -> None:
    notifier = Notifier()
    sub = notifier.subscribe("a")  # starts with one tick
    notifier.notify_all()  # coalesces with it
    notifier.unsubscribe("a")
    ticks = [t async for t in sub]
    assert len(ticks) == 1 and sub.closed
    assert [t async for t in sub] == []  # ended for good


async def test_a_subscriber_waiting_sees_the_tick_then_the_end() -> None:
    notifier = Notifier()
    sub = notifier.subscribe("a")
    seen: list[None] = []

    async def consume() -> None:
        async for tick in sub:
            seen.append(tick)

    task = asyncio.create_task(consume())
    await eventually(lambda: len(seen) == 1, 1, "the initial tick taken")
    notifier.notify_all()
    notifier.unsubscribe("a")
    await asyncio.wait_for(task, 1)
    assert len(seen) == 2


def info(*verbs: str) -> ResourceInfo:
    return ResourceInfo(WIDGETS, "Widget", True, frozenset(verbs), True)


def test_why_excluded_names_exactly_the_missing_verbs() -> None:
    f = ResourceFilter()
    assert f.why_excluded(info("get", "list")) == "lacks watch"
    assert f.why_excluded(info("get", "watch")) == "lacks list"
    assert f.why_excluded(info("get")) == "lacks list and watch"
    assert f.why_excluded(info("get", "list", "watch")) is None


def test_per_gvr_rules_and_preferred_version() -> None:
    f = ResourceFilter(include=["example.com/*"], exclude=["example.com/v1/gadgets"])
    assert f.why_excluded(info("list", "watch")) is None
    assert f.why_excluded(ResourceInfo(GADGETS, "Gadget", True, frozenset({"list", "watch"}), True)) == \
        "excluded by rule example.com/v1/gadgets"
    older = ResourceInfo(GVR("example.com", "v1alpha1", "widgets"), "Widget", True, frozenset({"list", "watch"}),
                         False)
    assert ResourceFilter(preferred_version_only=True).why_excluded(older) == "not the group's preferred version"


def test_gvr_states_are_an_enum_and_serialise_as_before() -> None:
    st = GVRStatus(WIDGETS, GVRState.SYNCED, kind="Widget")
    doc = st.as_dict()
    assert doc["state"] == "synced" and type(doc["state"]) is str
    assert json.loads(json.dumps(doc))["state"] == "synced"
    assert {s.value for s in GVRState} == {"discovered", "excluded", "forbidden", "starting", "synced", "stale", "idle",
                                           "error"}
    assert st.state == "synced"  # still compares equal to the string


def test_discovery_forbidden_is_one_line_for_the_cli() -> None:
    e = DiscoveryForbidden(ApiError(403, "Forbidden", 'forbidden: User "x" cannot get path "/apis"'))
    assert isinstance(e, ApiError) and e.status == 403
    assert str(e) == ('the API server refused discovery for this user (403 Forbidden): '
                      'forbidden: User "x" cannot get path "/apis"')
    assert str(DiscoveryForbidden(ApiError(401, "", ""))).startswith(
        "the API server refused discovery for this user (401 Unauthorized)")


class ReviewStub:
    """Answers SelfSubjectAccessReviews from ``allowed``; ``error`` (if set) is raised instead; ``hang`` hangs."""

    def __init__(self, allowed: set[GVR]) -> None:
        self.allowed = allowed
        self.error: Exception | None = None
        self.hang = False
        self.calls = 0

    async def request(self, method: str, path: str, body: Any = None, timeout: float | None = None) -> Any:
        self.calls += 1
        if self.hang:
            await asyncio.Event().wait()
        if self.error is not None:
            raise self.error
        a = body["spec"]["resourceAttributes"]
        return {"status": {"allowed": GVR(a["group"], a["version"], a["resource"]) in self.allowed}}


async def test_a_failed_access_review_keeps_the_previous_verdict() -> None:
    stub = ReviewStub(allowed={WIDGETS})
    reviewer = AccessReviewer(stub)  # type: ignore[arg-type]
    assert await reviewer.check([WIDGETS, GADGETS], recheck_forbidden=False) is None
    assert reviewer.denied(WIDGETS) is None and "may not list or watch" in (reviewer.denied(GADGETS) or "")
    stub.error = TransportError("ServerDisconnectedError: Server disconnected")
    new = GVR("example.com", "v1", "gizmos")
    failed = await reviewer.check([WIDGETS, GADGETS, new], recheck_forbidden=True)
    assert failed is not None and isinstance(failed.cause, TransportError)
    assert set(failed.failed) == {GADGETS, new} and failed.undecided == [new]
    assert reviewer.decided(GADGETS) and reviewer.denied(GADGETS) and not reviewer.decided(new)
    stub.error = None
    assert await reviewer.check([WIDGETS, GADGETS, new], recheck_forbidden=False) is None
    assert reviewer.decided(new)


async def test_access_reviews_of_a_pass_are_bounded_together() -> None:
    stub = ReviewStub(allowed=set())
    stub.hang = True
    reviewer = AccessReviewer(stub, timeout=0.1)  # type: ignore[arg-type]
    failed = await asyncio.wait_for(reviewer.check([WIDGETS, GADGETS], recheck_forbidden=False), 5)
    assert failed is not None and isinstance(failed.cause, TimeoutError)
    assert sorted(failed.undecided) == sorted([WIDGETS, GADGETS])


def test_trigger_view_keeps_what_the_triggers_read_and_drops_schemas() -> None:
    from informers.discovery_triggers import (
        _aggregated, _apiservice_changed, _available, _established, _served, trigger_view,
    )

    schema = {"openAPIV3Schema": {"type": "object", "properties": {f"f{i}": {"type": "string"} for i in range(200)}}}
    crd = {"metadata": {"name": "widgets.example.com", "uid": "u1", "resourceVersion": "7", "generation": 3,
                        "annotations": {"big": "x" * 5000}},
           "spec": {"group": "example.com", "names": {"plural": "widgets", "kind": "Widget"}, "scope": "Namespaced",
                    "versions": [{"name": "v1", "served": True, "storage": True, "schema": schema},
                                 {"name": "v2", "served": False, "storage": False, "schema": schema}]},
           "status": {"conditions": [{"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
                                      "message": "the initial names have been accepted"}]}}
    view = trigger_view(json.loads(json.dumps(crd)))
    assert _established(view) and _served(view) == {"v1"} == _served(crd)
    assert view["spec"]["group"] == "example.com" and view["spec"]["names"]["plural"] == "widgets"
    assert view["metadata"] == {"name": "widgets.example.com", "uid": "u1", "resourceVersion": "7"}
    assert len(json.dumps(view)) < len(json.dumps(crd)) // 20
    svc = {"kind": "APIService", "metadata": {"name": "v1beta1.metrics.k8s.io", "resourceVersion": "9"},
           "spec": {"group": "metrics.k8s.io", "version": "v1beta1",
                    "service": {"name": "m", "namespace": "kube-system"}},
           "status": {"conditions": [{"type": "Available", "status": "False", "reason": "MissingEndpoints"}]}}
    view = trigger_view(json.loads(json.dumps(svc)))
    assert view["spec"] == svc["spec"] and _aggregated(view) and not _available(view) and view["kind"] == "APIService"
    # A local APIService: only its name and resourceVersion; becoming aggregated is still a change.
    local = {"kind": "APIService", "metadata": {"name": "v1.apps", "uid": "u2", "resourceVersion": "3"},
             "spec": {"group": "apps", "version": "v1", "groupPriorityMinimum": 17800, "versionPriority": 15},
             "status": {"conditions": [{"type": "Available", "status": "True", "reason": "Local"}]}}
    local_view = trigger_view(json.loads(json.dumps(local)))
    assert local_view == {"kind": "APIService", "metadata": {"name": "v1.apps", "resourceVersion": "3"}}
    assert not _aggregated(local_view) and not _apiservice_changed(local_view, trigger_view(local))
    aggregated = {**local, "spec": {**local["spec"], "service": {"name": "apps", "namespace": "x"}}}
    assert _apiservice_changed(local_view, trigger_view(aggregated))
    assert _apiservice_changed(trigger_view(aggregated), local_view)


async def test_members_of_one_kind_of_cluster_share_what_discovery_found() -> None:
    """Two clients' results hold the same ResourceInfo and GVR objects (interned), not one copy each."""
    aggregated = {"kind": "APIGroupDiscoveryList", "items": [{"metadata": {"name": "apps"}, "versions": [
        {"version": "v1", "resources": [{"resource": "deployments", "responseKind": {"kind": "Deployment"},
                                         "scope": "Namespaced", "verbs": ["list", "watch"]}]}]}]}

    class Server:
        async def request(self, method: str, path: str, headers: Any = None, timeout: float | None = None) -> Any:
            return json.loads(json.dumps(aggregated if path == "/apis" else {**aggregated, "items": []}))

    one, two = [await DiscoveryClient(Server()).discover() for _ in range(2)]  # type: ignore[arg-type]
    [(gvr_one, info_one)] = one.resources.items()
    [(gvr_two, info_two)] = two.resources.items()
    assert info_one is info_two and gvr_one is gvr_two is info_one.gvr


def test_one_helper_unwraps_what_a_delete_handler_gets() -> None:
    from informers.store import DeletedFinalStateUnknown, deleted_key, last_state

    cm = {"metadata": {"name": "a", "namespace": "ns"}}
    tombstone = DeletedFinalStateUnknown("ns/a", cm)
    assert last_state(cm) is cm and last_state(tombstone) is cm
    assert deleted_key(cm) == deleted_key(tombstone) == "ns/a"


class _RecoveringClient:
    """``answered_again`` of an ApiClient; ``recover()`` plays the server answering after an outage."""

    def __init__(self) -> None:
        self.recoveries = 0
        self._answered = asyncio.Event()

    def recover(self) -> None:
        self.recoveries += 1
        self._answered.set()
        self._answered = asyncio.Event()

    async def answered_again(self, since: int) -> None:
        while self.recoveries <= since:
            await self._answered.wait()


def test_the_pass_after_an_outage_is_delayed_within_its_spread() -> None:
    assert 0 < discovery_loop.AFTER_OUTAGE_SPREAD <= 5.0
    delays = [discovery_loop.after_outage_delay() for _ in range(2000)]
    assert all(0.0 <= d <= discovery_loop.AFTER_OUTAGE_SPREAD for d in delays)
    assert max(delays) - min(delays) > discovery_loop.AFTER_OUTAGE_SPREAD / 2  # spread, not a fixed delay


async def test_the_server_answering_again_asks_for_a_pass_after_the_delay(monkeypatch: Any) -> None:
    monkeypatch.setattr(discovery_loop, "after_outage_delay", lambda: 0.3)
    client = _RecoveringClient()

    async def run_pass(periodic: bool) -> None:
        return None

    loop = discovery_loop.DiscoveryLoop(run_pass, client, None, name="t",  # type: ignore[arg-type]
                                        rediscovery_interval=60.0, full_rediscovery_interval=600.0,
                                        min_pass_interval=0.0, blind=lambda: False)
    task = asyncio.create_task(loop._after_outages(None))  # type: ignore[arg-type]
    try:
        await asyncio.sleep(0.05)
        client.recover()
        await asyncio.sleep(0.15)
        assert not loop._wake.is_set()  # still within its delay
        await eventually(loop._wake.is_set, 2, "the pass asked for")
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def _aggregated(*resources: str) -> dict[str, Any]:
    return {"kind": "APIGroupDiscoveryList", "items": [{"metadata": {"name": "apps"}, "versions": [
        {"version": "v1", "resources": [{"resource": r, "responseKind": {"kind": r.title()}, "scope": "Namespaced",
                                         "verbs": ["list", "watch"]} for r in resources]}]}]}


class BytesServer(ApiClient):
    """An ``ApiClient`` whose own ``request`` is kept: it answers ``request_bytes`` with fixed documents."""

    def __init__(self, docs: dict[str, dict[str, Any]]) -> None:
        super().__init__(Configuration(host="https://unused.invalid"))
        self.docs, self.asked = docs, 0

    async def request_bytes(self, method: str, path: str, params: Any = None, body: Any = None,
                            headers: Any = None, timeout: float | None = 60.0) -> bytes:
        self.asked += 1
        if path not in self.docs:
            raise ApiError(403, "Forbidden", f"may not get {path}")
        return json.dumps(self.docs[path]).encode()


async def test_members_given_the_same_documents_parse_each_once(monkeypatch: Any) -> None:
    """Byte-identical /api and /apis answers are read once per process; every member still asks its server, and
    gets a result of its own to change."""
    from informers import discovery

    read: list[Any] = []
    real = discovery._read_aggregated
    monkeypatch.setattr(discovery, "_PARSED", OrderedDict())
    monkeypatch.setattr(discovery, "_read_aggregated", lambda doc: read.append(doc) or real(doc))
    docs = {"/api": {"kind": "APIGroupDiscoveryList", "items": []}, "/apis": _aggregated("deployments")}
    servers = [BytesServer(docs) for _ in range(3)]
    results = [await DiscoveryClient(s).discover() for s in servers]
    assert len(read) == 2 and [s.asked for s in servers] == [2, 2, 2]
    assert all(r.requests == 2 and r.aggregated for r in results)
    one, two = results[0], results[1]
    assert one.resources == two.resources and one.resources is not two.resources
    one.resources.clear()
    one.stale_group_versions.add("apps/v1")
    assert len(two.resources) == 1 and not two.stale_group_versions


async def test_the_parsed_documents_are_bounded_and_a_changed_document_is_read_again(monkeypatch: Any) -> None:
    from informers import discovery

    monkeypatch.setattr(discovery, "_PARSED", OrderedDict())
    for i in range(discovery._PARSED_MAX + 3):
        docs = {"/api": {"kind": "APIGroupDiscoveryList", "items": []}, "/apis": _aggregated(f"r{i}")}
        found = await DiscoveryClient(BytesServer(docs)).discover()
        assert [g.resource for g in found.resources] == [f"r{i}"]
    assert len(discovery._PARSED) == discovery._PARSED_MAX


async def test_a_refused_discovery_through_the_shared_reading_is_still_discovery_forbidden() -> None:
    with pytest.raises(DiscoveryForbidden):
        await DiscoveryClient(BytesServer({"/api": {"kind": "APIGroupDiscoveryList", "items": []}})).discover()


async def test_a_client_that_overrides_request_is_asked_through_it() -> None:
    """Test doubles and wrappers that answer ``request()`` only keep working (and see every call)."""
    calls: list[str] = []

    class Server:
        async def request(self, method: str, path: str, headers: Any = None, timeout: float | None = None) -> Any:
            calls.append(path)
            return _aggregated("deployments") if path == "/apis" else {"kind": "APIGroupDiscoveryList", "items": []}

    for _ in range(2):
        found = await DiscoveryClient(Server()).discover()  # type: ignore[arg-type]
        assert [g.resource for g in found.resources] == ["deployments"]
    assert sorted(calls) == ["/api", "/api", "/apis", "/apis"]
