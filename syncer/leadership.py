"""Leadership: how the sidecar's leadership terms begin and end, whether a Lease decides them or not.

With ``[leader_election] enabled`` a ``LeaderElector`` (``leader.py``) decides: a term begins when this replica
takes the Lease and ends when a renewal misses its deadline. With election off, ``NoElection`` gives the process
one term from start to stop, under the ``OPEN`` fence, and holds no Lease. The sidecar asks both the same
questions, so it has one term loop and no "is election on" branch of its own.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from controllers.fence import OPEN, Fence


class Leadership(Protocol):
    """``acquire()`` returns when a term begins; ``hold()`` returns when it ends (cancel it to stop renewing);
    ``fence()`` is the current term's; ``release()`` gives a held Lease up. ``lease``: ``namespace/name`` of the
    Lease, or None when none is held; ``observed_holder``: its holder as last seen (None without one)."""

    @property
    def lease(self) -> str | None: ...

    @property
    def observed_holder(self) -> str | None: ...

    async def acquire(self) -> None: ...

    def fence(self) -> Fence: ...

    async def hold(self) -> None: ...

    async def release(self) -> None: ...


class NoElection:
    """Election off: one term for the whole process, always leader, nothing to release."""

    lease = None
    observed_holder = None

    async def acquire(self) -> None:
        """At once: this replica leads."""

    def fence(self) -> Fence:
        """``OPEN``: nothing can end the term but the stop."""
        return OPEN

    async def hold(self) -> None:
        """Never returns: only a stop ends the term."""
        await asyncio.Future()

    async def release(self) -> None:
        """No Lease is held."""
