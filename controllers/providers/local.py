"""LocalProvider: the management cluster itself as a member (skv2's ``LocalCluster``), named ``LOCAL_CLUSTER``.

Its member reuses the sidecar's own client and discovering factory: no second connection, no second cache.
"""

from __future__ import annotations

from typing import Any

from ..cluster import LOCAL_CLUSTER
from ..provider import Changed, ClusterConfig, Conflict, LocalConnection

_CONFIG = ClusterConfig(LOCAL_CLUSTER, "local", LocalConnection())


class LocalProvider:
    """Always exactly one cluster, the local one; nothing to watch."""

    name = "local"

    def get(self, cluster: str) -> ClusterConfig | None:
        """The local cluster's config for ``LOCAL_CLUSTER``, else None."""
        return _CONFIG if cluster == LOCAL_CLUSTER else None

    def names(self) -> set[str]:
        """``{LOCAL_CLUSTER}``."""
        return {LOCAL_CLUSTER}

    def conflicts(self) -> list[Conflict]:
        """None: no other provider can give the local cluster's name (it is not a valid cluster name)."""
        return []

    def status(self) -> dict[str, Any]:
        """Nothing to report."""
        return {}

    async def start(self, changed: Changed) -> None:
        """Nothing to start: the initial pass over every provider's names brings the local cluster in."""

    async def wait_synced(self, timeout: float) -> bool:
        """Always synced."""
        return True

    async def stop(self) -> None:
        """Nothing to stop."""
