"""The cluster providers and member options of multi-cluster mode, from ``[clusters]``: one place that reads the
settings, so that a new provider is its module plus a line here."""

from __future__ import annotations

from controllers.member import MemberOptions
from controllers.provider import ClusterProvider
from controllers.providers.local import LocalProvider
from controllers.providers.secrets import SecretOptions, SecretProvider
from informers import ApiClient

from .settings import Settings


def cluster_providers(settings: Settings, management: ApiClient) -> list[ClusterProvider]:
    """The providers ``[clusters]`` names, in precedence order, then the local cluster if included."""
    c = settings.clusters
    providers: list[ClusterProvider] = [
        SecretProvider(management, SecretOptions(namespaces=c.namespaces, label_selectors=c.label_selectors,
                                                 secret_types=c.secret_types))]
    if c.include_local:
        providers.append(LocalProvider())
    return providers


def member_options(settings: Settings) -> MemberOptions:
    """How members are brought up, from ``[clusters]``."""
    c = settings.clusters
    return MemberOptions(allowed_exec_commands=c.allowed_exec_commands, sync_timeout=c.sync_timeout,
                         probe_interval=c.probe_interval)
