"""SecretProvider: member clusters from kubeconfig Secrets on the management cluster (skv2's ClusterWatcher,
multicluster-runtime's kubeconfig provider).

Secrets are selected by label (``kube-syncer.io/kubeconfig=true`` or multicluster-runtime's) or type (skv2's
``solo.io/kubeconfig``); the kubeconfig is under ``kubeconfig``; the name is the Secret's, or its
``kube-syncer.io/cluster-name`` annotation. Two Secrets naming one cluster: the oldest holds it, from the cache
alone, so every replica and restart agrees (skv2 keeps the first event seen). The kubeconfig is untrusted
(``UntrustedKubeconfig``), never logged.
"""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from typing import Any, Sequence

from loguru import logger

from informers import GVR, ApiClient, FuncHandler, SharedIndexInformer, drop_managed_fields, object_key
from informers.store import DeletedFinalStateUnknown, Obj, deleted_key

from ..cluster import display_name
from ..provider import ClusterConfig, Conflict, UntrustedKubeconfig
from .claims import ConflictLog, oldest_first, secret_data
from .watching import ProviderState, WatchingProvider, or_all

SECRETS = GVR("", "v1", "secrets")
DEFAULT_LABEL_SELECTORS = ("kube-syncer.io/kubeconfig=true", "sigs.k8s.io/multicluster-runtime-kubeconfig=true")
DEFAULT_SECRET_TYPES = ("solo.io/kubeconfig",)
NAME_ANNOTATION = "kube-syncer.io/cluster-name"
_BY_CLUSTER = "cluster-name"  # the index of the Secret informers: the cluster name a Secret gives
# A Secret's own name always is one; an annotation must be too (names are compared exactly, as Kubernetes does).
CLUSTER_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


@dataclass(frozen=True)
class SecretOptions:
    """Where the kubeconfig Secrets are (``namespaces`` empty: all) and how they are read."""

    namespaces: Sequence[str] = ()
    label_selectors: Sequence[str] = DEFAULT_LABEL_SELECTORS
    secret_types: Sequence[str] = DEFAULT_SECRET_TYPES
    data_key: str = "kubeconfig"
    name_annotation: str = NAME_ANNOTATION


class SecretProvider(WatchingProvider):
    """The clusters named by the kubeconfig Secrets of ``management`` (see the module)."""

    def __init__(self, management: ApiClient, options: SecretOptions = SecretOptions(), *,
                 component: str = "clusters") -> None:
        super().__init__("secrets")
        self.options = options
        self._management = management
        self._component = component
        self._claims: dict[str, str] = {}  # secret key -> the cluster name it gives (valid or not)
        self._conflicts = ConflictLog(component)
        self._informers = [self._informer(ns, sel, typ) for ns in or_all(options.namespaces)
                           for sel, typ in [*((s, None) for s in options.label_selectors),
                                            *((None, t) for t in options.secret_types)]]

    def _informer(self, namespace: str | None, selector: str | None, type: str | None) -> SharedIndexInformer:
        inf = SharedIndexInformer(self._management, SECRETS, namespace=namespace, label_selector=selector,
                                  field_selector=f"type={type}" if type else None, transform=drop_managed_fields)
        inf.add_indexers({_BY_CLUSTER: lambda obj: [self._cluster_name(obj)]})
        inf.add_event_handler(FuncHandler(lambda obj, _initial: self._saw(obj), lambda _old, new: self._saw(new),
                                          self._saw), name=self._component)
        return inf

    # -- ClusterProvider ---------------------------------------------------------------------------------
    def get(self, cluster: str) -> ClusterConfig | None:
        """The oldest Secret naming ``cluster`` (as the caches have it now), as a config; None if none does."""
        claimants = self._claimants(cluster)
        if not claimants:
            return None
        key, secret = claimants[0]
        return ClusterConfig(cluster, f"secret {key}", UntrustedKubeconfig(secret_data(secret, self.options.data_key),
                                                                           f"data key {self.options.data_key!r}"))

    def names(self) -> set[str]:
        """Every valid cluster name some Secret gives."""
        return {n for n in self._claims.values() if CLUSTER_NAME.match(n)}

    def conflicts(self) -> list[Conflict]:
        """Secrets that name a cluster another (older) one holds, or a name that is not valid."""
        out = []
        for key, name in sorted(self._claims.items()):
            if not CLUSTER_NAME.match(name):
                out.append(Conflict("secret", key, name, "", f"annotation {self.options.name_annotation} names "
                                    f"cluster {name!r}, which is not a DNS-1123 subdomain (lowercase)"))
                continue
            holder = next(iter(self._claimants(name)), None)
            if holder is not None and holder[0] != key:
                out.append(Conflict("secret", key, name, f"secret {holder[0]}", f"cluster name "
                                    f"{display_name(name)!r} is held by secret {holder[0]}, the oldest Secret "
                                    "naming it"))
        return out

    def status(self) -> dict[str, Any]:
        """Which Secrets are watched, and whether they have been listed."""
        return {"watching": [_describe(inf) for inf in self._informers],
                "synced": all(inf.has_synced() for inf in self._informers)}

    async def wait_synced(self, timeout: float) -> bool:
        """Whether every Secret informer listed within ``timeout`` (those late are named in the log)."""
        if await super().wait_synced(timeout):
            return True
        logger.bind(component=self._component).warning(
            "kubeconfig secrets not listed within {:g}s ({}); registering those listed so far", timeout,
            ", ".join(_describe(inf) for inf in self._informers if not inf.has_synced()))
        return False

    async def _watch_source(self) -> None:
        """The Secret informers, started and listed (no discovery: Secrets are always served)."""
        self.state = ProviderState.WATCHING
        for inf in self._informers:
            inf.start()
        await asyncio.gather(*(inf.wait_for_sync() for inf in self._informers))
        self._synced.set()
        await asyncio.Future()

    async def _release(self) -> None:
        for inf in self._informers:
            await inf.stop()

    # -- claims ------------------------------------------------------------------------------------------
    def _saw(self, obj: Obj | DeletedFinalStateUnknown) -> None:
        key = deleted_key(obj)
        secret = self._find(key)
        previous = self._claims.pop(key, None)
        name = self._cluster_name(secret) if secret is not None else None
        if name is not None:
            self._claims[key] = name
            if not CLUSTER_NAME.match(name) and previous != name:
                logger.bind(component=self._component).error(
                    "secret {}: annotation {} names cluster {!r}, which is not a DNS-1123 subdomain (lowercase); "
                    "it is ignored", key, self.options.name_annotation, name)
        for cluster in dict.fromkeys(n for n in (previous, name) if n is not None and CLUSTER_NAME.match(n)):
            self._report(cluster)
            self._tell(cluster)

    def _report(self, cluster: str) -> None:
        """Log the Secrets that lose ``cluster``'s name (once each), as the caches have it after an event."""
        claimants = self._claimants(cluster)
        for other, _ in claimants[1:]:
            self._conflicts.lost(f"secret {other}", cluster, f"secret {claimants[0][0]}", "the oldest Secret naming "
                                 f"it holds it; rename one, or set annotation {self.options.name_annotation}")

    def _find(self, key: str) -> Obj | None:
        namespace, _, name = key.rpartition("/")
        for inf in self._informers:
            obj = inf.lister.get(name, namespace or None)
            if obj is not None:
                return obj
        return None

    def _cluster_name(self, secret: Obj) -> str:
        meta = secret["metadata"]
        return str((meta.get("annotations") or {}).get(self.options.name_annotation) or meta["name"])

    def _claimants(self, name: str) -> list[tuple[str, Obj]]:
        """The Secrets in the caches that name cluster ``name``, by key, the oldest first (then by namespace and
        name; ``claims.oldest_first``)."""
        if not CLUSTER_NAME.match(name):
            return []
        return [(object_key(obj), obj) for obj in oldest_first(
            obj for inf in self._informers for obj in inf.lister.by_index(_BY_CLUSTER, name))]


def _describe(inf: SharedIndexInformer) -> str:
    r = inf.reflector
    where = f"namespace {r.namespace}" if r.namespace else "all namespaces"
    return f"{where} {' '.join(f'{k}={v}' for k, v in r.selectors.items())}".rstrip()
