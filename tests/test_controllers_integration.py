"""ControllerManager + Controller helper + discovering factory against the real control plane."""

from __future__ import annotations

import asyncio
import time

from prometheus_client import CollectorRegistry

from controllers import Controller, ControllerManager, ManagedController, Request, Result
from informers import GVR, ApiClient, DiscoveringDynamicSharedInformerFactory, ResourceFilter

from .helpers import eventually
from .test_discovering_factory import create_crd, crd_gone, delete_crd, new_object, unique_group


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
        api, filter=ResourceFilter(include=["ctl-*.example.com/*"]), metrics_registry=CollectorRegistry())
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
        await create_crd(api, g1)
        established = await wait_established(api, f"widgets.{g1}")
        await new_object(api, w1, "early")
        await eventually(lambda: mgr.status()["single"].state == "running", 10, "single running")
        started_after = mgr.status()["single"].running_since - established
        await new_object(api, w1, "late")
        await eventually(lambda: {r.name for r in single.seen} >= {"early", "late"}, 10, "both reconciled")
        assert started_after < 3.0, started_after  # a loose sanity bound; the latency itself is measured in bench/
        assert mgr.status()["pair"].state == "waiting" and mgr.status()["pair"].missing == [str(w2)]
        # the second GVR arrives: the pair controller starts
        await create_crd(api, g2)
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
        await create_crd(api, g1)
        await wait_established(api, f"widgets.{g1}")
        await new_object(api, w1, "reborn")
        await eventually(lambda: any(r.name == "reborn" for r in single.seen), 15, "reconciled after recreate")
        assert creates["single"] == 2
        assert not any(r.name in ("early", "late") for r in single.seen)
    finally:
        await mgr.stop()
        await factory.shutdown()


async def wait_established(api: ApiClient, name: str) -> float:
    path = f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}"
    while True:
        crd = await api.request("GET", path)
        if any(c["type"] == "Established" and c["status"] == "True"
               for c in (crd.get("status") or {}).get("conditions") or ()):
            return time.time()
        await asyncio.sleep(0.01)
