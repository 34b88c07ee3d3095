"""ProviderSet: several cluster providers seen as one, in precedence order, and the loop that passes their changes on.

A cluster name given by two providers goes to the first listed (``clusters.providers``); the other claim is a
reported conflict, logged once, and takes over only when the first provider stops giving the name. The choice
depends on the providers' current views alone, so every replica and every restart makes the same one.

Changes are passed on only once every provider has listed its source (or ``sync_timeout`` passed): a restart
does not first connect to the cluster of a Secret that an older one, listed a moment later, overrules. Each name
is passed on by the keyed loop (``keyed_loop.py``: one name at a time, a failure retried with backoff), so a burst
of events for one cluster is one settle.
"""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Sequence

from loguru import logger

from informers import Supervisor, TaskHandle

from .cluster import display_name
from .provider import ClusterConfig, ClusterProvider, Conflict
from .keyed_loop import KeyedLoop
from .providers.claims import ConflictLog
from .workqueue import WorkQueue


class ProviderSet:
    """``providers`` in precedence order, read as one: ``get``, ``names``, ``conflicts``, ``status``."""

    def __init__(self, providers: Sequence[ClusterProvider], *, sync_timeout: float = 30.0,
                 name: str = "clusters", supervisor: Supervisor | None = None) -> None:
        names = [p.name for p in providers]
        duplicated = sorted({n for n in names if names.count(n) > 1})
        if duplicated:
            raise ValueError(f"cluster provider(s) {', '.join(duplicated)} given twice")
        self.providers = list(providers)
        self.name = name
        self._sync_timeout = sync_timeout
        self._supervisor = supervisor or Supervisor(name)
        self._queue: WorkQueue[str] = WorkQueue()
        self._loop = KeyedLoop(f"{name} providers", self._queue, self._settle, log=logger.bind(component=name),
                               action="settling cluster {}")
        self._on_change: Callable[[str], None] = lambda _: None
        self._conflicts = ConflictLog(name)
        self._started = False
        self._listed = False  # every provider has listed (or sync_timeout passed) and their names were queued
        self._log = logger.bind(component=name)

    def get(self, cluster: str) -> ClusterConfig | None:
        """The config of the first provider that gives ``cluster`` (the others' claims are conflicts)."""
        return next((c for p in self.providers if (c := p.get(cluster)) is not None), None)

    def names(self) -> set[str]:
        """Every cluster some provider gives."""
        return set().union(*(p.names() for p in self.providers))

    def conflicts(self) -> list[Conflict]:
        """The providers' own conflicts, then the claims that lost to a provider listed earlier."""
        out = [c for p in self.providers for c in p.conflicts()]
        held: dict[str, tuple[ClusterProvider, ClusterConfig]] = {}
        for provider in self.providers:
            for cluster in sorted(provider.names()):
                config = provider.get(cluster)
                if config is None:
                    continue
                if cluster not in held:
                    held[cluster] = provider, config
                    continue
                holder, kept = held[cluster]
                out.append(Conflict("provider", provider.name, cluster, kept.source,
                                    f"cluster name {display_name(cluster)!r} is held by {kept.source} (provider "
                                    f"{holder.name}, listed before {provider.name})", claim=config.source))
        return out

    def status(self) -> dict[str, Any]:
        """Each provider's own status, by name."""
        return {p.name: p.status() for p in self.providers}

    def synced(self) -> bool:
        """True once every provider has listed and every name they gave then has been passed on."""
        return self._listed and len(self._queue) == 0 and self._queue.processing == 0

    async def start(self, on_change: Callable[[str], None]) -> None:
        """Start every provider; ``on_change(name)`` is called (from one task, one name at a time) for each name
        whose config may have changed, once all have listed. A failing call is retried with backoff. A second
        call does nothing; one after ``stop()`` is refused: a set of providers runs once (build a new registry)."""
        if self._loop.state in ("stopping", "stopped"):
            raise RuntimeError(f"{self.name}: the cluster providers were stopped; they run once")
        if self._started:
            return
        self._started = True
        self._on_change = on_change
        for provider in self.providers:
            await provider.start(self._queue.add)
        # Not restarted: the loop runs once, and it only ends on a bug of its own, which /healthz then names.
        self._supervisor.spawn(f"{self.name} providers", self._work, restart=False)

    async def stop(self) -> None:
        """Stop passing changes on, then stop every provider."""
        await self._supervisor.cancel(f"{self.name} providers")
        await self._loop.stop()
        await asyncio.gather(*(p.stop() for p in self.providers))

    async def _work(self, _: TaskHandle) -> None:
        if not self._listed:
            await asyncio.gather(*(p.wait_synced(self._sync_timeout) for p in self.providers))
            for name in sorted(self.names()):
                self._queue.add(name)
            self._listed = True
        await self._loop.run()

    async def _settle(self, name: str) -> None:
        self._report(name)
        self._on_change(name)

    def _report(self, cluster: str) -> None:
        """Log the claims on ``cluster`` that lose to a provider listed earlier (once each)."""
        found = [(p, c) for p in self.providers if (c := p.get(cluster)) is not None]
        for provider, other in found[1:]:
            holder, config = found[0]
            self._conflicts.lost(f"{other.source} (provider {provider.name})", cluster,
                                 f"{config.source} (provider {holder.name}, listed first)",
                                 "the first provider in clusters.providers that gives a name holds it")
