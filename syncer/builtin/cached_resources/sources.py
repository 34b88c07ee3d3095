"""Where each source cluster stands with a replicated GVR, and so whether its wrappers stay.

A cluster's wrappers are kept current only while its informer is in the replication's union; every cluster a
wrapper names gets a ``Standing``: ``Serving`` (kept current), ``NotServed`` (its last discovery or CRD cache says
it has no such objects: removed), ``Left`` (no source any more: removed), ``Unreachable`` (what it holds is unknown:
kept as last seen) or ``Pending`` (serves it, informer not in yet: kept).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from controllers.cluster import display_name
from controllers.cluster_registry import ClusterRegistry
from controllers.cluster_term import ClusterTerm
from informers import GVR, ClusterSource


class Standing(enum.StrEnum):
    """A source cluster's relation to a replicated GVR (see the module docstring)."""

    SERVING = "Serving"
    NOT_SERVED = "NotServed"
    LEFT = "Left"
    UNREACHABLE = "Unreachable"
    PENDING = "Pending"

    @property
    def purges(self) -> bool:
        """Whether the cluster's wrappers are removed: it has no such objects, or is no source."""
        return self in (Standing.NOT_SERVED, Standing.LEFT)


@dataclass(frozen=True)
class SourceReport:
    """One cluster's standing and why."""

    standing: Standing
    detail: str = ""


class SourceClusters:
    """The source clusters of the fleet (``registry``'s members, only those named in ``only`` if it is not empty)
    and their standing with a GVR."""

    def __init__(self, registry: ClusterRegistry | ClusterTerm, only: tuple[str, ...] = ()) -> None:
        self.registry, self.only = registry, only

    def names(self) -> set[str] | None:
        """Every cluster that is a source now, connected or not; None until the registry has read its providers
        (before that, a cluster missing here may merely not be read yet)."""
        if not self.registry.synced():
            return None
        return {c for c in self.registry.providers.names() if not self.only or c in self.only}

    def standings(self, gvr: GVR, joined: Iterable[str], clusters: Iterable[str]) -> dict[str, SourceReport]:
        """The standing with ``gvr`` of every source cluster and of every one of ``clusters`` (those named by
        wrappers); ``joined``: the clusters whose informer of ``gvr`` is in the replication."""
        names = self.names()
        joined = set(joined)
        connected = _connected(self.registry)
        out: dict[str, SourceReport] = {}
        for cluster in sorted((names or set()) | set(clusters) | joined):
            out[cluster] = self._standing(cluster, gvr, names, cluster in joined, connected)
        return out

    def _standing(self, cluster: str, gvr: GVR, names: set[str] | None, joined: bool,
                  connected: Mapping[str, tuple[bool, str]]) -> SourceReport:
        if names is not None and cluster not in names:
            return SourceReport(Standing.LEFT, "no longer a source cluster (its kubeconfig Secret is gone, or it is "
                                "not in sources)")
        up, why = connected.get(cluster, (False, "not connected yet"))
        if not up and (names is not None or cluster in connected):
            return SourceReport(Standing.UNREACHABLE, why)
        if joined:
            return SourceReport(Standing.SERVING)
        if names is None:
            return SourceReport(Standing.PENDING, "the fleet's kubeconfig Secrets are still being read")
        try:
            factory = self.registry.cluster(cluster).factory
        except LookupError:
            return SourceReport(Standing.UNREACHABLE, "not connected")
        if not served(factory, gvr):
            return SourceReport(Standing.NOT_SERVED, f"does not serve {gvr}")
        return SourceReport(Standing.PENDING, factory.explain(gvr) or "its informer is starting")


def served(factory: ClusterSource, gvr: GVR) -> bool:
    """Whether ``gvr`` is served as far as the factory knows: listed by the last discovery pass that succeeded (a
    failed pass changes nothing; an unavailable aggregated API keeps its last known resources) and, if a CRD
    ever defined it, that CRD still in the CRD cache (discovery can lag behind a CRD's deletion). True before
    the first pass: nothing is known yet."""
    last = factory.last_pass
    if last is None:
        return True
    if gvr not in last.resources:
        return False
    triggers = factory.triggers
    crds = triggers.crds()
    return crds is None or not triggers.was_crd(gvr) or (gvr.group, gvr.resource) in crds


def _connected(registry: ClusterRegistry | ClusterTerm) -> dict[str, tuple[bool, str]]:
    """cluster -> (whether it is engaged and its Connected condition is not False, and if not why)."""
    engaged = set(registry.list_clusters())
    out: dict[str, tuple[bool, str]] = {}
    for row in registry.status()["clusters"]:
        name = row["name"]
        connected: dict[str, Any] = next((c for c in row["conditions"] if c["type"] == "Connected"), {})
        if connected.get("status") == "False":
            out[name] = (False, f"not answering ({connected.get('message') or connected.get('reason')})")
        elif name not in engaged:
            out[name] = (False, f"not connected ({row['state']})")
        else:
            out[name] = (True, "")
    return out


def summary(gvr: GVR, reports: Mapping[str, SourceReport]) -> tuple[bool, str, str]:
    """The ``SourcesReachable`` condition of a ClusterCachedResource: False while a source cluster is unreachable
    (its wrappers are kept as last seen), and which cluster stands how."""
    groups: dict[Standing, list[str]] = {}
    for cluster, report in reports.items():
        groups.setdefault(report.standing, []).append(display_name(cluster))
    parts = []
    for standing, what in ((Standing.SERVING, "serving"),
                           (Standing.UNREACHABLE, "unreachable (their cached objects are kept until they answer)"),
                           (Standing.PENDING, "pending"),
                           (Standing.NOT_SERVED, f"not serving {gvr} (their cached objects are removed)"),
                           (Standing.LEFT, "no longer sources (their cached objects are removed)")):
        if standing in groups:
            parts.append(f"{what}: {', '.join(groups[standing])}")
    message = "; ".join(parts) or "no source clusters"
    unreachable = [f"{display_name(c)} ({r.detail})" for c, r in reports.items() if r.standing is Standing.UNREACHABLE]
    if unreachable:
        return False, "Unreachable", f"{message}. Unreachable: {', '.join(unreachable)}"
    return True, "Reachable", message


__all__ = ["SourceClusters", "SourceReport", "Standing", "served", "summary"]
