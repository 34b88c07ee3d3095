"""Informer factories of the tests, each with a metrics registry of its own, and what the tests read off them: the
sum of a metric, the events a handler saw."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from informers import (
    ApiClient, DeletedFinalStateUnknown, DiscoveringDynamicSharedInformerFactory, DiscoveryOptions, DynamicSharedInformerFactory,
    ResourceFilter,
)


def only(prefix: str) -> ResourceFilter:
    """Keep the tests' own groups only: the built-in set is not what these tests are about."""
    return ResourceFilter(include=[f"{prefix}-*.example.com/*"])


_RUNTIME = ("metrics_registry", "supervisor", "name", "metrics_cluster")


def factory(client: ApiClient, **kw) -> DiscoveringDynamicSharedInformerFactory:
    """A discovering factory: ``kw`` are ``DiscoveryOptions`` fields and the constructor's own keywords."""
    runtime = {k: kw.pop(k) for k in _RUNTIME if k in kw}
    runtime.setdefault("metrics_registry", CollectorRegistry())
    return DiscoveringDynamicSharedInformerFactory(client, DiscoveryOptions(**kw), **runtime)


class Recorder:
    """An event handler that records what it sees."""

    def __init__(self, name: str = "recorder") -> None:
        self.name = name
        self.events: list[tuple] = []

    def on_add(self, obj, is_in_initial_list):
        self.events.append(("add", obj["metadata"]["name"], is_in_initial_list))

    def on_update(self, old, new):
        self.events.append(("update", new["metadata"]["name"], old["metadata"]["resourceVersion"],
                            new["metadata"]["resourceVersion"]))

    def on_delete(self, obj):
        if isinstance(obj, DeletedFinalStateUnknown):
            self.events.append(("tombstone", obj.obj["metadata"]["name"]))
        else:
            self.events.append(("delete", obj["metadata"]["name"]))


def factory_for(api: ApiClient, **kw) -> DynamicSharedInformerFactory:
    kw.setdefault("metrics_registry", CollectorRegistry())
    return DynamicSharedInformerFactory(api, **kw)


def counter_sum(f: DynamicSharedInformerFactory, name: str, **labels) -> float:
    """Sum of a metric's samples matching ``labels`` in the factory's own registry."""
    return sum(sample.value for family in f.metrics.registry.collect() for sample in family.samples
               if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()))


def passes_health(f: DiscoveringDynamicSharedInformerFactory) -> Any:
    (h,) = [h for h in f.supervisor.health() if h.name == "discovery passes"]
    return h
