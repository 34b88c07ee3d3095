"""Read-your-writes against the real server, the controller's informers behind a proxy that slows what they
receive: a reconcile requeued at once sees its own write (and its delete) only with the barrier on."""

from __future__ import annotations

from contextlib import asynccontextmanager
from typing import Any, AsyncIterator

from prometheus_client import CollectorRegistry

from controllers import Controller, ControllerManager, ManagedController, ReconcileContext, Request, Result
from controllers.metrics import read_your_writes_metrics
from informers import ApiClient, DiscoveringDynamicSharedInformerFactory, DiscoveryOptions, ResourceClient, ResourceFilter
from syncer.testing import ControlPlane

from tests.helpers import CONFIGMAPS, eventually
from tests.proxy import Proxy

# What the proxy adds to the watch's latency: far above a requeue at once, on however loaded a machine.
WATCH_DELAY = 0.4


@asynccontextmanager
async def slow_watch(api: ApiClient, cp: ControlPlane, namespace: str, reconcile: Any, read_your_writes: float,
                     registry: CollectorRegistry) -> AsyncIterator[None]:
    """A controller of the ConfigMaps of ``namespace`` that writes directly, its informers behind a slow proxy."""
    proxy = await Proxy(cp.port).start()
    proxy.delay = WATCH_DELAY
    slow = ApiClient.from_kubeconfig(str(cp.kubeconfig))
    slow.host = f"https://127.0.0.1:{proxy.port}"
    factory = DiscoveringDynamicSharedInformerFactory(
        slow, DiscoveryOptions(namespace=namespace, filter=ResourceFilter(include=["core/configmaps"])),
        metrics_registry=registry)
    controller = ManagedController([CONFIGMAPS], lambda ctx: Controller("ryw", reconcile,
                                                                        metrics_registry=registry).for_(CONFIGMAPS).run)
    mgr = ControllerManager("ryw", factory, {"c": controller}, client=api, metrics_registry=registry,
                            read_your_writes=read_your_writes)
    await factory.start()
    await mgr.start()
    try:
        yield
    finally:
        assert await mgr.stop() == []
        await factory.shutdown()
        await slow.close()
        await proxy.stop()


def counter(seen: list[int]) -> Any:
    """A reconcile that reads the annotation ``count`` from the cache, writes count + 1 and requeues at once,
    until 3."""

    async def reconcile(req: Request, rc: ReconcileContext) -> Result | None:
        cm = rc.lister().get(req.name, req.namespace)
        if cm is None or req.name != "counted":
            return None
        n = int((cm["metadata"].get("annotations") or {}).get("count", "0"))
        seen.append(n)
        if n >= 3:
            return None
        await rc.client.patch(req.name, {"metadata": {"annotations": {"count": str(n + 1)}}}, type="merge",
                              namespace=req.namespace)
        return Result(requeue_after=0)

    return reconcile


async def counted(api: ApiClient, namespace: str) -> ResourceClient:
    client = ResourceClient(api, CONFIGMAPS)
    await client.create({"metadata": {"name": "counted", "namespace": namespace}})
    return client


async def count_on_server(client: ResourceClient, namespace: str) -> int:
    return int((await client.get("counted", namespace))["metadata"].get("annotations", {}).get("count", "0"))


async def test_a_reconcile_requeued_at_once_sees_its_own_write(api: ApiClient, control_plane: ControlPlane,
                                                               namespace: str) -> None:
    client = await counted(api, namespace)
    seen: list[int] = []
    registry = CollectorRegistry()
    async with slow_watch(api, control_plane, namespace, counter(seen), 30.0, registry):
        await eventually(lambda: seen[-1:] == [3], 30, "the count to reach 3")
    assert seen[:4] == [0, 1, 2, 3] and set(seen[4:]) <= {3}, seen  # never a stale read
    metrics = read_your_writes_metrics("ryw", registry)
    assert metrics.caught_up >= 3 and metrics.timeouts == 0
    assert await count_on_server(client, namespace) == 3


async def test_without_it_the_requeued_reconcile_reads_its_stale_cache(api: ApiClient, control_plane: ControlPlane,
                                                                       namespace: str) -> None:
    client = await counted(api, namespace)
    seen: list[int] = []
    async with slow_watch(api, control_plane, namespace, counter(seen), 0, CollectorRegistry()):
        await eventually(lambda: seen[-1:] == [3], 30, "the count to reach 3")
    assert seen[:2] == [0, 0], seen  # requeued before its write came back: it read the old count again
    assert await count_on_server(client, namespace) == 3


async def test_a_create_then_a_delete_read_back_at_once(api: ApiClient, control_plane: ControlPlane,
                                                        namespace: str) -> None:
    client = await counted(api, namespace)
    steps: list[bool] = []  # whether the child was in the cache, at each reconcile of "counted"

    async def reconcile(req: Request, rc: ReconcileContext) -> Result | None:
        if req.name != "counted":
            return None
        steps.append(rc.lister().get("child", req.namespace) is not None)
        if len(steps) == 1:
            await rc.client.create({"metadata": {"name": "child", "namespace": req.namespace}})
            return Result(requeue_after=0)
        if len(steps) == 2:
            await rc.client.delete("child", req.namespace)
            return Result(requeue_after=0)
        return None

    registry = CollectorRegistry()
    async with slow_watch(api, control_plane, namespace, reconcile, 30.0, registry):
        await eventually(lambda: len(steps) >= 3, 30, "three reconciles")
    assert steps[:3] == [False, True, False], steps
    assert read_your_writes_metrics("ryw", registry).timeouts == 0
    assert [c["metadata"]["name"] for c in await client.list(namespace)
            if c["metadata"]["name"] != "kube-root-ca.crt"] == ["counted"]
