"""Wiring: the settings turned, once, into the parts of the sidecar: the local cluster's discovering factory, each
member cluster's, the cluster providers and member options, and the one workload the mode asks for.

A mode's module is imported only when that mode is used (bench/RESULTS-imports.md): a single-cluster process
loads neither the sharding nor the fleet workload.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

from loguru import logger

from controllers import OPEN, Fence
from controllers.cluster import display_name
from informers import (
    GVR, ApiClient, DiscoveringDynamicSharedInformerFactory, DiscoveryOptions, ResourceFilter, Supervisor,
)
from informers.wanted import WatchMode

from .plugins import Plugins
from .settings import Settings, UnitKind
from .workload import OnStuck, Process, Workload

if TYPE_CHECKING:
    from controllers.cluster_registry import ClusterRegistry
    from controllers.coordinator import Coordinator
    from controllers.member import MemberOptions
    from controllers.provider import ClusterProvider


def build_workload(process: Process, plugins: Plugins, on_stuck: OnStuck) -> Workload:
    """The workload of ``process.settings``' mode over ``plugins``; ``on_stuck(names)``: work of a sharded unit did
    not stop in time (the process must exit)."""
    s = process.settings
    fleet_level = sorted([*plugins.fleet, *(c.name for c in plugins.components)])
    if fleet_level and not s.clusters.enabled:
        logger.warning("fleet controller(s) {} run only in multi-cluster mode; set [clusters] enabled = true",
                       ", ".join(fleet_level))
    make_registry = partial(_cluster_registry, process)
    if s.sharding.enabled:
        from .workloads.sharded import ShardedClusters, ShardedControllers

        if s.sharding.unit_kind(s.clusters.enabled) is UnitKind.CLUSTERS:
            return ShardedClusters(process, plugins.controllers, make_registry, on_stuck)
        return ShardedControllers(process, plugins.controllers, on_stuck)
    if s.clusters.enabled:
        from .workloads.fleet import Fleet

        return Fleet(process, plugins, make_registry, term_stop_timeout(s))
    from .workloads.single import SingleCluster

    return SingleCluster(process, plugins.controllers, term_stop_timeout(s))


def term_stop_timeout(settings: Settings) -> float:
    """How long the work of an ended term may take to stop: with election, no longer than the margin before a
    standby may take the lease (``lease_duration - renew_deadline``)."""
    timeout = settings.shutdown_timeout / 2
    if settings.leader_election.enabled:
        le = settings.leader_election
        timeout = min(timeout, le.lease_duration - le.renew_deadline)
    return timeout


def sharding_refusal(settings: Settings, plugins: Plugins) -> str | None:
    """Why these plugins cannot run with these settings' sharding (fleet-level work needs every cluster), or None."""
    fleet = sorted([*plugins.fleet, *(c.name for c in plugins.components)])
    if fleet and settings.sharding.enabled:
        return (f"fleet controller(s) {', '.join(fleet)} need every member cluster in one process: they cannot "
                "run with [sharding] enabled (turn it off, or remove their plugin)")
    return None


def local_factory(settings: Settings, client: ApiClient,
                  supervisor: Supervisor) -> DiscoveringDynamicSharedInformerFactory:
    """The local cluster's discovering factory (started by the sidecar's discovery)."""
    s = settings
    return DiscoveringDynamicSharedInformerFactory(
        client, discovery_options(s, watch=s.clusters.watch if s.clusters.enabled else s.watch), supervisor=supervisor)


def _cluster_registry(process: Process, required: set[GVR], *, fence: Fence = OPEN,
                      coordinator: Coordinator | None = None) -> ClusterRegistry:
    """The registry of member clusters (the one place it is built): from ``[clusters]``, over the local factory."""
    from controllers.cluster_registry import ClusterRegistry

    s = process.settings
    return ClusterRegistry(process.client, cluster_providers(s, process.client), member_options(s),
                           coordinator=coordinator, fence=fence, required=required,
                           make_factory=partial(member_factory, s), local_factory=process.factory,
                           supervisor=process.supervisor)


def cluster_providers(settings: Settings, management: ApiClient) -> list[ClusterProvider]:
    """The cluster providers ``[clusters]`` names (built as their kinds say, ``settings/providers.py``), in
    precedence order, then the local cluster if included."""
    from controllers.providers.local import LocalProvider

    from .settings.providers import KINDS

    c = settings.clusters
    providers = [KINDS[name].build(c, management) for name in c.providers]
    if c.include_local:
        providers.append(LocalProvider())
    return providers


def member_options(settings: Settings) -> MemberOptions:
    """How members are brought up, from ``[clusters]``."""
    from controllers.member import MemberOptions

    c = settings.clusters
    return MemberOptions(allowed_exec_commands=c.allowed_exec_commands, sync_timeout=c.sync_timeout,
                         probe_interval=c.probe_interval)


def member_factory(settings: Settings, client: ApiClient, name: str) -> DiscoveringDynamicSharedInformerFactory:
    """The discovering factory of member cluster ``name`` (multi-cluster mode), or the one the host-namespaces
    provider's members share (named after the provider)."""
    options = discovery_options(settings, watch=settings.clusters.watch)
    return DiscoveringDynamicSharedInformerFactory(client, options, name=f"discovery {display_name(name)}",
                                                   metrics_cluster=name)


def discovery_options(settings: Settings, *, watch: WatchMode, namespace: str | None = None) -> DiscoveryOptions:
    """The settings' filter, namespace, passes and field selectors (the local cluster's and every member's alike),
    watching as ``watch`` says."""
    s = settings
    return DiscoveryOptions(
        filter=ResourceFilter(s.include, s.exclude, preferred_version_only=s.preferred_version_only),
        namespace=namespace or s.namespace or None, rediscovery_interval=s.rediscovery_interval,
        full_rediscovery_interval=s.full_rediscovery_interval, check_permissions=s.check_permissions,
        field_selectors={GVR.parse(g): selector for g, selector in s.field_selectors.items()}, watch=watch)
