"""Finalizers: add or remove one in ``metadata.finalizers`` without overwriting anyone else's change.

controllerutil's ``AddFinalizer``/``RemoveFinalizer`` edit an object in memory and leave the write, and its
races, to the caller. Here each writes at once, because the write is where the care goes: a merge patch of just
``metadata.finalizers`` carrying the ``resourceVersion`` it was computed from, so the server refuses it
(``Conflict``) if the object changed meanwhile; the object is then re-read and the change made again
(``retry_on_conflict``). A JSON patch ``test`` of the list would avoid conflicts with unrelated writes, but the
server reports a failed ``test`` as ``Invalid``, indistinguishable from a real validation error. Whether there is
anything to do is decided on the object as given (usually from an informer's cache), so that calling
``add_finalizer`` on every reconcile costs no request once the finalizer is there.
"""

from __future__ import annotations

from typing import Callable

from informers.resource import Object, ResourceClient

from .retry import DEFAULT_RETRY, RetryBackoff, retry_on_conflict


def has_finalizer(obj: Object, name: str) -> bool:
    """Whether ``obj`` lists finalizer ``name``."""
    return name in ((obj.get("metadata") or {}).get("finalizers") or ())


async def add_finalizer(client: ResourceClient, obj: Object, name: str,
                        backoff: RetryBackoff = DEFAULT_RETRY) -> Object:
    """Append finalizer ``name`` to the object (no request if ``obj`` has it); returns the object as written."""
    return await _change_finalizers(client, obj, lambda fs: fs if name in fs else [*fs, name], backoff)


async def remove_finalizer(client: ResourceClient, obj: Object, name: str,
                           backoff: RetryBackoff = DEFAULT_RETRY) -> Object:
    """Remove finalizer ``name`` from the object (no request if ``obj`` lacks it); returns the object as written,
    which may already be gone from the server if this was the last finalizer of an object being deleted."""
    return await _change_finalizers(client, obj, lambda fs: [f for f in fs if f != name], backoff)


async def _change_finalizers(client: ResourceClient, obj: Object, change: Callable[[list[str]], list[str]],
                             backoff: RetryBackoff) -> Object:
    meta = obj["metadata"]
    name, namespace = meta["name"], meta.get("namespace")
    latest: Object | None = obj  # None once a conflict has shown it stale

    async def attempt() -> Object:
        nonlocal latest
        current = latest if latest is not None else await client.get(name, namespace)
        latest = None
        finalizers = list(current["metadata"].get("finalizers") or ())
        wanted = change(finalizers)
        if wanted == finalizers:
            return current
        patch = {"metadata": {"resourceVersion": current["metadata"]["resourceVersion"], "finalizers": wanted}}
        return await client.patch(name, patch, type="merge", namespace=namespace)

    return await retry_on_conflict(attempt, backoff)
