"""A loopback TCP proxy for fault injection: cut connections, refuse new ones, or freeze them half-open."""

from __future__ import annotations

import asyncio


class Proxy:
    """Forwards 127.0.0.1:<port> to a target port. ``freeze()`` stops forwarding on current connections while
    keeping them open (a half-open stream); ``cut()`` closes them; ``refuse`` rejects new ones. ``delay``: seconds
    by which what the target sends reaches the client, on connections accepted from then on (a slow watch)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.refuse = False
        self.delay = 0.0
        self.accepted = 0
        # (client side, upstream side, frozen, cut): a frozen pipe swallows data until the connection is cut
        self._conns: list[tuple[asyncio.StreamWriter, asyncio.StreamWriter, asyncio.Event, asyncio.Event]] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> "Proxy":
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    @property
    def open_connections(self) -> int:
        return sum(1 for c, _, _, _ in self._conns if not c.is_closing())

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.refuse:
            writer.close()
            return
        self.accepted += 1
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        frozen, cut = asyncio.Event(), asyncio.Event()
        entry = (writer, up_writer, frozen, cut)
        self._conns.append(entry)
        try:
            await asyncio.gather(self._pipe(reader, up_writer, frozen, cut), self._pipe(up_reader, writer, frozen, cut,
                                                                                     self.delay))
        finally:
            for w in (writer, up_writer):
                w.close()
            self._conns.remove(entry)

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, frozen: asyncio.Event,
                    cut: asyncio.Event, delay: float = 0.0) -> None:
        loop = asyncio.get_running_loop()
        delayed: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def send_delayed() -> None:  # in order, each chunk ``delay`` after it was read
            while True:
                due, data = await delayed.get()
                if not data:
                    return
                await asyncio.sleep(due - loop.time())
                writer.write(data)
                await writer.drain()

        sender = asyncio.create_task(send_delayed()) if delay else None
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                if frozen.is_set():
                    await cut.wait()  # swallow: the peer sees silence, not a close, until the cut
                    break
                if sender is not None:
                    delayed.put_nowait((loop.time() + delay, data))
                    continue
                writer.write(data)
                await writer.drain()
            if sender is not None:
                delayed.put_nowait((0.0, b""))
                await sender
        except (ConnectionError, OSError):
            pass
        finally:
            if sender is not None:
                sender.cancel()
                await asyncio.gather(sender, return_exceptions=True)
            writer.close()

    def freeze(self) -> None:
        """Current connections go silent in both directions without closing."""
        for _, _, frozen, _ in self._conns:
            frozen.set()

    def cut(self) -> None:
        """Close every current connection."""
        for client, upstream, _, cut in self._conns:
            cut.set()
            client.transport.abort()
            upstream.transport.abort()

    async def stop(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
