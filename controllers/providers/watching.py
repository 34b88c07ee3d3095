"""WatchingProvider: what the providers that watch a source in one background task share (its lifecycle)."""

from __future__ import annotations

import asyncio

from ..provider import Changed


class WatchingProvider:
    """The lifecycle of a provider watching its source in one task: ``start`` runs ``_watch_source`` once, which
    sets ``_synced`` once it has read the source fully once and calls ``_tell(name)`` on every change; ``stop``
    cancels and awaits it, then ``_release`` (what the task set up: informers)."""

    def __init__(self, name: str) -> None:
        self.name = name
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
