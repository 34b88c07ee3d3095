"""Informers against the real control plane: sync, watch semantics, recovery, handlers, leaks."""

from __future__ import annotations

import asyncio
import time

import psutil
import pytest

from informers import GVR, ApiClient, ApiError, FuncHandler, ReflectorOptions

from tests.factories import Recorder, counter_sum, factory_for
from tests.helpers import (
    CONFIGMAPS, apiserver_requests, cache_state, converged, create_configmaps, eventually, server_state,
)
from tests.proxy import Proxy


async def test_initial_sync_by_watch_list_then_watch_events_in_order(api, namespace) -> None:
    await create_configmaps(api, namespace, 30)
    f = factory_for(api, namespace=namespace)
    inf, lister = f.for_resource(CONFIGMAPS)
    assert f.for_resource(CONFIGMAPS)[0] is inf
    rec = Recorder()
    reg = inf.add_event_handler(rec)
    f.start()
    try:
        assert (await f.wait_for_cache_sync(30)) == {CONFIGMAPS: True}
        await reg.wait_for_sync(10)
        assert len(lister.list()) == 30
        assert all(e[0] == "add" and e[2] is True for e in rec.events)
        # the server supports watch-list: no LIST request was needed
        assert counter_sum(f, "informer_watches_total", mode="watch_list") == 1
        assert counter_sum(f, "informer_lists_total") == 0
        assert inf.reflector.use_watch_list is None
        rec.events.clear()
        path = CONFIGMAPS.path(namespace)
        await api.request("POST", path, body={"metadata": {"name": "new"}})
        await api.request("PATCH", f"{path}/new", body={"data": {"k": "v"}})
        await api.request("DELETE", f"{path}/new")
        await eventually(lambda: len(rec.events) == 3, 10, "3 events")
        assert [e[0] for e in rec.events] == ["add", "update", "delete"]
        assert rec.events[0][2] is False
        assert lister.get("new", namespace) is None
        assert await converged(api, inf, namespace)
        # cached objects look like watched ones and carry no managedFields (default transform)
        obj = lister.get("cm-1", namespace)
        assert obj["kind"] == "ConfigMap" and obj["apiVersion"] == "v1"
        assert "managedFields" not in obj["metadata"]
    finally:
        await f.shutdown()


async def test_bookmarks_advance_rv_and_watch_resumes_without_relist(api, namespace) -> None:
    f = factory_for(api, namespace=namespace, options=ReflectorOptions(min_watch_timeout=2))
    inf, _ = f.for_resource(CONFIGMAPS)
    f.start()
    try:
        assert await inf.wait_for_sync(30)
        rv0 = int(inf.resource_version)
        # a write elsewhere moves the global RV; only a bookmark can tell this namespaced watch about it
        other = await api.request("POST", "/api/v1/namespaces/default/configmaps",
                                  body={"metadata": {"generateName": "elsewhere-"}})
        other_rv = int(other["metadata"]["resourceVersion"])
        await eventually(lambda: int(inf.resource_version) >= other_rv, 20, "a bookmark past the foreign write")
        assert int(inf.resource_version) > rv0
        assert counter_sum(f, "informer_events_total", type="BOOKMARK") >= 1
        # the server ends each watch after 2-4 s: the reflector re-watches, never relists
        await eventually(lambda: counter_sum(f, "informer_watches_total", mode="watch") >= 3, 30, "3 re-watches")
        await api.request("POST", CONFIGMAPS.path(namespace), body={"metadata": {"name": "after"}})
        await eventually(lambda: inf.lister.get("after", namespace) is not None, 10, "event after re-watch")
        assert counter_sum(f, "informer_relists_total") == 0
        assert counter_sum(f, "informer_watches_total", mode="watch_list") == 1
        assert counter_sum(f, "informer_lists_total") == 0
    finally:
        await f.shutdown()


async def test_paged_list_410_relist_and_tombstones(control_plane_factory) -> None:
    # Without a watch cache the server pages LISTs and answers old RVs with 410 after a compaction.
    cp = control_plane_factory(["--watch-cache-sizes=configmaps#0", "--feature-gates=WatchList=false"])
    async with ApiClient.from_kubeconfig(str(cp.kubeconfig)) as admin:
        await admin.request("POST", "/api/v1/namespaces", body={"metadata": {"name": "p"}})
        await create_configmaps(admin, "p", 1200)
        proxy = await Proxy(cp.port).start()
        client = ApiClient.from_kubeconfig(str(cp.kubeconfig))
        client.host = f"https://127.0.0.1:{proxy.port}"
        f = factory_for(client, namespace="p")
        inf, _ = f.for_resource(CONFIGMAPS)
        rec = Recorder()
        inf.add_event_handler(rec)
        lists_before = await apiserver_requests(admin, "LIST", "configmaps")
        f.start()
        try:
            assert await inf.wait_for_sync(60)
            # watch-list refused (422) -> paged list: 1200 objects in 3 pages of 500
            assert inf.reflector.use_watch_list is False
            assert await apiserver_requests(admin, "LIST", "configmaps") - lists_before == 3
            assert counter_sum(f, "informer_lists_total") == 3
            assert await converged(admin, inf, "p")
            rec.events.clear()
            # cut the connection and keep it down while objects change and etcd is compacted
            proxy.refuse = True
            proxy.cut()
            for i in range(5):
                await admin.request("DELETE", f"{CONFIGMAPS.path('p')}/cm-{i}")
            await admin.request("PATCH", f"{CONFIGMAPS.path('p')}/cm-10", body={"data": {"x": "changed"}})
            await admin.request("POST", CONFIGMAPS.path("p"), body={"metadata": {"name": "born-in-gap"}})
            cp.compact()
            proxy.refuse = False
            await eventually(lambda: converged(admin, inf, "p"), 60, "convergence after 410")
            assert counter_sum(f, "informer_relists_total", reason="expired") >= 1
            tombstones = sorted(e[1] for e in rec.events if e[0] == "tombstone")
            assert tombstones == [f"cm-{i}" for i in range(5)]
            assert ("add", "born-in-gap", False) in rec.events
            assert any(e[0] == "update" and e[1] == "cm-10" for e in rec.events)
        finally:
            await f.shutdown()
            await client.close()
            await proxy.stop()


async def test_recovers_from_apiserver_restart_mid_watch(control_plane_factory) -> None:
    cp = control_plane_factory()
    async with ApiClient.from_kubeconfig(str(cp.kubeconfig)) as api:
        f = factory_for(api, namespace="default")
        inf, _ = f.for_resource(CONFIGMAPS)
        f.start()
        writing = True
        written: list[str] = []

        async def writer() -> None:
            while writing:
                name = f"w-{len(written)}"
                try:
                    await api.request("POST", CONFIGMAPS.path("default"), body={"metadata": {"name": name}})
                    written.append(name)
                except Exception:  # the server is restarting
                    await asyncio.sleep(0.1)
                await asyncio.sleep(0.02)

        try:
            assert await inf.wait_for_sync(30)
            task = asyncio.create_task(writer())
            await eventually(lambda: len(written) >= 5, 30, "writes before the restart")
            await asyncio.to_thread(cp.restart_apiserver)
            restarted = len(written)
            await eventually(lambda: len(written) >= restarted + 5, 60, "writes after the restart")
            writing = False
            await task
            await eventually(lambda: converged(api, inf, "default"), 60, "convergence after restart")
            assert len(inf.store) > 10
        finally:
            await f.shutdown()


async def test_half_open_stream_is_detected_and_replaced(control_plane, api, namespace) -> None:
    proxy = await Proxy(control_plane.port).start()
    client = ApiClient.from_kubeconfig(str(control_plane.kubeconfig))
    client.host = f"https://127.0.0.1:{proxy.port}"
    f = factory_for(client, namespace=namespace, options=ReflectorOptions(inactivity_timeout=2))
    inf, _ = f.for_resource(CONFIGMAPS)
    f.start()
    try:
        assert await inf.wait_for_sync(30)
        accepted = proxy.accepted
        proxy.freeze()  # the watch connection now neither delivers nor closes
        await api.request("POST", CONFIGMAPS.path(namespace), body={"metadata": {"name": "during-freeze"}})
        await eventually(lambda: inf.lister.get("during-freeze", namespace) is not None, 20, "reconnect")
        assert proxy.accepted > accepted
        assert counter_sum(f, "informer_errors_total", kind="timeout") >= 1
        assert await converged(api, inf, namespace)
    finally:
        await f.shutdown()
        await client.close()
        await proxy.stop()


async def test_handlers_replay_sync_remove_resync_and_isolation(api, namespace) -> None:
    await create_configmaps(api, namespace, 5)
    f = factory_for(api, namespace=namespace)
    inf, _ = f.for_resource(CONFIGMAPS)
    early = Recorder("early")
    early_reg = inf.add_event_handler(early)
    assert not early_reg.has_synced()
    f.start()
    try:
        assert await early_reg.wait_for_sync(30)
        assert inf.has_synced()
        # a late handler gets the cache replayed as initial adds, then its own has_synced
        late = Recorder("late")
        late_reg = inf.add_event_handler(late, resync_period=0.3)
        assert await late_reg.wait_for_sync(10)
        assert sorted(e[1] for e in late.events[:5]) == [f"cm-{i}" for i in range(5)]
        assert all(e[0] == "add" and e[2] is True for e in late.events[:5])
        # resync goes only to the handler that asked for it
        await eventually(lambda: any(e[0] == "update" for e in late.events), 5, "a resync")
        assert not any(e[0] == "update" for e in early.events)
        # a raising handler and a slow one do not hold up the others
        slow_release = asyncio.Event()

        async def slow(obj, initial):
            await slow_release.wait()

        def boom(obj, initial):
            raise RuntimeError("handler bug")

        slow_reg = inf.add_event_handler(FuncHandler(on_add=slow, name="slow"))
        inf.add_event_handler(FuncHandler(on_add=boom, name="boom"))
        early.events.clear()
        await api.request("POST", CONFIGMAPS.path(namespace), body={"metadata": {"name": "x1"}})
        await api.request("POST", CONFIGMAPS.path(namespace), body={"metadata": {"name": "x2"}})
        await eventually(lambda: [e[1] for e in early.events] == ["x1", "x2"], 10, "events past slow/boom")
        assert slow_reg.queue_depth > 0 and not slow_reg.has_synced()
        slow_release.set()
        assert await slow_reg.wait_for_sync(10)
        # removal is idempotent and stops delivery
        await inf.remove_event_handler(early_reg)
        await inf.remove_event_handler(early_reg)
        early.events.clear()
        await api.request("POST", CONFIGMAPS.path(namespace), body={"metadata": {"name": "x3"}})
        await eventually(lambda: ("add", "x3", False) in late.events, 10, "x3 delivered to the handlers left")
        assert early.events == []
    finally:
        await f.shutdown()


async def test_indexers_selectors_and_namespace_scope(api, namespace) -> None:
    await create_configmaps(api, namespace, 4, prefix="blue", labels={"color": "blue", "tier": "a"})
    await create_configmaps(api, namespace, 3, prefix="red", labels={"color": "red"})
    await api.request("POST", CONFIGMAPS.path("default"), body={"metadata": {"generateName": "outside-"}})

    def by_color(obj):
        return [(obj["metadata"].get("labels") or {}).get("color", "")]

    f = factory_for(api, namespace=namespace, indexers={"color": by_color})
    inf, lister = f.for_resource(CONFIGMAPS)
    f.start()
    try:
        assert await inf.wait_for_sync(30)
        assert {o["metadata"]["namespace"] for o in lister.list()} == {namespace}
        assert len(lister.by_index("color", "red")) == 3
        inf.add_indexers({"tier": lambda o: [(o["metadata"].get("labels") or {}).get("tier", "-")]})
        assert len(inf.store.by_index("tier", "a")) == 4
        assert len(lister.list(label_selector="color in (blue),tier")) == 4
        assert len(lister.list(namespace, label_selector="color!=blue")) == 3
    finally:
        await f.shutdown()
    # server-side label selector
    f2 = factory_for(api, namespace=namespace, label_selector="color=red")
    inf2, lister2 = f2.for_resource(CONFIGMAPS)
    f2.start()
    try:
        assert await inf2.wait_for_sync(30)
        assert sorted(o["metadata"]["name"] for o in lister2.list()) == ["red-0", "red-1", "red-2"]
    finally:
        await f2.shutdown()


async def test_restricted_user_without_list_permission_backs_off(control_plane) -> None:
    async with ApiClient.from_kubeconfig(str(control_plane.kubeconfig), context="restricted") as client:
        f = factory_for(client)
        inf, _ = f.for_resource(GVR("", "v1", "secrets"))
        started = time.monotonic()
        f.start()
        try:
            await eventually(lambda: counter_sum(f, "informer_errors_total", kind="403") >= 3, 30, "3 attempts")
            # 0.8 s doubling (plus jitter) between attempts, no hot loop
            assert time.monotonic() - started >= 0.8 + 1.6
            assert not inf.has_synced()
            assert isinstance(inf.last_error, ApiError) and inf.last_error.status == 403
        finally:
            await f.shutdown()


async def test_watch_list_falls_back_to_list_when_disabled(control_plane_factory) -> None:
    cp = control_plane_factory(["--feature-gates=WatchList=false"])
    async with ApiClient.from_kubeconfig(str(cp.kubeconfig)) as api:
        f = factory_for(api)
        inf, _ = f.for_resource(GVR("", "v1", "namespaces"))
        f.start()
        try:
            assert await inf.wait_for_sync(30)
            assert inf.reflector.use_watch_list is False
            assert counter_sum(f, "informer_lists_total") == 1
            assert inf.lister.get("default") is not None
        finally:
            await f.shutdown()


def _connections_to(port: int) -> int:
    return sum(1 for c in psutil.Process().net_connections("tcp")
               if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED)


@pytest.mark.parametrize("http2", [True, False], ids=["http2", "http1"])
async def test_shutdown_leaves_no_tasks_or_connections(control_plane, namespace, http2) -> None:
    before = set(asyncio.all_tasks())
    baseline = _connections_to(control_plane.port)  # the official client of the fixtures keeps its own
    client = ApiClient.from_kubeconfig(str(control_plane.kubeconfig))
    client.http2 = http2
    f = factory_for(client, namespace=namespace)
    for gvr in (CONFIGMAPS, GVR("", "v1", "secrets"), GVR("", "v1", "serviceaccounts")):
        inf, _ = f.for_resource(gvr)
        inf.add_event_handler(Recorder(), resync_period=60)
    f.start()
    assert all((await f.wait_for_cache_sync(30)).values())
    # HTTP/2: the three watches and the lists before them share one connection, as client-go's do.
    assert _connections_to(control_plane.port) == baseline + 1 if http2 else baseline + 3
    assert client.connections == (1 if http2 else 3)
    await f.shutdown()
    assert set(asyncio.all_tasks()) - before == set()
    await client.close()
    await eventually(lambda: _connections_to(control_plane.port) == baseline, 10, "the connections closed")


async def test_stop_one_resource_keeps_the_others(api, namespace) -> None:
    f = factory_for(api, namespace=namespace)
    cms, _ = f.for_resource(CONFIGMAPS)
    secrets, _ = f.for_resource(GVR("", "v1", "secrets"))
    f.start()
    try:
        assert all((await f.wait_for_cache_sync(30)).values())
        await f.stop_resource(GVR("", "v1", "secrets"))
        assert GVR("", "v1", "secrets") not in f.informers()
        assert secrets.reflector is not None and len(secrets.store) == 0
        await api.request("POST", CONFIGMAPS.path(namespace), body={"metadata": {"name": "still"}})
        await eventually(lambda: cms.lister.get("still", namespace) is not None, 10)
        assert cache_state(cms) == await server_state(api, CONFIGMAPS, namespace)
    finally:
        await f.shutdown()
