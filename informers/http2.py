"""One HTTP/2 connection to an API server: many requests and watches multiplexed on one TLS connection.

The frames are the ``h2`` package's (a sans-I/O state machine); this module is its asyncio protocol, with the
behaviour of Go's ``http2.Transport`` as client-go configures it:

- **Stream slots.** A connection carries at most the server's ``SETTINGS_MAX_CONCURRENT_STREAMS`` (kube-apiserver:
  ``--http2-max-streams-per-connection``, Go's 250 if unset) streams; ``reserve()`` takes a slot before a request is
  sent, so the pool (``transport.py``) opens another connection instead of queueing behind a full one.
- **Flow control per stream.** A stream's window is handed back to the server only as its consumer reads, so a
  consumer that stops reading stops only its own stream (at most ``STREAM_WINDOW`` bytes buffered); the
  connection's window is much larger than all the streams' together, as Go's (4 MiB per stream, 1 GiB per
  connection).
- **Health.** After ``read_idle`` seconds without a frame from the server the connection sends a PING; no answer
  within ``ping_timeout`` closes it (client-go: 30 s and 15 s). Closing fails every stream at once with
  ``ConnectionResetError``, the connection error every caller already recovers from.
- **GOAWAY.** The connection takes no new streams; streams the server will not process (above its last stream
  id) fail at once with ``ConnectionResetError`` (safe to retry: the server did nothing), the others run to
  their end, then the connection closes.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
from http import HTTPStatus
from typing import Any, Callable, Mapping, cast

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.frame_buffer
import h2.settings
import hpack
import hpack.huffman
import hpack.huffman_constants
import hyperframe.frame

from . import hpack_decoder
from .tls_transport import connect_tls

STREAM_WINDOW = 4 << 20
CONNECTION_WINDOW = 1 << 30
_MAX_FRAME = 256 << 10
# A consumed window is handed back once this much of it is used: one WINDOW_UPDATE per quarter, not per frame.
_STREAM_REFRESH = STREAM_WINDOW // 4
_CONNECTION_REFRESH = 16 << 20
# Header fields sent as never-indexed (RFC 7541 §7.1.3): a credential is kept out of both sides' HPACK tables.
_SECRET_FIELDS = frozenset({"authorization", "proxy-authorization", "cookie"})


# h2 only reads its configuration: one for every connection.
_CONFIG = h2.config.H2Configuration(client_side=True, header_encoding=None, validate_inbound_headers=False,
                                    normalize_inbound_headers=False, validate_outbound_headers=False,
                                    normalize_outbound_headers=False)


class H2Connection(asyncio.Protocol):
    """An HTTP/2 client connection; made by ``connect()``, used through ``reserve()`` and ``request()``."""

    def __init__(self, authority: str, read_idle: float, ping_timeout: float, idle_timeout: float) -> None:
        """``authority`` is the ``:authority`` of every request (host[:port] of the server URL); a connection
        without streams for ``idle_timeout`` seconds closes."""
        # The h2 state machine (settings, HPACK tables, buffers) is made in ``connection_made``: a connect the
        # server refuses, hundreds a second from a fleet whose server is down, then costs no more than the socket.
        self._h2: _DrainingH2
        self._authority = authority.encode()
        self._read_idle = read_idle
        self._ping_timeout = ping_timeout
        self._idle_timeout = idle_timeout
        self._unused_timer: asyncio.TimerHandle | None = None
        self._transport: asyncio.Transport | None = None
        self._streams: dict[int, _Stream] = {}
        self._reserved = 0
        self._settled: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._failure: BaseException | None = None
        self._going_away = False
        self._suspect = False  # a stream went silent: no new streams until a PING is answered
        self._unacked = 0
        self._partial = b""  # the start of a frame whose end has not come yet
        self._last_read = 0.0
        self._idle_timer: asyncio.TimerHandle | None = None
        self._ping_timer: asyncio.TimerHandle | None = None
        self._writable = asyncio.Event()
        self._writable.set()
        self._flush_pending = False

    @classmethod
    async def connect(cls, host: str, port: int, context: ssl.SSLContext, server_hostname: str | None,
                   authority: str, read_idle: float, ping_timeout: float,
                   idle_timeout: float) -> "H2Connection | None":
        """Connect over TLS offering ``h2``; None (connection closed) when the server chose HTTP/1.1.

        Returns once the server's first SETTINGS arrived, so its stream limit is known before the first request.
        """
        transport, conn = await connect_tls(lambda: cls(authority, read_idle, ping_timeout, idle_timeout), host,
                                            port, context, server_hostname)
        ssl_object = transport.get_extra_info("ssl_object")
        if ssl_object is None or ssl_object.selected_alpn_protocol() != "h2":
            transport.close()
            return None
        try:
            await asyncio.wait_for(asyncio.shield(conn._settled), read_idle)
        except BaseException:
            conn.close()
            raise
        return conn

    # -- state the pool reads ---------------------------------------------------------------------------
    @property
    def open(self) -> bool:
        """The TLS connection is still open (maybe draining after a GOAWAY)."""
        return self._transport is not None

    @property
    def usable(self) -> bool:
        """Takes new streams: open, and no GOAWAY received."""
        return self._failure is None and not self._going_away and not self._suspect and self._transport is not None

    @property
    def free_slots(self) -> int:
        """Streams that may still be opened under the server's limit."""
        limit = self._h2.remote_settings.max_concurrent_streams
        return limit - len(self._streams) - self._reserved

    @property
    def active_streams(self) -> int:
        """Streams open or reserved on this connection."""
        return len(self._streams) + self._reserved

    def reserve(self) -> None:
        """Take a slot for a request about to be sent by ``request``."""
        self._reserved += 1
        if self._unused_timer is not None:
            self._unused_timer.cancel()
            self._unused_timer = None

    # -- requests -----------------------------------------------------------------------------------------
    async def request(self, method: str, path: str, headers: Mapping[str, str], body: bytes | None,
                      guard: Callable[[], None] | None = None) -> "H2Response":
        """Send a request on a slot taken by ``reserve()`` and return once its response headers came.

        ``guard()`` (which may raise, a fence's check) is called last before the HEADERS frame is made: nothing
        is awaited between it and the write, and after it would be too late (HPACK's state has moved on)."""
        self._reserved -= 1
        self._raise_if_failed()
        if self._going_away:
            raise ConnectionResetError("the server sent GOAWAY before the request was sent")
        fields = [(b":method", method.encode()), (b":scheme", b"https"), (b":authority", self._authority),
                  (b":path", path.encode())]
        for k, v in headers.items():
            name = k.lower()
            if name in _SECRET_FIELDS:
                fields.append(hpack.NeverIndexedHeaderTuple(name.encode(), v.encode()))
            elif name != "host":
                fields.append((name.encode(), v.encode()))
        if body is not None:
            fields.append((b"content-length", str(len(body)).encode()))
        if guard is not None:
            try:
                guard()
            except BaseException:
                self._close_if_drained()  # its slot is free again
                raise
        sid = self._h2.get_next_available_stream_id()
        stream = _Stream(self, sid)
        self._streams[sid] = stream
        try:
            self._h2.send_headers(sid, fields, end_stream=not body)
            if body:
                self._flush()
                await self._send_body(stream, body, guard)
            else:
                self._flush_soon()
            await self._writable.wait()
            return await stream.response()
        except BaseException:
            stream.cancel()
            raise

    async def _send_body(self, stream: _Stream, body: bytes, guard: Callable[[], None] | None) -> None:
        view = memoryview(body)
        while view:
            self._raise_if_failed()
            stream.raise_if_failed()
            window = min(self._h2.local_flow_control_window(stream.id), self._h2.max_outbound_frame_size)
            if window <= 0:
                await stream.wait_window()
                continue
            if guard is not None:
                # A body larger than the window waits between frames: a request cut short there is reset (by the
                # caller), and the server acts on no request whose body did not end.
                guard()
            chunk, view = view[:window], view[window:]
            self._h2.send_data(stream.id, bytes(chunk), end_stream=not view)
            self._flush()

    # -- asyncio.Protocol ----------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's are not asyncio.Transport instances
        self._h2 = _DrainingH2(_CONFIG)
        self._h2.local_settings = h2.settings.Settings(client=True, initial_values={
            h2.settings.SettingCodes.ENABLE_PUSH: 0,
            h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
            h2.settings.SettingCodes.MAX_FRAME_SIZE: _MAX_FRAME,
        })
        self._h2.max_inbound_frame_size = _MAX_FRAME  # h2 read it from the settings it was made with
        self._h2.initiate_connection()
        # Through h2, so its own view of the window (it counts the frames it parses) is as large as the server's.
        self._h2.increment_flow_control_window(CONNECTION_WINDOW - 65535)
        self._flush()
        loop = asyncio.get_running_loop()
        self._last_read = loop.time()
        self._idle_timer = loop.call_later(self._read_idle, self._check_idle)

    def data_received(self, data: bytes) -> None:
        # DATA frames of open streams (the bulk: list pages, watch events) are cut out here and go straight to
        # their stream; h2 parses the rest. h2's own path costs ~30 µs a frame (a state machine step, an event
        # object, an eager repr for its logger), which made one busy watch 1.3× costlier than HTTP/1.1. h2
        # never sees those frames, so their window is handed back here, outside h2 (``_window_update``).
        if self._failure is not None:
            return  # closing: what is still in flight is of no use
        self._last_read = asyncio.get_running_loop().time()
        buf = self._partial + data if self._partial else data
        streams = self._streams
        others: list[bytes] = []
        pos, end = 0, len(buf)
        while end - pos >= 9:
            frame_end = pos + 9 + ((buf[pos] << 16) | (buf[pos + 1] << 8) | buf[pos + 2])
            if frame_end > end:
                break
            # Type 0 is DATA; flags 0x1 (END_STREAM) and 0x8 (PADDED) are h2's to handle.
            if buf[pos + 3] == 0 and not buf[pos + 4] & 0x09:
                stream = streams.get(int.from_bytes(buf[pos + 5:pos + 9], "big") & 0x7FFFFFFF)
                if stream is not None:
                    if others:  # keep each stream's frames in order
                        self._receive(b"".join(others))
                        others.clear()
                        if self._failure is not None:
                            return
                    stream.feed(buf[pos + 9:frame_end], frame_end - pos - 9)
                    pos = frame_end
                    continue
            others.append(buf[pos:frame_end])
            pos = frame_end
        self._partial = buf[pos:]
        if others:
            self._receive(b"".join(others))
        self._flush()

    def _receive(self, data: bytes) -> None:
        """Frames for h2: settings, headers, last DATA of a stream, resets, PING, GOAWAY."""
        try:
            events = self._h2.receive_data(data)
        except h2.exceptions.ProtocolError as e:
            self._fail(ConnectionResetError(f"HTTP/2 protocol error from the server: {e}"))
            self._flush()
            return
        streams = self._streams
        for event in events:
            kind = type(event)
            if kind is h2.events.DataReceived:
                sid = event.stream_id  # type: ignore[attr-defined]
                stream = streams.get(sid)
                if stream is not None:
                    stream.feed(event.data, 0)  # type: ignore[attr-defined]
                # h2 counted these bytes against its windows: it hands them back itself.
                self._h2.acknowledge_received_data(event.flow_controlled_length, sid)  # type: ignore[attr-defined]
            elif kind is h2.events.ResponseReceived:
                stream = streams.get(event.stream_id)  # type: ignore[attr-defined]
                if stream is not None:
                    stream.headers(event.headers)  # type: ignore[attr-defined]
            elif kind is h2.events.StreamEnded:
                stream = streams.get(event.stream_id)  # type: ignore[attr-defined]
                if stream is not None:
                    stream.end(None)
            elif kind is h2.events.StreamReset:
                stream = streams.get(event.stream_id)  # type: ignore[attr-defined]
                if stream is not None:
                    code = h2.errors._error_code_from_int(event.error_code)  # type: ignore[attr-defined]
                    stream.end(ConnectionResetError(f"the server reset the stream ({code!s})"))
            elif kind is h2.events.WindowUpdated:
                self._window_opened(event.stream_id)  # type: ignore[attr-defined]
            elif kind is h2.events.RemoteSettingsChanged:
                _compact(self._h2.local_settings)
                _compact(self._h2.remote_settings)
                if not self._settled.done():
                    self._settled.set_result(None)
                self._window_opened(0)
            elif kind is h2.events.PingAckReceived:
                self._suspect = False
                if self._ping_timer is not None:
                    self._ping_timer.cancel()
                    self._ping_timer = None
            elif kind is h2.events.ConnectionTerminated:
                self._goaway(event.error_code, event.last_stream_id)  # type: ignore[attr-defined]

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(ConnectionResetError(f"the connection to the server was lost: {exc}" if exc else
                                        "the server closed the connection"))
        self._transport = None
        if not self._lost.done():
            self._lost.set_result(None)

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    # -- closing ----------------------------------------------------------------------------------------
    def close(self) -> None:
        """Fail every stream and close the connection (politely: GOAWAY first)."""
        if self._transport is not None and self._failure is None:
            self._h2.close_connection()
            self._flush()
        self._fail(ConnectionResetError("the client closed the connection"))

    async def wait_closed(self) -> None:
        """Return once the TLS connection is closed."""
        await asyncio.shield(self._lost)

    def _fail(self, error: BaseException) -> None:
        if self._failure is None:
            self._failure = error
        for stream in list(self._streams.values()):
            stream.end(self._failure)
        self._streams.clear()
        for timer in (self._idle_timer, self._ping_timer, self._unused_timer):
            if timer is not None:
                timer.cancel()
        self._idle_timer = self._ping_timer = self._unused_timer = None
        if not self._settled.done():
            self._settled.set_exception(self._failure)
            self._settled.exception()  # retrieved: nobody may be waiting
        self._writable.set()
        if self._transport is not None:
            self._transport.close()

    def _raise_if_failed(self) -> None:
        if self._failure is not None:
            raise ConnectionResetError(str(self._failure))

    def _goaway(self, error_code: int, last_stream_id: int) -> None:
        self._going_away = True
        if error_code != h2.errors.ErrorCodes.NO_ERROR:
            code = h2.errors._error_code_from_int(error_code)
            self._fail(ConnectionResetError(f"the server closed the connection with GOAWAY ({code!s})"))
            return
        for sid, stream in list(self._streams.items()):
            if sid > last_stream_id:
                stream.end(ConnectionResetError("the server sent GOAWAY before it processed the request"))
        self._close_if_drained()

    def _close_if_drained(self) -> None:
        if self._streams or self._reserved or self._transport is None:
            return
        if self._going_away:
            self._transport.close()
        elif self._unused_timer is None:
            self._unused_timer = asyncio.get_running_loop().call_later(self._idle_timeout, self._unused)

    def _unused(self) -> None:
        self._unused_timer = None
        if not self._streams and not self._reserved:
            self.close()

    # -- flow control and health -------------------------------------------------------------------------
    def consumed(self, n: int, stream_id: int | None = None, stream_unacked: int = 0) -> int:
        """Note ``n`` bytes of fast-path DATA read by a consumer; returns the stream's bytes not handed back yet."""
        if self._failure is not None:
            return 0
        self._unacked += n
        if self._unacked >= _CONNECTION_REFRESH:
            self._window_update(0, self._unacked)
            self._unacked = 0
        if stream_id is not None:
            stream_unacked += n
            if stream_unacked >= _STREAM_REFRESH:
                self._window_update(stream_id, stream_unacked)
                stream_unacked = 0
        return stream_unacked

    def _window_update(self, stream_id: int, increment: int) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(b"\x00\x00\x04\x08\x00" + stream_id.to_bytes(4, "big") + increment.to_bytes(4, "big"))

    def forget(self, stream: _Stream, reset: bool) -> None:
        """Drop a finished stream (``reset``: it is still open at the server, cancel it there)."""
        if self._streams.pop(stream.id, None) is None:
            return
        if reset and self._failure is None:
            try:
                self._h2.reset_stream(stream.id, h2.errors.ErrorCodes.CANCEL)
            except h2.exceptions.StreamClosedError:
                pass
            self._flush()
        self._close_if_drained()

    def _window_opened(self, stream_id: int) -> None:
        if stream_id == 0:
            for each in self._streams.values():
                each.window_opened()
        elif (stream := self._streams.get(stream_id)) is not None:
            stream.window_opened()

    def suspect(self) -> None:
        """A stream's reader timed out: check the connection with a PING now, and open no stream on it before
        the answer. Without this a half-open connection would take every retry of the stream that noticed it
        until the idle PING, up to ``read_idle + ping_timeout`` later, found it dead."""
        if self._failure is None:
            self._suspect = True
            self._ping()

    def _check_idle(self) -> None:
        loop = asyncio.get_running_loop()
        idle = loop.time() - self._last_read
        if idle < self._read_idle:
            self._idle_timer = loop.call_later(self._read_idle - idle, self._check_idle)
            return
        self._ping()
        self._idle_timer = loop.call_later(self._read_idle, self._check_idle)

    def _ping(self) -> None:
        if self._ping_timer is None:
            self._h2.ping(b"kubesync")
            self._flush()
            self._ping_timer = asyncio.get_running_loop().call_later(self._ping_timeout, self._ping_unanswered)

    def _ping_unanswered(self) -> None:
        self._ping_timer = None
        self._fail(ConnectionResetError(
            f"the server did not answer a PING within {self._ping_timeout:g} s (after {self._read_idle:g} s silent)"))

    def _flush_soon(self) -> None:
        """Flush once the loop comes round: the requests a tick makes (an informer factory starting, a member
        coming up) leave in one write, one TLS record, instead of one each. Only for requests without a body:
        a write (which a fence guards) is flushed at once, as is everything else."""
        if not self._flush_pending:
            self._flush_pending = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_pending = False
        data = self._h2.data_to_send()
        if data and self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)


class _DrainingH2(h2.connection.H2Connection):
    """h2's connection, except that a GOAWAY without an error lets the streams the server still processes end.

    h2 moves to CLOSED on any GOAWAY and refuses every later frame; RFC 9113 §6.8 lets streams up to the last
    stream id complete, and kube-apiserver relies on it: it answers a failed authentication over HTTP/2 with
    the 401 *and* a GOAWAY (so a client with a bad credential cannot keep the connection), and a graceful
    shutdown sends GOAWAY before its open watches end. Its HPACK encoder is ``_Encoder`` and its decoder
    ``hpack_decoder.Decoder``.
    """

    def __init__(self, config: h2.config.H2Configuration) -> None:
        super().__init__(config)
        self.encoder = _Encoder()
        decoder = hpack_decoder.Decoder()
        decoder.max_header_list_size = self.decoder.max_header_list_size
        self.decoder = decoder  # type: ignore[assignment]
        self.incoming_buffer = _QuietFrames()
        table = self._frame_dispatch_table
        table.update({_QUIET[kind]: receive for kind, receive in list(table.items())})

    def _receive_goaway_frame(self, frame: Any) -> tuple[list[Any], list[h2.events.Event]]:
        frames, events = super()._receive_goaway_frame(frame)
        if frame.error_code == h2.errors.ErrorCodes.NO_ERROR:
            self.state_machine.state = h2.connection.ConnectionState.CLIENT_OPEN
        return frames, events


def _named(frame: hyperframe.frame.Frame) -> str:
    return type(frame).__name__


# Each frame type with a repr that is its name alone (``_QuietFrames``).
_QUIET: dict[type[hyperframe.frame.Frame], type[hyperframe.frame.Frame]] = {
    kind: type(kind.__name__, (kind,), {"__repr__": _named, "__module__": __name__})
    for kind in (*hyperframe.frame.FRAMES.values(), hyperframe.frame.ExtensionFrame)}


class _QuietFrames(h2.frame_buffer.FrameBuffer):
    """h2's frame buffer, handing each frame out as its type's ``_QUIET`` subclass: h2 makes every frame's repr
    for its trace log whether or not anything logs (``repr(frame)``), which hexlifies the body and formats the
    flags and settings, ~3.5 µs a frame and a few frames a request. ``_DrainingH2`` dispatches the subclasses as
    their types."""

    def __next__(self) -> hyperframe.frame.Frame:
        frame = super().__next__()
        frame.__class__ = _QUIET.get(type(frame), type(frame))  # a CONTINUATION-joined HEADERS comes back quiet
        return frame


class _Values(list):  # type: ignore[type-arg]
    """One setting's values in h2's ``Settings`` (the current one first, then those not acknowledged yet), in a list
    instead of h2's deque: a deque is 760 bytes even for its one value, and a connection keeps about a dozen."""

    def popleft(self) -> Any:
        return self.pop(0)


def _compact(settings: h2.settings.Settings) -> None:
    """Put ``settings``' values in ``_Values`` (h2 adds a deque for a setting the server names the first time)."""
    values = settings._settings
    for key, value in values.items():
        if not isinstance(value, list):
            values[key] = _Values(value)  # type: ignore[assignment]


class _SharedHuffman(hpack.huffman.HuffmanEncoder):
    """hpack's Huffman coder, remembering its last codes for every connection of the process.

    A new connection's HPACK table is empty, so it Huffman-codes every field of its first requests in pure Python
    (~0.2 ms a fleet member), though its requests are those of every other member (paths, user agent, accept).
    Bounded: emptied when full. Never given a credential (``_Encoder``): a member's token must not outlive it here.
    """

    _LIMIT = 1024

    def __init__(self) -> None:
        super().__init__(hpack.huffman_constants.REQUEST_CODES, hpack.huffman_constants.REQUEST_CODES_LENGTH)
        self._codes: dict[bytes | None, bytes] = {}

    def encode(self, bytes_to_encode: bytes | None) -> bytes:
        code = self._codes.get(bytes_to_encode)
        if code is None:
            if len(self._codes) >= self._LIMIT:
                self._codes.clear()
            code = self._codes[bytes_to_encode] = super().encode(bytes_to_encode)
        return code


_SHARED_HUFFMAN = _SharedHuffman()


class _Encoder(hpack.Encoder):
    """hpack's encoder, with the encodings of never-indexed fields kept: such a field is never added to the
    dynamic table and its name is in the static one, so its encoding depends on nothing but the field, and the
    credential sent on every request is Huffman-coded once, not once a request. (It also keeps hpack's debug
    line, which names the field, from being made for it.) Other fields are Huffman-coded by the process's
    ``_SHARED_HUFFMAN``; never-indexed ones by this connection's own coder."""

    def __init__(self) -> None:
        super().__init__()
        self._own_huffman = self.huffman_coder
        self.huffman_coder = _SHARED_HUFFMAN
        self._sensitive: dict[tuple[bytes, bytes, bool], bytes] = {}

    def add(self, to_add: tuple[bytes, bytes], sensitive: bool, huffman: bool = False) -> bytes:
        if not sensitive:
            return super().add(to_add, sensitive, huffman)
        key = (*to_add, huffman)
        encoded = self._sensitive.get(key)
        if encoded is None:
            if len(self._sensitive) >= 8:  # a rotated credential: the old one's encoding is no longer needed
                self._sensitive.clear()
            self.huffman_coder = self._own_huffman
            try:
                encoded = self._sensitive[key] = super().add(to_add, sensitive, huffman)
            finally:
                self.huffman_coder = _SHARED_HUFFMAN
        return encoded


class _Stream:
    """One request's stream: its response headers, then its body as the consumer reads it."""

    __slots__ = ("conn", "id", "_head", "_chunks", "_pending", "_unacked", "_ended", "_error", "_waiter",
                 "_window")

    def __init__(self, conn: H2Connection, stream_id: int) -> None:
        self.conn = conn
        self.id = stream_id
        self._head: asyncio.Future[list[tuple[bytes, bytes]]] = asyncio.get_running_loop().create_future()
        self._chunks: collections.deque[bytes] = collections.deque()
        self._pending = 0  # flow-controlled bytes received and not yet read
        self._unacked = 0  # read and not yet handed back
        self._ended = False
        self._error: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._window: asyncio.Future[None] | None = None

    # -- fed by the connection ----------------------------------------------------------------------------
    def headers(self, fields: list[tuple[bytes, bytes]]) -> None:
        if fields and fields[0][0] == b":status" and fields[0][1].startswith(b"1"):
            return  # informational (100 Continue): the final headers follow
        if not self._head.done():
            self._head.set_result(fields)

    def feed(self, data: bytes, flow_length: int) -> None:
        self._chunks.append(data)
        self._pending += flow_length
        self._wake()

    def end(self, error: BaseException | None) -> None:
        if self._ended:
            return
        self._ended, self._error = True, error
        if not self._head.done():
            self._head.set_exception(error or ConnectionResetError("the stream ended without response headers"))
            self._head.exception()
        self.conn.forget(self, reset=False)  # its slot is free even if the body is still to be read
        self._wake()
        self.window_opened()

    def window_opened(self) -> None:
        if self._window is not None and not self._window.done():
            self._window.set_result(None)

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    # -- used by the request and the response ------------------------------------------------------------
    async def response(self) -> "H2Response":
        fields = await self._head
        status = 0
        headers: dict[str, str] = {}
        for k, v in fields:
            if k == b":status":
                status = int(v)
            elif not k.startswith(b":"):
                name = k.decode("latin-1")
                headers[name] = f"{headers[name]}, {v.decode('latin-1')}" if name in headers else v.decode("latin-1")
        return H2Response(self, status, headers)

    async def wait_window(self) -> None:
        self._window = asyncio.get_running_loop().create_future()
        await self._window

    def raise_if_failed(self) -> None:
        if self._error is not None:
            raise ConnectionResetError(str(self._error))

    async def read_chunk(self, timeout: float | None) -> bytes:
        """The body bytes received so far (waiting for some), b"" at its end; TimeoutError after ``timeout``."""
        while not self._chunks:
            if self._ended:
                if self._error is not None:
                    raise ConnectionResetError(str(self._error))
                return b""
            loop = asyncio.get_running_loop()
            waiter = self._waiter = loop.create_future()
            # A timer, not wait_for: this runs once per chunk of every watch.
            timer = loop.call_later(timeout, _expire, waiter, timeout, self.conn) if timeout is not None else None
            try:
                await waiter
            finally:
                self._waiter = None
                if timer is not None:
                    timer.cancel()
        chunks = self._chunks
        data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        pending, self._pending = self._pending, 0
        self._unacked = self.conn.consumed(pending, None if self._ended else self.id, self._unacked)
        return data

    def cancel(self) -> None:
        """The consumer is done: reset the stream if the server may still send on it."""
        if not self._ended:
            self._ended = True
            self.conn.forget(self, reset=True)
        if self._pending:  # unread bytes still count against the connection's window
            self.conn.consumed(self._pending)
            self._pending = 0
        self._chunks.clear()


def _expire(waiter: asyncio.Future[None], timeout: float, conn: H2Connection) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError(f"no data from the server for {timeout:g} s"))
        conn.suspect()


class H2Response:
    """A response on an HTTP/2 stream: ``status``, ``headers`` (names in lower case), then the body."""

    def __init__(self, stream: _Stream, status: int, headers: dict[str, str]) -> None:
        self._stream = stream
        self.status = status
        self.headers = headers
        self.read_idle: float | None = None  # bound on the silence between two reads of the body

    @property
    def reason(self) -> str:
        """HTTP/2 has no reason phrase; the standard one for the status."""
        try:
            return HTTPStatus(self.status).phrase
        except ValueError:
            return ""

    def header(self, name: str) -> str | None:
        """The value of header ``name`` (any case), or None."""
        return self.headers.get(name.lower())

    async def readany(self) -> bytes:
        """Body bytes as they come, b"" at the end; TimeoutError after ``read_idle`` seconds without any."""
        return await self._stream.read_chunk(self.read_idle)

    async def read(self) -> bytes:
        """The whole body."""
        parts = []
        while chunk := await self._stream.read_chunk(self.read_idle):
            parts.append(chunk)
        return b"".join(parts)

    def release(self) -> None:
        """Done with the response: cancel the stream if its body was not read to the end."""
        self._stream.cancel()

