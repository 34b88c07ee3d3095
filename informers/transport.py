"""Transports under ``ApiClient``: HTTP/2 (one multiplexed connection per server) or HTTP/1.1 (aiohttp's pool).

``Http2Transport`` is client-go's default: every request and watch to one server shares one TLS connection, and
another is opened only when the server's stream limit is reached. A server that does not offer ``h2`` in ALPN
(a proxy in front of the apiserver, say) is spoken to over HTTP/1.1 from then on, as Go's transport falls back.
``Http1Transport`` (aiohttp) is a connection per concurrent request; it is also what ``http://`` URLs get, since
the apiserver does not serve cleartext HTTP/2.

Both answer with a ``Response``; timeouts mean the same in both: ``total`` bounds the whole exchange, ``read_idle``
the silence between two reads of the body, ``connect_within`` getting a connection (dial or free stream slot),
``connect_timeout`` one TCP+TLS handshake. ``guard`` (a fence's check, which raises) is called once the request has
its connection, at the last synchronous moment before its first byte is written: a request that waited for a
dial or a stream slot (or whose process was paused meanwhile) is refused there, not sent.
"""

from __future__ import annotations

import asyncio
import contextvars
import ssl
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Iterator, Mapping, Protocol
from urllib.parse import urlencode, urlsplit

from .http2 import H2Connection

if TYPE_CHECKING:
    import aiohttp

class TransportError(ConnectionError):
    """The HTTP/1.1 library's own failure (a broken or truncated response, say), as a ``ConnectionError``."""


# Raises (a FenceError) if the request must not be sent any more.
Guard = Callable[[], None]
# The guard of the HTTP/1.1 request being made in this task, for ``_GuardedRequest.send`` (aiohttp makes the
# request object itself: a context variable is how it gets there).
_HTTP1_GUARD: contextvars.ContextVar[Guard | None] = contextvars.ContextVar("http1_guard", default=None)

# Failures below HTTP: the server was not reached, or the connection broke, or it went silent.
CONNECTION_ERRORS = (OSError, TimeoutError)

# client-go's HTTP/2 health check (k8s.io/apimachinery/pkg/util/net: ReadIdleTimeout, PingTimeout).
READ_IDLE = 30.0
PING_TIMEOUT = 15.0
# Go's IdleConnTimeout as client-go sets it: an HTTP/2 connection without streams is closed after this.
IDLE_CONNECTION = 90.0
# aiohttp's keep-alive: kube-apiserver closes an idle HTTP/1.1 connection after 90 s (its IdleTimeout), so longer
# would not help; a request sooner than that (a lease renewal, a write burst) reuses the connection.
HTTP1_KEEPALIVE = IDLE_CONNECTION


class Response(Protocol):
    """A response whose headers came; its body is read with ``read`` or ``readany``."""

    status: int

    @property
    def reason(self) -> str: ...

    def header(self, name: str) -> str | None: ...

    async def read(self) -> bytes: ...

    async def readany(self) -> bytes: ...


class Transport(Protocol):
    """Sends requests to one server."""

    def request(self, method: str, path: str, headers: Mapping[str, str], params: Mapping[str, str] | None,
                body: bytes | None, *, total: float | None, read_idle: float | None,
                connect_within: float | None, guard: Guard | None = None) -> AbstractAsyncContextManager[Response]:
        ...

    @property
    def connections(self) -> int: ...

    async def close(self) -> None: ...


class Http1Transport:
    """HTTP/1.1 through one aiohttp session (imported only when used)."""

    def __init__(self, base_url: str, context: ssl.SSLContext | bool, server_hostname: str | None,
                 connect_timeout: float, user_agent: str) -> None:
        """``base_url`` is prefixed to every path; ``context`` is False for ``http://``."""
        import aiohttp
        import orjson

        self._base = base_url
        self._server_hostname = server_hostname
        self._connect_timeout = connect_timeout
        self._connector = aiohttp.TCPConnector(ssl=context, limit=0, enable_cleanup_closed=True,
                                               keepalive_timeout=HTTP1_KEEPALIVE)
        self._session = aiohttp.ClientSession(
            connector=self._connector, json_serialize=lambda o: orjson.dumps(o).decode(),
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=connect_timeout),
            auto_decompress=True, headers={"User-Agent": user_agent}, request_class=_guarded_request_class(),
        )

    @asynccontextmanager
    async def request(self, method: str, path: str, headers: Mapping[str, str], params: Mapping[str, str] | None,
                      body: bytes | None, *, total: float | None, read_idle: float | None,
                      connect_within: float | None, guard: Guard | None = None) -> AsyncIterator[Response]:
        """One request on a pooled (or new) connection."""
        import aiohttp

        timeout = aiohttp.ClientTimeout(total=total, sock_connect=self._connect_timeout, sock_read=read_idle,
                                        connect=connect_within)
        token = _HTTP1_GUARD.set(guard)
        try:
            with _translated():
                async with self._session.request(method, self._base + path, params=params, data=body,
                                                 headers=dict(headers), timeout=timeout,
                                                 server_hostname=self._server_hostname) as resp:
                    yield _Http1Response(resp)
        finally:
            _HTTP1_GUARD.reset(token)

    @property
    def connections(self) -> int:
        """Open TCP connections, busy or kept alive."""
        busy = len(self._connector._acquired)
        return busy + sum(len(c) for c in self._connector._conns.values())

    async def close(self) -> None:
        """Close the session and its connections."""
        await self._session.close()


def _guarded_request_class() -> type["aiohttp.ClientRequest"]:
    """aiohttp's request, calling the task's guard when ``send`` starts: aiohttp calls it once the connection is
    got, and it writes the status line and headers before its first await, so that is the last moment aiohttp
    lets a check run before the request is written. A refused request's connection is closed by aiohttp (it
    cannot tell that nothing was written on it)."""
    import aiohttp

    class _GuardedRequest(aiohttp.ClientRequest):
        async def send(self, conn: "aiohttp.connector.Connection") -> "aiohttp.ClientResponse":
            guard = _HTTP1_GUARD.get()
            if guard is not None:
                guard()
            return await super().send(conn)

    return _GuardedRequest


class _Http1Response:
    def __init__(self, resp: "aiohttp.ClientResponse") -> None:
        self._resp = resp
        self.status = resp.status

    @property
    def reason(self) -> str:
        return self._resp.reason or ""

    def header(self, name: str) -> str | None:
        return self._resp.headers.get(name)

    async def read(self) -> bytes:
        with _translated():
            return await self._resp.read()

    async def readany(self) -> bytes:
        with _translated():
            return await self._resp.content.readany()


@contextmanager
def _translated() -> Iterator[None]:
    """aiohttp's errors as ``CONNECTION_ERRORS``: its timeouts are TimeoutErrors already, the rest become
    ``TransportError`` (its OS-level ones are OSErrors already, kept as they are)."""
    import aiohttp

    try:
        yield
    except (TimeoutError, OSError):
        raise
    except aiohttp.ClientError as e:
        raise TransportError(f"{type(e).__name__}: {e}") from e


class Http2Transport:
    """HTTP/2 connections to one server, each carrying up to the server's stream limit.

    ``context_factory`` gives the TLS context, offering ``h2`` and ``http/1.1`` in ALPN (it may be shared: it is
    not changed here); ``http1`` makes the HTTP/1.1 transport used
    once the server turns ``h2`` down. ``read_idle`` and ``ping_timeout`` (default ``READ_IDLE``, ``PING_TIMEOUT``)
    tune the health check.
    """

    def __init__(self, base_url: str, context_factory: Callable[[], ssl.SSLContext], server_hostname: str | None,
                 connect_timeout: float, user_agent: str, http1: Callable[[], Transport],
                 read_idle: float | None = None, ping_timeout: float | None = None) -> None:
        url = urlsplit(base_url)
        if url.scheme != "https" or url.hostname is None:
            raise ValueError(f"HTTP/2 needs an https:// URL, not {base_url!r}")
        self._host = url.hostname
        self._port = url.port or 443
        self._authority = url.netloc.rpartition("@")[2]
        self._prefix = url.path.rstrip("/")
        self._context_factory = context_factory
        self._server_hostname = server_hostname
        self._connect_timeout = connect_timeout
        self._user_agent = user_agent
        self._http1_factory = http1
        self._http1: Transport | None = None
        self._read_idle = READ_IDLE if read_idle is None else read_idle
        self._ping_timeout = PING_TIMEOUT if ping_timeout is None else ping_timeout
        self._conns: list[H2Connection] = []
        self._dialing: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def connections(self) -> int:
        """Open connections (HTTP/1.1 ones too, after a fallback)."""
        own = sum(1 for c in self._conns if c.open)
        return own + (self._http1.connections if self._http1 is not None else 0)

    @property
    def negotiated(self) -> str | None:
        """``"h2"`` or ``"http/1.1"`` once a connection was made, else None."""
        return "http/1.1" if self._http1 is not None else ("h2" if self._conns else None)

    @asynccontextmanager
    async def request(self, method: str, path: str, headers: Mapping[str, str], params: Mapping[str, str] | None,
                      body: bytes | None, *, total: float | None, read_idle: float | None,
                      connect_within: float | None, guard: Guard | None = None) -> AsyncIterator[Response]:
        """One request on a stream of a connection with a free slot (dialling one if none has)."""
        if self._http1 is None:
            async with asyncio.timeout(total):
                async with asyncio.timeout(connect_within):
                    conn = await self._acquire()
                if conn is not None:
                    target = self._prefix + path + ("?" + urlencode(params) if params else "")
                    resp = await conn.request(method, target, {"user-agent": self._user_agent, **headers}, body,
                                              guard)
                    resp.read_idle = read_idle
                    try:
                        yield resp
                    finally:
                        resp.release()
                    return
        assert self._http1 is not None
        async with self._http1.request(method, path, headers, params, body, total=total, read_idle=read_idle,
                                       connect_within=connect_within, guard=guard) as resp1:
            yield resp1

    async def _acquire(self) -> H2Connection | None:
        """A connection with a slot reserved, or None once the server chose HTTP/1.1."""
        while True:
            if self._closed:
                raise ConnectionResetError("the client is closed")
            if self._http1 is not None:
                return None
            self._conns = [c for c in self._conns if c.open]
            for conn in self._conns:
                if conn.usable and conn.free_slots > 0:
                    conn.reserve()
                    return conn
            if self._dialing is None:
                self._dialing = asyncio.create_task(self._dial(), name=f"http2 dial {self._authority}")
                self._dialing.add_done_callback(_retrieve)
            await asyncio.shield(self._dialing)

    async def _dial(self) -> None:
        try:
            context = self._context_factory()
            async with asyncio.timeout(self._connect_timeout):
                conn = await H2Connection.connect(self._host, self._port, context, self._server_hostname,
                                               self._authority, self._read_idle, self._ping_timeout, IDLE_CONNECTION)
            if conn is None:
                self._http1 = self._http1_factory()
            elif self._closed:
                conn.close()
            else:
                self._conns.append(conn)
        finally:
            self._dialing = None

    async def close(self) -> None:
        """Close every connection (failing their streams) and wait until they are closed."""
        self._closed = True
        if self._dialing is not None:
            self._dialing.cancel()
            await asyncio.gather(self._dialing, return_exceptions=True)
        conns, self._conns = self._conns, []
        for conn in conns:
            conn.close()
        if conns:
            await asyncio.wait([asyncio.ensure_future(c.wait_closed()) for c in conns], timeout=2.0)
        if self._http1 is not None:
            await self._http1.close()


def _retrieve(task: asyncio.Task[Any]) -> None:
    # A dial every waiter gave up on still fails quietly: the next request dials again.
    if not task.cancelled():
        task.exception()
