"""What the commands share: the settings and the API client of the command line, the plugins, one discovery pass,
and the two ways a command fails (a usage error, exit code 2; an unreachable API server, exit code 1)."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path
from typing import Any, Sequence

from informers import GVR, ApiClient, ApiError, CredentialError, DiscoveryClient
from informers.client import CONNECTION_ERRORS

from ..plugins import PluginError, Plugins, load_plugins
from ..settings import SETTINGS_ENV, Settings, SettingsError, load_settings

EXIT_USAGE = 2


class UsageError(Exception):
    """A mistake of the user's that stops the command with exit code 2."""


def settings_of(args: argparse.Namespace) -> Settings:
    """The settings ``--settings`` (or ``$SYNCER_SETTINGS``), the environment and ``--kubeconfig``/``--context``
    give; UsageError for a mistake."""
    path = args.settings or os.environ.get(SETTINGS_ENV) or None
    options = {k: v for k in ("kubeconfig", "context") if (v := getattr(args, k, None))}
    try:
        return load_settings(path, options)
    except SettingsError as e:
        raise UsageError(str(e)) from None


def client_of(settings: Settings) -> ApiClient:
    """The API client the settings describe; credentials are loaded (and checked) but nothing connects."""
    if settings.in_cluster:
        where = "in-cluster configuration"
    else:
        # The kubeconfig setting was checked when the settings loaded; the fallbacks are checked here.
        paths = settings.kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
        where = f"kubeconfig {paths}"
        if not any(Path(p).expanduser().is_file() for p in paths.split(os.pathsep) if p):
            origin = "" if settings.kubeconfig else " ($KUBECONFIG)" if "KUBECONFIG" in os.environ else " (default)"
            raise UsageError(f"{where}{origin} does not exist; set the 'kubeconfig' setting or --kubeconfig, or "
                             "in_cluster = true inside a pod")
    try:
        client = (ApiClient.in_cluster() if settings.in_cluster else
                  ApiClient.from_kubeconfig(settings.kubeconfig or None, settings.context or None))
        client.http2 = settings.http2 and client.http2
        return client
    except Exception as e:  # the loader raises anything from ConfigException to TypeError on a bad file
        from kubernetes.config.config_exception import ConfigException  # this error path only

        contexts = _contexts(settings.kubeconfig) if settings.context and not settings.in_cluster else None
        if contexts is not None and settings.context not in contexts:
            raise UsageError(f"{where} has no context {settings.context!r} (it has: {', '.join(contexts) or 'none'});"
                             " fix the 'context' setting or --context") from None
        what = str(e) if isinstance(e, (ConfigException, OSError)) else f"not a valid kubeconfig ({e})"
        raise UsageError(f"{where}: {what}; check the 'kubeconfig' / 'context' / 'in_cluster' settings") from None


def _contexts(kubeconfig: str) -> list[str] | None:
    """The context names of a kubeconfig (default: $KUBECONFIG or ~/.kube/config); None if it cannot be read."""
    import kubernetes

    try:
        contexts, _ = kubernetes.config.list_kube_config_contexts(kubeconfig or None)  # type: ignore[no-untyped-call]
        return [str(c["name"]) for c in contexts]
    except Exception:  # not a kubeconfig at all: the loader's own message says so
        return None


def plugins_of(settings: Settings) -> Plugins:
    """The plugins the settings name; UsageError for a plugin that cannot load."""
    # Plugins named by dotted path are usually in the working directory (like `python -m` does).
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return load_plugins(settings.plugins, settings.plugin_settings, settings.entry_point_plugins)
    except PluginError as e:
        raise UsageError(str(e)) from None


def refuse_fleet_with_sharding(settings: Settings, plugins: Any) -> None:
    """UsageError when the plugins' fleet controllers cannot run with the sharding settings."""
    from ..runtime import sharding_refusal

    refused = sharding_refusal(settings, plugins)
    if refused:
        raise UsageError(refused)


class Unreachable(Exception):
    """The API server could not be asked (exit code 1, not a usage error); the message says why."""


def discover(client: ApiClient) -> list[Any]:
    """One discovery pass of ``client``'s API server, its resources sorted; UsageError for bad credentials,
    Unreachable for a server that cannot be asked."""
    async def main() -> list[Any]:
        async with client:
            result = await DiscoveryClient(client).discover()
        return sorted(result.resources.values(), key=lambda i: (i.gvr.group, i.gvr.resource, i.gvr.version))

    try:
        return asyncio.run(main())
    except ApiError as e:
        if e.status in (401, 403):
            raise UsageError(f"the API server {client.host} refused discovery ({e}); check the credentials in "
                             "the 'kubeconfig' / 'context' / 'in_cluster' settings") from None
        raise Unreachable(f"discovery failed at {client.host}: {e}") from None
    except CredentialError as e:
        raise UsageError(f"{e}; check the 'kubeconfig' / 'context' settings") from None
    except CONNECTION_ERRORS as e:
        raise Unreachable(f"cannot reach the API server {client.host}: {e}") from None


def served_gvrs(client: ApiClient) -> set[GVR]:
    """What ``client``'s API server serves (one discovery pass); UsageError or exit 1 as ``discover`` says."""
    return {info.gvr for info in discover(client)}


def print_table(rows: Sequence[Sequence[str]]) -> None:
    """``rows`` (the first one the header) in aligned columns."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
