"""A running WebhookServer with an HTTPS client for it, for the tests of the server without an API server."""

from __future__ import annotations

import ssl
from typing import Any

import aiohttp
import orjson

from syncer.webhook.server import WebhookServer
from tests.tls import client_context


class Served:
    """A running WebhookServer and a client for it."""

    def __init__(self, server: WebhookServer, ca_pem: bytes) -> None:
        self.server, self.ca_pem = server, ca_pem
        self.url = f"https://127.0.0.1:{server.port}"

    async def post(self, path: str, body: bytes, content_type: str = "application/json",
                   context: ssl.SSLContext | None = None, query: str = "") -> tuple[int, Any]:
        connector = aiohttp.TCPConnector(ssl=context or client_context(self.ca_pem), force_close=True)
        async with aiohttp.ClientSession(connector=connector) as session:
            async with session.post(self.url + path + query, data=body,
                                    headers={"Content-Type": content_type}) as resp:
                raw = await resp.read()
                return resp.status, orjson.loads(raw) if raw.startswith(b"{") else raw.decode()
