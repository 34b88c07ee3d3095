"""The sidecar's HTTP endpoints: ``/healthz``, ``/readyz``, ``/metrics`` and ``/status``; with ``debug``, also
``/debug/tasks`` and ``/debug/stalls`` (``debug.py``).

Served by ``http_server.py`` (not aiohttp, whose import alone was a fifth of the sidecar's start-up memory).
``/status`` answers JSON, unless the request prefers HTML (a browser's ``Accept``) or asks for a format
(``?format=html`` or ``json``): then the page of ``status_page.py``, with the charts of the history this server
samples (``status_history.py``)."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING, Any, Callable

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from .http_server import Handler, HttpServer, Request, Response
from .status_history import StatusHistory

if TYPE_CHECKING:
    from controllers.health import HealthItem

    from .debug import StallWatch  # imported only with debug on

# The event loop is considered stuck when a ticker is this late.
_LOOP_STALL = 5.0
_TICK = 1.0


class StatusServer:
    """Serves probes, metrics and status; ``status()`` and ``health()`` are supplied by the runtime."""

    def __init__(self, bind: str, status: Callable[[], dict[str, Any]],
                 health: Callable[[], tuple[bool, list[HealthItem]]],
                 not_ready: Callable[[], str | None], debug: bool = False) -> None:
        host, _, port = bind.rpartition(":")
        self.stall_watch: StallWatch | None = None
        if debug:
            from .debug import StallWatch

            self.stall_watch = StallWatch()
        self.host, self.port = host, int(port)
        self._status, self._health, self._not_ready = status, health, not_ready
        self._server: HttpServer | None = None
        self._ticker: asyncio.Task[None] | None = None
        self.history = StatusHistory()
        self._sampler: asyncio.Task[None] | None = None
        self._next_tick = time.monotonic() + _TICK
        self._last_lag = 0.0

    async def start(self) -> None:
        """Bind and serve (raises OSError if the address is taken)."""
        routes: dict[str, Handler] = {"/healthz": self._healthz, "/readyz": self._readyz, "/metrics": self._metrics,
                                      "/status": self._status_handler}
        if self.stall_watch is not None:
            routes.update({"/debug/tasks": self._tasks_handler, "/debug/stalls": self._stalls_handler})
        server = HttpServer(self.host, self.port, routes)
        await server.start()
        self._server = server
        if self.stall_watch is not None:  # only once serving: a failed start leaves nothing running
            self.stall_watch.start()
        self._ticker = asyncio.create_task(self._tick(), name="event loop ticker")
        self._sampler = asyncio.create_task(self.history.run(), name="status history")

    async def stop(self) -> None:
        """Stop serving, the ticker and the history's sampling."""
        for task in (self._ticker, self._sampler):
            if task is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
        if self._server is not None:
            await self._server.stop()
        if self.stall_watch is not None:
            await self.stall_watch.stop()

    async def _tick(self) -> None:
        while True:
            self._next_tick = time.monotonic() + _TICK
            await asyncio.sleep(_TICK)
            self._last_lag = max(0.0, time.monotonic() - self._next_tick)

    def loop_lag(self) -> float:
        """How late the event loop is now: the ticker's last oversleep, or how overdue the next tick is."""
        return max(self._last_lag, time.monotonic() - self._next_tick, 0.0)

    async def _healthz(self, request: Request) -> Response:
        lag = self.loop_lag()
        healthy, items = self._health()
        loop_ok = lag < _LOOP_STALL
        body = {"healthy": healthy and loop_ok, "event_loop_lag_seconds": round(lag, 3),
                "controllers": [i.as_dict() for i in items]}
        return _json(body, 200 if body["healthy"] else 503)

    async def _readyz(self, request: Request) -> Response:
        why = self._not_ready()
        return Response(f"not ready: {why}\n".encode() if why else b"ok\n", 503 if why else 200)

    async def _metrics(self, request: Request) -> Response:
        return Response(generate_latest(REGISTRY), content_type=CONTENT_TYPE_LATEST)

    async def _status_handler(self, request: Request) -> Response:
        wanted = request.query.get("format")
        if wanted not in (None, "json", "html"):
            return Response(f"format={wanted!r}: use format=json or format=html\n".encode(), 400)
        if wanted == "html" or (wanted is None and prefers_html(request.headers.get("accept", ""))):
            from . import status_page  # the page's code is only loaded by a process someone looks at

            page = status_page.render(self._status(), self.history.trends(), self.history.window)
            return Response(page.encode(), content_type="text/html; charset=utf-8", headers={
                "Vary": "Accept", "Cache-Control": "no-store",
                "Content-Security-Policy": status_page.CONTENT_SECURITY_POLICY})
        return _json(self._status(), 200, {"Vary": "Accept"})

    async def _tasks_handler(self, request: Request) -> Response:
        from .debug import task_dump

        return Response(task_dump().encode())

    async def _stalls_handler(self, request: Request) -> Response:
        assert self.stall_watch is not None
        return _json({"threshold_seconds": self.stall_watch.threshold, "stalls": self.stall_watch.report()}, 200)


def prefers_html(accept: str) -> bool:
    """Whether an ``Accept`` header ranks ``text/html`` above JSON: a browser's does, while none, ``*/*`` (curl,
    urllib) or a tie keep the JSON that scripts have always had."""
    html_q = json_q = 0.0
    for item in accept.split(","):
        media, *params = (p.strip() for p in item.split(";"))
        q = 1.0
        for param in params:
            key, _, value = param.partition("=")
            if key.strip() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        if media.lower() == "text/html":
            html_q = max(html_q, q)
        elif media.lower() in ("application/json", "application/*", "*/*"):
            json_q = max(json_q, q)
    return html_q > json_q


def _json(body: Any, status: int, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(body, option=orjson.OPT_INDENT_2), status, "application/json; charset=utf-8",
                    headers or {})
