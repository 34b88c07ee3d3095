"""Prometheus metrics of informers, registered once per registry."""

from __future__ import annotations

import bisect
import copy
import itertools
import weakref
from typing import Any, Iterable, Iterator, Protocol, TypeVar

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

M = TypeVar("M", bound="MetricSet")
_sets: "weakref.WeakKeyDictionary[CollectorRegistry, dict[type, Any]]" = weakref.WeakKeyDictionary()


class MetricSet:
    """A group of metric families created once per registry (prometheus refuses a name registered twice)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry

    @classmethod
    def for_registry(cls: type[M], registry: CollectorRegistry | None = None) -> M:
        """The instance registered on ``registry`` (default: prometheus_client's global one)."""
        reg = registry if registry is not None else REGISTRY
        per_class = _sets.setdefault(reg, {})
        found = per_class.get(cls)
        if found is None:
            found = per_class[cls] = cls(reg)
        return found

    @classmethod
    def registered(cls: type[M], registry: CollectorRegistry | None = None) -> M | None:
        """The instance registered on ``registry`` if one was made (a reader that must not add families)."""
        found: M | None = _sets.get(registry if registry is not None else REGISTRY, {}).get(cls)
        return found


class Histogram:
    """A lock-free histogram for the single-threaded event loop: ``observe`` is a bisect and two additions,
    against several microseconds for prometheus_client's (which would dominate a work queue's own cost)."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        """Record one value."""
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    @staticmethod
    def buckets(histograms: Iterable["Histogram"]) -> list[tuple[str, float]]:
        """The cumulative ``(le, count)`` buckets of histograms with the same bounds, summed, for a family."""
        hs = list(histograms)
        counts = [sum(c) for c in zip(*(h.counts for h in hs))]
        bounds = hs[0].bounds if hs else ()
        return list(zip([*map(str, bounds), "+Inf"], itertools.accumulate(counts)))


# A reading: (family, label values after cluster and gvr, value).
Reading = tuple[str, tuple[str, ...], float]

# The per-GVR families, read from their owners at scrape time (``InformerMetrics.observe``): name -> (counter?,
# help, labels after cluster and gvr). A counter's series is the sum over its owners (two informers of one GVR
# count together), a gauge's is the reading of the owner observed last.
FAMILIES: dict[str, tuple[bool, str, tuple[str, ...]]] = {
    "informer_lists_total": (True, "LIST requests made (pages count once each).", ()),
    "informer_watches_total": (True, "WATCH requests opened.", ("mode",)),
    "informer_relists_total": (True, "Full resynchronisations from the server, by reason.", ("reason",)),
    "informer_errors_total": (True, "List/watch failures, by kind.", ("kind",)),
    "informer_events_total": (True, "Watch events received, by type.", ("type",)),
    "informer_last_resource_version": (False, "Last resourceVersion seen (when numeric).", ()),
    "informer_objects": (False, "Objects in the cache.", ()),
    "informer_synced": (False, "1 once the informer has synced.", ()),
    "informer_handler_queue_depth": (False, "Events waiting for one handler.", ("handler",)),
}


class Observed(Protocol):
    """An owner of per-GVR series (``InformerMetrics.observe``)."""

    def metric_readings(self) -> Iterable[Reading]:
        """Its series' current values."""
        ...


class _ScrapeCollector:
    """The per-GVR families, whose values live in informers and reflectors, read when /metrics is scraped."""

    def __init__(self, metrics: "InformerMetrics") -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        values: dict[str, dict[tuple[str, ...], float]] = {name: {} for name in FAMILIES}
        live = set()
        for owner, series in list(self.metrics._observed.items()):
            live.add(series)
            for name, extra, value in owner.metric_readings():
                found, key = values[name], (*series, *extra)
                found[key] = found.get(key, 0) + value if FAMILIES[name][0] else value
        for series in [s for s in self.metrics._owners if s not in live]:
            self.metrics._drop(series)  # its owners were dropped without being forgotten
        for series, readings in self.metrics._retired.items():
            for (name, extra), value in readings.items():
                found, key = values[name], (*series, *extra)
                found[key] = found.get(key, 0) + value
        for name, (counter, documentation, extra_labels) in FAMILIES.items():
            kind = CounterMetricFamily if counter else GaugeMetricFamily
            family = kind(name, documentation, labels=["cluster", "gvr", *extra_labels])
            for labels, value in sorted(values[name].items()):
                family.add_metric(list(labels), value)
            yield family


class InformerMetrics(MetricSet):
    """The informer metric families; get the shared instance of a registry with ``InformerMetrics.for_registry``.

    Every family is labelled by ``cluster`` and GVR: ``for_cluster(name)`` gives the view whose informers' series
    carry ``cluster=name``, so the informers of a fleet's members share the process's registry without
    colliding. The cluster the process connects to is ``""``, which Prometheus stores as no label at all: a
    single-cluster process keeps the series it always had. The series of a (cluster, GVR) live while an informer
    of it does (from ``observe`` to ``forget``): a process that watches CRDs, or members, as they come and go would
    otherwise keep every one it ever saw on /metrics. One watched again starts its counters from zero, which
    Prometheus reads as a counter reset.
    """

    cluster = ""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        # Every per-GVR series is counted or read in plain Python on its informer or reflector and exposed at
        # scrape time (``FAMILIES``): a prometheus_client Counter.inc() per watch event, or a child per series
        # made as each informer starts, costs a fleet CPU and memory per member for figures that are only read
        # when scraped. client-go's informers export no such series; ours keep them, only cheaper.
        self._observed: "weakref.WeakKeyDictionary[Any, tuple[str, str]]" = weakref.WeakKeyDictionary()
        # Per (cluster, GVR): how many owners were observed and not yet forgotten, and the counter readings of the
        # forgotten ones, still added in while another owner of the series lives so a counter never goes down.
        self._owners: dict[tuple[str, str], int] = {}
        self._retired: dict[tuple[str, str], dict[tuple[str, tuple[str, ...]], float]] = {}
        registry.register(_ScrapeCollector(self))

    def for_cluster(self, cluster: str) -> "InformerMetrics":
        """The view of these families whose series are labelled ``cluster=cluster`` (same registry, same
        series bookkeeping)."""
        if cluster == self.cluster:
            return self
        view = copy.copy(self)
        view.cluster = cluster
        return view

    def observe(self, owner: Observed, gvr: str) -> None:
        """Show ``owner``'s readings (``FAMILIES``), under this view's cluster and ``gvr``, on every scrape until
        ``owner`` is forgotten or gone (it is held weakly)."""
        if owner not in self._observed:
            series = (self.cluster, gvr)
            self._owners[series] = self._owners.get(series, 0) + 1
            self._observed[owner] = series

    def forget(self, owner: Observed) -> None:
        """Stop showing ``owner``'s readings: its counts stay in its series' counters while another owner of the
        series lives, and a series none of whose owners is left is gone from /metrics (no-op for an unknown or
        already forgotten owner)."""
        series = self._observed.pop(owner, None)
        if series is None:
            return
        left = self._owners.get(series, 1) - 1
        if left <= 0:
            self._drop(series)
            return
        self._owners[series] = left
        retired = self._retired.setdefault(series, {})
        for name, extra, value in owner.metric_readings():
            if FAMILIES[name][0]:
                retired[name, extra] = retired.get((name, extra), 0) + value

    def _drop(self, series: tuple[str, str]) -> None:
        self._owners.pop(series, None)
        self._retired.pop(series, None)
