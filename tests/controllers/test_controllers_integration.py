"""ControllerManager + Controller helper + discovering factory against the real control plane."""

from __future__ import annotations

import asyncio
import time
import uuid
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Iterator

import kubernetes
import pytest
from prometheus_client import CollectorRegistry

from controllers import (
    Controller, ControllerContext, ControllerManager, ItemExponentialFailureRateLimiter, ManagedController,
    ReconcileContext, Request, Result, TerminalError, generation_changed, has_finalizer, set_controller_reference,
)
from informers import (
    GVR, ApiClient, DiscoveringDynamicSharedInformerFactory, DiscoveryOptions, NotFound, ResourceClient, ResourceFilter,
)

from tests.helpers import CONFIGMAPS, eventually
from tests.kube import configmap, crd_gone, delete_crd, install_crd, new_object, post_crd, unique_group, widget

FINALIZER = "example.com/cleanup"
EVENTS = GVR("events.k8s.io", "v1", "events")


class Reconciler:
    def __init__(self) -> None:
        self.seen: list[Request] = []
        self.first_at: float | None = None

    async def __call__(self, req: Request) -> Result | None:
        if self.first_at is None:
            self.first_at = time.monotonic()
        self.seen.append(req)
        return None


async def test_controller_follows_its_crd_and_two_gvr_controller_waits_for_both(api: ApiClient) -> None:
    g1, g2 = unique_group("ctl"), unique_group("ctl")
    w1, w2 = GVR(g1, "v1", "widgets"), GVR(g2, "v1", "widgets")
    factory = DiscoveringDynamicSharedInformerFactory(
        api, DiscoveryOptions(filter=ResourceFilter(include=["ctl-*.example.com/*"])), metrics_registry=CollectorRegistry())
    single, pair = Reconciler(), Reconciler()
    creates = {"single": 0, "pair": 0}

    def make(name, rec, gvrs):
        def create(ctx):
            creates[name] += 1
            c = Controller(name, rec, workers=2, metrics_registry=CollectorRegistry())
            for g in gvrs:
                c.watch(g)
            return c.run
        return ManagedController(gvrs, create)

    mgr = ControllerManager("it", factory, {"single": make("single", single, [w1]),
                                            "pair": make("pair", pair, [w1, w2])},
                            metrics_registry=CollectorRegistry())
    await factory.start()
    await mgr.start()
    try:
        await post_crd(api, g1)
        established = await wait_established(api, f"widgets.{g1}")
        await new_object(api, w1, "early")
        await eventually(lambda: mgr.status()["single"].state == "running", 10, "single running")
        started_after = mgr.status()["single"].running_since - established
        await new_object(api, w1, "late")
        await eventually(lambda: {r.name for r in single.seen} >= {"early", "late"}, 10, "both reconciled")
        assert started_after < 3.0, started_after  # a loose sanity bound; the latency itself is measured in bench/
        (why,) = [m.split(" (", 1)[1] for m in mgr.status()["pair"].missing]
        assert mgr.status()["pair"].state == "waiting"
        # The closest served name: w1, or the widgets of another test's CRD left on the shared control plane.
        assert why.startswith("not served: no CRD or APIService provides it; did you mean widgets.v1.ctl-"), why
        # the second GVR arrives: the pair controller starts
        await post_crd(api, g2)
        await eventually(lambda: mgr.status()["pair"].state == "running", 10, "pair running")
        w1_informer = factory.informers()[0][w1]
        assert len(w1_informer.registrations) == 2
        # the second CRD goes: pair stops, and its handler leaves the surviving w1 informer
        await delete_crd(api, f"widgets.{g2}")
        await eventually(lambda: mgr.status()["pair"].state == "waiting", 10, "pair stopped")
        assert [r.name for r in w1_informer.registrations] == ["single"]
        assert mgr.status()["single"].state == "running"
        # the first CRD goes and comes back: single stops and starts again with a fresh create
        await delete_crd(api, f"widgets.{g1}")
        await eventually(lambda: mgr.status()["single"].state == "waiting", 10, "single stopped")
        await eventually(lambda: crd_gone(api, f"widgets.{g1}"), 30, "CRD gone")
        single.seen.clear()
        await post_crd(api, g1)
        await wait_established(api, f"widgets.{g1}")
        await new_object(api, w1, "reborn")
        await eventually(lambda: any(r.name == "reborn" for r in single.seen), 15, "reconciled after recreate")
        assert creates["single"] == 2
        assert not any(r.name in ("early", "late") for r in single.seen)
    finally:
        await mgr.stop()
        await factory.shutdown()


async def wait_established(api: ApiClient, name: str, timeout: float = 30) -> float:
    path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        crd = await api.request("GET", path)
        if any(c["type"] == "Established" and c["status"] == "True"
               for c in (crd.get("status") or {}).get("conditions") or ()):
            return time.time()
        await asyncio.sleep(0.01)
    raise AssertionError(f"CRD {name} not Established within {timeout}s")


def owned(gvr: GVR, name: str, owner: str | None = None) -> dict:
    refs = [{"apiVersion": f"{gvr.group}/{gvr.version}", "kind": "Widget", "name": owner,
             "uid": str(uuid.uuid5(uuid.NAMESPACE_URL, owner))}] if owner else []
    return {"apiVersion": f"{gvr.group}/{gvr.version}", "kind": "Widget",
            "metadata": {"name": name, "ownerReferences": refs}}


def owners(obj: dict) -> list[Request]:
    meta = obj["metadata"]
    return [Request(ref["name"], meta.get("namespace")) for ref in meta.get("ownerReferences") or ()]


async def test_reconcile_errors_terminal_errors_and_owner_changes(api: ApiClient) -> None:
    group = unique_group("ctl")
    widgets = GVR(group, "v1", "widgets")
    factory = DiscoveringDynamicSharedInformerFactory(
        api, DiscoveryOptions(filter=ResourceFilter(include=["ctl-*.example.com/*"])), metrics_registry=CollectorRegistry())
    by_owner = Reconciler()
    attempts: dict[str, int] = {}

    async def flaky(req: Request) -> None:
        attempts[req.name] = attempts.get(req.name, 0) + 1
        if req.name == "bad":
            raise RuntimeError("bad is never right")
        if req.name == "invalid":
            raise TerminalError("invalid cannot be fixed by retrying")

    def controller(name: str, reconcile: Any, map_fn: Any = None) -> ManagedController:
        def create(ctx: Any) -> Any:
            c = Controller(name, reconcile, rate_limiter=ItemExponentialFailureRateLimiter(0.005, 0.05),
                           metrics_registry=CollectorRegistry())
            return (c.watch(widgets, map_fn) if map_fn else c.watch(widgets)).run
        return ManagedController([widgets], create)

    mgr = ControllerManager("it-errors", factory, {"owners": controller("owners", by_owner, owners),
                                                   "flaky": controller("flaky", flaky)},
                            metrics_registry=CollectorRegistry())
    await post_crd(api, group)
    await factory.start()
    await mgr.start()
    try:
        await wait_established(api, f"widgets.{group}")
        await eventually(lambda: all(s.state == "running" for s in mgr.status().values()), 10, "both running")
        for body in (owned(widgets, "p1"), owned(widgets, "p2"), owned(widgets, "child", "p1"),
                     owned(widgets, "bad"), owned(widgets, "invalid")):
            await api.request("POST", widgets.path("default"), body=body)
        await eventually(lambda: [r.name for r in by_owner.seen] == ["p1"], 10, "the owner reconciled")
        # adopted by p2: both the new and the old owner are told
        await api.request("PATCH", widgets.path("default", "child"),
                          body={"metadata": {"ownerReferences": owned(widgets, "child", "p2")["metadata"]
                                             ["ownerReferences"]}})
        await eventually(lambda: sorted(r.name for r in by_owner.seen[1:]) == ["p1", "p2"], 10, "both owners")
        # a reconcile that always fails is retried (not dropped) and visible in the status; a terminal one is not
        await eventually(lambda: attempts.get("bad", 0) >= 20, 20, "bad retried past the old limit of 16")
        status = mgr.status()["flaky"].as_dict()
        assert status["state"] == "running" and status["healthy"]
        assert status["reconcile_errors"] >= 21 and status["last_reconcile_error_at"] is not None
        assert status["last_reconcile_error"] == "RuntimeError: bad is never right"
        assert attempts["invalid"] == 1 and attempts["p1"] == 1
    finally:
        assert await mgr.stop() == []
        await factory.shutdown()
        await delete_crd(api, f"widgets.{group}")


# -- the builder, finalizers and predicates against the real API server ---------------------------------------
@pytest.fixture(scope="module")
def widgets(admin_client: kubernetes.client.ApiClient) -> Iterator[GVR]:
    """A namespaced Widget CRD of its own group (examples/crds/widget.json: spec.size, a status subresource)."""
    gvr = install_crd(admin_client, "Namespaced", "Widget", "widgets")
    yield gvr
    kubernetes.client.ApiextensionsV1Api(admin_client).delete_custom_resource_definition(f"{gvr.resource}.{gvr.group}")


@asynccontextmanager
async def managed(api: ApiClient, namespace: str, gvrs: list[GVR], create: Any) -> AsyncIterator[ControllerManager]:
    """One controller (``create``) under a manager with an API client, on informers of ``namespace``; waits until it
    runs, and stops everything after."""
    factory = DiscoveringDynamicSharedInformerFactory(
        api, DiscoveryOptions(namespace=namespace,
                              filter=ResourceFilter(include=[f"{g.group or 'core'}/{g.resource}" for g in gvrs])),
        metrics_registry=CollectorRegistry())
    mgr = ControllerManager("it-builder", factory, {"c": ManagedController(gvrs, create)}, client=api,
                            metrics_registry=CollectorRegistry())
    await factory.start()
    await mgr.start()
    try:
        await eventually(lambda: mgr.status()["c"].state == "running", 15, "the controller to run")
        yield mgr
    finally:
        assert await mgr.stop() == []
        await factory.shutdown()


def quick(name: str, reconcile: Any, **kw: Any) -> Controller:
    return Controller(name, reconcile, rate_limiter=ItemExponentialFailureRateLimiter(0.005, 0.05),
                      metrics_registry=CollectorRegistry(), **kw)


async def quiet(seconds: float = 0.3) -> None:
    """Time for events that should not come (an absence can only be checked by waiting)."""
    await asyncio.sleep(seconds)


async def finalizer_on_server(client: ResourceClient, name: str, namespace: str) -> bool:
    return has_finalizer(await client.get(name, namespace), FINALIZER)


async def observed_generation(client: ResourceClient, name: str, namespace: str, generation: int) -> bool:
    return bool(((await client.get(name, namespace)).get("status") or {}).get("observedGeneration") == generation)


async def gone(client: ResourceClient, name: str, namespace: str) -> bool:
    try:
        await client.get(name, namespace)
    except NotFound:
        return True
    return False


async def events_about(api: ApiClient, namespace: str, name: str, reason: str) -> bool:
    return any(e["regarding"]["name"] == name and e["reason"] == reason
               for e in await ResourceClient(api, EVENTS).list(namespace))


async def test_owned_objects_enqueue_their_controller_owner(api: ApiClient, namespace: str, widgets: GVR) -> None:
    seen: list[str] = []

    async def reconcile(req: Request, rc: ReconcileContext) -> None:
        seen.append(req.name)

    def create(ctx: ControllerContext) -> Any:
        return quick("owners", reconcile).for_(widgets, predicates=[generation_changed]).owns(CONFIGMAPS).run

    wc, cc = ResourceClient(api, widgets), ResourceClient(api, CONFIGMAPS)
    async with managed(api, namespace, [widgets, CONFIGMAPS], create):
        p1 = await wc.create(widget(widgets, "p1", namespace))
        p2 = await wc.create(widget(widgets, "p2", namespace))
        await eventually(lambda: sorted(seen) == ["p1", "p2"], 10, "the owners' own reconciles")
        seen.clear()
        child = configmap("child", namespace, k="v")
        set_controller_reference(p1, child)
        await cc.create(child)
        await eventually(lambda: seen == ["p1"], 10, "the owner of a new child")
        seen.clear()
        adopted = configmap("child", namespace)
        set_controller_reference(p2, adopted)
        await cc.patch("child", {"metadata": {"ownerReferences": adopted["metadata"]["ownerReferences"]}},
                       type="merge", namespace=namespace)
        await eventually(lambda: sorted(seen) == ["p1", "p2"], 10, "the old and the new owner")
        seen.clear()
        await cc.delete("child", namespace)
        await eventually(lambda: seen == ["p2"], 10, "the owner of a deleted child")
        await quiet()
        assert seen == ["p2"]


async def test_finalizer_added_then_finalize_runs_once_and_the_object_goes(api: ApiClient, namespace: str,
                                                                           widgets: GVR) -> None:
    reconciled: list[dict[str, Any]] = []
    finalized: list[dict[str, Any]] = []

    async def reconcile(req: Request, rc: ReconcileContext) -> None:
        obj = rc.lister().get(req.name, req.namespace)
        if obj is not None:
            reconciled.append(obj)

    async def finalize(req: Request, rc: ReconcileContext, obj: dict[str, Any]) -> None:
        finalized.append(obj)
        rc.events.event(obj, "Normal", "Finalized", "Delete", "cleaned up")

    def create(ctx: ControllerContext) -> Any:
        return quick("finalizing", reconcile, finalizer=FINALIZER, finalize=finalize).for_(widgets).run

    wc = ResourceClient(api, widgets)
    async with managed(api, namespace, [widgets], create):
        await wc.create(widget(widgets, "w", namespace))
        await eventually(lambda: finalizer_on_server(wc, "w", namespace), 10, "the finalizer")
        await eventually(lambda: any(has_finalizer(o, FINALIZER) for o in reconciled), 10, "a reconcile after it")
        await wc.delete("w", namespace)
        await eventually(lambda: gone(wc, "w", namespace), 10, "the object to go")
        await quiet()
        assert len(finalized) == 1
        assert finalized[0]["metadata"]["deletionTimestamp"] and has_finalizer(finalized[0], FINALIZER)
        assert not any(o["metadata"].get("deletionTimestamp") for o in reconciled)  # finalize, not reconcile
        await eventually(lambda: events_about(api, namespace, "w", "Finalized"), 10, "the Event")
    assert not [t for t in asyncio.all_tasks() if t.get_name() == "event recorder"]  # closed with the controller


async def test_a_failing_finalize_is_retried_with_backoff_and_the_object_stays(api: ApiClient, namespace: str,
                                                                              widgets: GVR) -> None:
    attempts: list[float] = []
    present: list[bool] = []
    wc = ResourceClient(api, widgets)

    async def reconcile(req: Request) -> None:
        return None

    async def finalize(req: Request, rc: ReconcileContext, obj: dict[str, Any]) -> None:
        attempts.append(time.monotonic())
        present.append(bool((await wc.get(req.name, req.namespace))["metadata"].get("deletionTimestamp")))
        if len(attempts) <= 3:
            raise RuntimeError("cleanup failed")

    def create(ctx: ControllerContext) -> Any:
        return Controller("finalize-retries", reconcile, finalizer=FINALIZER, finalize=finalize,
                          rate_limiter=ItemExponentialFailureRateLimiter(0.1, 10),
                          metrics_registry=CollectorRegistry()).for_(widgets).run

    async with managed(api, namespace, [widgets], create) as mgr:
        await wc.create(widget(widgets, "w", namespace))
        await eventually(lambda: finalizer_on_server(wc, "w", namespace), 10, "the finalizer")
        await wc.delete("w", namespace)
        await eventually(lambda: gone(wc, "w", namespace), 15, "the object to go")
        assert len(attempts) == 4 and present == [True] * 4  # it stayed, being deleted, until finalize succeeded
        gaps = [b - a for a, b in zip(attempts, attempts[1:])]
        assert gaps[0] >= 0.095 and gaps[1] >= 0.195 and gaps[2] >= 0.395, gaps  # 100 ms doubling
        assert mgr.status()["c"].reconciles.errors == 3


async def test_generation_changed_skips_status_writes_not_spec_changes(api: ApiClient, namespace: str,
                                                                       widgets: GVR) -> None:
    calls: list[int] = []

    async def reconcile(req: Request, rc: ReconcileContext) -> None:
        obj = rc.lister().get(req.name, req.namespace)
        if obj is None:
            return
        calls.append(obj["metadata"]["generation"])
        await rc.client.patch_status(req.name, {"status": {"observedGeneration": obj["metadata"]["generation"]}},
                                     type="merge", namespace=req.namespace)

    def create(ctx: ControllerContext) -> Any:
        return quick("generations", reconcile).for_(widgets, predicates=[generation_changed]).run

    wc = ResourceClient(api, widgets)
    async with managed(api, namespace, [widgets], create):
        await wc.create(widget(widgets, "w", namespace))
        await eventually(lambda: calls == [1], 10, "the first reconcile")
        await eventually(lambda: observed_generation(wc, "w", namespace, 1),
                         10, "its status write")
        await wc.patch_status("w", {"status": {"note": "from someone else"}}, type="merge", namespace=namespace)
        await quiet()
        assert calls == [1]  # neither our status write nor another's triggered a reconcile
        await wc.patch("w", {"spec": {"size": 5}}, type="merge", namespace=namespace)
        await eventually(lambda: calls == [1, 2], 10, "the reconcile of the spec change")


async def test_a_live_change_is_reconciled_before_the_rest_of_the_initial_list(api: ApiClient, namespace: str) -> None:
    """The priority queue against a real control plane: one worker held by the test on the first object of the
    initial list, the others waiting, and an object changed meanwhile is the next reconciled."""
    names = [f"cm-{i:02}" for i in range(30)]
    cc = ResourceClient(api, CONFIGMAPS)
    await asyncio.gather(*(cc.create(configmap(n, namespace, k="initial")) for n in names))
    gate = asyncio.Event()
    seen: list[tuple[str, str | None]] = []  # (name, data.k as the reconcile read it)
    registry = CollectorRegistry()

    async def reconcile(req: Request, rc: ReconcileContext) -> None:
        obj = rc.lister().get(req.name, req.namespace)
        seen.append((req.name, (obj.get("data") or {}).get("k") if obj is not None else None))
        if len(seen) == 1:
            await gate.wait()  # a slow reconcile

    def create(ctx: ControllerContext) -> Any:
        return Controller("live-first", reconcile, metrics_registry=registry).for_(CONFIGMAPS).run

    def live_queued() -> bool:
        return registry.get_sample_value("workqueue_depth", {"name": "live-first", "priority": "0"}) == 1

    async with managed(api, namespace, [CONFIGMAPS], create):
        await eventually(lambda: len(seen) == 1, 15, "the first reconcile")
        first = seen[0][0]
        target = names[-1] if first != names[-1] else names[-2]
        await cc.patch(target, {"data": {"k": "live"}}, type="merge", namespace=namespace)
        await eventually(live_queued, 15, "the live change queued")
        gate.set()
        await eventually(lambda: {n for n, _ in seen} >= set(names), 15, "every object reconciled")
        assert seen[1] == (target, "live")
        assert sorted(n for n, _ in seen[2:] if n in names) == sorted(set(names) - {first, target})  # each once
