"""Fence: whether the current leadership term still allows this process to act.

controller-runtime stops controllers when the lease is lost, but between the loss and the stop a worker may
still start a reconcile, and a process resumed after a pause (SIGSTOP, a VM freeze, a blocked loop) runs its
queued work before the elector notices. A fence is checked locally, without a network call, before every work
item and every write, so nothing of an expired term is acted on even in that window. The fences of Lease holders
(a leadership term, a shard unit's tenure) are ``syncer/fences.py``'s; here are the constant ones.
"""

from __future__ import annotations

import math
from typing import Protocol

from informers import ApiClient


class Fence(Protocol):
    """``valid()`` is True while the term that started a controller still holds; ``remaining()`` is for how many
    more seconds at most (0 once closed): the fenced client bounds getting a connection by it."""

    def valid(self) -> bool: ...

    def remaining(self) -> float: ...


class _Open:
    """The fence of a process without leader election: always valid."""

    def valid(self) -> bool:
        return True

    def remaining(self) -> float:
        return math.inf


OPEN: Fence = _Open()


class _Closed:
    """The fence of what no term runs: never valid. A fleet's registry of members that outlives the terms (the warm
    standby) engages them under it, so only a term's view of them writes (``cluster_term.py``)."""

    def valid(self) -> bool:
        return False

    def remaining(self) -> float:
        return 0.0


CLOSED: Fence = _Closed()


def fenced(client: ApiClient, fence: Fence) -> ApiClient:
    """``client`` seen through ``fence`` (writes refused once it no longer holds); ``client`` itself when ``OPEN``."""
    return client if fence is OPEN else client.fenced(fence.valid, remaining=fence.remaining)
