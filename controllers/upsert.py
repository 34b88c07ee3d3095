"""create_or_update and create_or_patch: make an object what ``mutate`` says, creating it if needed.

controller-runtime's ``controllerutil.CreateOrUpdate``/``CreateOrPatch``, on dicts: ``mutate`` edits a copy and the
server's object comes back with the result. Neither retries on conflict (wrap in ``retry_on_conflict``);
``create_or_patch`` sends a merge patch of what ``mutate`` changed. Comparison is semantic (``semantic_equal``);
without a schema, which empty values the server drops is learned from its answers (``OMISSIONS``).
"""

from __future__ import annotations

import copy
import enum
from typing import Any, Callable

from informers.errors import NotFound
from informers.resource import Object, ResourceClient

from .equality import Omissions, semantic_equal

# Where servers leave empty values out, learned from the answers to the upserts' own writes (process-wide: a
# resource's schema is the same for every client of it).
OMISSIONS = Omissions()

Mutate = Callable[[Object], None]


class OperationResult(enum.StrEnum):
    """What ``create_or_update`` / ``create_or_patch`` did."""

    UNCHANGED = "unchanged"
    CREATED = "created"
    UPDATED = "updated"
    UPDATED_STATUS = "updated_status"
    UPDATED_STATUS_ONLY = "updated_status_only"


async def create_or_update(client: ResourceClient, obj: Object, mutate: Mutate) -> tuple[Object, OperationResult]:
    """Read the object named by ``obj``; ``mutate`` it and update it if that changed anything (``UPDATED``, else
    ``UNCHANGED``); if there is none, ``mutate`` a copy of ``obj`` and create it (``CREATED``)."""
    found = await _get(client, obj)
    if found is None:
        return await _create(client, _mutated(obj, mutate)), OperationResult.CREATED
    desired = _mutated(found, mutate)
    if semantic_equal(desired, found, OMISSIONS.of(client.gvr)):
        return found, OperationResult.UNCHANGED
    updated = await client.update(desired)
    OMISSIONS.learn(client.gvr, desired, updated)
    return updated, OperationResult.UPDATED


async def create_or_patch(client: ResourceClient, obj: Object, mutate: Mutate) -> tuple[Object, OperationResult]:
    """As ``create_or_update``, but changes are written as merge patches: the object without its status first,
    then the status subresource (``UPDATED``, ``UPDATED_STATUS`` for both, ``UPDATED_STATUS_ONLY``)."""
    found = await _get(client, obj)
    if found is None:
        return await _create(client, _mutated(obj, mutate)), OperationResult.CREATED
    desired = _mutated(found, mutate)
    meta = found["metadata"]
    omitted = OMISSIONS.of(client.gvr)
    result = OperationResult.UNCHANGED
    current = found
    before, after = _without_status(found), _without_status(desired)
    if not semantic_equal(before, after, omitted):
        current = await client.patch(meta["name"], _merge_patch(before, after), type="merge",
                                     namespace=meta.get("namespace"))
        OMISSIONS.learn(client.gvr, after, current)
        result = OperationResult.UPDATED
    status_before, status_after = {"status": found.get("status")}, {"status": desired.get("status")}
    if not semantic_equal(status_before, status_after, omitted):
        current = await client.patch_status(meta["name"], _merge_patch(status_before, status_after), type="merge",
                                            namespace=meta.get("namespace"))
        OMISSIONS.learn(client.gvr, status_after, current)
        result = (OperationResult.UPDATED_STATUS if result is OperationResult.UPDATED
                  else OperationResult.UPDATED_STATUS_ONLY)
    return current, result


async def _create(client: ResourceClient, obj: Object) -> Object:
    created = await client.create(obj)
    OMISSIONS.learn(client.gvr, obj, created)
    return created


def _key(obj: Object) -> tuple[str | None, str | None]:
    meta = obj.get("metadata") or {}
    return meta.get("name"), meta.get("namespace")


async def _get(client: ResourceClient, obj: Object) -> Object | None:
    name, namespace = _key(obj)
    if not name:
        raise ValueError("create_or_update/create_or_patch need the object's metadata.name")
    try:
        return await client.get(name, namespace)
    except NotFound:
        return None


def _mutated(obj: Object, mutate: Mutate) -> Object:
    """A mutated deep copy of ``obj``; ValueError if ``mutate`` renamed it (the write would hit another object)."""
    out = copy.deepcopy(obj)
    mutate(out)
    if _key(out) != _key(obj):
        raise ValueError("mutate must not change the object's metadata.name or metadata.namespace")
    return out


def _without_status(obj: Object) -> Object:
    return {k: v for k, v in obj.items() if k != "status"}


def _merge_patch(before: Any, after: Any) -> Any:
    """The JSON merge patch (RFC 7386) turning ``before`` into ``after``: changed keys, and None for removed ones."""
    if not (isinstance(before, dict) and isinstance(after, dict)):
        return after
    patch = {k: None for k in before.keys() - after.keys()}
    for k, v in after.items():
        if k not in before or not semantic_equal(before[k], v, ()):
            patch[k] = _merge_patch(before.get(k), v)
    return patch
