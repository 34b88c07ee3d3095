"""The registries' member metrics: ``syncer_cluster_condition{cluster,condition}`` and ``syncer_clusters{state}``,
read from the members when collected (so they show what the informers see at that moment, and a member that
leaves takes its series with it). ``cluster`` is the member's name (``""`` for the local one, as its informers'
metrics have it)."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric

from informers.metrics import MetricSet

from .member import MemberState

if TYPE_CHECKING:
    from .cluster_registry import ClusterRegistry


def track(registry: "ClusterRegistry", metrics_registry: CollectorRegistry | None) -> None:
    """Report ``registry``'s members on ``metrics_registry`` (the process's by default) while it lives."""
    _Collector.for_registry(metrics_registry).registries.add(registry)


class _Collector(MetricSet):
    def __init__(self, registry: CollectorRegistry) -> None:
        super().__init__(registry)
        self.registries: "weakref.WeakSet[ClusterRegistry]" = weakref.WeakSet()
        registry.register(self)

    def collect(self) -> Iterator[Metric]:
        conditions = GaugeMetricFamily("syncer_cluster_condition", "1 if the member cluster's condition is true, 0 "
                                       "if false (absent while unknown).", labels=["cluster", "condition"])
        members = GaugeMetricFamily("syncer_clusters", "Member clusters by state.", labels=["state"])
        shown = [s for s in MemberState if s not in (MemberState.SUPERSEDED, MemberState.STOPPED)]
        counts = dict.fromkeys((s.value for s in shown), 0)
        for registry in list(self.registries):
            for name, m in sorted(registry.members().items()):
                member_conditions = m.current_conditions()
                counts[m.shown_state(member_conditions).value] += 1
                for c in member_conditions:
                    if c.status is not None:
                        conditions.add_metric([name, c.type.value], float(c.status))
        for state, n in counts.items():
            members.add_metric([state], n)
        yield from (conditions, members)
