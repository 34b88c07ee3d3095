"""The cached-resources objects as the tests read them from the management plane."""

from __future__ import annotations

from typing import Any

from informers import ApiClient, NotFound
from syncer.builtin.cached_resources.naming import CLUSTER_CACHED_RESOURCES


async def get_ccr(api: ApiClient, name: str) -> dict[str, Any] | None:
    try:
        obj: dict[str, Any] = await api.request("GET", CLUSTER_CACHED_RESOURCES.path(name=name))
        return obj
    except NotFound:
        return None
