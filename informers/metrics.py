"""Prometheus metrics of informers, registered once per registry."""

from __future__ import annotations

import bisect
import copy
import itertools
import weakref
from typing import Any, Iterable, Iterator, Protocol, TypeVar

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

M = TypeVar("M", bound="MetricSet")
_F = TypeVar("_F", Counter, Gauge)
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

# The gauges read at scrape time (``InformerMetrics.observe``): name -> (help, labels after cluster and gvr).
GAUGES: dict[str, tuple[str, tuple[str, ...]]] = {
    "informer_last_resource_version": ("Last resourceVersion seen (when numeric).", ()),
    "informer_objects": ("Objects in the cache.", ()),
    "informer_synced": ("1 once the informer has synced.", ()),
    "informer_handler_queue_depth": ("Events waiting for one handler.", ("handler",)),
}


class Observed(Protocol):
    """An owner of gauge series (``InformerMetrics.observe``)."""

    def metric_readings(self) -> Iterable[Reading]:
        """Its gauges' current readings."""
        ...


class _ScrapeCollector:
    """The families whose values live in informers and reflectors, read when /metrics is scraped."""

    def __init__(self, metrics: "InformerMetrics") -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily("informer_events_total", "Watch events received, by type.",
                                     labels=["cluster", "gvr", "type"])
        totals: dict[tuple[str, str, str], int] = {}
        for (cluster, gvr), counts in list(self.metrics._owners.values()):
            for typ, n in counts.items():
                totals[(cluster, gvr, typ)] = totals.get((cluster, gvr, typ), 0) + n
        for labels, n in sorted(totals.items()):
            family.add_metric(list(labels), n)
        yield family
        values: dict[str, dict[tuple[str, ...], float]] = {name: {} for name in GAUGES}
        for owner, series in list(self.metrics._observed.items()):
            for name, extra, value in owner.metric_readings():
                values[name][(*series, *extra)] = value  # of two owners of one series, the later one is shown
        for name, (documentation, extra_labels) in GAUGES.items():
            gauge = GaugeMetricFamily(name, documentation, labels=["cluster", "gvr", *extra_labels])
            for series_labels, value in sorted(values[name].items()):
                gauge.add_metric(list(series_labels), value)
            yield gauge


class InformerMetrics(MetricSet):
    """The informer metric families; get the shared instance of a registry with ``InformerMetrics.for_registry``.

    Every family is labelled by ``cluster`` and GVR: ``for_cluster(name)`` gives the view whose informers' series
    carry ``cluster=name``, so the informers of a fleet's members share the process's registry without
    colliding. The cluster the process connects to is ``""``, which Prometheus stores as no label at all: a
    single-cluster process keeps the series it always had. The series of a (cluster, GVR) live while an informer
    of it does (from ``track`` to ``forget``): a process that watches CRDs, or members, as they come and go would
    otherwise keep every one it ever saw on /metrics. One watched again starts its counters from zero, which
    Prometheus reads as a counter reset.
    """

    cluster = ""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self._families: list[Counter | Gauge] = []
        self.lists = self._per_gvr(Counter, "informer_lists_total", "LIST requests made (pages count once each).")
        self.watches = self._per_gvr(Counter, "informer_watches_total", "WATCH requests opened.", "mode")
        self.relists = self._per_gvr(Counter, "informer_relists_total",
                                     "Full resynchronisations from the server, by reason.", "reason")
        # Watch events are counted in plain integers on each reflector and exposed at scrape time: a
        # prometheus_client Counter.inc() per event would cost a sizeable part of handling the event.
        self._owners: "weakref.WeakKeyDictionary[Any, tuple[tuple[str, str], dict[str, int]]]" = \
            weakref.WeakKeyDictionary()
        # The gauges (``GAUGES``) are read from their owners at scrape time too (``observe``): making a
        # prometheus_client child per series as each informer started was ~2.5 % of a fleet's bring-up CPU
        # (py-spy, 250 members), and a child is ~1 KiB (9 for a member's 3 informers). client-go's informers
        # export no such gauges; ours keep them, only cheaper.
        self._observed: "weakref.WeakKeyDictionary[Any, tuple[str, str]]" = weakref.WeakKeyDictionary()
        registry.register(_ScrapeCollector(self))
        self.errors = self._per_gvr(Counter, "informer_errors_total", "List/watch failures, by kind.", "kind")

    def _per_gvr(self, kind: type[_F], name: str, documentation: str, *labels: str) -> _F:
        family = kind(name, documentation, ("cluster", "gvr", *labels), registry=self.registry)
        self._families.append(family)
        return family

    def for_cluster(self, cluster: str) -> "InformerMetrics":
        """The view of these families whose series are labelled ``cluster=cluster`` (same registry, same
        series bookkeeping)."""
        if cluster == self.cluster:
            return self
        view = copy.copy(self)
        view.cluster = cluster
        return view

    def track(self, owner: object, gvr: str, event_counts: dict[str, int]) -> None:
        """Count ``owner``'s watch events (``event_counts``, by type) under this view's cluster and ``gvr``, and
        keep their series until ``owner`` and every other owner of them are forgotten."""
        self._owners[owner] = ((self.cluster, gvr), event_counts)

    def observe(self, owner: Observed, gvr: str) -> None:
        """Show ``owner``'s gauge readings (``GAUGES``), under this view's cluster and ``gvr``, on every scrape
        until ``owner`` is forgotten or gone (held weakly, as the events of ``track``)."""
        self._observed[owner] = (self.cluster, gvr)

    def forget(self, owner: object) -> None:
        """Stop counting ``owner``'s events and reading its gauges; if it was the last owner of its (cluster,
        GVR), remove every series of them (no-op for an unknown or already forgotten owner)."""
        self._observed.pop(owner, None)
        entry = self._owners.pop(owner, None)
        if entry is None or any(key == entry[0] for key, _ in self._owners.values()):
            return
        for family in self._families:
            # Label values start (cluster, gvr) (``_per_gvr``): the series are found by their keys, not collected.
            # Collecting every series of every member, for each informer that stops, made a replica running
            # hundreds of members block its event loop for seconds when it handed tens of them over.
            for values in [v for v in list(family._metrics) if tuple(v[:2]) == entry[0]]:
                family.remove(*values)
