"""WarmMembers: member clusters brought up ahead of their engagement (connected, discovered, the required informers
synced), so that the member that then engages one adopts its client and caches instead of connecting and listing
again: the warm standby of sharded member clusters, where a replica warms the clusters assigned to it whose Lease
another replica still holds (``syncer/sharding/units.py``).

A warm member is never engaged: it has no ``Cluster`` for anyone, so nothing reads or writes through it; its
adopter serves it under the adopter's own fence. multicluster-runtime's sharded coordinator connects to a cluster
only once it owns it, so a handover there lists everything again.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from loguru import logger

from informers.errors import describe_error

from .cluster import display_name, finish
from .fence import CLOSED
from .member import Member, MemberEnv
from .provider import ClusterConfig


@dataclass(eq=False)
class _Warm:
    member: Member
    task: asyncio.Task[None]  # its bring-up, done once synced (or failed: then it has released everything)


class WarmMembers:
    """The warm members of one registry (its ``env``), by cluster name: each brought up by a task of its own,
    adopted once (``take``) or dropped; ``stop()`` awaits every task and release."""

    def __init__(self, env: MemberEnv) -> None:
        self._env = env
        self._warm: dict[str, _Warm] = {}
        self._ending: set[asyncio.Task[None]] = set()
        self._log = logger.bind(component=env.component)

    def names(self) -> list[str]:
        """The clusters warm or warming, sorted."""
        return sorted(self._warm)

    def prepare(self, config: ClusterConfig) -> None:
        """Bring ``config`` up ahead (nothing if it is already; one of another config is dropped first). Not the
        local cluster: its informers are the process's own, which a warm member's release would take from under
        its engaged one (both require them as the registry)."""
        w = self._warm.get(config.name)
        if config.local or w is not None and _same(w.member.config, config):
            return
        self.drop(config.name)
        m = Member(config, CLOSED)
        self._warm[config.name] = _Warm(m, asyncio.create_task(self._run(m),
                                                               name=f"warm cluster {display_name(config.name)}"))

    def drop(self, name: str) -> None:
        """Stop warming ``name`` and release what it has (in the background; ``stop()`` awaits it)."""
        w = self._warm.pop(name, None)
        if w is not None:
            self._end_soon(w)

    async def take(self, config: ClusterConfig) -> Member | None:
        """The warm member of ``config`` (same source and digest), once its bring-up is over, for a new member to
        adopt; None if there is none or it failed (the adopter connects itself). One of another config is
        dropped."""
        w = self._warm.get(config.name)
        if w is None or not _same(w.member.config, config):
            self.drop(config.name)
            return None
        del self._warm[config.name]
        try:
            await asyncio.wait({w.task})  # no longer than the adopter's own bring-up would take
        except asyncio.CancelledError:  # the adopter is going: the warm member with it
            self._end_soon(w)
            raise
        return w.member if w.member.factory is not None else None

    async def stop(self) -> None:
        """Drop every warm member; return once each has released what it had."""
        for name in list(self._warm):
            self.drop(name)
        while self._ending:
            await asyncio.gather(*list(self._ending), return_exceptions=True)

    async def _run(self, m: Member) -> None:
        try:
            await m.warm_up(self._env)
        except Exception as e:  # the member that engages it retries as usual
            self._log.info("cluster {}: not brought up ahead ({}); it connects once engaged", display_name(m.name),
                           describe_error(e))
            await m.release(self._env)

    def _end_soon(self, w: _Warm) -> None:
        task = asyncio.create_task(finish(self._end(w)), name=f"cool cluster {display_name(w.member.name)}")
        self._ending.add(task)
        task.add_done_callback(self._ending.discard)

    async def _end(self, w: _Warm) -> None:
        w.task.cancel()
        await asyncio.wait({w.task})
        await w.member.release(self._env)


def _same(a: ClusterConfig, b: ClusterConfig) -> bool:
    """Whether ``a`` and ``b`` connect the same way, as the registry judges a config change."""
    return a.source == b.source and a.digest == b.digest
