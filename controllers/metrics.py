"""Reconcile metrics under controller-runtime's names, kept in plain counters and read at scrape time.

controller-runtime updates prometheus vectors (a lookup and a lock) per reconcile; here each controller name has a
``ReconcileMetrics`` record of plain numbers, turned into metric families at scrape. A name's record outlives its
controller instances, so counters only go up. Series ``controller_runtime_`` + ``reconcile_total``,
``reconcile_errors_total``, ``terminal_reconcile_errors_total``, ``reconcile_time_seconds``, ``active_workers``,
``max_concurrent_reconciles``; and ours, ``controller_read_your_writes_waits_total`` and
``controller_read_your_writes_wait_seconds``.
"""

from __future__ import annotations

from typing import Iterator, Literal

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from informers.metrics import Histogram, MetricSet

ReconcileResult = Literal["success", "error", "requeue", "requeue_after"]
RESULTS: tuple[ReconcileResult, ...] = ("success", "error", "requeue", "requeue_after")
# controller-runtime's reconcile_time_seconds buckets.
BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.35, 0.4, 0.45, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0,
           1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 15.0, 20.0, 25.0, 30.0,
           40.0, 50.0, 60.0)
# A read-your-writes wait is one watch event's latency when all goes well, and at most the bound (a few seconds).
WAIT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0)


class ReconcileMetrics:
    """The reconcile counts of one controller name; ``observe`` records one finished reconcile."""

    __slots__ = ("results", "errors", "terminal_errors", "durations", "active_workers", "max_concurrent_reconciles")

    def __init__(self) -> None:
        self.results = dict.fromkeys(RESULTS, 0)
        self.errors = 0
        self.terminal_errors = 0
        self.durations = Histogram(BUCKETS)
        self.active_workers = 0
        self.max_concurrent_reconciles = 0

    def observe(self, result: ReconcileResult, seconds: float, terminal: bool = False) -> None:
        """One reconcile ended with ``result`` after ``seconds``; an error is ``terminal`` if not retried."""
        self.results[result] += 1
        if result == "error":
            self.errors += 1
            self.terminal_errors += terminal
        self.durations.observe(seconds)


class ReadYourWritesMetrics:
    """The read-your-writes waits of one controller name; ``observe`` records one."""

    __slots__ = ("caught_up", "timeouts", "durations")

    def __init__(self) -> None:
        self.caught_up = 0
        self.timeouts = 0
        self.durations = Histogram(WAIT_BUCKETS)

    def observe(self, caught_up: bool, seconds: float) -> None:
        """A reconcile waited ``seconds`` for its earlier writes, which then showed (``caught_up``) or not."""
        if caught_up:
            self.caught_up += 1
        else:
            self.timeouts += 1
        self.durations.observe(seconds)


class _Collector(MetricSet):
    """Exposes the ``ReconcileMetrics`` of every controller name of a registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.controllers: dict[str, ReconcileMetrics] = {}
        self.read_your_writes: dict[str, ReadYourWritesMetrics] = {}
        registry.register(self)

    def collect(self) -> Iterator[Metric]:
        total = CounterMetricFamily("controller_runtime_reconcile_total", "Total number of reconciliations per "
                                    "controller.", labels=["controller", "result"])
        errors = CounterMetricFamily("controller_runtime_reconcile_errors_total", "Total number of reconciliation "
                                     "errors per controller.", labels=["controller"])
        terminal = CounterMetricFamily("controller_runtime_terminal_reconcile_errors_total", "Total number of "
                                       "terminal reconciliation errors per controller.", labels=["controller"])
        duration = HistogramMetricFamily("controller_runtime_reconcile_time_seconds", "Length of time per "
                                     "reconciliation per controller.", labels=["controller"])
        active = GaugeMetricFamily("controller_runtime_active_workers", "Number of currently used workers per "
                                   "controller.", labels=["controller"])
        limit = GaugeMetricFamily("controller_runtime_max_concurrent_reconciles", "Maximum number of concurrent "
                                  "reconciles per controller.", labels=["controller"])
        for name, m in sorted(self.controllers.items()):
            for result, n in m.results.items():
                total.add_metric([name, result], n)
            errors.add_metric([name], m.errors)
            terminal.add_metric([name], m.terminal_errors)
            duration.add_metric([name], Histogram.buckets([m.durations]), m.durations.total)
            active.add_metric([name], m.active_workers)
            limit.add_metric([name], m.max_concurrent_reconciles)
        yield from (total, errors, terminal, duration, active, limit)
        waits = CounterMetricFamily("controller_read_your_writes_waits_total", "Reconciles that waited for their "
                                    "own earlier writes to show in the caches, by outcome.",
                                    labels=["controller", "result"])
        waited = HistogramMetricFamily("controller_read_your_writes_wait_seconds", "How long reconciles waited for "
                                       "their own earlier writes to show in the caches.", labels=["controller"])
        for name, r in sorted(self.read_your_writes.items()):
            waits.add_metric([name, "caught_up"], r.caught_up)
            waits.add_metric([name, "timeout"], r.timeouts)
            waited.add_metric([name], Histogram.buckets([r.durations]), r.durations.total)
        yield from (waits, waited)


def reconcile_metrics(controller: str, registry: CollectorRegistry | None = None) -> ReconcileMetrics:
    """The record of ``controller`` on ``registry`` (prometheus_client's global one by default), made on first
    use and shared by every instance of that controller."""
    controllers = _Collector.for_registry(registry).controllers
    found = controllers.get(controller)
    if found is None:
        found = controllers[controller] = ReconcileMetrics()
    return found


def read_your_writes_metrics(controller: str, registry: CollectorRegistry | None = None) -> ReadYourWritesMetrics:
    """As ``reconcile_metrics``, the read-your-writes record of ``controller``."""
    records = _Collector.for_registry(registry).read_your_writes
    found = records.get(controller)
    if found is None:
        found = records[controller] = ReadYourWritesMetrics()
    return found


def reconcile_records(registry: CollectorRegistry | None = None) -> dict[str, ReconcileMetrics]:
    """The record of every controller name on ``registry`` so far, to read without a scrape (the status page's
    history samples them); none is made."""
    collector = _Collector.registered(registry)
    return dict(collector.controllers) if collector is not None else {}
