"""WatchingProvider: what the providers that watch a source in one background task share (its lifecycle), and
for those whose source is a custom resource, waiting until it is served."""

from __future__ import annotations

import asyncio
import enum
from typing import Iterable, Sequence

from loguru import logger

from informers import ApiClient, ApiError, Backoff
from informers.errors import describe_error

from ..provider import Changed


class ProviderState(enum.StrEnum):
    """Where a provider of a custom resource is: asking which version is served, waiting for it, or watching."""

    DISCOVERING = "discovering"
    NOT_INSTALLED = "not-installed"
    WATCHING = "watching"


class WatchingProvider:
    """The lifecycle of a provider watching its source in one task: ``start`` runs ``_watch_source`` once, which
    sets ``_synced`` once it has read the source fully once and calls ``_tell(name)`` on every change; ``stop``
    cancels and awaits it, then ``_release`` (what the task set up: informers)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.state = ProviderState.DISCOVERING
        self.last_error: Exception | None = None  # of the last failed discovery request, until one succeeds
        self._changed: Changed | None = None
        self._synced = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self, changed: Changed) -> None:
        """Begin watching (once); returns at once."""
        if self._task is None:
            self._changed = changed
            self._task = asyncio.create_task(self._watch_source(), name=f"{self.name} provider")

    async def wait_synced(self, timeout: float) -> bool:
        """True once the source has been read fully once, False after ``timeout`` seconds."""
        try:
            async with asyncio.timeout(timeout):
                await self._synced.wait()
        except TimeoutError:
            return False
        return True

    async def stop(self) -> None:
        """Stop watching, awaited."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        await self._release()

    def _tell(self, name: str) -> None:
        if self._changed is not None:
            self._changed(name)

    async def _watch_source(self) -> None:
        raise NotImplementedError

    async def _release(self) -> None:
        """Stop what ``_watch_source`` started (nothing by default)."""

    async def _served(self, client: ApiClient, group: str, versions: Sequence[str], resource: str,
                      interval: float) -> str:
        """The first of ``versions`` of ``group`` whose discovery lists ``resource``, once one does.

        While none does, the provider is synced (it knows there is nothing), in state ``NOT_INSTALLED``, and asks
        again every ``interval`` seconds; a failed request (unreachable, forbidden) is asked again with backoff,
        never given up. The reflector alone would retry a missing resource too, but by backing off a 404 it never
        tells "not installed" from "failing"."""
        log = logger.bind(component=self.name)
        backoff = Backoff(initial=1.0, cap=60.0)
        while True:
            try:
                version = await _served_version(client, group, versions, resource)
            except Exception as e:
                self.last_error = e
                delay = backoff.next()
                log.warning("asking which version of {} {} is served failed ({}); asking again in {:.1f}s", group,
                            resource, describe_error(e), delay)
                await asyncio.sleep(delay)
                continue
            self.last_error = None
            backoff.reset()
            if version is not None:
                return version
            if self.state is not ProviderState.NOT_INSTALLED:
                log.info("{} {} is not served (no version of {}); looking again every {:g}s", group, resource,
                         ", ".join(versions), interval)
                self.state = ProviderState.NOT_INSTALLED
            self._synced.set()
            await asyncio.sleep(interval)


async def _served_version(client: ApiClient, group: str, versions: Sequence[str], resource: str) -> str | None:
    """The first of ``versions`` whose discovery lists ``resource``; None if none does."""
    for version in versions:
        try:
            doc = await client.request("GET", f"/apis/{group}/{version}")
        except ApiError as e:
            if e.status == 404:
                continue
            raise
        if any(r.get("name") == resource for r in doc.get("resources") or ()):
            return version
    return None


def or_all(namespaces: Iterable[str]) -> list[str | None]:
    """The namespaces to watch one informer each in: ``namespaces``, or None (all namespaces) when empty."""
    return list(namespaces) or [None]
