"""ClusterProfileProvider: ``ClusterProfile`` objects (the Cluster Inventory API) reached through the operator's
access providers (multicluster-runtime's ``clusterinventory`` provider).

- A member is a ``ClusterProfile`` in the configured namespaces matching ``label_selector``, not being deleted, with
  ``ControlPlaneHealthy`` true, named ``<namespace>/<name>``; health changes come by watch, not a 10 s poll.
- It is reached through the first provider of the operator's file that it offers in ``status.accessProviders``
  (else the deprecated ``credentialProviders``); one offering none is refused with that message.
- The profile is untrusted: the only exec command is the operator's; of its ``cluster`` only server, CA data and
  extensions are taken; ``proxy-url`` and per-profile exec arguments/environment are refused.

Without the API installed it waits as the Cluster API provider does. The file is read once, at start.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from loguru import logger

from informers import GVR, ApiClient, FuncHandler, SharedIndexInformer, drop_managed_fields
from informers.credentials import API_VERSIONS
from informers.errors import describe_error
from informers.store import DeletedFinalStateUnknown, Obj, deleted_key, object_key

from ..provider import ClusterConfig, Conflict, UntrustedKubeconfig
from .watching import ProviderState, WatchingProvider, or_all

GROUP = "multicluster.x-k8s.io"
VERSIONS = ("v1alpha1",)
RESOURCE = "clusterprofiles"
HEALTHY = "ControlPlaneHealthy"
EXEC_EXTENSION = "client.authentication.k8s.io/exec"
_CLUSTER_FIELDS = ("server", "certificate-authority-data", "proxy-url", "extensions")  # what the consumer reads
_POLICIES = ("profileSourcedCLIArgsPolicy", "profileSourcedEnvVarsPolicy")


@dataclass(frozen=True)
class AccessProvider:
    """One entry of the operator's access-provider file: a ``name`` profiles offer, and the client-go exec config
    (``command``, ``args``, ``env``, ``apiVersion``, ``provideClusterInfo``, ...) of its credential plugin."""

    name: str
    exec: Mapping[str, Any]

    @property
    def command(self) -> str:
        """The plugin's command, the one exec command its members may run."""
        return str(self.exec["command"])


def load_access_providers(path: str) -> tuple[AccessProvider, ...]:
    """The providers of access-provider file ``path``, in order; ValueError naming the culprit when it cannot be
    read or is not ``{"providers": [{"name": ..., "execConfig": {"command": ..., ...}}, ...]}``."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: cannot be read as JSON ({e})") from None
    entries = doc.get("providers") if isinstance(doc, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{path}: has no list 'providers' of access providers")
    out: list[AccessProvider] = []
    for i, entry in enumerate(entries):
        where = f"{path}: providers[{i}]"
        name = entry.get("name") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not name:
            raise ValueError(f"{where}: has no name")
        if any(p.name == name for p in out):
            raise ValueError(f"{where}: names provider {name!r} a second time")
        for policy in _POLICIES:
            if entry.get(policy) not in (None, "", "Ignore"):
                raise ValueError(f"{where}.{policy}: {entry[policy]!r} is not supported: what a ClusterProfile "
                                 "says is untrusted, so it adds nothing to the plugin's arguments or environment "
                                 "(leave it Ignore)")
        exec_config = entry.get("execConfig")
        if not isinstance(exec_config, dict) or not isinstance(exec_config.get("command"), str) or \
                not exec_config["command"]:
            raise ValueError(f"{where}.execConfig: has no command")
        if exec_config.get("apiVersion") not in API_VERSIONS:
            raise ValueError(f"{where}.execConfig.apiVersion: is not one of {', '.join(API_VERSIONS)}")
        out.append(AccessProvider(name, exec_config))
    return tuple(out)


@dataclass(frozen=True)
class ClusterProfileOptions:
    """Members from the Cluster Inventory API, table ``[clusters.cluster_profile]``: each healthy ``ClusterProfile``
    on the management cluster, named ``<namespace>/<name>``, reached through an access provider of ``provider_file``.

    - ``provider_file``: the access-provider file (``~`` expanded; required when the provider is listed), as the
      consumers' ``-clusterprofile-provider-file``: ``{"providers": [{"name": ..., "execConfig": {...}}]}``. It is the
      allow-list: nothing a profile says chooses what runs.
    - ``namespaces``: where the ClusterProfiles are (DNS-1123 labels; ``[]``: all namespaces).
    - ``label_selector``: only ClusterProfiles matching this label selector (``""``: every one).
    - Not settings: ``access_providers`` (instead of ``provider_file``), ``discovery_interval``.
    """

    provider_file: str = ""
    namespaces: Sequence[str] = ()
    label_selector: str = ""
    access_providers: Sequence[AccessProvider] = ()
    discovery_interval: float = 30.0


def healthy(profile: Obj) -> bool:
    """Whether the profile's ``ControlPlaneHealthy`` condition is ``True``."""
    conditions = (profile.get("status") or {}).get("conditions") or ()
    return any(isinstance(c, dict) and c.get("type") == HEALTHY and c.get("status") == "True" for c in conditions)


def offered(profile: Obj) -> dict[str, Any]:
    """The access providers the profile offers, by name: ``accessProviders`` over the deprecated
    ``credentialProviders`` for one name."""
    status = profile.get("status") or {}
    out: dict[str, Any] = {}
    for field in ("credentialProviders", "accessProviders"):
        for entry in status.get(field) or ():
            if isinstance(entry, dict) and isinstance(entry.get("name"), str):
                out[entry["name"]] = entry
    return out


def profile_kubeconfig(provider: AccessProvider, accessor: Mapping[str, Any]) -> bytes:
    """The kubeconfig (JSON, which is YAML) of one profile's ``accessor`` entry reached through ``provider``: the
    consumer-read fields of its ``cluster`` and the operator's exec config, non-interactive."""
    cluster = accessor.get("cluster")
    if isinstance(cluster, dict):
        cluster = {k: cluster[k] for k in _CLUSTER_FIELDS if k in cluster}
    doc = {"apiVersion": "v1", "kind": "Config", "current-context": "profile",
           "contexts": [{"name": "profile", "context": {"cluster": "profile", "user": provider.name}}],
           "clusters": [{"name": "profile", "cluster": cluster}],
           "users": [{"name": provider.name, "user": {"exec": {**provider.exec, "interactiveMode": "Never"}}}]}
    return json.dumps(doc, sort_keys=True).encode()


class ClusterProfileProvider(WatchingProvider):
    """Member clusters from the ClusterProfiles on ``management`` (see the module docstring for the rules)."""

    def __init__(self, management: ApiClient, options: ClusterProfileOptions, *,
                 name: str = "cluster-profile") -> None:
        self.management = management
        self.options = options
        self.access_providers = tuple(options.access_providers) or \
            (load_access_providers(options.provider_file) if options.provider_file else ())
        super().__init__(name)
        self.gvr: GVR | None = None
        self._profiles: list[SharedIndexInformer] = []
        self._log = logger.bind(component=name)

    # -- the view ----------------------------------------------------------------------------------------
    def get(self, cluster: str) -> ClusterConfig | None:
        """The config of member ``cluster`` (``<namespace>/<name>``) if its profile counts; its data None (the
        member refused) when the profile offers none of the allowed access providers."""
        namespace, _, name = cluster.partition("/")
        profile = self._profile(namespace, name) if name else None
        if profile is None or not _counts(profile):
            return None
        source = f"clusterprofile {cluster}"
        offers = offered(profile)
        for provider in self.access_providers:
            if provider.name in offers:
                return ClusterConfig(cluster, source, UntrustedKubeconfig(
                    profile_kubeconfig(provider, offers[provider.name]),
                    where=f"status.accessProviders[{provider.name}]", exec_commands=(provider.command,)))
        allowed = ", ".join(p.name for p in self.access_providers)
        return ClusterConfig(cluster, source, UntrustedKubeconfig(
            None, where=f"status.accessProviders entry of an allowed access provider ({allowed})"))

    def names(self) -> set[str]:
        """The members' names."""
        return {object_key(obj) for inf in self._profiles for obj in inf.store if _counts(obj)}

    def conflicts(self) -> list[Conflict]:
        """None: a profile's name is its namespace and name, which no other profile has."""
        return []

    def status(self) -> dict[str, Any]:
        """What the provider watches, and how far it got."""
        messages = {
            ProviderState.DISCOVERING: f"asking whether {GROUP} {RESOURCE} is served",
            ProviderState.NOT_INSTALLED: f"the Cluster Inventory API is not installed ({GROUP}/{VERSIONS[0]} does "
                                         f"not serve {RESOURCE}); looking again every "
                                         f"{self.options.discovery_interval:g}s",
            ProviderState.WATCHING: f"watching {self.gvr}",
        }
        message = messages[self.state]
        if self.last_error is not None:
            message += f"; last error: {describe_error(self.last_error)}"
        return {"provider": self.name, "kind": "cluster-profile", "state": self.state.value, "message": message,
                "resource": str(self.gvr) if self.gvr is not None else None,
                "namespaces": list(self.options.namespaces), "label_selector": self.options.label_selector,
                "access_providers": [p.name for p in self.access_providers],
                "synced": self._synced.is_set(), "profiles": sum(len(inf.store) for inf in self._profiles),
                "members": len(self.names())}

    def _profile(self, namespace: str, name: str) -> Obj | None:
        for inf in self._profiles:
            obj = inf.lister.get(name, namespace)
            if obj is not None:
                return obj
        return None

    # -- lifecycle ---------------------------------------------------------------------------------------
    async def _release(self) -> None:
        await asyncio.gather(*(inf.stop() for inf in self._profiles))
        self._profiles = []

    async def _watch_source(self) -> None:
        o = self.options
        version = await self._served(self.management, GROUP, VERSIONS, RESOURCE, o.discovery_interval)
        self.gvr = GVR(GROUP, version, RESOURCE)
        self._log.info("watching {} (access providers: {})", self.gvr, ", ".join(p.name for p in o.access_providers))

        def tell(obj: Obj | DeletedFinalStateUnknown) -> None:
            self._tell(deleted_key(obj))

        for namespace in or_all(o.namespaces):
            inf = SharedIndexInformer(self.management, self.gvr, namespace=namespace,
                                      label_selector=o.label_selector, transform=drop_managed_fields)
            inf.add_event_handler(FuncHandler(lambda obj, _initial: tell(obj), lambda _old, new: tell(new), tell),
                                  name=self.name)
            self._profiles.append(inf)
            inf.start()
        self.state = ProviderState.WATCHING
        await asyncio.gather(*(inf.wait_for_sync() for inf in self._profiles))
        self._synced.set()


def _counts(profile: Obj) -> bool:
    return not profile["metadata"].get("deletionTimestamp") and healthy(profile)

