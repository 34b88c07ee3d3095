"""wait_first: the one "wait for X, or stop, or a timeout" helper; everything it started is cancelled and awaited.

``asyncio.wait`` leaves the losers running and ``asyncio.wait_for`` takes one awaitable: each caller that needs
"whichever comes first" would otherwise write its own create-wait-cancel-gather dance (and forget the gather).
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable


async def wait_first(*awaitables: Awaitable[Any], timeout: float | None = None) -> int | None:
    """Run ``awaitables`` until the first one finishes; return its index, or None on timeout.

    The others are cancelled and awaited before returning. If the first one to finish raised, that exception
    is raised here; if this call is cancelled, every awaitable is cancelled too.
    """
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    try:
        done, _ = await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    if not done:
        return None
    first = next(i for i, t in enumerate(tasks) if t in done)
    winner = tasks[first]
    if not winner.cancelled() and winner.exception() is not None:
        raise winner.exception()  # type: ignore[misc]
    return first
