"""The last minutes of each controller's figures, for the status page's charts: every ``interval`` seconds the
reconcile counters, reconcile time and work queue depth of every controller name are read from its metrics
records (``controllers.metrics``, ``controllers.workqueue``: what ``/metrics`` would report, without a scrape)
into a ring buffer of ``size`` samples, 10 minutes by default.

Prometheus keeps the long history; this is for a person looking at one replica with no Prometheus to ask. The
figures are by the name a controller's metrics carry (its ``Controller`` name), which every instance of it
shares: in a fleet, the instances in all member clusters together. A sample costs a few reads per controller
name; ``run()`` is a task the HTTP server owns.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Callable

from prometheus_client import CollectorRegistry

from controllers.metrics import reconcile_records
from controllers.workqueue import queue_depths

# The mean reconcile time and the rates the page gives as numbers are over this many seconds (the charts show
# the whole buffer).
RECENT = 60.0


@dataclass(frozen=True)
class Figures:
    """One controller name's counters at one sample: reconciles (all results), errors, seconds spent reconciling,
    and the depth of its work queue(s)."""

    reconciles: int
    errors: int
    seconds: float
    depth: int


@dataclass(frozen=True)
class Trend:
    """What the page shows of one controller name: ``rates`` (reconciles per second between samples) and
    ``depths`` (queue depth at each sample), each point as (seconds before now, value); over the last ``RECENT``
    seconds the reconcile rate, error rate and mean reconcile time (None without a reconcile then); the depth now."""

    rates: list[tuple[float, float]]
    depths: list[tuple[float, float]]
    rate: float | None
    error_rate: float | None
    latency: float | None
    depth: int


class StatusHistory:
    """A ring buffer of samples of every controller name's figures; ``trends()`` reads it for the page."""

    def __init__(self, interval: float = 5.0, size: int = 120, registry: CollectorRegistry | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.interval, self.size = interval, size
        self._registry, self._clock = registry, clock
        self._samples: list[tuple[float, dict[str, Figures]]] = []
        self._next = 0  # where the next sample goes once the buffer is full

    @property
    def window(self) -> float:
        """How many seconds the buffer spans when full."""
        return self.interval * self.size

    def sample(self) -> None:
        """Read every controller name's figures now."""
        depths = queue_depths(self._registry)
        figures = {name: Figures(sum(m.results.values()), m.errors, m.durations.total, depths.get(name, 0))
                   for name, m in reconcile_records(self._registry).items()}
        figures.update({name: Figures(0, 0, 0.0, depth) for name, depth in depths.items() if name not in figures})
        entry = (self._clock(), figures)
        if len(self._samples) < self.size:
            self._samples.append(entry)
        else:
            self._samples[self._next] = entry
            self._next = (self._next + 1) % self.size

    async def run(self) -> None:
        """Sample every ``interval`` seconds until cancelled."""
        while True:
            self.sample()
            await asyncio.sleep(self.interval)

    def trends(self) -> dict[str, Trend]:
        """Every controller name's trend over the buffer, by name."""
        samples = self._samples[self._next:] + self._samples[:self._next]  # oldest first
        now = self._clock()
        names = {name for _, figures in samples for name in figures}
        return {name: self._trend(name, samples, now) for name in sorted(names)}

    @staticmethod
    def _trend(name: str, samples: list[tuple[float, dict[str, Figures]]], now: float) -> Trend:
        seen = [(at, figures[name]) for at, figures in samples if name in figures]
        rates = [(now - at, (f.reconciles - p.reconciles) / (at - before))
                 for (before, p), (at, f) in zip(seen, seen[1:]) if at > before]
        depths = [(now - at, float(f.depth)) for at, f in seen]
        # The oldest sample within RECENT of the last one (and before it) is the base of the recent figures.
        last_at, last = seen[-1]
        base_at, base = next(((at, f) for at, f in seen if last_at - at <= RECENT and at < last_at), seen[-1])
        span, done = last_at - base_at, last.reconciles - base.reconciles
        return Trend(rates, depths, done / span if span else None,
                     (last.errors - base.errors) / span if span else None,
                     (last.seconds - base.seconds) / done if done else None, last.depth)
