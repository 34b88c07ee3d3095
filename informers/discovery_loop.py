"""DiscoveryLoop: when a discovering factory runs its discovery passes.

Passes run at start, when asked (``trigger``: a CRD or APIService changed, a watch answered 404, demand
changed), when the server answers again after an outage (it may have been upgraded; after a random 0 to
``AFTER_OUTAGE_SPREAD`` seconds, so the N members of one restarted server do not all rediscover at the moment it
is back, when it is busiest with their relists; informers resume on their own, not after it), and periodically: every
``rediscovery_interval`` while only a pass can see a change (``blind()``), else every
``full_rediscovery_interval``, jittered (client-go's ``wait.Jitter``) so a fleet's members do not pass together.
A burst of triggers becomes one pass (``min_pass_interval``).

kcp's update loop logs a failed update and runs again at its next tick; here every failed pass (an API error, a
cut connection, a bug) is logged with its cause and retried with backoff, under a ``Supervisor`` that shows a
hanging pass as wedged. The first pass is retried inside ``first_pass()``, except ``DiscoveryForbidden``, which
no retry fixes.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from typing import Awaitable, Callable

from loguru import logger

from .access_review import AccessReviewsFailed
from .backoff import Backoff
from .client import CONNECTION_ERRORS, ApiClient
from .discovery import DiscoveryForbidden
from .errors import ApiError
from .supervisor import Supervisor, TaskHandle

_EXPECTED_ERRORS = (ApiError, *CONNECTION_ERRORS, AccessReviewsFailed)
_JITTER = 0.2  # a periodic pass waits its interval plus up to this fraction of it
AFTER_OUTAGE_SPREAD = 5.0  # seconds: the pass after an outage waits a random part of this (module docstring)

# One pass: ``periodic`` says whether a timer (not a trigger) asked for it; returns what made it fail or left it
# incomplete, if anything.
PassFunc = Callable[[bool], Awaitable[Exception | None]]


class DiscoveryLoop:
    """Runs ``run_pass`` as the module docstring says; its tasks run under ``supervisor``, named after ``name``."""

    def __init__(self, run_pass: PassFunc, client: ApiClient, supervisor: Supervisor, *, name: str,
                 rediscovery_interval: float, full_rediscovery_interval: float, min_pass_interval: float,
                 blind: Callable[[], bool]) -> None:
        self.run_pass = run_pass
        self.client = client
        self.supervisor = supervisor
        self.rediscovery_interval = rediscovery_interval
        self.full_rediscovery_interval = max(full_rediscovery_interval, rediscovery_interval)
        self.min_pass_interval = min_pass_interval
        self.blind = blind
        self.loop_name = f"{name} passes"
        self._recoveries_name = f"{name} recoveries"
        self._wake = asyncio.Event()
        self._last_pass_started = 0.0
        self._log = logger.bind(component=name)

    def trigger(self) -> None:
        """Ask for a pass soon (coalesced with other requests)."""
        self._wake.set()

    async def first_pass(self) -> None:
        """Run the first pass, retried with backoff until it succeeds; ``DiscoveryForbidden`` is raised at once.
        A pass left incomplete by failed access reviews counts: the loop asks again."""
        backoff = Backoff()
        for attempt in itertools.count(1):
            error = await self._attempt(periodic=True)
            if error is None:
                return
            if isinstance(error, AccessReviewsFailed):
                self._log.warning("first discovery pass incomplete ({}); asking again shortly", error)
                self.trigger()
                return
            if isinstance(error, DiscoveryForbidden):
                raise error
            delay = backoff.next()
            self._log_failure(f"first discovery pass (attempt {attempt})", error, delay)
            await asyncio.sleep(delay)

    def start(self, wedge_after: float) -> None:
        """Keep passing in the background; a pass busy longer than ``wedge_after`` shows as wedged."""
        self.supervisor.spawn(self.loop_name, self._loop, wedge_after=wedge_after)
        self.supervisor.spawn(self._recoveries_name, self._after_outages)

    async def stop(self) -> None:
        """Stop passing (a pass in progress is cancelled)."""
        await self.supervisor.cancel(self.loop_name)
        await self.supervisor.cancel(self._recoveries_name)

    def _period(self) -> float:
        interval = self.rediscovery_interval if self.blind() else self.full_rediscovery_interval
        return interval * (1 + random.uniform(0, _JITTER))

    async def _after_outages(self, _: TaskHandle) -> None:
        while True:
            await self.client.answered_again(self.client.recoveries)
            await asyncio.sleep(after_outage_delay())
            self.trigger()

    async def _loop(self, handle: TaskHandle) -> None:
        backoff = Backoff()
        while True:
            periodic = False
            try:
                async with asyncio.timeout(self._period()):
                    await self._wake.wait()
            except TimeoutError:
                periodic = True
            wait = self._last_pass_started + self.min_pass_interval - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            self._wake.clear()
            with handle.busy():
                error = await self._attempt(periodic)
            if error is None:
                handle.succeeded()
                backoff.reset()
                continue
            handle.failed(error)
            delay = backoff.next()
            self._log_failure("discovery pass", error, delay)
            await asyncio.sleep(delay)
            self._wake.set()

    async def _attempt(self, periodic: bool) -> Exception | None:
        self._last_pass_started = time.monotonic()
        try:
            return await self.run_pass(periodic)
        except Exception as e:  # every failure is retried: a dead pass loop would freeze the informer set
            return e

    def _log_failure(self, what: str, error: Exception, delay: float) -> None:
        if isinstance(error, _EXPECTED_ERRORS):
            self._log.warning("{} failed ({!r}); retrying in {:.1f}s", what, error, delay)
        else:
            self._log.opt(exception=error).error("{} failed unexpectedly ({!r}); retrying in {:.1f}s", what, error,
                                                 delay)


def after_outage_delay() -> float:
    """How long the pass after an outage waits: uniform in [0, ``AFTER_OUTAGE_SPREAD``]."""
    return random.uniform(0, AFTER_OUTAGE_SPREAD)
