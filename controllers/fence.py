"""Fence: whether the current leadership term still allows this process to act.

controller-runtime stops controllers when the lease is lost, but between the loss and the stop a worker may
still start a reconcile, and a process resumed after a pause (SIGSTOP, a VM freeze, a blocked loop) runs its
queued work before the elector notices. A fence is checked locally, without a network call, before every work
item and every write, so nothing of an expired term is acted on even in that window.
"""

from __future__ import annotations

from typing import Protocol

from informers import ApiClient


class Fence(Protocol):
    """``valid()`` is True while the term that started a controller still holds. A fence may also offer
    ``remaining()`` (seconds it still holds): the fenced client then bounds getting a connection by it."""

    def valid(self) -> bool: ...


class _Open:
    """The fence of a process without leader election: always valid."""

    def valid(self) -> bool:
        return True


OPEN: Fence = _Open()


def fenced(client: ApiClient, fence: Fence) -> ApiClient:
    """``client`` seen through ``fence`` (writes refused once it no longer holds); ``client`` itself when ``OPEN``."""
    return client if fence is OPEN else client.fenced(fence.valid, remaining=getattr(fence, "remaining", None))
