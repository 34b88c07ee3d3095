"""The HTTP/2 transport against the real apiserver: stream slots, cuts, GOAWAY, flow control, PING, fallback."""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from informers import ApiClient, DynamicSharedInformerFactory, Unauthorized
from informers import transport as transport_module
from informers.http2 import STREAM_WINDOW

from tests.helpers import CONFIGMAPS, cache_state, converged, eventually, server_state
from tests.proxy import Proxy


def _watch_params(rv: str) -> dict[str, str]:
    return {"watch": "1", "resourceVersion": rv, "allowWatchBookmarks": "true", "timeoutSeconds": "120"}


def _conns(client: ApiClient) -> list:
    transport = client._transport
    assert isinstance(transport, transport_module.Http2Transport)
    return [c for c in transport._conns if c.open]


async def test_watches_above_the_stream_limit_open_a_second_connection(control_plane, namespace) -> None:
    async with ApiClient.from_kubeconfig(str(control_plane.kubeconfig)) as client:
        listed = await client.request("GET", CONFIGMAPS.path(namespace))
        [conn] = _conns(client)
        limit = conn._h2.remote_settings.max_concurrent_streams
        assert limit == 100  # kube-apiserver's default (--http2-max-streams-per-connection unset)
        seen: dict[int, set[str]] = {}

        async def watch(i: int) -> None:
            seen[i] = set()
            async with client.stream(CONFIGMAPS.path(namespace), _watch_params(listed["metadata"]["resourceVersion"])) \
                    as events:
                async for event in events:
                    if event["type"] == "ADDED":
                        seen[i].add(event["object"]["metadata"]["name"])
                        if len(seen[i]) == 3:
                            return

        watches = [asyncio.create_task(watch(i)) for i in range(150)]
        await eventually(lambda: sum(c.active_streams for c in _conns(client)) == 150, 20, "150 streams open")
        assert client.connections == 2 and all(c.active_streams <= limit for c in _conns(client))
        for name in ("a", "b", "c"):
            await client.request("POST", CONFIGMAPS.path(namespace), body={"metadata": {"name": name}})
        await asyncio.wait_for(asyncio.gather(*watches), 30)
        assert all(names == {"a", "b", "c"} for names in seen.values())
        # Finished streams give their slots back: the next requests fit on the connections there are.
        await asyncio.gather(*(client.request("GET", "/version") for _ in range(120)))
        assert client.connections <= 2


async def test_a_cut_connection_fails_every_watch_at_once_and_all_recover(control_plane, api, namespace) -> None:
    proxy = await Proxy(control_plane.port).start()
    client = ApiClient.from_kubeconfig(str(control_plane.kubeconfig))
    client.host = f"https://127.0.0.1:{proxy.port}"
    factories = [DynamicSharedInformerFactory(client, namespace=namespace, label_selector=f"w{i} notin (x)",
                                              metrics_registry=CollectorRegistry()) for i in range(50)]
    informers = [f.for_resource(CONFIGMAPS)[0] for f in factories]
    for f in factories:
        f.start()
    try:
        assert all(await asyncio.gather(*(inf.wait_for_sync(30) for inf in informers)))
        assert client.connections == 1 and proxy.accepted == 1
        writes = asyncio.create_task(_churn(api, namespace, 40))
        await asyncio.sleep(0.3)
        proxy.cut()
        await writes
        await api.request("POST", CONFIGMAPS.path(namespace), body={"metadata": {"name": "after-cut"}})
        await eventually(lambda: all(inf.lister.get("after-cut", namespace) for inf in informers), 10,
                         "every informer past the cut")
        truth = await server_state(api, CONFIGMAPS, namespace)
        await eventually(lambda: all(cache_state(inf) == truth for inf in informers), 10, "every cache converged")
        assert client.connections == 1  # the 50 watches came back on one new connection
    finally:
        for f in factories:
            await f.shutdown()
        await client.close()
        await proxy.stop()


async def _churn(api: ApiClient, namespace: str, n: int) -> None:
    for i in range(n):
        name = f"churn-{i % 7}"
        try:
            await api.request("POST", CONFIGMAPS.path(namespace), body={"metadata": {"name": name}})
        except Exception:
            await api.request("DELETE", CONFIGMAPS.path(namespace) + f"/{name}")


@pytest.mark.parametrize("graceful", [False, True], ids=["watches-ended", "graceful-goaway"])
async def test_an_apiserver_restart_goaway_is_followed_by_a_new_connection(control_plane_factory, graceful) -> None:
    plane = control_plane_factory(graceful_shutdown=graceful)
    async with ApiClient.from_kubeconfig(str(plane.kubeconfig)) as client:
        f = DynamicSharedInformerFactory(client, namespace="default", metrics_registry=CollectorRegistry())
        inf, _ = f.for_resource(CONFIGMAPS)
        f.start()
        try:
            assert await inf.wait_for_sync(30)
            [first] = _conns(client)
            # The apiserver sends GOAWAY when told to stop, then ends (or leaves) its watches.
            await asyncio.to_thread(plane.restart_apiserver, 90 if graceful else 10)
            await client.request("POST", CONFIGMAPS.path("default"), body={"metadata": {"name": "after-restart"}})
            await eventually(lambda: inf.lister.get("after-restart", "default") is not None, 30, "watch resumed")
            assert not first.open and client.connections == 1
            assert await converged(client, inf, "default")
        finally:
            await f.shutdown()


async def test_a_401_with_goaway_still_answers_and_the_next_request_dials_again(control_plane) -> None:
    async with ApiClient.from_kubeconfig(str(control_plane.kubeconfig)) as client:
        await client.request("GET", "/version")
        [first] = _conns(client)
        keys = client.configuration.api_key
        field = "authorization" if "authorization" in keys else "BearerToken"
        good = keys[field]
        keys[field] = "Bearer not-a-token"
        with pytest.raises(Unauthorized):  # the apiserver answers it and closes the connection (GOAWAY)
            await client.request("GET", "/api/v1/namespaces")
        keys[field] = good
        await client.request("GET", "/api/v1/namespaces")
        await eventually(lambda: not first.open, 5, "the connection that got GOAWAY closed")
        assert client.connections == 1


async def test_a_consumer_that_stops_reading_stalls_only_its_own_stream(api, control_plane, namespace) -> None:
    async with ApiClient.from_kubeconfig(str(control_plane.kubeconfig)) as client:
        listed = await client.request("GET", CONFIGMAPS.path(namespace))
        params = _watch_params(listed["metadata"]["resourceVersion"])
        big = "x" * (900 << 10)
        count = STREAM_WINDOW // len(big) + 4  # beyond the stream window: the stalled stream's fills up
        async with client.stream(CONFIGMAPS.path(namespace), params) as stalled_events:
            async with client.stream(CONFIGMAPS.path(namespace), params) as live_events:
                assert client.connections == 1
                for i in range(count):
                    await api.request("POST", CONFIGMAPS.path(namespace),
                                      body={"metadata": {"name": f"big-{i}"}, "data": {"v": big}})
                live = [e["object"]["metadata"]["name"] async for e in _first(live_events, count)]
                assert live == [f"big-{i}" for i in range(count)]
                [conn] = _conns(client)
                [stalled] = [s for s in conn._streams.values() if s._chunks]
                assert stalled._pending <= STREAM_WINDOW  # the server stopped at the window the reader left
                late = [e["object"]["metadata"]["name"] async for e in _first(stalled_events, count)]
                assert late == live  # and sent the rest once it was read: nothing lost


async def _first(events, n: int):
    got = 0
    async for event in events:
        if event["type"] == "ADDED":
            yield event
            got += 1
            if got == n:
                return


async def test_a_silent_connection_is_closed_by_the_ping_health_check(control_plane, api, namespace,
                                                                      monkeypatch) -> None:
    monkeypatch.setattr(transport_module, "READ_IDLE", 1.0)
    monkeypatch.setattr(transport_module, "PING_TIMEOUT", 1.0)
    proxy = await Proxy(control_plane.port).start()
    client = ApiClient.from_kubeconfig(str(control_plane.kubeconfig))
    client.host = f"https://127.0.0.1:{proxy.port}"
    f = DynamicSharedInformerFactory(client, namespace=namespace, metrics_registry=CollectorRegistry())
    inf, _ = f.for_resource(CONFIGMAPS)  # no inactivity timeout: only the PING can find the connection dead
    f.start()
    try:
        assert await inf.wait_for_sync(30)
        proxy.freeze()
        await api.request("POST", CONFIGMAPS.path(namespace), body={"metadata": {"name": "during-freeze"}})
        await eventually(lambda: inf.lister.get("during-freeze", namespace) is not None, 15, "watch replaced")
        assert proxy.accepted == 2
    finally:
        await f.shutdown()
        await client.close()
        await proxy.stop()


async def test_a_server_without_h2_is_spoken_to_over_http1(control_plane) -> None:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(control_plane.dir / "apiserver.crt", control_plane.dir / "apiserver.key")

    async def version(request: web.Request) -> web.Response:
        return web.json_response({"gitVersion": "v0-http1", "proto": request.version.major})

    app = web.Application()
    app.router.add_get("/version", version)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=context)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        async with ApiClient.from_kubeconfig(str(control_plane.kubeconfig)) as client:
            client.host = f"https://127.0.0.1:{port}"
            assert await client.request("GET", "/version") == {"gitVersion": "v0-http1", "proto": 1}
            assert await client.request("GET", "/version") == {"gitVersion": "v0-http1", "proto": 1}
            assert client._transport.negotiated == "http/1.1" and client.connections == 1
    finally:
        await runner.cleanup()


async def test_http2_off_uses_http1(control_plane, namespace) -> None:
    async with ApiClient.from_kubeconfig(str(control_plane.kubeconfig)) as client:
        client.http2 = False
        await client.request("GET", "/version")
        assert isinstance(client._transport, transport_module.Http1Transport)


async def test_concurrent_large_responses_arrive_whole(api, control_plane, namespace) -> None:
    # Many streams ending with large frames at once: the frames h2 parses itself (a stream's last) must fit its
    # view of the connection window as well as the server's.
    for i in range(3):
        await api.request("POST", CONFIGMAPS.path(namespace),
                          body={"metadata": {"name": f"large-{i}"}, "data": {"v": str(i) * (700 << 10)}})
    async with ApiClient.from_kubeconfig(str(control_plane.kubeconfig)) as client:
        for _ in range(3):
            lists = await asyncio.gather(*(client.request("GET", CONFIGMAPS.path(namespace)) for _ in range(60)))
            assert all(sorted(o["data"]["v"][:1] for o in lst["items"]) == ["0", "1", "2"] for lst in lists)
        assert client.connections == 1


# -- the fence at the send (no apiserver: what reaches the wire is read back) ------------------------------------
class _Wire(asyncio.Transport):
    """A connection's socket: keeps what is written, closes as a socket would (later, by the loop)."""

    def __init__(self, protocol: asyncio.Protocol) -> None:
        super().__init__()
        self.protocol, self.written, self._closing = protocol, bytearray(), False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written.extend(data)

    def is_closing(self) -> bool:
        return self._closing

    def close(self) -> None:
        if not self._closing:
            self._closing = True
            asyncio.get_running_loop().call_soon(self.protocol.connection_lost, None)


def _unreachable() -> Any:
    """A configuration of a server that is not there (the kubernetes package's, as ``from_configuration`` takes)."""
    import kubernetes

    conf = kubernetes.client.Configuration()
    conf.host = "https://127.0.0.1:1"  # nothing listens: only the patched dial gets anywhere
    return conf


async def test_a_fence_closing_while_a_write_waits_for_its_http2_connection_sends_nothing(monkeypatch) -> None:
    """The fence holds when the write is handed to the pool and closes while the pool dials (a SIGSTOP there, or
    a slow handshake): the write is refused on the connection, before its HEADERS, and no stream is opened."""
    import h2.config
    import h2.connection
    import h2.events

    from informers import FenceError
    from informers.http2 import H2Connection

    server = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
    server.initiate_connection()
    dialing, dialled = asyncio.Event(), asyncio.Event()
    wires: list[_Wire] = []

    async def connect(cls: type[H2Connection], *args: object, **kwargs: object) -> H2Connection:
        dialing.set()
        await dialled.wait()
        conn = cls("127.0.0.1:1", 30.0, 15.0, 90.0)
        wires.append(_Wire(conn))
        conn.connection_made(wires[-1])
        conn.data_received(server.data_to_send())  # the server's SETTINGS: the stream limit is known
        return conn

    monkeypatch.setattr(H2Connection, "connect", classmethod(connect))
    open_ = [True]
    async with ApiClient(_unreachable(), http2=True) as client:
        write = asyncio.create_task(client.fenced(lambda: open_[0]).request("POST", CONFIGMAPS.path("default"),
                                                                           body={}))
        await asyncio.wait_for(dialing.wait(), 5)
        open_[0] = False
        dialled.set()
        with pytest.raises(FenceError, match="POST /api/v1/namespaces/default/configmaps refused"):
            await asyncio.wait_for(write, 5)
        conn = _conns(client)[0]
        assert conn.active_streams == 0  # the slot it had reserved is free again
        events = server.receive_data(bytes(wires[0].written))
    assert not [e for e in events if isinstance(e, h2.events.RequestReceived)], events


async def test_a_fence_closing_while_a_write_waits_for_its_http1_connection_sends_nothing(monkeypatch) -> None:
    """The same over HTTP/1.1: the check runs once aiohttp has the connection, before it writes the request."""
    import aiohttp

    from informers import FenceError

    received: list[str] = []

    async def anything(request: web.Request) -> web.Response:
        received.append(f"{request.method} {request.path}")
        return web.json_response({})

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", anything)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    open_ = [True]
    connect = aiohttp.TCPConnector.connect

    async def closing_while_connecting(self: aiohttp.TCPConnector, *args: object, **kwargs: object) -> object:
        open_[0] = False  # the term ends while the pool gets a connection
        return await connect(self, *args, **kwargs)  # type: ignore[arg-type]

    try:
        conf = _unreachable()
        conf.host = f"http://127.0.0.1:{port}"
        async with ApiClient(conf, http2=False) as client:
            await client.request("GET", "/version")  # the connection exists: the write would reuse it
            monkeypatch.setattr(aiohttp.TCPConnector, "connect", closing_while_connecting)
            with pytest.raises(FenceError):
                await client.fenced(lambda: open_[0]).request("PUT", CONFIGMAPS.path("default", "x"), body={})
        assert received == ["GET /version"]
    finally:
        await runner.cleanup()


async def test_credentials_are_sent_never_indexed(monkeypatch) -> None:
    """Authorization goes out as a never-indexed field (RFC 7541 §7.1.3) on every request, so it is in neither
    side's HPACK table; other repeated fields are indexed as before."""
    import h2.config
    import h2.connection
    import h2.events
    import hpack

    from informers.http2 import H2Connection

    server = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
    server.initiate_connection()
    wires: list[_Wire] = []

    async def connect(cls: type[H2Connection], *args: object, **kwargs: object) -> H2Connection:
        conn = cls("127.0.0.1:1", 30.0, 15.0, 90.0)
        wires.append(_Wire(conn))
        conn.connection_made(wires[-1])
        conn.data_received(server.data_to_send())
        return conn

    monkeypatch.setattr(H2Connection, "connect", classmethod(connect))
    conf = _unreachable()
    conf.api_key = {"authorization": "Bearer planted-token"}
    received: list[Any] = []
    async with ApiClient(conf, http2=True) as client:
        requests = [asyncio.create_task(client.request("GET", "/version")) for _ in range(3)]

        def arrived() -> bool:
            if wires:
                received.extend(e for e in server.receive_data(bytes(wires[0].written))
                                if isinstance(e, h2.events.RequestReceived))
                wires[0].written.clear()
            return len(received) == 3

        await eventually(arrived, 5, "three requests")
        for request in requests:
            request.cancel()
        await asyncio.gather(*requests, return_exceptions=True)
    for event in received:
        [auth] = [h for h in event.headers if h[0] == b"authorization"]
        assert isinstance(auth, hpack.NeverIndexedHeaderTuple) and auth[1] == b"Bearer planted-token"
        assert all(isinstance(h, hpack.HeaderTuple) for h in event.headers)
    assert all(name != b"authorization" for name, _ in server.decoder.header_table.dynamic_entries)
    assert any(name == b"user-agent" for name, _ in server.decoder.header_table.dynamic_entries)
    # The Huffman codes every connection shares (a new connection's first requests) never hold a credential.
    from informers.http2 import _SHARED_HUFFMAN
    assert any(b"kube-syncer" in (value or b"") for value in _SHARED_HUFFMAN._codes)
    assert not any(b"planted-token" in (value or b"") for value in _SHARED_HUFFMAN._codes)


def test_header_blocks_are_hpacks_own_with_the_shared_huffman_codes() -> None:
    """A connection's header blocks are byte for byte hpack's own, whether its Huffman codes are new or shared."""
    import hpack

    from informers.http2 import _Encoder

    def blocks(encoder: hpack.Encoder) -> list[bytes]:
        return [encoder.encode([(b":method", b"GET"), (b":path", path), (b"user-agent", b"kube-syncer/1 (linux)"),
                                hpack.NeverIndexedHeaderTuple(b"authorization", b"Bearer t0ken")])
                for path in (b"/version", b"/api", b"/api/v1/namespaces/x/configmaps?watch=1", b"/api")]

    assert blocks(_Encoder()) == blocks(_Encoder()) == blocks(hpack.Encoder())


async def test_settings_kept_in_lists_still_change_when_the_server_changes_them() -> None:
    """The settings' values move from h2's deques (760 bytes each) to lists once the server's SETTINGS came; a later
    SETTINGS from the server still changes them, and our own are acknowledged as h2 would."""
    import h2.config
    import h2.connection
    import h2.settings

    from informers.http2 import H2Connection

    server = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding=None))
    server.initiate_connection()
    conn = H2Connection("127.0.0.1:1", 30.0, 15.0, 90.0)
    wire = _Wire(conn)
    conn.connection_made(wire)
    conn.data_received(server.data_to_send())
    server.receive_data(bytes(wire.written))  # our preface and SETTINGS, and the ACK of the server's
    wire.written.clear()
    conn.data_received(server.data_to_send())  # the server's ACK of ours
    for settings in (conn._h2.local_settings, conn._h2.remote_settings):
        assert all(isinstance(v, list) for v in settings._settings.values())
    assert conn._h2.local_settings.initial_window_size == 4 << 20
    assert conn.free_slots == server.local_settings.max_concurrent_streams
    server.update_settings({h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 7})
    conn.data_received(server.data_to_send())
    assert conn.free_slots == 7
    assert all(isinstance(v, list) for v in conn._h2.remote_settings._settings.values())
    conn.close()


async def test_received_frames_are_never_rendered_for_h2s_trace_log(control_plane, namespace, monkeypatch) -> None:
    # h2 renders every frame it is handed (``repr(frame)``) for a trace log nothing reads: a frame's full repr
    # hexlifies its body. A request's frames (SETTINGS, HEADERS, the last DATA, a 404's too) must not need it.
    import hyperframe.frame

    def rendered(frame: object) -> str:
        raise AssertionError(f"{type(frame).__name__} rendered")

    monkeypatch.setattr(hyperframe.frame.Frame, "__repr__", rendered)
    async with ApiClient.from_kubeconfig(str(control_plane.kubeconfig)) as client:
        listed = await asyncio.wait_for(client.request("GET", CONFIGMAPS.path(namespace)), 10)
        assert listed["kind"] == "ConfigMapList"
        with pytest.raises(Exception, match="404|not found|NotFound"):
            await asyncio.wait_for(client.request("GET", CONFIGMAPS.path(namespace, "absent")), 10)
