"""RESTMapper: which GVR serves a kind, which kind a GVR holds, and whether it is namespaced, from discovery.

It plays client-go's RESTMapper role with these differences, and why:

- Lookups are async and a miss refreshes discovery before failing (client-go needs a separate
  ``DeferredDiscoveryRESTMapper`` plus a ``Reset()`` for that), because a kind installed by a CRD a moment ago
  is the usual reason for a miss. Misses arriving together share one discovery pass, and passes start at most
  once per ``min_refresh_interval``: a controller asking for an uninstalled kind in a loop cannot become a
  discovery storm.
- The kind is matched exactly in the ``apiVersion`` given: no version defaulting, no plural/singular/short-name
  guessing (kubectl's job, not a controller's, whose types are known).
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Callable, TypeVar

from .client import ApiClient
from .discovery import DiscoveryClient, DiscoveryResult, ResourceInfo
from .gvr import GVR

_T = TypeVar("_T")


class NoMatchError(LookupError):
    """Discovery, even freshly refreshed, knows no resource for this kind or GVR."""


class RESTMapper:
    """Maps ``(apiVersion, kind)`` to its GVR and back, and tells a GVR's scope, from discovery results.

    Feed it with ``load(result)`` when discovery results are at hand (a discovering factory has them), or let it
    run its own ``DiscoveryClient`` pass on the first lookup and on every miss.
    """

    def __init__(self, discovery: DiscoveryClient | ApiClient, *, min_refresh_interval: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.discovery = discovery if isinstance(discovery, DiscoveryClient) else DiscoveryClient(discovery)
        self.min_refresh_interval = min_refresh_interval
        self._clock = clock
        self._by_gvr: dict[GVR, ResourceInfo] = {}
        self._by_kind: dict[tuple[str, str], GVR] = {}
        self._refreshing = asyncio.Lock()
        self._last_pass_started = -math.inf

    def load(self, result: DiscoveryResult) -> None:
        """Replace what the mapper knows with one discovery pass's result."""
        self._by_gvr = dict(result.resources)
        self._by_kind = {}
        # Sorted so that a kind served by two resources of one group-version (rare) maps the same way every time.
        for gvr in sorted(result.resources):
            info = result.resources[gvr]
            if info.kind:
                self._by_kind.setdefault((gvr.group_version, info.kind), gvr)

    async def refresh(self) -> None:
        """Run a discovery pass now (after the least interval), unless one has started since this call."""
        asked = self._clock()
        async with self._refreshing:
            if self._last_pass_started < asked:
                await self._pass()

    async def resource_info(self, gvr: GVR) -> ResourceInfo:
        """What discovery says about ``gvr`` (kind, scope, verbs); NoMatchError if the server does not serve it."""
        return await self._lookup(lambda: self._by_gvr.get(gvr), f"resource {gvr}")

    async def gvr_for(self, api_version: str, kind: str) -> GVR:
        """The GVR serving ``kind`` in ``api_version`` (``v1``, ``apps/v1``); NoMatchError names the kind."""
        return await self._lookup(lambda: self._by_kind.get((api_version, kind)),
                                  f"kind {kind} in apiVersion {api_version}")

    async def kind_for(self, gvr: GVR) -> str:
        """The kind of the objects of ``gvr``."""
        return (await self.resource_info(gvr)).kind

    async def is_namespaced(self, gvr: GVR) -> bool:
        """Whether the objects of ``gvr`` live in namespaces."""
        return (await self.resource_info(gvr)).namespaced

    async def _lookup(self, find: Callable[[], _T | None], what: str) -> _T:
        found = find()
        if found is None:
            asked = self._clock()
            # Misses wait here in turn. A pass that ran meanwhile may have brought the answer; if not, only a pass
            # started after the miss can tell it is a real one: of a burst of misses, the first runs that pass and
            # the others find it has happened.
            async with self._refreshing:
                found = find()
                if found is None and self._last_pass_started < asked:
                    await self._pass()
                    found = find()
        if found is None:
            raise NoMatchError(f"the API server serves no {what} (discovery refreshed just now)")
        return found

    async def _pass(self) -> None:
        wait = self._last_pass_started + self.min_refresh_interval - self._clock()
        if wait > 0:
            await asyncio.sleep(wait)
        self._last_pass_started = self._clock()
        self.load(await self.discovery.discover())
