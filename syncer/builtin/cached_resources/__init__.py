"""Built-in plugin: cached resource replication (kcp's ClusterCachedResources).

A ``ClusterCachedResource`` (``cache.kcp.io/v1alpha1``) names a GVR and a label selector; every matching object of
every source (member) cluster is kept as a ``CachedObject`` wrapper on the management cluster. Load it with
``plugins = ["syncer.builtin.cached_resources"]`` and ``[clusters] enabled``. Settings,
``[plugin_settings.cached_resources]``: ``sources`` (``[]``: all members), ``identity_namespace`` (default
``default``), ``install_crds`` (default true), ``workers`` (per replication, default 2).
"""

from __future__ import annotations

from typing import Any

from controllers.fleet import FleetComponent
from syncer.webhook import Webhook

from .admission import webhook
from .root import CachedResources, Options

_KNOWN = {"sources", "identity_namespace", "install_crds", "workers"}


def options(settings: dict[str, Any]) -> Options:
    """The plugin's settings, checked; ValueError names the bad one."""
    unknown = sorted(set(settings) - _KNOWN)
    if unknown:
        raise ValueError(f"unknown setting(s) {', '.join(unknown)} in [plugin_settings.cached_resources]; known: "
                         f"{', '.join(sorted(_KNOWN))}")
    sources = settings.get("sources", [])
    if not isinstance(sources, list) or not all(isinstance(s, str) and s for s in sources):
        raise ValueError(f"[plugin_settings.cached_resources] sources must be a list of cluster names, got {sources!r}")
    namespace = settings.get("identity_namespace", "default")
    if not isinstance(namespace, str) or not namespace:
        raise ValueError("[plugin_settings.cached_resources] identity_namespace must be a namespace name, got "
                         f"{namespace!r}")
    install = settings.get("install_crds", True)
    if not isinstance(install, bool):
        raise ValueError(f"[plugin_settings.cached_resources] install_crds must be true or false, got {install!r}")
    workers = settings.get("workers", 2)
    if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= 100:
        raise ValueError(f"[plugin_settings.cached_resources] workers must be an integer from 1 to 100, got "
                         f"{workers!r}")
    return Options(identity_namespace=namespace, sources=tuple(sources), workers=workers, install_crds=install)


def syncer_fleet_components(settings: dict[str, Any]) -> list[FleetComponent]:
    """The root controller (runs on the leader, in multi-cluster mode)."""
    return [CachedResources(options(settings))]


def syncer_webhooks(settings: dict[str, Any]) -> list[Webhook]:
    """At most one ClusterCachedResource per GVR."""
    options(settings)
    return [webhook()]
