"""Helpers of the tests: waiting for a condition (or its absence), free ports, server and cache states."""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import uuid
from typing import Any, AsyncIterator, Callable

import pytest

from controllers.provider import Changed, ClusterConfig, Conflict
from informers import GVR, ApiClient, ApiError
from syncer.testing import eventually  # noqa: F401 (the suite imports it from here)

CONFIGMAPS = GVR("", "v1", "configmaps")


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on (free when asked: another process may take it since)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def settle(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    """Return once ``cond()`` is true, polling every 5 ms of the loop's clock; AssertionError after ``timeout``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        if loop.time() > deadline:
            raise AssertionError(f"not settled within {timeout}s")
        await asyncio.sleep(0.005)


async def nothing_within(cond: Callable[[], bool], seconds: float) -> None:
    """Fail if ``cond`` becomes true within ``seconds`` (how an absence is checked)."""
    with pytest.raises(AssertionError, match="not settled"):
        await settle(cond, seconds)


async def create_configmaps(api: ApiClient, namespace: str, count: int, prefix: str = "cm",
                            size: int = 100, labels: dict[str, str] | None = None) -> None:
    sem = asyncio.Semaphore(32)

    async def one(i: int) -> None:
        async with sem:
            await api.request("POST", CONFIGMAPS.path(namespace), body={
                "metadata": {"name": f"{prefix}-{i}", "labels": labels or {}}, "data": {"x": "y" * size}})

    await asyncio.gather(*(one(i) for i in range(count)))


async def server_state(api: ApiClient, gvr: GVR, namespace: str | None = None) -> dict[str, str]:
    """key -> resourceVersion of every object on the server (consistent read)."""
    out = await api.request("GET", gvr.path(namespace), {"resourceVersion": ""})
    return {(f"{i['metadata']['namespace']}/" if i["metadata"].get("namespace") else "") + i["metadata"]["name"]:
            i["metadata"]["resourceVersion"] for i in out["items"]}


def cache_state(informer: Any) -> dict[str, str]:
    return {k: informer.store.get(k)["metadata"]["resourceVersion"] for k in informer.store.keys()}


async def converged(api: ApiClient, informer: Any, namespace: str | None = None) -> bool:
    try:
        return await server_state(api, informer.gvr, namespace) == cache_state(informer)
    except (ApiError, OSError):
        return False


async def apiserver_requests(api: ApiClient, verb: str, resource: str) -> float:
    """The apiserver's own count of requests (apiserver_request_total) for a verb and resource."""
    text = await api.request_text("/metrics")
    total = 0.0
    for line in text.splitlines():
        if line.startswith("apiserver_request_total{") and f'verb="{verb}"' in line \
                and re.search(rf'[{{,]resource="{resource}"', line):
            total += float(line.rsplit(" ", 1)[1])
    return total


@contextlib.asynccontextmanager
async def fresh_namespace(api: ApiClient, prefix: str) -> AsyncIterator[str]:
    """A namespace of its own for one test (deleted afterwards)."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    await api.request("POST", "/api/v1/namespaces", body={"metadata": {"name": name}})
    try:
        yield name
    finally:
        await api.request("DELETE", f"/api/v1/namespaces/{name}")


class HandlerLog:
    """A cluster handler that records which clusters it is told of (``added``) and which leave (``removed``)."""

    def __init__(self) -> None:
        self.added: list[str] = []
        self.removed: list[str] = []

    def add_cluster(self, ctx: Any, name: str, cluster: Any) -> None:
        self.added.append(name)

    def remove_cluster(self, name: str) -> None:
        self.removed.append(name)


class FakeProvider:
    """A cluster provider whose clusters a test sets in ``configs`` (the registry's seam for any source); it has
    listed once ``listed`` is set (at once without one) and hands ``changed`` on as ``self.changed``."""

    def __init__(self, name: str = "fake", configs: dict[str, ClusterConfig] | None = None,
                 listed: asyncio.Event | None = None) -> None:
        self.name = name
        self.configs = dict(configs or {})
        self.listed = listed
        self.changed: Changed = lambda _: None
        self.stopped = False

    def get(self, cluster: str) -> ClusterConfig | None:
        return self.configs.get(cluster)

    def names(self) -> set[str]:
        return set(self.configs)

    def conflicts(self) -> list[Conflict]:
        return []

    def status(self) -> dict[str, Any]:
        return {"clusters": len(self.configs)}

    async def start(self, changed: Changed) -> None:
        self.changed = changed

    async def wait_synced(self, timeout: float) -> bool:
        if self.listed is not None:
            await self.listed.wait()
        return True

    async def stop(self) -> None:
        self.stopped = True
