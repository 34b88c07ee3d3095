"""Recovery against real servers: an apiserver outage, a 410 in watch-list mode after a compaction and a restart,
and the ApiClient's "the server answered again" signal."""

from __future__ import annotations

import asyncio
import socket
import time

import aiohttp
import kubernetes
import pytest
from aiohttp import web

from informers import ApiClient, ApiError
from informers.client import CONNECTION_ERRORS

from .helpers import CONFIGMAPS, converged, create_configmaps, eventually
from .proxy import Proxy
from .test_informer_integration import Recorder, counter_sum, factory_for


def record_watch_params(client: ApiClient) -> list[dict[str, str]]:
    """The parameters of every watch ``client`` opens from now on."""
    calls: list[dict[str, str]] = []
    original = client.stream

    def stream(path, params, inactivity_timeout=None):
        calls.append(dict(params))
        return original(path, params, inactivity_timeout)

    client.stream = stream  # type: ignore[method-assign]
    return calls


async def test_410_in_watch_list_mode_resumes_from_the_last_rv_and_delivers_tombstones(control_plane_factory) -> None:
    cp = control_plane_factory()  # default flags: watch cache and watch-list on
    async with ApiClient.from_kubeconfig(str(cp.kubeconfig)) as admin:
        await admin.request("POST", "/api/v1/namespaces", body={"metadata": {"name": "w"}})
        await create_configmaps(admin, "w", 20)
        proxy = await Proxy(cp.port).start()
        client = ApiClient.from_kubeconfig(str(cp.kubeconfig))
        client.host = f"https://127.0.0.1:{proxy.port}"
        watches = record_watch_params(client)
        f = factory_for(client, namespace="w")
        inf, _ = f.for_resource(CONFIGMAPS)
        rec = Recorder()
        inf.add_event_handler(rec)
        f.start()
        try:
            assert await inf.wait_for_sync(30)
            assert inf.reflector.use_watch_list is None and counter_sum(f, "informer_lists_total") == 0
            rec.events.clear()
            proxy.refuse = True
            proxy.cut()
            await eventually(lambda: inf.last_error is not None, 10, "the informer to notice the cut")
            old_rv = inf.resource_version
            for i in range(5):
                await admin.request("DELETE", f"{CONFIGMAPS.path('w')}/cm-{i}")
            await admin.request("PATCH", f"{CONFIGMAPS.path('w')}/cm-10", body={"data": {"x": "changed"}})
            await admin.request("POST", CONFIGMAPS.path("w"), body={"metadata": {"name": "born-in-gap"}})
            cp.compact()
            # A new watch cache starts at the current revision: resuming from old_rv now answers 410.
            await asyncio.to_thread(cp.restart_apiserver)
            seen = len(watches)
            proxy.refuse = False
            await eventually(lambda: converged(admin, inf, "w"), 60, "convergence after the 410")
            assert counter_sum(f, "informer_relists_total", reason="expired") >= 1
            # client-go's rule: the relist asks for "not older than" the last synced RV, not a consistent read
            relist = next(p for p in watches[seen:] if p.get("sendInitialEvents") == "true")
            assert relist["resourceVersion"] == old_rv and relist["resourceVersionMatch"] == "NotOlderThan"
            assert counter_sum(f, "informer_lists_total") == 0 and inf.reflector.use_watch_list is None
            assert sorted(e[1] for e in rec.events if e[0] == "tombstone") == [f"cm-{i}" for i in range(5)]
            assert ("add", "born-in-gap", False) in rec.events
            assert any(e[0] == "update" and e[1] == "cm-10" for e in rec.events)
        finally:
            await f.shutdown()
            await client.close()
            await proxy.stop()


async def test_objects_created_right_after_an_outage_are_seen_within_seconds(control_plane_factory) -> None:
    cp = control_plane_factory()
    kubeconfig = str(cp.kubeconfig)
    namespaces = [f"outage-{i}" for i in range(4)]
    async with ApiClient.from_kubeconfig(kubeconfig) as admin, ApiClient.from_kubeconfig(kubeconfig) as client:
        for ns in namespaces:
            await admin.request("POST", "/api/v1/namespaces", body={"metadata": {"name": ns}})
        factories = [factory_for(client, namespace=ns) for ns in namespaces]
        informers = [f.for_resource(CONFIGMAPS)[0] for f in factories]
        for f in factories:
            f.start()
        try:
            assert all(await asyncio.gather(*(i.wait_for_sync(30) for i in informers)))
            await asyncio.to_thread(cp.stop_apiserver)
            await eventually(lambda: all(isinstance(i.last_error, CONNECTION_ERRORS) for i in informers), 30,
                             "every informer to lose the server")
            await asyncio.sleep(20)  # the outage: long enough for the reflectors' backoffs to grow
            await asyncio.to_thread(cp.start_apiserver)
            ready = time.monotonic()
            # the writes go through another client: the informers' client learns of the server by itself
            await asyncio.gather(*(admin.request("POST", CONFIGMAPS.path(ns), body={"metadata": {"name": "after"}})
                                   for ns in namespaces))
            await eventually(lambda: all(i.lister.get("after", ns) is not None
                                         for i, ns in zip(informers, namespaces)), 90, "the new objects")
            elapsed = time.monotonic() - ready
            assert elapsed < 8, f"objects created at the server's return were seen only {elapsed:.1f}s later"
        finally:
            await asyncio.gather(*(f.shutdown() for f in factories))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_api_client_tells_when_the_server_answers_again() -> None:
    status = {"code": 200}

    async def readyz(request: web.Request) -> web.Response:
        return web.Response(status=status["code"], text="x")

    async def broken_watch(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(b'{"type": "ADDED", "object": {}}\n')
        assert request.transport is not None
        request.transport.abort()  # the connection breaks mid-stream
        return resp

    app = web.Application()
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/watch", broken_watch)
    port = _free_port()
    client = ApiClient(kubernetes.client.Configuration(host=f"http://127.0.0.1:{port}"))
    runner = web.AppRunner(app)
    try:
        with pytest.raises(aiohttp.ClientConnectionError):
            await client.request_bytes("GET", "/readyz")  # nothing listens yet
        waiter = asyncio.create_task(client.answered_again(0))
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        for code in (503, 403):  # a server that is starting, or a proxy in front of one that is down
            status["code"] = code
            with pytest.raises(ApiError):
                await client.request_bytes("GET", "/readyz")
        assert client.recoveries == 0
        status["code"] = 200
        await client.request_bytes("GET", "/readyz")
        assert client.recoveries == 1
        await asyncio.wait_for(waiter, 10)
        await client.request_bytes("GET", "/readyz")
        assert client.recoveries == 1  # no failure in between: nothing to recover from
        with pytest.raises(CONNECTION_ERRORS):
            async with client.stream("/watch", {}) as events:
                async for _ in events:
                    pass
        await client.request_bytes("GET", "/readyz")
        assert client.recoveries == 2
        await asyncio.wait_for(client.answered_again(1), 1)  # already past: returns at once
    finally:
        await client.close()
        await runner.cleanup()
