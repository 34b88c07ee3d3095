"""The discovering factory when the API server misbehaves: errors in a pass, in access reviews, in the first pass;
connections cut during passes and the apiserver restarted during one. After each, the pass loop must still be
alive (a new CRD is picked up) and healthy (``supervisor.problems()`` empty)."""

from __future__ import annotations

import asyncio
from typing import Iterator

import kubernetes
import pytest
from loguru import logger

from informers import GVR, ApiClient, DiscoveringDynamicSharedInformerFactory, DiscoveryClient, DiscoveryForbidden
from informers.transport import TransportError
from syncer.testing.controlplane import ControlPlane

from tests.factories import factory, only, passes_health
from tests.fakes import FaultyClient
from tests.helpers import eventually
from tests.kube import post_crd, unique_group
from tests.proxy import Proxy

SSAR = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"


@pytest.fixture
def logged() -> Iterator[list[str]]:
    """Log lines of level WARNING and above, as text."""
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m)), level="WARNING", format="{level} {message}")
    try:
        yield lines
    finally:
        logger.remove(sink)


async def picks_up_a_new_crd(f: DiscoveringDynamicSharedInformerFactory, api: ApiClient, prefix: str) -> None:
    group = unique_group(prefix)
    await post_crd(api, group)
    await eventually(lambda: GVR(group, "v1", "widgets") in f.informers()[0], 30, f"informer for {group}")


@pytest.mark.parametrize("error", [lambda: TransportError("ServerDisconnectedError: Server disconnected"),
                                   lambda: ConnectionResetError("the server reset the stream (CANCEL)")],
                         ids=["http1-TransportError", "http2-ConnectionResetError"])
async def test_a_pass_failing_with_a_transport_error_is_logged_and_retried(control_plane, logged, error) -> None:
    async with FaultyClient.from_kubeconfig(str(control_plane.kubeconfig)) as api:
        f = factory(api, filter=only("flaky"))
        await f.start()
        try:
            api.fail(lambda method, path: path == "/apis", error, times=2)
            f.trigger()
            await eventually(lambda: api.injected == 2, 20, "two failed passes")
            await picks_up_a_new_crd(f, api, "flaky")
            await eventually(lambda: passes_health(f).last_error == "", 10, "a successful pass")
            assert f.supervisor.problems() == [] and passes_health(f).restarts == 0
            failures = [w for w in logged if "discovery pass failed" in w]
            assert len(failures) == 2 and all(type(error()).__name__ in w for w in failures), logged
        finally:
            await f.shutdown()
        assert f.supervisor.health() == []


async def test_legacy_discovery_keeps_a_group_version_failing_with_a_transport_error_as_stale(control_plane) -> None:
    async with FaultyClient.from_kubeconfig(str(control_plane.kubeconfig)) as api:
        discovery = DiscoveryClient(api)
        discovery.aggregated = False
        deployments = GVR("apps", "v1", "deployments")
        assert deployments in (await discovery.discover()).resources
        api.fail(lambda method, path: path == "/apis/apps/v1", TransportError, times=1)
        result = await discovery.discover()
        assert result.stale_group_versions == {"apps/v1"}
        assert result.resources[deployments].stale and GVR("", "v1", "configmaps") in result.resources


async def test_a_failing_access_review_keeps_verdicts_and_is_asked_again(control_plane, logged) -> None:
    async with FaultyClient.from_kubeconfig(str(control_plane.kubeconfig)) as api:
        f = factory(api, filter=only("review"), check_permissions=True)
        await f.start()
        try:
            first = unique_group("review")
            await post_crd(api, first)
            await eventually(lambda: GVR(first, "v1", "widgets") in f.informers()[0], 30, "first CRD watched")
            watched = f.informers()[0][GVR(first, "v1", "widgets")]
            api.fail(lambda method, path: path == SSAR, lambda: TransportError("ServerDisconnectedError"), times=3)
            second = GVR(unique_group("review"), "v1", "widgets")
            await post_crd(api, second.group)
            await eventually(lambda: api.injected >= 1, 20, "an access review failing")
            await eventually(lambda: second in f.informers()[0], 30, "second CRD watched once reviews work")
            assert f.informers()[0][GVR(first, "v1", "widgets")] is watched  # never stopped meanwhile
            assert f.supervisor.problems() == []
            assert any("access review(s) failed" in w and "ServerDisconnectedError" in w for w in logged), logged
        finally:
            await f.shutdown()


async def test_the_first_pass_is_retried_until_the_apiserver_is_back(control_plane_factory, logged) -> None:
    cp = control_plane_factory()
    async with ApiClient.from_kubeconfig(str(cp.kubeconfig)) as api:
        await asyncio.to_thread(cp.stop_apiserver)
        f = factory(api, filter=only("late"))
        starting = asyncio.create_task(f.start())
        try:
            await eventually(lambda: sum("first discovery pass (attempt" in w for w in logged) >= 2, 30,
                             "two failed first passes, logged")
            assert not starting.done()
            await asyncio.to_thread(cp.start_apiserver)
            await asyncio.wait_for(starting, 60)
            await picks_up_a_new_crd(f, api, "late")
            assert f.supervisor.problems() == []
        finally:
            starting.cancel()
            await asyncio.gather(starting, return_exceptions=True)
            await f.shutdown()


async def test_a_refused_discovery_raises_discovery_forbidden_at_once(control_plane) -> None:
    config = kubernetes.client.Configuration()
    config.host = control_plane.url
    config.ssl_ca_cert = str(control_plane.ca_file)
    config.api_key = {"authorization": "Bearer not-a-valid-token"}
    async with ApiClient(config) as api:
        f = factory(api)
        with pytest.raises(DiscoveryForbidden) as raised:
            await asyncio.wait_for(f.start(), 30)
        assert str(raised.value).startswith("the API server refused discovery for this user (401 Unauthorized): ")
        assert "\n" not in str(raised.value)
        assert f.supervisor.health() == []  # what start() started is stopped


class StallingProxy(Proxy):
    """A Proxy whose ``stall()`` also holds new connections without forwarding anything, so that a request
    cannot dodge the freeze by dialling anew (HTTP/1.1 retries an idempotent request once on a fresh connection
    when a pooled one is cut, and HTTP/2 dials a new connection when a stream times out); ``cut()`` closes everything, ``resume()`` ends the stall."""

    def __init__(self, target_port: int) -> None:
        super().__init__(target_port)
        self.stalled = False
        self._held: list[asyncio.StreamWriter] = []
        self._serving: set[asyncio.Future[None]] = set()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Served on a task of our own, which stop() can cancel: asyncio's callback on this one would log the
        # cancellation as an error.
        serving = asyncio.ensure_future(self._serve(reader, writer))
        self._serving.add(serving)
        await asyncio.gather(serving, return_exceptions=True)
        self._serving.discard(serving)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self.stalled:
            await super()._accept(reader, writer)
            return
        self._held.append(writer)
        try:
            await reader.read()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def stop(self) -> None:
        # Held connections wait for their peer forever: end them here.
        await super().stop()
        for serving in self._serving:
            serving.cancel()
        await asyncio.gather(*self._serving, return_exceptions=True)

    def stall(self) -> None:
        self.stalled = True
        self.freeze()

    @property
    def held(self) -> int:
        return len(self._held)

    def cut(self) -> None:
        super().cut()
        for writer in self._held:
            writer.transport.abort()
        self._held.clear()

    def resume(self) -> None:
        self.stalled = False


def through(proxy: Proxy, cp: ControlPlane) -> ApiClient:
    config = kubernetes.client.Configuration()
    config.host = f"https://127.0.0.1:{proxy.port}"
    config.ssl_ca_cert = str(cp.ca_file)
    config.api_key = {"authorization": f"Bearer {cp.admin_token}"}
    return ApiClient(config)


async def test_connections_cut_during_passes(control_plane, api, logged) -> None:
    proxy = await StallingProxy(control_plane.port).start()
    async with through(proxy, control_plane) as client:
        f = factory(client, filter=only("cut"), check_permissions=True)
        await f.start()
        try:
            for i in range(3):
                failures = sum("discovery pass failed" in w for w in logged)
                proxy.stall()
                f.trigger()
                await eventually(lambda: (passes_health(f).busy_for or 0) > 0.3, 10, f"pass {i} hanging")
                proxy.cut()
                await eventually(lambda: proxy.held > 0 or sum("discovery pass failed" in w for w in logged)
                                 > failures, 10, f"pass {i} retrying its request, or failed")
                proxy.resume()
                proxy.cut()
                await eventually(lambda: sum("discovery pass failed" in w for w in logged) > failures, 10,
                                 f"pass {i} failed and logged")
            await picks_up_a_new_crd(f, api, "cut")
            await eventually(lambda: passes_health(f).last_error == "", 30, "a successful pass")
            assert f.supervisor.problems() == [] and passes_health(f).restarts == 0
        finally:
            await f.shutdown()
            await proxy.stop()


async def refused(port: int) -> bool:
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return True
    writer.close()
    await writer.wait_closed()
    return False


async def test_apiserver_restarts_during_passes(control_plane_factory, logged) -> None:
    cp = control_plane_factory()
    async with FaultyClient.from_kubeconfig(str(cp.kubeconfig)) as api:
        f = factory(api, filter=only("restart"), check_permissions=True)
        await f.start()
        restarts: list[asyncio.Future[None]] = []
        try:
            for i in range(3):
                failures = sum("discovery pass failed" in w for w in logged)
                gate = api.hold(lambda method, path: path == "/apis")
                f.trigger()
                await eventually(lambda: (passes_health(f).busy_for or 0) > 0, 10, f"pass {i} running")
                restarts.append(restart := asyncio.ensure_future(asyncio.to_thread(cp.restart_apiserver)))
                await eventually(lambda: refused(cp.port), 20, f"apiserver down ({i})")
                gate.set()
                await eventually(lambda: sum("discovery pass failed" in w for w in logged) > failures, 10,
                                 f"pass {i} failed and logged")
                await restart
                await picks_up_a_new_crd(f, api, "restart")
                assert f.supervisor.problems() == []
        finally:
            await asyncio.gather(*restarts, return_exceptions=True)
            await f.shutdown()
