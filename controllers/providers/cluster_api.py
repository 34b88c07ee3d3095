"""ClusterAPIProvider: Cluster API ``Cluster`` objects and their kubeconfig Secrets (multicluster-runtime's
cluster-api provider).

- A member is a ``Cluster`` (v1beta2, else v1beta1) in the configured namespaces matching ``label_selector``, not
  being deleted, whose Secret ``<c>-kubeconfig`` (type ``cluster.x-k8s.io/secret``, key ``value``) exists. Only that
  key of such Secrets is cached: the other Secrets of that type hold private keys.
- ``ready_only``: only once the control plane is initialized (``controlPlaneInitialized``/``controlPlaneReady``,
  set once): not ``status.phase`` (display only) nor ``Ready``/``Available``, which flap with worker scaling.
- Two Clusters of one name: the oldest holds it, also while still provisioning.
- The kubeconfig is cluster state: ``UntrustedKubeconfig``, exec plugins only from the allow-list.

Without the Cluster API installed it asks again every ``discovery_interval`` and is synced meanwhile; a backing-off
reflector could not tell "not installed" from "failing". Once found, the served version is kept.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from loguru import logger

from informers import GVR, ApiClient, FuncHandler, SharedIndexInformer, drop_managed_fields
from informers.errors import describe_error
from informers.store import DeletedFinalStateUnknown, Obj, deleted_key, object_key

from ..provider import ClusterConfig, Conflict, UntrustedKubeconfig
from .claims import ConflictLog, oldest_first, secret_data
from .watching import ProviderState, WatchingProvider, or_all

GROUP = "cluster.x-k8s.io"
VERSIONS = ("v1beta2", "v1beta1")  # the versions read, the preferred first
SECRETS = GVR("", "v1", "secrets")
SECRET_TYPE = "cluster.x-k8s.io/secret"
CLUSTER_NAME_LABEL = "cluster.x-k8s.io/cluster-name"
SECRET_SUFFIX = "-kubeconfig"
DATA_KEY = "value"
_BY_NAME = "name"  # the index of the Cluster informers


@dataclass(frozen=True)
class ClusterAPIOptions:
    """Members from Cluster API, table ``[clusters.cluster_api]``: each ``Cluster`` on the management cluster is a
    member, with the kubeconfig of its ``<cluster>-kubeconfig`` Secret.

    - ``namespaces``: where the Cluster objects and their Secrets are (DNS-1123 labels; ``[]``: all namespaces).
    - ``ready_only``: only Clusters whose control plane Cluster API reports initialized join
      (``status.initialization.controlPlaneInitialized``, in v1beta1 ``status.controlPlaneReady``; off: every
      Cluster with a kubeconfig Secret does).
    - ``label_selector``: only Clusters matching this label selector (``""``: every Cluster).
    - ``discovery_interval`` (not a setting): how often to look for the Cluster API while it is not installed.
    """

    namespaces: Sequence[str] = ()
    ready_only: bool = False
    label_selector: str = ""
    discovery_interval: float = 30.0


def control_plane_initialized(cluster: Obj) -> bool:
    """Whether Cluster API says the control plane of ``cluster`` accepts requests (the field of its version)."""
    status = cluster.get("status") or {}
    if cluster.get("apiVersion") == f"{GROUP}/v1beta1":
        return status.get("controlPlaneReady") is True
    return (status.get("initialization") or {}).get("controlPlaneInitialized") is True


def _deleting(cluster: Obj) -> bool:
    return bool(cluster["metadata"].get("deletionTimestamp"))


def _keep_kubeconfig_only(secret: Obj) -> Obj:
    """The cache's transform of the Secrets: no managedFields, and of the data only a kubeconfig's ``value``."""
    drop_managed_fields(secret)
    data = secret.get("data")
    if data is not None:
        kept = {DATA_KEY: data[DATA_KEY]} if secret["metadata"]["name"].endswith(SECRET_SUFFIX) and \
            DATA_KEY in data else {}
        secret["data"] = kept
    return secret


class ClusterAPIProvider(WatchingProvider):
    """Member clusters from the Cluster API's Clusters and their kubeconfig Secrets on ``management`` (see the
    module docstring for the rules); ``name`` is its name in the ``clusters.providers`` setting."""

    def __init__(self, management: ApiClient, options: ClusterAPIOptions = ClusterAPIOptions(), *,
                 name: str = "cluster-api") -> None:
        self.management = management
        self.options = options
        super().__init__(name)
        self.gvr: GVR | None = None  # the Clusters' GVR, once found
        self._clusters: list[SharedIndexInformer] = []
        self._secrets: list[SharedIndexInformer] = []
        self._log = logger.bind(component=name)
        self._conflicts = ConflictLog(name)

    # -- the view ----------------------------------------------------------------------------------------
    def get(self, cluster: str) -> ClusterConfig | None:
        """The config of member ``cluster``: its holder's kubeconfig Secret, if it counts (module docstring)."""
        claimants = self._claimants(cluster)
        return self._config(claimants[0]) if claimants else None

    def _report(self, cluster: str) -> None:
        """Log the Clusters that lose ``cluster``'s name (once each), as the caches have it after an event."""
        claimants = self._claimants(cluster)
        for other in claimants[1:]:
            self._conflicts.lost(f"cluster {object_key(other)}", cluster, f"cluster {object_key(claimants[0])}",
                                 "the oldest Cluster of that name holds it; rename one, or narrow "
                                 "clusters.cluster_api.namespaces")

    def names(self) -> set[str]:
        """The members' names."""
        return {name for name in self._claimed() if self.get(name) is not None}

    def conflicts(self) -> list[Conflict]:
        """The Clusters that do not hold their name: an older one in another namespace does."""
        out: list[Conflict] = []
        for name in sorted(self._claimed()):
            holder, *others = self._claimants(name)
            source = f"cluster {object_key(holder)}"
            out.extend(Conflict("cluster", object_key(c), name, source, f"cluster name {name!r} is held by {source}, "
                                "the oldest Cluster of that name") for c in others)
        return out

    def status(self) -> dict[str, Any]:
        """What the provider watches, and how far it got."""
        messages = {
            ProviderState.DISCOVERING: f"asking which version of {GROUP} clusters is served",
            ProviderState.NOT_INSTALLED: f"the Cluster API is not installed (no {GROUP} version of {', '.join(VERSIONS)} "
                                         f"serves clusters); looking again every {self.options.discovery_interval:g}s",
            ProviderState.WATCHING: f"watching {self.gvr}",
        }
        message = messages[self.state]
        if self.last_error is not None:
            message += f"; last error: {describe_error(self.last_error)}"
        return {"provider": self.name, "kind": "cluster-api", "state": self.state.value, "message": message,
                "resource": str(self.gvr) if self.gvr is not None else None,
                "namespaces": list(self.options.namespaces), "label_selector": self.options.label_selector,
                "ready_only": self.options.ready_only, "synced": self._synced.is_set(),
                "clusters": sum(len(inf.store) for inf in self._clusters), "members": len(self.names())}

    def _claimed(self) -> set[str]:
        """Every name a Cluster not being deleted claims."""
        return {obj["metadata"]["name"] for inf in self._clusters for obj in inf.store if not _deleting(obj)}

    def _claimants(self, name: str) -> list[Obj]:
        """The Clusters claiming ``name``, the holder first."""
        return oldest_first(obj for inf in self._clusters for obj in inf.lister.by_index(_BY_NAME, name)
                            if not _deleting(obj))

    def _config(self, cluster: Obj) -> ClusterConfig | None:
        if self.options.ready_only and not control_plane_initialized(cluster):
            return None
        meta = cluster["metadata"]
        name, namespace = meta["name"], meta["namespace"]
        secret = self._secret(namespace, name + SECRET_SUFFIX)
        if secret is None or (secret["metadata"].get("labels") or {}).get(CLUSTER_NAME_LABEL) != name:
            return None
        return ClusterConfig(name, f"cluster {namespace}/{name}",
                             UntrustedKubeconfig(secret_data(secret, DATA_KEY), where=f"data key {DATA_KEY!r}"))

    def _secret(self, namespace: str, name: str) -> Obj | None:
        for inf in self._secrets:
            obj = inf.lister.get(name, namespace)
            if obj is not None:
                return obj
        return None

    # -- lifecycle ---------------------------------------------------------------------------------------
    async def _release(self) -> None:
        await asyncio.gather(*(inf.stop() for inf in (*self._clusters, *self._secrets)))
        self._clusters, self._secrets = [], []

    async def _watch_source(self) -> None:
        version = await self._served(self.management, GROUP, VERSIONS, "clusters", self.options.discovery_interval)
        self.gvr = GVR(GROUP, version, "clusters")
        self._log.info("watching {} and their kubeconfig Secrets", self.gvr)
        self._watch(self.gvr)
        self.state = ProviderState.WATCHING
        await asyncio.gather(*(inf.wait_for_sync() for inf in (*self._clusters, *self._secrets)))
        self._synced.set()

    def _watch(self, gvr: GVR) -> None:
        o = self.options
        for namespace in or_all(o.namespaces):
            clusters = SharedIndexInformer(self.management, gvr, namespace=namespace, label_selector=o.label_selector,
                                           transform=drop_managed_fields)
            clusters.add_indexers({_BY_NAME: lambda obj: [obj["metadata"]["name"]]})
            clusters.add_event_handler(self._handler(lambda name: name), name=self.name)
            secrets = SharedIndexInformer(self.management, SECRETS, namespace=namespace,
                                          label_selector=CLUSTER_NAME_LABEL, field_selector=f"type={SECRET_TYPE}",
                                          transform=_keep_kubeconfig_only)
            secrets.add_event_handler(self._handler(_cluster_of_secret), name=self.name)
            self._clusters.append(clusters)
            self._secrets.append(secrets)
        for inf in (*self._clusters, *self._secrets):
            inf.start()

    def _handler(self, cluster_of: Callable[[str], str | None]) -> FuncHandler:
        """Tell ``changed`` the cluster name ``cluster_of(object name)`` on any event of an object."""
        def tell(obj: Obj | DeletedFinalStateUnknown) -> None:
            key = deleted_key(obj)
            name = cluster_of(key.rpartition("/")[2])
            if name:
                self._report(name)
                self._tell(name)

        return FuncHandler(lambda obj, _initial: tell(obj), lambda _old, new: tell(new), tell)


def _cluster_of_secret(name: str) -> str | None:
    return name.removesuffix(SECRET_SUFFIX) if name.endswith(SECRET_SUFFIX) else None
