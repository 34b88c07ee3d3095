"""TLS with the handshake on a worker thread, against the real apiserver: what ``create_connection(ssl=...)`` did."""

from __future__ import annotations

import asyncio
import ssl
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlsplit

import pytest

from informers import tls
from informers.tls_transport import connect_tls

from tests.tls import CA, client_context, pem


class _Collect(asyncio.Protocol):
    def __init__(self) -> None:
        self.data = b""
        self.lost: asyncio.Future[Exception | None] = asyncio.get_running_loop().create_future()

    def data_received(self, data: bytes) -> None:
        self.data += data

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost.set_result(exc)


class _RecordingExecutor(ThreadPoolExecutor):
    """Records the threads that ran its work; ``after_last_step()`` runs on the worker once a handshake
    step has completed the handshake."""

    def __init__(self, after_last_step: Callable[[], None] = lambda: None) -> None:
        super().__init__(max_workers=2)
        self.threads: set[int] = set()
        self.after_last_step = after_last_step

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        def run() -> Any:
            self.threads.add(threading.get_ident())
            result = fn(*args, **kwargs)
            if result is True:
                self.after_last_step()
            return result
        return super().submit(run)


def _server_context(tmp_path: Path, ca: CA) -> ssl.SSLContext:
    cert, key = ca.issue("server")
    (tmp_path / "tls.crt").write_bytes(cert)
    (tmp_path / "tls.key").write_bytes(key)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    # TLS 1.2: the server's Finished is the client's last handshake message, and the server may send data
    # and close right behind it, while the client's last step still runs.
    context.maximum_version = ssl.TLSVersion.TLSv1_2
    return context


def _address(control_plane: Any) -> tuple[str, int]:
    url = urlsplit(control_plane.url)
    assert url.hostname is not None and url.port is not None
    return url.hostname, url.port


async def test_the_handshake_runs_on_a_worker_and_the_connection_carries_both_ways(control_plane) -> None:
    loop = asyncio.get_running_loop()
    executor = _RecordingExecutor()
    loop.set_default_executor(executor)
    host, port = _address(control_plane)
    context = tls.client_context(cafile=str(control_plane.ca_file), alpn=("http/1.1",))
    transport, protocol = await connect_tls(_Collect, host, port, context, None)
    assert executor.threads and threading.get_ident() not in executor.threads
    assert transport.get_extra_info("ssl_object").selected_alpn_protocol() == "http/1.1"
    assert transport.get_extra_info("peercert")["subject"]
    transport.write(f"GET /version HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {control_plane.admin_token}\r\n"
                    "Connection: close\r\n\r\n".encode())
    # The server answers, then closes (close_notify and FIN): the protocol hears of both, as over asyncio's TLS.
    assert await asyncio.wait_for(protocol.lost, 10) is None
    assert protocol.data.startswith(b"HTTP/1.1 200") and b'"gitVersion"' in protocol.data
    assert transport.is_closing()


async def test_a_server_certificate_the_context_does_not_trust_fails_the_connect(control_plane) -> None:
    host, port = _address(control_plane)
    untrusting = ssl.create_default_context(cadata=_OTHER_CA)
    with pytest.raises(ssl.SSLCertVerificationError):
        await connect_tls(_Collect, host, port, untrusting, None)
    # The name is checked too: the apiserver's certificate does not name this one.
    context = tls.client_context(cafile=str(control_plane.ca_file))
    with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch|doesn't match|IP address mismatch"):
        await connect_tls(_Collect, host, port, context, "not-the-apiserver.example")


async def test_a_connect_cancelled_during_the_handshake_closes_the_connection() -> None:
    closed = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()  # the ClientHello, never answered; then the client's close
        closed.set()
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.5):
                await connect_tls(_Collect, "127.0.0.1", port, ssl.create_default_context(), "localhost")
        await asyncio.wait_for(closed.wait(), 5)
    finally:
        server.close()
        await server.wait_closed()


async def test_a_server_that_closes_during_the_handshake_fails_the_connect() -> None:
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1)
        writer.close()

    server = await asyncio.start_server(hang_up, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        with pytest.raises((ConnectionError, ssl.SSLError)):
            await asyncio.wait_for(connect_tls(_Collect, "127.0.0.1", port, ssl.create_default_context(),
                                               "localhost"), 5)
    finally:
        server.close()
        await server.wait_closed()


async def test_a_server_that_answers_and_closes_behind_its_last_handshake_message_is_heard_whole(tmp_path) -> None:
    # The data and the close arrive while the client's last handshake step runs on the worker (held there by
    # 0.2 s): the connect succeeds, then the protocol gets the data and the loss, as over asyncio's own TLS.
    loop = asyncio.get_running_loop()
    loop.set_default_executor(_RecordingExecutor(after_last_step=lambda: time.sleep(0.2)))
    ca = CA.new()

    async def answer_and_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"hello")
        await asyncio.sleep(0.05)
        writer.transport.abort()  # no TLS shutdown: the TCP connection ends at once

    server = await asyncio.start_server(answer_and_close, "127.0.0.1", 0, ssl=_server_context(tmp_path, ca))
    port = server.sockets[0].getsockname()[1]
    try:
        _, protocol = await connect_tls(_Collect, "127.0.0.1", port, client_context(pem(ca.cert)), None)
        await asyncio.wait_for(protocol.lost, 5)
        assert protocol.data == b"hello"
    finally:
        server.close()
        await server.wait_closed()


async def test_a_connect_cancelled_as_its_handshake_completes_leaves_nothing_behind(tmp_path) -> None:
    loop = asyncio.get_running_loop()
    errors: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _, context: errors.append(context))
    connecting: asyncio.Task[Any] | None = None

    def cancel_the_connect() -> None:
        assert connecting is not None
        loop.call_soon_threadsafe(connecting.cancel)

    loop.set_default_executor(_RecordingExecutor(after_last_step=cancel_the_connect))
    ca = CA.new()
    closed = asyncio.Event()

    async def wait_for_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read()
        closed.set()
        writer.close()

    server = await asyncio.start_server(wait_for_close, "127.0.0.1", 0, ssl=_server_context(tmp_path, ca))
    port = server.sockets[0].getsockname()[1]
    try:
        connecting = asyncio.create_task(connect_tls(_Collect, "127.0.0.1", port, client_context(pem(ca.cert)),
                                                     None))
        with pytest.raises(asyncio.CancelledError):
            await connecting
        await asyncio.wait_for(closed.wait(), 5)
        await asyncio.sleep(0.1)
        assert errors == []
    finally:
        server.close()
        await server.wait_closed()


# A self-signed CA that signed nothing the apiserver presents.
_OTHER_CA = """-----BEGIN CERTIFICATE-----
MIIBlDCCATugAwIBAgIUaYRVM5KBHvQcN8mmJhmI8VPKo1AwCgYIKoZIzj0EAwIw
HzEdMBsGA1UEAwwUbm90LXRoZS1hcGlzZXJ2ZXItY2EwIBcNMjYxMjA3MTgzODQ5
WhgPMjEyNjExMTMxODM4NDlaMB8xHTAbBgNVBAMMFG5vdC10aGUtYXBpc2VydmVy
LWNhMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAEGP5yy6F5ZVBmghMVZa3YMZJb
sZU4AuXfT7UEr7S6y3S8q3OcmOoNcpiMYZApaFjfuY/ooYqkmk9BKKr2n1AFIaNT
MFEwHQYDVR0OBBYEFInh7ozxb4WgRLh5vUpMFGU3/cqeMB8GA1UdIwQYMBaAFInh
7ozxb4WgRLh5vUpMFGU3/cqeMA8GA1UdEwEB/wQFMAMBAf8wCgYIKoZIzj0EAwID
RwAwRAIgCWqwk8hHTr3IlrlRX/LHtF4lcxTmBmD824jSXivZr8ACIC8p9aNUr8O7
qa919SQqlXbSE1ah9Rj9C13B6ksaQc6z
-----END CERTIFICATE-----
"""
