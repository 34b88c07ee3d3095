"""A small HTTP/1.1 server for the sidecar's own GET endpoints (probes, ``/metrics``, ``/status``, ``/debug``).

It replaces aiohttp's web server there: importing ``aiohttp.web`` costs every ``syncer run`` about 11 MiB of
its ~55 MiB at start-up, for four read-only endpoints that kubelet, Prometheus and a browser call. What it does,
as those clients expect: persistent connections (HTTP/1.1 keep-alive, ``Connection: close`` honoured), ``GET``
and ``HEAD``, 404 for an unknown path, 405 (with ``Allow``) for another method, 400 for a malformed request,
431 for a head over ``MAX_HEAD`` bytes; a request body is read and dropped. No TLS, no chunked requests, no
pipelining beyond answering requests one after another. The admission webhooks keep aiohttp (TLS, POST bodies).

Every connection is a task of the server, cancelled and awaited by ``stop()``.
"""

from __future__ import annotations

import asyncio
import urllib.parse
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Awaitable, Callable, Mapping

MAX_HEAD = 64 * 1024
_MAX_BODY = 1 << 20
IDLE_TIMEOUT = 75.0  # a kept-alive connection without a request is closed after this (Go's net/http: none)


@dataclass(frozen=True)
class Request:
    """A request as a handler sees it: ``path``, ``query`` (first value of each parameter), ``headers`` (names
    in lower case)."""

    method: str
    path: str
    query: Mapping[str, str]
    headers: Mapping[str, str]


@dataclass(frozen=True)
class Response:
    """What a handler answers: a status, a body and its content type, and any other headers."""

    body: bytes = b""
    status: int = 200
    content_type: str = "text/plain; charset=utf-8"
    headers: Mapping[str, str] = field(default_factory=dict)


Handler = Callable[[Request], Awaitable[Response]]


class HttpServer:
    """Serves ``routes`` (path -> handler) on ``host:port``; ``start()`` raises OSError if the address is taken."""

    def __init__(self, host: str, port: int, routes: Mapping[str, Handler]) -> None:
        self.host, self.port = host.strip("[]"), port
        self._routes = dict(routes)
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        """Bind and serve."""
        self._server = await asyncio.start_server(self._accept, self.host or None, self.port, reuse_address=True,
                                                  limit=MAX_HEAD)

    async def stop(self) -> None:
        """Stop listening, then end every connection (a request being answered is cut short)."""
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.get_running_loop().create_task(self._serve(reader, writer), name="http connection")
        self._connections.add(task)
        task.add_done_callback(self._connections.discard)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    async with asyncio.timeout(IDLE_TIMEOUT):
                        head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.LimitOverrunError:
                    await _write(writer, Response(b"request head too large\n", 431), close=True)
                    return
                except (asyncio.IncompleteReadError, TimeoutError, ConnectionError):
                    return
                parsed = _parse(head)
                if parsed is None:
                    await _write(writer, Response(b"malformed request\n", 400), close=True)
                    return
                request, version = parsed
                length = request.headers.get("content-length", "0")
                if not length.isdigit() or int(length) > _MAX_BODY or "transfer-encoding" in request.headers:
                    await _write(writer, Response(b"request bodies are not accepted here\n", 413), close=True)
                    return
                if int(length):
                    await reader.readexactly(int(length))
                connection = request.headers.get("connection", "").lower()
                close = connection == "close" or (version == "HTTP/1.0" and connection != "keep-alive")
                response = await self._answer(request)
                await _write(writer, response, close, head_only=request.method == "HEAD")
                if close:
                    return
        except (ConnectionError, asyncio.IncompleteReadError):
            return
        finally:
            writer.close()

    async def _answer(self, request: Request) -> Response:
        handler = self._routes.get(request.path)
        if handler is None:
            return Response(b"404: Not Found", 404)
        if request.method not in ("GET", "HEAD"):
            return Response(b"405: Method Not Allowed", 405, headers={"Allow": "GET, HEAD"})
        return await handler(request)


def _parse(head: bytes) -> tuple[Request, str] | None:
    try:
        lines = head.decode("latin-1").split("\r\n")
        method, target, version = lines[0].split(" ")
    except ValueError:
        return None
    if not version.startswith("HTTP/1.") or not target.startswith("/"):
        return None
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip():
                return None
            headers[name.lower()] = value.strip()
    url = urllib.parse.urlsplit(target)
    query = {k: v[0] for k, v in urllib.parse.parse_qs(url.query, keep_blank_values=True).items()}
    return Request(method, urllib.parse.unquote(url.path), query, headers), version


async def _write(writer: asyncio.StreamWriter, response: Response, close: bool, head_only: bool = False) -> None:
    reason = HTTPStatus(response.status).phrase
    lines = [f"HTTP/1.1 {response.status} {reason}", f"Content-Type: {response.content_type}",
             f"Content-Length: {len(response.body)}", *(f"{k}: {v}" for k, v in response.headers.items())]
    if close:
        lines.append("Connection: close")
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (b"" if head_only else response.body))
    await writer.drain()
