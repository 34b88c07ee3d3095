"""Recovery against real servers: an apiserver outage, a 410 after compactions and restarts in watch-list and in
LIST+WATCH mode (plain and sharded), the apiserver's LIST semantics that the relist relies on, and the
ApiClient's "the server answered again" signal."""

from __future__ import annotations

import asyncio
import random
import time

import kubernetes
import pytest
from aiohttp import web

from prometheus_client import CollectorRegistry

from informers import ApiClient, ApiError, InformerMetrics, ObjectShard, ReflectorOptions, SharedIndexInformer
from informers.client import CONNECTION_ERRORS

from tests.factories import Recorder, counter_sum, factory_for
from tests.helpers import CONFIGMAPS, cache_state, converged, create_configmaps, eventually, free_port, server_state
from tests.proxy import Proxy


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


async def list_rv(api: ApiClient, namespace: str, **params: str) -> int:
    out = await api.request("GET", CONFIGMAPS.path(namespace), params)
    return int(out["metadata"]["resourceVersion"])


@pytest.mark.parametrize("watch_cache", [True, False], ids=["watch-cache", "no-watch-cache"])
async def test_list_and_watch_informers_converge_after_churn_compactions_and_restarts(control_plane_factory, seed,
                                                                                       watch_cache) -> None:
    """Informers without watch-list (a plain one, and two over halves of the objects, which always list) through
    rounds of: cut off, churn, then an apiserver restart with no compaction, a compaction up to the informers' RV
    (both leave that RV readable in etcd but older than the new watch cache) or a compaction up to now. After
    each round every informer matches a fresh consistent LIST, and delivered one delete (a tombstone after a
    relist) for each object it held that was deleted meanwhile. Without a watch cache the first list comes in pages, and so do relists."""
    rng = random.Random(seed)
    cp = control_plane_factory(() if watch_cache else ("--watch-cache=false",))
    ns = "lw"
    async with ApiClient.from_kubeconfig(str(cp.kubeconfig)) as admin:
        await admin.request("POST", "/api/v1/namespaces", body={"metadata": {"name": ns}})
        await create_configmaps(admin, ns, 40)
        proxy = await Proxy(cp.port).start()
        client = ApiClient.from_kubeconfig(str(cp.kubeconfig))
        client.host = f"https://127.0.0.1:{proxy.port}"
        shards = [None, ObjectShard.of(0, 2), ObjectShard.of(1, 2)]
        informers = [SharedIndexInformer(client, CONFIGMAPS, namespace=ns, shard=shard,
                                         options=ReflectorOptions(watch_list=False, page_size=15),
                                         metrics=InformerMetrics.for_registry(CollectorRegistry()))
                     for shard in shards]
        recorders = [Recorder() for _ in informers]
        for inf, rec in zip(informers, recorders):
            inf.add_event_handler(rec)
            inf.start()

        async def expected(shard: ObjectShard | None) -> dict[str, str]:
            out = await admin.request("GET", CONFIGMAPS.path(ns), {"resourceVersion": ""})
            return {f"{ns}/{i['metadata']['name']}": i["metadata"]["resourceVersion"] for i in out["items"]
                    if shard is None or shard.contains(i)}

        async def all_converged() -> bool:
            try:
                return all([await expected(s) == cache_state(i) for s, i in zip(shards, informers)])
            except (ApiError, OSError):
                return False

        try:
            assert all(await asyncio.gather(*(i.wait_for_sync(30) for i in informers)))
            assert [i.reflector._paginated_result for i in informers] == [not watch_cache] * 3
            kinds = ["no compaction", "compaction to the informers' RV", "compaction to now"]
            rng.shuffle(kinds)
            for round_, kind in enumerate(kinds):
                for rec in recorders:
                    rec.events.clear()
                proxy.refuse = True
                proxy.cut()
                await eventually(lambda: all(i.last_error is not None for i in informers), 10, "the cut noticed")
                held = [{k.split("/")[1] for k in i.store.keys()} for i in informers]
                old_rv = int(informers[0].resource_version)
                names = sorted(held[0])
                deleted = set(rng.sample(names, rng.randint(3, 8)))
                for name in deleted:
                    await admin.request("DELETE", f"{CONFIGMAPS.path(ns)}/{name}")
                for name in rng.sample(sorted(set(names) - deleted), rng.randint(3, 8)):
                    await admin.request("PATCH", f"{CONFIGMAPS.path(ns)}/{name}", body={"data": {"r": str(round_)}})
                await create_configmaps(admin, ns, rng.randint(3, 8), prefix=f"born-{round_}")
                if kind == "compaction to now":
                    cp.compact()
                elif kind == "compaction to the informers' RV":
                    cp.compact(min(int(i.resource_version) for i in informers))
                await asyncio.to_thread(cp.restart_apiserver)
                if kind != "compaction to now":
                    # The apiserver's rule the relist must respect: with `limit`, a LIST at an older RV is an
                    # exact read (etcd still has that revision, so it answers with the old state); without,
                    # it is "not older than", from the new watch cache.
                    current = await list_rv(admin, ns, resourceVersion="")
                    assert await list_rv(admin, ns, resourceVersion=str(old_rv), limit="500") == old_rv
                    assert await list_rv(admin, ns, resourceVersion=str(old_rv)) >= current
                proxy.refuse = False
                await eventually(all_converged, 60, f"convergence after round {round_} ({kind}), seed {seed}")
                for inf, rec, had in zip(informers, recorders, held):
                    # A relist delivers tombstones; a watch resumed from etcd (no watch cache) the deletes.
                    gone = sorted(e[1] for e in rec.events if e[0] in ("tombstone", "delete"))
                    assert gone == sorted(deleted & had), (kind, inf.reflector.shard, seed)
            assert {k for i in informers[1:] for k in i.store.keys()} == set(informers[0].store.keys())
        finally:
            await asyncio.gather(*(i.stop() for i in informers))
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
    port = free_port()
    client = ApiClient(kubernetes.client.Configuration(host=f"http://127.0.0.1:{port}"))
    runner = web.AppRunner(app)
    try:
        with pytest.raises(OSError):
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


async def test_an_answer_to_a_request_sent_before_a_connection_error_is_no_recovery() -> None:
    # A server shutting down answers the requests it had (after a GOAWAY) while every new one is refused: that
    # answer must not tell the client's waiters that the server is back.
    entered, release = asyncio.Event(), asyncio.Event()

    async def slow(request: web.Request) -> web.Response:
        entered.set()
        await release.wait()
        return web.Response(text="x")

    async def readyz(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def broken_watch(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        assert request.transport is not None
        request.transport.abort()
        return resp

    app = web.Application()
    app.router.add_get("/slow", slow)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/watch", broken_watch)
    port = free_port()
    client = ApiClient(kubernetes.client.Configuration(host=f"http://127.0.0.1:{port}"))
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        in_flight = asyncio.create_task(client.request_bytes("GET", "/slow"))
        await asyncio.wait_for(entered.wait(), 10)
        with pytest.raises(CONNECTION_ERRORS):
            async with client.stream("/watch", {}) as events:
                async for _ in events:
                    pass
        errors = client.connection_errors
        assert errors == 1
        waiter = asyncio.create_task(client.answered_after(errors))
        release.set()
        assert await in_flight == b"x"  # answered, but it was sent before the failure
        await asyncio.sleep(0.1)
        assert client.recoveries == 0 and not waiter.done()
        await client.request_bytes("GET", "/readyz")
        assert client.recoveries == 1
        await asyncio.wait_for(waiter, 1)
    finally:
        await client.close()
        await runner.cleanup()
