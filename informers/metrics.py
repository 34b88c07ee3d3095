"""Prometheus metrics of informers, registered once per registry."""

from __future__ import annotations

import weakref
from typing import Any, Iterator, TypeVar

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, Metric

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


class _EventCollector:
    def __init__(self, metrics: "InformerMetrics") -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily("informer_events_total", "Watch events received, by type.",
                                     labels=["gvr", "type"])
        totals: dict[tuple[str, str], int] = {}
        for owner, counts in list(self.metrics.event_counters.items()):
            for typ, n in counts.items():
                key = (str(getattr(owner, "gvr", owner)), typ)
                totals[key] = totals.get(key, 0) + n
        for (gvr, typ), n in sorted(totals.items()):
            family.add_metric([gvr, typ], n)
        yield family


class InformerMetrics(MetricSet):
    """The informer metric families; get the shared instance of a registry with ``InformerMetrics.for_registry``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.lists = Counter("informer_lists_total", "LIST requests made (pages count once each).",
                             ["gvr"], registry=registry)
        self.watches = Counter("informer_watches_total", "WATCH requests opened.", ["gvr", "mode"],
                               registry=registry)
        self.relists = Counter("informer_relists_total", "Full resynchronisations from the server, by reason.",
                               ["gvr", "reason"], registry=registry)
        # Watch events are counted in plain integers on each reflector and exposed at scrape time: a
        # prometheus_client Counter.inc() per event would cost a sizeable part of handling the event.
        self.event_counters: "weakref.WeakKeyDictionary[Any, dict[str, int]]" = weakref.WeakKeyDictionary()
        registry.register(_EventCollector(self))
        self.errors = Counter("informer_errors_total", "List/watch failures, by kind.", ["gvr", "kind"],
                              registry=registry)
        self.resource_version = Gauge("informer_last_resource_version",
                                      "Last resourceVersion seen (when numeric).", ["gvr"], registry=registry)
        self.objects = Gauge("informer_objects", "Objects in the cache.", ["gvr"], registry=registry)
        self.synced = Gauge("informer_synced", "1 once the informer has synced.", ["gvr"], registry=registry)
        self.handler_queue_depth = Gauge("informer_handler_queue_depth", "Events waiting for one handler.",
                                         ["gvr", "handler"], registry=registry)

    def forget(self, gvr: str) -> None:
        """Drop the per-GVR gauges of a stopped informer (counters stay: they are monotonic)."""
        for gauge in (self.resource_version, self.objects, self.synced):
            try:
                gauge.remove(gvr)
            except KeyError:
                pass
