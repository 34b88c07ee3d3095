"""The kinds of cluster provider, each registered once here: the name ``clusters.providers`` lists, its settings
table under ``[clusters]`` (the provider's own options dataclass: the ``Clusters`` field of that name) with a check
per setting, and how it is built from the settings. The schema, the settings reference and the wiring read
``PROVIDER_KINDS``; a new provider is its module, an entry here and its field in ``Clusters``. The Secrets
provider reads ``[clusters]``' own keys (its settings predate the provider tables)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from controllers.providers.cluster_api import ClusterAPIProvider
from controllers.providers.cluster_profile import ClusterProfileProvider, load_access_providers
from controllers.providers.kubeconfig_files import KubeconfigFilesProvider
from controllers.providers.namespaces import HostNamespacesProvider
from controllers.providers.secrets import SecretOptions, SecretProvider
from informers import ApiClient

from .checks import Check, Invalid, boolean, dns_labels, duration, label_selector, string_list, strings

if TYPE_CHECKING:
    from controllers.provider import ClusterProvider

    from .tables import Clusters


@dataclass(frozen=True)
class ProviderKind:
    """One kind of cluster provider: ``name`` in ``clusters.providers``; ``table`` its ``[clusters.<table>]``
    (``""``: none) whose settings ``checks`` checks, in order; ``build(clusters, management)`` the provider."""

    name: str
    table: str
    checks: Mapping[str, Check]
    build: Callable[[Clusters, ApiClient], ClusterProvider]


def _kubeconfig_paths(value: Any, done: Mapping[str, Any]) -> tuple[str, ...]:
    expect = ("a list of paths of existing kubeconfig files ('~' expanded), not empty while \"kubeconfig-files\" is "
              "in clusters.providers")
    paths = string_list(value)
    if paths is None:
        raise Invalid(expect)
    if not paths and "kubeconfig-files" in done["clusters.providers"]:
        raise Invalid(expect, "clusters.providers lists \"kubeconfig-files\": name at least one file")
    expanded = tuple(str(Path(p).expanduser()) for p in paths)
    for given, path in zip(paths, expanded):
        if not Path(path).is_file():
            raise Invalid(expect, f"{given!r} {'is not a file' if Path(path).exists() else 'does not exist'}")
    return expanded


def _provider_file(value: Any, done: Mapping[str, Any]) -> str:
    expect = ("the path of a JSON access-provider file ({\"providers\": [{\"name\": ..., \"execConfig\": {...}}]}), "
              "required while \"cluster-profile\" is in clusters.providers")
    if not isinstance(value, str):
        raise Invalid(expect)
    if not value:
        if "cluster-profile" in done["clusters.providers"]:
            raise Invalid(expect, "clusters.providers lists \"cluster-profile\": name the file")
        return ""
    path = str(Path(value).expanduser())
    if not Path(path).is_file():
        raise Invalid(expect, f"{value!r} {'is not a file' if Path(path).exists() else 'does not exist'}")
    try:
        load_access_providers(path)
    except ValueError as e:
        raise Invalid(expect, str(e)) from None
    return path


def _secrets(c: Clusters, management: ApiClient) -> ClusterProvider:
    return SecretProvider(management, SecretOptions(namespaces=c.namespaces, label_selectors=c.label_selectors,
                                                    secret_types=c.secret_types))


PROVIDER_KINDS = (
    ProviderKind("secrets", "", {}, _secrets),
    ProviderKind("cluster-api", "cluster_api", {
        "namespaces": dns_labels, "ready_only": boolean, "label_selector": label_selector,
    }, lambda c, management: ClusterAPIProvider(management, c.cluster_api)),
    ProviderKind("kubeconfig-files", "kubeconfig_files", {
        "paths": _kubeconfig_paths, "contexts": strings("context names, or [] for every context"),
        "reload_interval": duration(),
    }, lambda c, management: KubeconfigFilesProvider(c.kubeconfig_files)),
    ProviderKind("cluster-profile", "cluster_profile", {
        "provider_file": _provider_file, "namespaces": dns_labels, "label_selector": label_selector,
    }, lambda c, management: ClusterProfileProvider(management, c.cluster_profile)),
    ProviderKind("host-namespaces", "host_namespaces", {
        "label_selector": label_selector,
    }, lambda c, management: HostNamespacesProvider(management, c.host_namespaces)),
)
KINDS = {kind.name: kind for kind in PROVIDER_KINDS}
CLUSTER_PROVIDERS = tuple(KINDS)
PROVIDER_TABLES = tuple(f"clusters.{kind.table}" for kind in PROVIDER_KINDS if kind.table)
PROVIDER_CHECKS: dict[str, Check] = {f"clusters.{kind.table}.{key}": check for kind in PROVIDER_KINDS
                                     for key, check in kind.checks.items()}
