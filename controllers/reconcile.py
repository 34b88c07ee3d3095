"""Reconcile requests, results, and the error that asks for no retry."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from informers.store import last_state


@dataclass(frozen=True, slots=True)
class Request:
    """Names the object to reconcile (``namespace`` is None for cluster-scoped objects)."""

    name: str
    namespace: str | None = None

    @classmethod
    def for_object(cls, obj: Any) -> "Request":
        """The request for an object dict (or a ``DeletedFinalStateUnknown`` tombstone)."""
        obj = last_state(obj)
        meta = obj["metadata"]
        return cls(meta["name"], meta.get("namespace") or None)

    @property
    def key(self) -> str:
        """``namespace/name`` or ``name``: the informer store key."""
        return f"{self.namespace}/{self.name}" if self.namespace else self.name

    def __str__(self) -> str:
        return self.key


@dataclass(frozen=True, slots=True)
class Result:
    """What a reconcile asks for next: nothing (default), a rate-limited ``requeue``, or a re-run after
    ``requeue_after`` seconds; ``priority`` is the work queue priority of that requeue (None: the one the request
    was taken with, as a failure's retry keeps it too)."""

    requeue: bool = False
    requeue_after: float | None = None
    priority: int | None = None


class TerminalError(Exception):
    """Raised by a reconcile that retrying cannot fix (an invalid spec, say): the Controller logs it once and
    forgets the request until its object changes again, where any other exception is retried with backoff for
    as long as it fails (controller-runtime's ``reconcile.TerminalError``, kopf's ``PermanentError``)."""
