"""The sidecar's small HTTP server, over real sockets: keep-alive, HEAD, 404/405/400/431/413, and no task left
after stop (a connection idle or mid-request included)."""

from __future__ import annotations

import asyncio
import http.client

from syncer.http_server import MAX_HEAD, HttpServer, Request, Response

from tests.helpers import free_port


async def _served() -> HttpServer:
    async def hello(request: Request) -> Response:
        return Response(f"hello {request.query.get('who', '?')} {request.headers.get('x-name', '')}".encode())

    server = HttpServer("127.0.0.1", free_port(), {"/hello": hello})
    await server.start()
    return server


def _exchange(port: int, *requests: tuple[str, str, dict[str, str]]) -> list[tuple[int, dict[str, str], bytes]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    out = []
    for method, path, headers in requests:
        conn.request(method, path, headers=headers)
        r = conn.getresponse()
        out.append((r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()))
    conn.close()
    return out


async def test_requests_on_one_connection_and_the_answers_clients_expect() -> None:
    tasks_before = asyncio.all_tasks()
    server = await _served()
    try:
        answers = await asyncio.to_thread(_exchange, server.port, ("GET", "/hello?who=kubelet", {"X-Name": "a"}),
                                          ("HEAD", "/hello", {}), ("GET", "/nope", {}), ("POST", "/hello", {}),
                                          ("GET", "/hello?who=again", {}))
        assert [a[0] for a in answers] == [200, 200, 404, 405, 200]
        assert answers[0][2] == b"hello kubelet a" and answers[0][1]["content-length"] == "15"
        assert answers[1][2] == b"" and answers[1][1]["content-length"] == "8"  # HEAD: the length, no body
        assert answers[3][1]["allow"] == "GET, HEAD"
        assert answers[4][2] == b"hello again "

        async def raw(data: bytes) -> bytes:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(data)
            answer = await reader.read()
            writer.close()
            return answer

        assert (await raw(b"NONSENSE\r\n\r\n")).startswith(b"HTTP/1.1 400 ")
        assert (await raw(b"GET /hello HTTP/1.1\r\nX: " + b"y" * MAX_HEAD + b"\r\n\r\n")).startswith(b"HTTP/1.1 431 ")
        assert (await raw(b"GET /hello HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n")).startswith(b"HTTP/1.1 413 ")
        assert (await raw(b"GET /hello HTTP/1.0\r\n\r\n")).endswith(b"hello ? ")  # 1.0: closed after the answer
        idle = await asyncio.open_connection("127.0.0.1", server.port)
        half = await asyncio.open_connection("127.0.0.1", server.port)
        half[1].write(b"GET /hello HTTP/1.1\r\n")
        await half[1].drain()
        await asyncio.sleep(0.1)
    finally:
        await server.stop()
    assert await idle[0].read() == b"" and await half[0].read() == b""  # both closed by the stop
    for _, writer in (idle, half):
        writer.close()
    assert asyncio.all_tasks() - tasks_before == {asyncio.current_task()} - tasks_before


async def test_a_taken_address_raises_and_leaves_nothing_running() -> None:
    server = await _served()
    try:
        taken = HttpServer("127.0.0.1", server.port, {})
        try:
            await taken.start()
        except OSError:
            pass
        else:
            raise AssertionError("a second server bound the same port")
        await taken.stop()
    finally:
        await server.stop()
