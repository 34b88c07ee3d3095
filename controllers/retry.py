"""retry_on_conflict: run a read-modify-write again, after a short pause, while the server answers ``Conflict``.

client-go's ``retry.RetryOnConflict`` with its ``DefaultRetry`` (5 tries, 10 ms apart, 10 % jitter), with two
differences: ``fn`` returns its result, which ``retry_on_conflict`` passes on, and ``AlreadyExists`` (also a
409) is not retried, since ``Conflict`` here is its own error class and a name taken does not free itself up.
``fn`` must read the object afresh on each call: retrying a write of the same stale object fails the same way.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import Awaitable, Callable, TypeVar

from informers import Backoff
from informers.errors import Conflict

_T = TypeVar("_T")


@dataclass(frozen=True)
class RetryBackoff:
    """At most ``steps`` tries; the pauses between them start at ``delay`` seconds, are multiplied by ``factor``
    after each, and get up to ``jitter`` times themselves added at random."""

    steps: int = 5
    delay: float = 0.01
    factor: float = 1.0
    jitter: float = 0.1


DEFAULT_RETRY = RetryBackoff()


async def retry_on_conflict(fn: Callable[[], Awaitable[_T]], backoff: RetryBackoff = DEFAULT_RETRY) -> _T:
    """``await fn()`` until it does not raise ``Conflict`` or ``backoff.steps`` tries are spent (then the last
    ``Conflict`` is raised); any other error is raised at once."""
    pauses = Backoff(backoff.delay, backoff.factor, math.inf, backoff.jitter)
    for remaining in range(backoff.steps - 1, -1, -1):
        try:
            return await fn()
        except Conflict:
            if not remaining:
                raise
        await asyncio.sleep(pauses.next())
    raise ValueError(f"retry_on_conflict needs at least one step, got {backoff.steps}")
