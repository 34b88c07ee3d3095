"""ClusterClients: the multi-cluster client (skv2's ``mcClient``): a member's API client by cluster name.

Each client writes through the fence of the ``Cluster`` it is asked for (a term's, through ``ClusterTerm``; with
sharding this replica's tenure of the cluster: see ``coordinator.py``), the same fence as the cluster's controllers.
"""

from __future__ import annotations

from typing import Protocol

from informers import GVR, ApiClient, ResourceClient

from .cluster import Cluster
from .fence import fenced


class _Clusters(Protocol):
    def cluster(self, name: str) -> Cluster: ...

    def list_clusters(self) -> list[str]: ...


class ClusterClients:
    """Clients of the engaged members of ``registry``, by name."""

    def __init__(self, registry: _Clusters) -> None:
        self._registry = registry

    def cluster(self, name: str) -> ApiClient:
        """The API client of cluster ``name``, behind its fence; ClusterNotFound if it is not up."""
        cluster = self._registry.cluster(name)
        return fenced(cluster.client, cluster.fence)

    def resource(self, name: str, gvr: GVR, field_manager: str | None = None) -> ResourceClient:
        """A ResourceClient of ``gvr`` in cluster ``name``."""
        return ResourceClient(self.cluster(name), gvr, field_manager=field_manager)

    def list_clusters(self) -> list[str]:
        """The clusters that are up, sorted."""
        return self._registry.list_clusters()
