"""wait_first and wait_all: "whichever comes first" and "all of them, or the first failure"; everything either
started is cancelled and awaited.

``asyncio.wait`` leaves the losers running and ``asyncio.wait_for`` takes one awaitable: each caller that needs
"whichever comes first" would otherwise write its own create-wait-cancel-gather dance (and forget the gather).
"""

from __future__ import annotations

import asyncio
from typing import Any, Awaitable


async def wait_first(*awaitables: Awaitable[Any], timeout: float | None = None) -> int | None:
    """Run ``awaitables`` until the first one finishes; return its index, or None on timeout.

    The others are cancelled and awaited before returning. If one that finished raised, that exception is
    raised here (of several finishing together, the first by position); if this call is cancelled, every
    awaitable is cancelled too.
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
    finished = [i for i, t in enumerate(tasks) if t in done]
    for i in finished:  # several may finish in the same turn: none of their errors is dropped
        if not tasks[i].cancelled() and (error := tasks[i].exception()) is not None:
            raise error
    return finished[0]


async def wait_all(*awaitables: Awaitable[Any]) -> list[Any]:
    """Run ``awaitables`` together; return their results (in order) once all have succeeded.

    The first to fail cancels the others, which are awaited, and its exception is raised here (``asyncio.gather``
    would leave them running; ``TaskGroup`` would raise an ``ExceptionGroup`` callers must unwrap). If this call is
    cancelled, every awaitable is cancelled too.
    """
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    try:
        for finished in asyncio.as_completed(tasks):
            await finished
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    return [t.result() for t in tasks]
