"""HostNamespacesProvider: the namespaces of the management cluster as members (multicluster-runtime's
``namespace`` provider), for tenants that are namespaces rather than clusters.

Each Namespace matching ``label_selector`` is a member until it is deleted or starts terminating. Members share the
management client and one ``NamespaceHost``: one watch and cache per required GVR for all of them, each seen
through its namespace's view (``informers.namespace_view``). Cluster-scoped GVRs are invisible to a member (a
controller requiring one waits, "excluded: cluster-scoped"), and the sidecar needs list/watch cluster-wide.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from loguru import logger

from informers import GVR, ApiClient, FuncHandler, SharedIndexInformer, drop_managed_fields
from informers.namespace_view import NamespaceHost
from informers.store import DeletedFinalStateUnknown, Obj, deleted_key

from ..provider import ClusterConfig, Conflict, NamespaceConnection
from .watching import ProviderState, WatchingProvider

NAMESPACES = GVR("", "v1", "namespaces")


@dataclass(frozen=True)
class HostNamespacesOptions:
    """Members from the management cluster's own namespaces, table ``[clusters.host_namespaces]``: each Namespace is
    a member named after it, until it is deleted; its informers are its namespace's view of informers the members
    share, over the management cluster's connection.

    - ``label_selector``: only Namespaces matching this label selector (``""``: every Namespace).
    """

    label_selector: str = ""


class HostNamespacesProvider(WatchingProvider):
    """Member clusters from the Namespaces of ``management`` that ``options`` select (see the module)."""

    def __init__(self, management: ApiClient, options: HostNamespacesOptions = HostNamespacesOptions(), *,
                 name: str = "host-namespaces") -> None:
        super().__init__(name)
        self.management = management
        self.options = options
        label_selector = options.label_selector
        self.host = NamespaceHost(name)  # the informers its members share: outlives the provider while they run
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
        return ClusterConfig(cluster, f"namespace {cluster}", NamespaceConnection(cluster, self.host))

    def names(self) -> set[str]:
        """The selected namespaces that are not terminating."""
        return {obj["metadata"]["name"] for obj in self._namespaces.store if _live(obj)}

    def conflicts(self) -> list[Conflict]:
        """None: namespace names are unique."""
        return []

    def status(self) -> dict[str, Any]:
        """What the provider watches."""
        return {"provider": self.name, "kind": "host-namespaces", "state": self.state.value,
                "message": f"watching namespaces{f' ({self.options.label_selector})' if self.options.label_selector else ''}",
                "label_selector": self.options.label_selector, "synced": self._synced.is_set(),
                "namespaces": len(self._namespaces.store), "members": len(self.names()),
                "views": self.host.views}

    async def _watch_source(self) -> None:
        logger.bind(component=self.name).info("watching namespaces{} as member clusters",
                                              f" ({self.options.label_selector})" if self.options.label_selector else "")
        self.state = ProviderState.WATCHING
        self._namespaces.start()
        await self._namespaces.wait_for_sync()
        self._synced.set()

    async def _release(self) -> None:
        await self._namespaces.stop()


def _live(namespace: Obj) -> bool:
    return not namespace["metadata"].get("deletionTimestamp") and \
        (namespace.get("status") or {}).get("phase") != "Terminating"
