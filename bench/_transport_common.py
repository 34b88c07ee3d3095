"""What the transport benchmarks (deadconn_bench.py, transport_bench.py) share: the ApiClient they build, with
HTTP/2 on or off when the client has that setting, and a record of when each watch stream opened.

Only the public API is used (``ApiClient.__init__``'s keywords, ``from_kubeconfig``, ``stream``), so the same
scripts measure today's HTTP/1.1 client and a later one: ``http2`` is passed only when ``ApiClient.__init__``
takes it.
"""

from __future__ import annotations

import inspect
import time
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable

from informers import ApiClient


def supports_http2() -> bool:
    """Whether ``ApiClient.__init__`` takes an ``http2`` keyword."""
    return "http2" in inspect.signature(ApiClient.__init__).parameters


def http2_modes(wanted: str) -> list[bool | None]:
    """The ``--http2`` choice as the values to build clients with: None = the client has no such setting."""
    if not supports_http2():
        if wanted == "on":
            raise SystemExit("--http2 on: this ApiClient has no http2 setting (HTTP/1.1 only)")
        return [None]
    modes: dict[str, list[bool | None]] = {"on": [True], "off": [False], "both": [False, True]}
    return modes[wanted]


def transport_name(http2: bool | None) -> str:
    return "HTTP/2" if http2 else "HTTP/1.1" if http2 is False else "HTTP/1.1 (no http2 setting)"


def client_class(http2: bool | None, on_stream: Callable[[str, float], None] | None = None) -> type[ApiClient]:
    """An ApiClient subclass that passes ``http2`` to ``__init__`` (if not None) and calls
    ``on_stream(path, time.monotonic())`` when a watch stream has been answered (status below 400)."""

    class BenchClient(ApiClient):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            if http2 is not None:
                kwargs["http2"] = http2
            super().__init__(*args, **kwargs)

        @asynccontextmanager
        async def stream(self, path: str, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
            async with super().stream(path, *args, **kwargs) as events:
                if on_stream is not None:
                    on_stream(path, time.monotonic())
                yield events

    return BenchClient
