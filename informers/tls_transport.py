"""TLS over a plain TCP connection, with the handshake's CPU on a worker thread instead of the event loop.

A fleet's bring-up is hundreds of TLS handshakes at once, ~1 ms of OpenSSL work each (key exchange, certificate
decoding and verification), and the loop's own TLS layer (asyncio's or uvloop's) runs them on the loop: one core
does the handshakes and everything else while the other waits. Here each handshake step (the ClientHello's key
share included) is run by the loop's default executor; ``ssl`` releases the GIL inside OpenSSL, so handshakes use
the other core while the loop serves the members already up. Go's ``crypto/tls`` runs each handshake on its
connection's goroutine, so client-go's spread over the cores the same way.

After the handshake the TLS records are read and written on the loop through an ``ssl.SSLObject``, as the loops'
own layers do. Decrypted data is read in pieces the size of what arrived, so a connection keeps no fixed read
buffer (uvloop's layer keeps 256 KiB a connection once a burst has filled it).
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any, Callable, TypeVar

_P = TypeVar("_P", bound=asyncio.Protocol)
_READ_SIZE = 1 << 16  # more than a record holds; small enough for malloc to serve from its heap


async def connect_tls(protocol_factory: Callable[[], _P], host: str, port: int, context: ssl.SSLContext,
                      server_hostname: str | None) -> tuple[asyncio.Transport, _P]:
    """Open a TCP connection to ``host:port``, complete the TLS handshake (the server checked as ``context`` says,
    by ``server_hostname`` or else ``host``), then hand the decrypted connection to a new protocol, as
    ``loop.create_connection(..., ssl=context)`` does. A failed handshake raises its ``ssl.SSLError``; cancelling
    closes the connection."""
    loop = asyncio.get_running_loop()
    tcp, layer = await loop.create_connection(lambda: _TLSTransport(context, server_hostname or host), host, port)
    try:
        await layer.handshaken
    except BaseException:
        tcp.abort()
        raise
    protocol = protocol_factory()
    layer.attach(protocol)
    return layer, protocol


class _TLSTransport(asyncio.Transport, asyncio.Protocol):
    """The TCP connection's protocol (records in and out) and the decrypted transport its user's protocol sees."""

    def __init__(self, context: ssl.SSLContext, server_hostname: str) -> None:
        super().__init__()
        self._incoming = ssl.MemoryBIO()
        self._outgoing = ssl.MemoryBIO()
        self._ssl = context.wrap_bio(self._incoming, self._outgoing, server_hostname=server_hostname)
        self._loop = asyncio.get_running_loop()
        self.handshaken: asyncio.Future[None] = self._loop.create_future()
        self._tcp: asyncio.Transport | None = None
        self._app: asyncio.Protocol | None = None
        self._in_thread = False  # a handshake step runs on a worker: the SSLObject and its BIOs are its alone
        self._held: list[bytes] = []  # records that arrived meanwhile
        self._closing = False  # closed by its user, or a TLS error
        self._lost = False  # the TCP connection is gone; what arrived before is still delivered
        self._lost_exc: Exception | None = None
        self._error: Exception | None = None

    # -- the TCP side --------------------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._tcp = transport  # type: ignore[assignment]  # uvloop's are not asyncio.Transport instances
        self._step()  # the ClientHello

    def data_received(self, data: bytes) -> None:
        if self._in_thread:
            self._held.append(data)
            return
        self._incoming.write(data)
        if self._app is not None:
            self._read()
        elif not self.handshaken.done():
            self._step()

    def eof_received(self) -> bool | None:
        return False  # the TCP transport closes; connection_lost says so

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost, self._lost_exc = True, exc
        if self._app is not None:
            self._app.connection_lost(exc if exc is not None else self._error)
        elif not self.handshaken.done() and not self._in_thread:  # else the step decides: it may complete
            self._handshake_failed(exc or _cut_short())

    def pause_writing(self) -> None:
        if self._app is not None:
            self._app.pause_writing()

    def resume_writing(self) -> None:
        if self._app is not None:
            self._app.resume_writing()

    # -- the handshake -------------------------------------------------------------------------------------
    def _step(self) -> None:
        try:
            step = self._loop.run_in_executor(None, self._handshake_step)
        except RuntimeError as e:  # the executor is shut down: the loop is closing
            self._handshake_failed(e)
            return
        self._in_thread = True
        step.add_done_callback(self._handshake_stepped)

    def _handshake_step(self) -> bool:
        try:
            self._ssl.do_handshake()
        except ssl.SSLWantReadError:
            return False
        return True

    def _handshake_stepped(self, step: asyncio.Future[bool]) -> None:
        self._in_thread = False
        error = None if step.cancelled() else step.exception()
        if self.handshaken.done():  # the connect was cancelled
            return
        self._send_records()  # the next handshake message, or the alert that tells the server why
        if error is not None:
            self._handshake_failed(error)
            return
        held, self._held = self._held, []
        for data in held:
            self._incoming.write(data)
        if step.result():
            self.handshaken.set_result(None)  # what came after the handshake is read once attached
        elif self._incoming.pending:
            self._step()
        elif self._lost:
            self._handshake_failed(self._lost_exc or _cut_short())

    def _handshake_failed(self, error: BaseException) -> None:
        if not self.handshaken.done():
            self.handshaken.set_exception(error)
            self.handshaken.exception()  # retrieved: a cancelled connect no longer awaits it
        if self._tcp is not None:
            self._tcp.close()

    def attach(self, app: asyncio.Protocol) -> None:
        """Hand the open connection to ``app``, then give it what already arrived after the handshake, and the
        connection's loss if it came meanwhile."""
        self._app = app
        app.connection_made(self)
        if self._incoming.pending:
            self._read()
        if self._lost:
            app.connection_lost(self._lost_exc if self._lost_exc is not None else self._error)

    # -- records ---------------------------------------------------------------------------------------------
    def _read(self) -> None:
        # SSL_read gives one record (16 KiB at most) a call: the records that arrived together are handed on
        # together, so a large HTTP/2 frame is not put together from 16 KiB pieces.
        app = self._app
        assert app is not None
        chunks: list[bytes] = []
        closed = False
        while True:
            try:
                chunk = self._ssl.read(_READ_SIZE)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:  # the server's close_notify, after ours
                closed = True
                break
            except ssl.SSLError as e:
                self._fatal(e)
                return
            if not chunk:  # the server's close_notify
                closed = True
                break
            chunks.append(chunk)
            if not self._incoming.pending and not self._ssl.pending():
                break  # nothing left to decrypt: spare the read that would only raise SSLWantReadError
        if chunks and not self._closing:
            app.data_received(chunks[0] if len(chunks) == 1 else b"".join(chunks))
        if closed:
            self.close()
        else:
            self._send_records()  # a TLS 1.3 KeyUpdate is answered

    def _send_records(self) -> None:
        records = self._outgoing.read()
        if records and self._tcp is not None and not self._tcp.is_closing():
            self._tcp.write(records)

    def _fatal(self, error: Exception) -> None:
        self._error = error
        self._closing = True
        if self._tcp is not None:
            self._tcp.abort()

    # -- the decrypted transport -------------------------------------------------------------------------
    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Encrypt ``data`` and send it; nothing once the transport is closing."""
        if self._closing or self._lost:
            return
        try:
            self._ssl.write(data)
        except ssl.SSLError as e:
            self._fatal(e)
            return
        self._send_records()

    def close(self) -> None:
        """Send close_notify and close the TCP connection once what is buffered is sent."""
        if self._closing:
            return
        self._closing = True
        if not self._lost:
            try:
                self._ssl.unwrap()
            except ssl.SSLError:
                pass  # close_notify is written; the server's is not awaited
            self._send_records()
        if self._tcp is not None:
            self._tcp.close()

    def is_closing(self) -> bool:
        """Closing or closed."""
        return self._closing or self._lost or self._tcp is None or self._tcp.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        """``ssl_object`` and ``peercert`` from TLS; the rest (``peername``, ...) from the TCP transport."""
        if name == "ssl_object":
            return self._ssl
        if name == "peercert":
            return self._ssl.getpeercert()
        return self._tcp.get_extra_info(name, default) if self._tcp is not None else default


def _cut_short() -> ConnectionResetError:
    return ConnectionResetError("the server closed the connection during the TLS handshake")
