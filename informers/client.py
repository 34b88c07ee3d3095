"""ApiClient: an asyncio HTTP client for the Kubernetes API, configured by the ``kubernetes`` package.

Configuration (kubeconfig with context selection, in-cluster service account, exec/token credentials and
their refresh, client certificates, CA) is read by ``kubernetes.config``; requests go through one aiohttp
session. Responses are decoded once with orjson into plain dicts.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Mapping

import aiohttp
import kubernetes
import orjson

from .errors import ApiError

_JSON = "application/json"
_REFRESH_EVERY = 5.0


class ApiClient:
    """Async client of one API server; create with ``from_kubeconfig``, ``in_cluster`` or ``from_configuration``.

    Use as an async context manager or call ``close()``: it owns the HTTP session and its connections.
    """

    def __init__(self, configuration: kubernetes.client.Configuration, connect_timeout: float = 10.0) -> None:
        self.configuration = configuration
        self.host = configuration.host.rstrip("/")
        self._connect_timeout = connect_timeout
        self._session: aiohttp.ClientSession | None = None
        self._next_refresh = 0.0

    # -- construction ------------------------------------------------------------------------------------
    @classmethod
    def from_kubeconfig(cls, path: str | None = None, context: str | None = None) -> "ApiClient":
        """Client for a kubeconfig file (default: ``$KUBECONFIG`` or ``~/.kube/config``) and context."""
        config = kubernetes.client.Configuration()
        kubernetes.config.load_kube_config(config_file=path, context=context, client_configuration=config)  # type: ignore[no-untyped-call]
        return cls(config)

    @classmethod
    def in_cluster(cls) -> "ApiClient":
        """Client using the pod's service account (token re-read when it rotates)."""
        config = kubernetes.client.Configuration()
        kubernetes.config.load_incluster_config(client_configuration=config)  # type: ignore[no-untyped-call]
        return cls(config)

    @classmethod
    def from_configuration(cls, configuration: kubernetes.client.Configuration) -> "ApiClient":
        """Client for an already loaded ``kubernetes.client.Configuration``."""
        return cls(configuration)

    # -- session -----------------------------------------------------------------------------------------
    def _ssl(self) -> ssl.SSLContext | bool:
        c = self.configuration
        if not self.host.startswith("https"):
            return False
        ctx = ssl.create_default_context(cafile=c.ssl_ca_cert) if c.ssl_ca_cert else ssl.create_default_context()
        if c.cert_file:
            ctx.load_cert_chain(c.cert_file, c.key_file)
        if not c.verify_ssl:
            # Only when the kubeconfig says insecure-skip-tls-verify.
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        return ctx

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(ssl=self._ssl(), limit=0, enable_cleanup_closed=True)
            self._session = aiohttp.ClientSession(
                connector=connector, json_serialize=lambda o: orjson.dumps(o).decode(),
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self._connect_timeout),
                auto_decompress=True,
            )
        return self._session

    async def close(self) -> None:
        """Close the session and every pooled connection."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> "ApiClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _headers(self) -> dict[str, str]:
        c = self.configuration
        if c.refresh_api_key_hook is not None and time.monotonic() >= self._next_refresh:
            # The hook may run an exec credential plugin (a subprocess): keep it off the event loop, and ask
            # at most every few seconds (it only does work when the credential is about to expire).
            self._next_refresh = time.monotonic() + _REFRESH_EVERY
            await asyncio.to_thread(c.refresh_api_key_hook, c)
        headers = {"Accept": _JSON}
        key = c.api_key.get("authorization") or c.api_key.get("BearerToken")
        if key:
            prefix = c.api_key_prefix.get("authorization")
            headers["Authorization"] = f"{prefix} {key}" if prefix else key
        elif c.username:
            headers["Authorization"] = aiohttp.BasicAuth(c.username, c.password or "").encode()
        return headers

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
        hdrs = await self._headers()
        if headers:
            hdrs.update(headers)
        data = None
        if body is not None:
            data = orjson.dumps(body)
            hdrs.setdefault("Content-Type", "application/merge-patch+json" if method == "PATCH" else _JSON)
        session = self._get_session()
        async with session.request(
            method, self.host + path, params=params, data=data, headers=hdrs,
            timeout=aiohttp.ClientTimeout(total=timeout, sock_connect=self._connect_timeout),
        ) as resp:
            raw = await resp.read()
            if resp.status >= 400:
                raise _error(resp, raw)
            return raw

    @asynccontextmanager
    async def stream(
        self, path: str, params: Mapping[str, str], inactivity_timeout: float | None = None
    ) -> AsyncIterator[AsyncIterator[dict[str, Any]]]:
        """Open a watch and yield an async iterator of decoded watch events.

        ``inactivity_timeout`` bounds the silence between two reads: a half-open stream raises TimeoutError
        instead of hanging forever.
        """
        hdrs = await self._headers()
        session = self._get_session()
        async with session.get(
            self.host + path, params=params, headers=hdrs,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=self._connect_timeout,
                                          sock_read=inactivity_timeout),
        ) as resp:
            if resp.status >= 400:
                raise _error(resp, await resp.read())
            yield _events(resp.content)


async def _events(content: aiohttp.StreamReader) -> AsyncIterator[dict[str, Any]]:
    # Splitting lines ourselves: aiohttp's readline caps line length, and objects can be megabytes.
    pending: list[bytes] = []
    loads = orjson.loads
    while True:
        chunk = await content.readany()
        if not chunk:
            return
        view = memoryview(chunk)
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            if pending:
                pending.append(chunk[start:end])
                line: bytes | memoryview = b"".join(pending)
                pending.clear()
            else:
                line = view[start:end]
            if len(line):
                yield loads(line)
            start = end + 1
        if start < len(chunk):
            pending.append(chunk[start:])


def _error(resp: aiohttp.ClientResponse, raw: bytes) -> ApiError:
    retry_after = None
    if "Retry-After" in resp.headers:
        try:
            retry_after = float(resp.headers["Retry-After"])
        except ValueError:
            pass
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        body = None
    if isinstance(body, dict) and body.get("kind") == "Status":
        return ApiError.from_status(body, resp.status, retry_after)
    return ApiError(resp.status, resp.reason or "", raw[:200].decode(errors="replace"), None, retry_after)
