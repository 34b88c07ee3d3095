"""ApiClient: an asyncio HTTP client for the Kubernetes API, configured as the ``kubernetes`` package does it.

Configuration (kubeconfig with context selection, in-cluster service account, token credentials and their
refresh, client certificates, CA) is read as ``kubernetes.config`` reads it (``kubeconfig.py``: without importing
the package in the common cases, by the package for the rest); exec credential plugins are run by
``credentials.ExecPlugin`` instead (asynchronously, with a timeout). Requests go through a ``transport.Transport``
(HTTP/2 by default). Responses are decoded once with orjson into plain dicts. Every request says ``User-Agent: kube-syncer/<version>
(<os>/<arch>)``, client-go's form: the apiserver names a write without ``fieldManager`` after the part before the
first "/", so such writes are managed by "kube-syncer", not by the HTTP library's name.
"""

from __future__ import annotations

import asyncio
import base64
import math
import os
import platform
import ssl
import sys
import time
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Mapping, Union

import orjson

from . import kubeconfig, tls
from .credentials import DEFAULT_TIMEOUT, Credential, ExecPlugin
from .errors import ApiError, FenceError
from .request_metrics import NO_ANSWER, RequestCounts, track, untrack
from .request_tracing import request_tracer
from .transport import CONNECTION_ERRORS as CONNECTION_ERRORS  # re-exported: callers catch them
from .transport import Http1Transport, Http2Transport, Response, Transport
from .version import __version__

if TYPE_CHECKING:
    import kubernetes

# What ApiClient is configured with: either has the settings it reads.
Configuration = Union[kubeconfig.ClientConfig, "kubernetes.client.Configuration"]

_JSON = "application/json"
_READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_REFRESH_EVERY = 5.0
_GO_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "i686": "386", "ppc64le": "ppc64le",
            "s390x": "s390x"}


def default_user_agent() -> str:
    """``kube-syncer/<version> (<os>/<arch>)``, with Go's names for the OS and architecture, as client-go's."""
    machine = platform.machine().lower()
    return f"kube-syncer/{__version__} ({sys.platform}/{_GO_ARCH.get(machine, machine)})"


USER_AGENT = default_user_agent()


class ApiClient:
    """Async client of one API server; create with ``from_kubeconfig``, ``in_cluster`` or ``from_configuration``.

    Use as an async context manager or call ``close()``: it owns the HTTP session and its connections.
    """

    def __init__(self, configuration: Configuration, connect_timeout: float = 10.0,
                 exec_plugin: ExecPlugin | None = None, *, ca_data: str | None = None,
                 client_cert_data: str | None = None, client_key_data: str | None = None,
                 tls_server_name: str | None = None, user_agent: str = USER_AGENT, http2: bool | None = None) -> None:
        """``exec_plugin`` supplies the credential instead of ``configuration`` (see ``from_kubeconfig``).

        ``ca_data`` (PEM) is trusted in addition to ``configuration.ssl_ca_cert``; ``client_cert_data`` and
        ``client_key_data`` (PEM, the key unencrypted) win over ``cert_file``/``key_file``. They are held in memory
        and loaded like an exec plugin's certificate (``load_client_certificate``): the kubernetes package writes
        each ``*-data`` field of a kubeconfig to a temporary file kept until the process exits, which piles up when
        clusters come and go. ``tls_server_name`` is the name the server's certificate is checked against (and
        sent as SNI) instead of the host of the URL. ``user_agent`` is sent with every request. ``http2``: speak
        HTTP/2 to an ``https://`` server that offers it (one connection carries every request and watch), else
        HTTP/1.1 (a connection per concurrent request); by default on unless ``$DISABLE_HTTP2`` is set to
        anything, client-go's switch.
        """
        if (client_cert_data is None) != (client_key_data is None):
            raise ValueError("client_cert_data and client_key_data go together")
        self.configuration = configuration
        self.host = configuration.host.rstrip("/")
        self.exec_plugin = exec_plugin
        self._ca_data = ca_data
        self._client_cert = f"{client_cert_data}\n{client_key_data}" if client_cert_data is not None else None
        self._tls_server_name = tls_server_name
        self.user_agent = user_agent
        self.request_counts = RequestCounts(self.host)  # rest_client_* metrics, exported while the client is open
        self._connect_timeout = connect_timeout
        self.http2 = not os.environ.get("DISABLE_HTTP2") if http2 is None else http2
        self._transport: Transport | None = None
        self._session_cert: str | None = None
        self._context: ssl.SSLContext | None = None  # the last one made: kept, so that it stays shared (tls.py)
        self._next_refresh = 0.0

    # -- construction ------------------------------------------------------------------------------------
    @classmethod
    def from_kubeconfig(cls, path: str | None = None, context: str | None = None,
                        exec_timeout: float = DEFAULT_TIMEOUT) -> "ApiClient":
        """Client for a kubeconfig file (default: ``$KUBECONFIG`` or ``~/.kube/config``) and context.

        Loaded like ``kubernetes.config.load_kube_config`` except for a user's ``exec`` credential plugin, which
        the package runs right here, synchronously and without a timeout. It runs on the first request instead,
        at most ``exec_timeout`` seconds (``client.exec_plugin.timeout`` changes it later), and a plugin that
        fails or hangs raises ``CredentialError`` there instead of leaving the client anonymous or hung.
        """
        loaded = kubeconfig.load(path, context, exec_timeout)
        return cls(loaded.configuration, exec_plugin=loaded.exec_plugin, ca_data=loaded.ca_data,
                   client_cert_data=loaded.client_cert_data, client_key_data=loaded.client_key_data)

    @classmethod
    def in_cluster(cls) -> "ApiClient":
        """Client using the pod's service account (token re-read when it rotates)."""
        return cls(kubeconfig.in_cluster())

    @classmethod
    def from_configuration(cls, configuration: Configuration) -> "ApiClient":
        """Client for an already loaded ``kubernetes.client.Configuration`` (or a ``ClientConfig``)."""
        return cls(configuration)

    # -- session -----------------------------------------------------------------------------------------
    def _ssl(self, alpn: tuple[str, ...] = ()) -> ssl.SSLContext | bool:
        c = self.configuration
        if not self.host.startswith("https"):
            return False
        credential = self.exec_plugin.current if self.exec_plugin is not None else None
        # A client certificate from the exec plugin wins over the kubeconfig's, as in the kubernetes package.
        self._session_cert = credential.client_cert if credential is not None else None
        self._context = tls.client_context(
            cafile=c.ssl_ca_cert, cadata=self._ca_data,
            client_cert=self._session_cert if self._session_cert is not None else self._client_cert,
            cert_file=c.cert_file, key_file=c.key_file,
            verify=c.verify_ssl,  # False only when the kubeconfig says insecure-skip-tls-verify
            alpn=alpn)
        return self._context

    def _get_transport(self) -> Transport:
        if self._transport is None:
            def http1() -> Transport:
                return Http1Transport(self.host, self._ssl(), self._tls_server_name, self._connect_timeout,
                                      self.user_agent)

            if self.http2 and self.host.startswith("https"):
                self._transport = Http2Transport(self.host, self._h2_context, self._tls_server_name,
                                                 self._connect_timeout, self.user_agent, http1)
            else:
                self._transport = http1()
        return self._transport

    def _h2_context(self) -> ssl.SSLContext:
        context = self._ssl(tls.H2_ALPN)
        assert isinstance(context, ssl.SSLContext)
        return context

    def tls_context(self) -> ssl.SSLContext | None:
        """The TLS context of this client's next connection (None for an ``http://`` server).

        One context per distinct CA and credential set in the process, shared by every client that has the same
        (``informers.tls``). Raises ``ssl.SSLError`` when the CA or the client certificate is unusable: a caller
        may check a configuration this way before connecting.
        """
        context = self._ssl(tls.H2_ALPN if self.http2 else ())
        return context if isinstance(context, ssl.SSLContext) else None

    @property
    def connections(self) -> int:
        """TCP connections this client has open to its server (busy or idle)."""
        return self._transport.connections if self._transport is not None else 0

    @property
    def closed(self) -> bool:
        """No connection is open and none will be until the next request."""
        return self._transport is None

    async def close(self) -> None:
        """Close the session and every pooled connection; its ``rest_client_*`` series leave the metrics."""
        untrack(self.request_counts)
        if self._transport is not None:
            transport, self._transport = self._transport, None
            await transport.close()

    def fenced(self, valid: Callable[[], bool], what: str = "the leadership term",
               remaining: Callable[[], float] | None = None) -> "ApiClient":
        """A view of this client (same session) that refuses every write once ``valid()`` is False.

        The check is local and runs before the request is handed to the connection pool, after any credential
        refresh, and again right before the request is written on the connection it got; ``remaining()`` (seconds the fence still holds, if known) bounds getting a connection,
        so a write is not left waiting for a TCP or TLS handshake past the end of the term. Reads are not
        fenced. ``close()`` on the view does nothing: this client owns the connections.
        """
        return _FencedClient(self, valid, what, remaining)

    async def __aenter__(self) -> "ApiClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _headers(self) -> dict[str, str]:
        if self.exec_plugin is not None:
            return {"Accept": _JSON, **await self._exec_headers(self.exec_plugin)}
        c = self.configuration
        if c.refresh_api_key_hook is not None and time.monotonic() >= self._next_refresh:
            # The hook re-reads the in-cluster token file, refreshes an auth-provider token (network), or, in a
            # configuration loaded by kubernetes.config itself (from_configuration), runs an exec plugin: keep it
            # off the event loop, and ask at most every few seconds (it only does work when the credential is
            # about to expire).
            self._next_refresh = time.monotonic() + _REFRESH_EVERY
            await asyncio.to_thread(c.refresh_api_key_hook, c)
        headers = {"Accept": _JSON}
        key = c.api_key.get("authorization") or c.api_key.get("BearerToken")
        if key:
            prefix = c.api_key_prefix.get("authorization")
            headers["Authorization"] = f"{prefix} {key}" if prefix else key
        elif c.username:
            # RFC 7617 with latin-1, as aiohttp's (deprecated) BasicAuth encoded it.
            pair = f"{c.username}:{c.password or ''}".encode("latin-1")
            headers["Authorization"] = "Basic " + base64.b64encode(pair).decode("ascii")
        return headers

    async def _exec_headers(self, plugin: ExecPlugin, rejected: Credential | None = None) -> dict[str, str]:
        """The Authorization header of the exec plugin's credential, running the plugin if needed.

        A new client certificate only takes effect on new connections, so the session is replaced when it
        changes; requests still on the old session fail and are retried by their callers (client-go, too,
        closes every connection when an exec certificate rotates).
        """
        credential = await plugin.get(rejected)
        if self._transport is not None and credential.client_cert != self._session_cert:
            old, self._transport = self._transport, None
            await old.close()
        return {"Authorization": f"Bearer {credential.token}"} if credential.token else {}

    @asynccontextmanager
    async def _send(self, method: str, path: str, headers: dict[str, str], guard: Callable[[], None] | None,
                    **kwargs: Any) -> AsyncIterator[Response]:
        """``_counted``, sent once more with a new exec credential when the server answers 401 to one; traced by the
        context's ``request_tracer`` (``request_tracing.py``) as one span, whatever the resends.

        client-go re-runs the plugin on 401 and fails the request; sending it again (a 401 means the server did
        nothing) spares the caller an error when a token is revoked or rotated before its expiry. Only once:
        a fresh credential that is rejected too makes the request fail with the 401.
        """
        plugin = self.exec_plugin
        used = plugin.current if plugin is not None else None
        if guard is not None:
            guard()  # early: a closed fence does not wait for a connection (the transport checks again, last)
        span = request_tracer.get().start(self.host, method, path, kwargs["params"], headers)
        try:
            async with self._counted(method, path, headers, guard, kwargs) as resp:
                span.answered(resp.status)
                if resp.status != 401 or plugin is None:
                    yield resp
                    span.end(None)
                    return
            fresh = {k: v for k, v in headers.items() if k != "Authorization"} | await self._exec_headers(plugin, used)
            if guard is not None:
                guard()
            span.resent()
            async with self._counted(method, path, fresh, guard, kwargs) as resp:
                span.answered(resp.status)
                yield resp
        except BaseException as e:
            span.end(e)
            raise
        span.end(None)

    @asynccontextmanager
    async def _counted(self, method: str, path: str, headers: dict[str, str], guard: Callable[[], None] | None,
                       kwargs: dict[str, Any]) -> AsyncIterator[Response]:
        """The transport's request, counted in ``request_counts`` once its headers came (or it got no answer);
        the transport calls ``guard()`` at the last moment before the request is written."""
        counts = self.request_counts
        counts.server(self.host)  # a test or a proxy may point the client elsewhere after it was made
        track(counts)
        started = time.monotonic()
        try:
            async with self._get_transport().request(method, path, headers, guard=guard, **kwargs) as resp:
                counts.observe(method, resp.status, started)
                started = 0.0
                yield resp
        except CONNECTION_ERRORS:
            if started:
                counts.observe(method, NO_ANSWER, started)
            raise

    # -- requests ----------------------------------------------------------------------------------------
    async def request(
        self, method: str, path: str, params: Mapping[str, str] | None = None, body: Any = None,
        headers: Mapping[str, str] | None = None, timeout: float | None = 60.0,
    ) -> Any:
        """Send one request and return the decoded JSON body; raise ApiError on an HTTP error."""
        raw = await self.request_bytes(method, path, params, body, headers, timeout)
        return orjson.loads(raw) if raw else None

    async def request_text(self, path: str, params: Mapping[str, str] | None = None) -> str:
        """GET a non-JSON document (``/metrics``, ``/version`` text) as a string."""
        raw = await self.request_bytes("GET", path, params, headers={"Accept": "text/plain"})
        return raw.decode()

    async def request_bytes(
        self, method: str, path: str, params: Mapping[str, str] | None = None, body: Any = None,
        headers: Mapping[str, str] | None = None, timeout: float | None = 60.0,
    ) -> bytes:
        """Send one request and return the raw body; raise ApiError on an HTTP error."""
        return await self._request_bytes(method, path, params, body, headers, timeout)

    async def _request_bytes(
        self, method: str, path: str, params: Mapping[str, str] | None = None, body: Any = None,
        headers: Mapping[str, str] | None = None, timeout: float | None = 60.0, guard: Callable[[], None] | None = None,
        connect_within: float | None = None,
    ) -> bytes:
        """``request_bytes``, calling ``guard()`` (which may raise) before the request is handed to the transport,
        after any credential refresh, and again in the transport once a connection (an HTTP/2 stream slot) is
        got, right before the request is written: a fence that closes while the request waits sends nothing."""
        hdrs = await self._headers()
        if headers:
            hdrs.update(headers)
        data = None
        if body is not None:
            data = orjson.dumps(body)
            hdrs.setdefault("Content-Type", "application/merge-patch+json" if method == "PATCH" else _JSON)
        async with self._noting_answers(self._send(
            method, path, hdrs, guard, params=params, body=data, total=timeout, read_idle=None,
            connect_within=connect_within,
        )) as resp:
            raw = await resp.read()
            if resp.status >= 400:
                raise _error(resp, raw)
            return raw

    @asynccontextmanager
    async def stream(
        self, path: str, params: Mapping[str, str], inactivity_timeout: float | None = None, *,
        headers: Mapping[str, str] | None = None,
    ) -> AsyncIterator[AsyncIterator[dict[str, Any]]]:
        """Open a watch and yield an async iterator of decoded watch events.

        ``inactivity_timeout`` bounds the silence between two reads: a half-open stream raises TimeoutError
        instead of hanging forever. ``headers`` are added to (or replace) the client's own, as in ``request``.
        """
        hdrs = await self._headers()
        if headers:
            hdrs.update(headers)
        async with self._noting_answers(self._send(
            "GET", path, hdrs, None, params=params, body=None, total=None, read_idle=inactivity_timeout,
            connect_within=None,
        )) as resp:
            if resp.status >= 400:
                raise _error(resp, await resp.read())
            yield _events(resp)

    # -- "the server answered again" ---------------------------------------------------------------------
    # Class-level defaults, shadowed per instance by the first change.
    _errors = 0  # requests failed with a CONNECTION_ERRORS so far
    _answered_past = 0  # the most such failures a request had come after when it was sent, among the answered
    _recoveries = 0
    _answered: asyncio.Event | None = None  # set and dropped on each recovery; created by the first waiter

    @property
    def recoveries(self) -> int:
        """How many times a request sent after a connection error (later than any answered before) succeeded."""
        return self._recoveries

    @property
    def connection_errors(self) -> int:
        """How many requests have failed with a connection error so far."""
        return self._errors

    def went_away(self) -> None:
        """The server said it is shutting down (its 503 during a graceful termination): counted as a connection
        error, so that the next answer to a request sent after it is the server answering again, although no
        connection was refused in between (a restart quicker than the retries)."""
        self._errors += 1

    async def answered_again(self, since: int) -> None:
        """Return once ``recoveries`` exceeds ``since`` (at once if it already does).

        Lets a caller that backs off after a connection error retry as soon as any request of this client,
        its own or another's, succeeds: read ``recoveries`` before the request that failed, then wait for this
        or the backoff, whichever comes first.
        """
        await self._wait_answer(lambda: self._recoveries > since)

    async def answered_after(self, errors: int) -> None:
        """Return once a request sent after the first ``errors`` connection errors has succeeded (at once if one
        has): read ``connection_errors`` after a failure, then this waits for the server to answer since."""
        await self._wait_answer(lambda: self._answered_past >= errors)

    async def _wait_answer(self, done: Callable[[], bool]) -> None:
        while not done():
            if self._answered is None:
                self._answered = asyncio.Event()
            await self._answered.wait()

    @asynccontextmanager
    async def _noting_answers(
        self, sending: AbstractAsyncContextManager[Response]
    ) -> AsyncIterator[Response]:
        """``sending``'s response; notes a connection error, or a success that answers past the last one.

        Only a success counts as the server answering again: a server still starting answers 403, 429 or 503
        to some requests, and a proxy in front of one that is down answers 502 or 503. And only the success
        of a request sent after the connection errors: a server shutting down still answers the requests it
        had (after a GOAWAY) while every new one is refused, which says nothing about it being back.
        """
        errors = self._errors
        try:
            async with sending as resp:
                if resp.status < 300 and errors > self._answered_past:
                    self._answered_past = errors
                    self._recoveries += 1
                    if self._answered is not None:
                        self._answered.set()
                        self._answered = None
                yield resp
        except CONNECTION_ERRORS:
            self._errors += 1
            raise


class _FencedClient(ApiClient):
    """``ApiClient.fenced``: writes go through ``inner`` only while the fence holds."""

    def __init__(self, inner: ApiClient, valid: Callable[[], bool], what: str,
                 remaining: Callable[[], float] | None) -> None:
        super().__init__(inner.configuration, inner._connect_timeout)
        self._inner, self._valid, self._what, self._remaining = inner, valid, what, remaining

    def fenced(self, valid: Callable[[], bool], what: str = "the leadership term",
               remaining: Callable[[], float] | None = None) -> ApiClient:
        # Both fences hold, over the one client that owns the connections.
        outer, outer_remaining = self._valid, self._remaining
        bound = [r for r in (outer_remaining, remaining) if r is not None]
        return _FencedClient(self._inner, lambda: outer() and valid(), what,
                             (lambda: min(r() for r in bound)) if bound else None)

    async def request_bytes(
        self, method: str, path: str, params: Mapping[str, str] | None = None, body: Any = None,
        headers: Mapping[str, str] | None = None, timeout: float | None = 60.0,
    ) -> bytes:
        if method.upper() in _READ_METHODS:
            return await self._inner.request_bytes(method, path, params, body, headers, timeout)

        def guard() -> None:
            if not self._valid():
                raise FenceError(f"{method} {path} refused: {self._what} has ended")

        guard()  # fail fast, before any credential refresh
        left = self._remaining() if self._remaining is not None else math.inf
        within = max(0.001, left) if left != math.inf else None
        return await self._inner._request_bytes(method, path, params, body, headers, timeout, guard, within)

    def stream(self, path: str, params: Mapping[str, str],
               inactivity_timeout: float | None = None, *, headers: Mapping[str, str] | None = None) -> Any:
        return self._inner.stream(path, params, inactivity_timeout, headers=headers)

    @property
    def recoveries(self) -> int:
        return self._inner.recoveries

    @property
    def connection_errors(self) -> int:
        return self._inner.connection_errors

    def went_away(self) -> None:
        self._inner.went_away()

    @property
    def connections(self) -> int:
        return self._inner.connections

    @property
    def closed(self) -> bool:
        return self._inner.closed

    async def answered_again(self, since: int) -> None:
        await self._inner.answered_again(since)

    async def answered_after(self, errors: int) -> None:
        await self._inner.answered_after(errors)

    async def close(self) -> None:
        return None


async def _events(resp: Response) -> AsyncIterator[dict[str, Any]]:
    # Splitting lines ourselves: objects can be megabytes, and one chunk may hold many events.
    pending: list[bytes] = []
    loads = orjson.loads
    readany = resp.readany
    while True:
        chunk = await readany()
        if not chunk:
            return
        view = memoryview(chunk)
        line: bytes | memoryview = b""
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            if pending:
                pending.append(chunk[start:end])
                line = b"".join(pending)
                pending.clear()
            else:
                line = view[start:end]
            if len(line):
                yield loads(line)
            start = end + 1
        if start < len(chunk):
            pending.append(chunk[start:])
        # Not held while the next chunk is awaited (a watch may then be quiet for minutes): a watch-list's initial
        # events arrive in chunks of up to a flow-control window, one per watch.
        del chunk, view, line


def _error(resp: Response, raw: bytes) -> ApiError:
    retry_after = None
    if (value := resp.header("Retry-After")) is not None:
        try:
            retry_after = float(value)
        except ValueError:
            pass
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        body = None
    if isinstance(body, dict) and body.get("kind") == "Status":
        return ApiError.from_status(body, resp.status, retry_after)
    return ApiError.for_status_code(resp.status, resp.reason or "", raw[:200].decode(errors="replace"), None,
                                    retry_after)
