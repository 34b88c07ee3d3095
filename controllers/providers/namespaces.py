"""HostNamespacesProvider: the namespaces of the management cluster as member clusters (multicluster-runtime's
``namespace`` provider), for tenants that are namespaces rather than clusters.

Each Namespace matching ``label_selector`` (``None``: every one) is a member named after it, from its creation
until it is deleted or starts terminating (its objects are going; the controllers stop before they do).

What is shared, and what differs from multicluster-runtime: there every namespace-cluster is a view of the host's
one cache (a single informer per GVR for the whole cluster; wrappers filter its events and reads by namespace).
Here a member is a ``NamespaceConnection``: it shares the management client, so all its watches go over the
management cluster's one connection (HTTP/2) and no credentials are read, but it has a factory of its own
restricted to its namespace (``DiscoveringDynamicSharedInformerFactory(namespace=...)``, namespaced resources
only), so there is one watch per required GVR per namespace, each caching only its namespace's objects. The
memory is the same as one shared cache; the watches and initial lists grow with the namespaces.
"""

from __future__ import annotations

from typing import Any

from loguru import logger

from informers import GVR, ApiClient, FuncHandler, SharedIndexInformer, drop_managed_fields
from informers.store import DeletedFinalStateUnknown, Obj, deleted_key

from ..provider import ClusterConfig, Conflict, NamespaceConnection
from .watching import ProviderState, WatchingProvider

NAMESPACES = GVR("", "v1", "namespaces")


class HostNamespacesProvider(WatchingProvider):
    """Member clusters from the Namespaces of ``management`` matching ``label_selector`` (see the module)."""

    def __init__(self, management: ApiClient, label_selector: str | None = None, *,
                 name: str = "host-namespaces") -> None:
        super().__init__(name)
        self.management = management
        self.label_selector = label_selector
        self._namespaces = SharedIndexInformer(management, NAMESPACES, label_selector=label_selector,
                                               transform=drop_managed_fields)

        def tell(obj: Obj | DeletedFinalStateUnknown) -> None:
            self._tell(deleted_key(obj))

        self._namespaces.add_event_handler(FuncHandler(lambda obj, _initial: tell(obj), lambda _old, new: tell(new),
                                                       tell), name=name)

    def get(self, cluster: str) -> ClusterConfig | None:
        """The config of namespace ``cluster`` while it is selected and not terminating."""
        namespace = self._namespaces.lister.get(cluster) if cluster else None
        if namespace is None or not _live(namespace):
            return None
        return ClusterConfig(cluster, f"namespace {cluster}", NamespaceConnection(cluster))

    def names(self) -> set[str]:
        """The selected namespaces that are not terminating."""
        return {obj["metadata"]["name"] for obj in self._namespaces.store if _live(obj)}

    def conflicts(self) -> list[Conflict]:
        """None: namespace names are unique."""
        return []

    def status(self) -> dict[str, Any]:
        """What the provider watches."""
        return {"provider": self.name, "kind": "host-namespaces", "state": self.state.value,
                "message": f"watching namespaces{f' ({self.label_selector})' if self.label_selector else ''}",
                "label_selector": self.label_selector, "synced": self._synced.is_set(),
                "namespaces": len(self._namespaces.store), "members": len(self.names())}

    async def _watch_source(self) -> None:
        logger.bind(component=self.name).info("watching namespaces{} as member clusters",
                                              f" ({self.label_selector})" if self.label_selector else "")
        self.state = ProviderState.WATCHING
        self._namespaces.start()
        await self._namespaces.wait_for_sync()
        self._synced.set()

    async def _release(self) -> None:
        await self._namespaces.stop()


def _live(namespace: Obj) -> bool:
    return not namespace["metadata"].get("deletionTimestamp") and \
        (namespace.get("status") or {}).get("phase") != "Terminating"
