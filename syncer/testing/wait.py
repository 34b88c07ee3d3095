"""eventually: wait in a test for a condition on the cluster or on a controller, polling, without a tuned sleep."""

from __future__ import annotations

import asyncio
import time
from typing import Awaitable, Callable

_POLL = 0.05


async def eventually(check: Callable[[], Awaitable[bool] | bool], timeout: float = 30, what: str = "") -> None:
    """Return once ``check()`` (a function, or a coroutine function) is true; AssertionError naming ``what`` (or
    ``check``) after ``timeout`` seconds. Exceptions that ``check`` raises propagate."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if not isinstance(result, bool):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or check}")
        await asyncio.sleep(_POLL)
