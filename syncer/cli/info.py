"""The commands that only look: ``check-config``, ``discover``, ``settings`` and ``version``."""

from __future__ import annotations

import argparse
import json
import sys

from loguru import logger

from informers import ResourceFilter, __version__
from informers.discovery import not_served

from ..logs import logs_after
from ..settings import Settings, settings_reference
from .common import client_of, discover, plugins_of, print_table, refuse_fleet_with_sharding, served_gvrs, settings_of


def cmd_check_config(args: argparse.Namespace) -> int:
    """``syncer check-config``: the checks ``run`` makes before it connects, and their report."""
    settings = settings_of(args)
    with logs_after(settings.log_level, settings.log_format, settings.log_libraries):
        return _check_config(args, settings)


def _check_config(args: argparse.Namespace, settings: Settings) -> int:
    """check-config's checks and report: the settings as JSON (alone with ``--json``), then what the plugins
    declare, sharding and credentials; warnings follow (``logs_after``)."""
    plugins = plugins_of(settings)
    host = None if args.local else client_of(settings).host
    # With --kubeconfig, the cluster it names is asked what it serves; otherwise nothing connects.
    served = served_gvrs(client_of(settings)) if args.kubeconfig and not args.local else None
    rules = ResourceFilter(settings.include, settings.exclude)
    for name, controller in sorted(plugins.controllers.items()):
        for gvr in controller.required_gvrs:
            why = rules.why_rules_exclude(gvr)
            if why:
                logger.warning("controller {} requires {}, which the settings exclude ({}): it would wait forever; "
                               "add it to 'include' or remove it from 'exclude'", name, gvr, why)
            elif served is not None and gvr.full not in served:
                logger.warning("controller {} requires {}, which the API server {} does not serve ({}): it would "
                               "wait until it does", name, gvr, host,
                               controller.waiting_reason(gvr, not_served(gvr.full, served)))
    fleet = sorted(plugins.fleet)
    components = sorted(c.name for c in plugins.components)
    refuse_fleet_with_sharding(settings, plugins)
    if (fleet or components) and not settings.clusters.enabled:
        logger.warning("fleet controller(s) {} run only in multi-cluster mode; set [clusters] enabled = true",
                       ", ".join(fleet + components))
    print(json.dumps(settings.masked(), indent=2, default=str))
    if args.json:
        return 0
    print(f"plugins OK: {len(plugins.controllers)} controller(s): "
          f"{', '.join(sorted(plugins.controllers)) or '-'}" +
          (f"; {len(fleet)} fleet controller(s): {', '.join(fleet)}" if fleet else "") +
          (f"; {len(components)} fleet component(s): {', '.join(components)}" if components else ""))
    for what, names in (("webhook", [w.path for w in plugins.webhooks]),
                        ("CRD conversion", [f"{c.path} ({c.strategy}: {', '.join(c.versions)})"
                                            for c in plugins.conversions]),
                        ("store", [s.name for s in plugins.stores]),
                        ("runnable", [r.name for r in plugins.runnables])):
        if names:
            print(f"  {len(names)} {what}(s): {', '.join(sorted(names))}")
    sh = settings.sharding
    if sh.enabled:
        print(f"sharding: the {sh.unit_kind(settings.clusters.enabled)} are spread over the replicas of group "
              f"{sh.group!r} (Leases in namespace {sh.lease_namespace!r})")
    print(f"credentials OK: API server {host} (" +
          (f"answered: it serves {len(served)} resources)" if served is not None else "not contacted)") if host else
          "credentials: not checked (--local: a local control plane brings its own)")
    return 0


def cmd_discover(args: argparse.Namespace) -> int:
    """``syncer discover``: the served GVRs and whether the settings would watch each."""
    settings = settings_of(args)
    client = client_of(settings)
    rules = ResourceFilter(settings.include, settings.exclude, namespaced_only=bool(settings.namespace),
                           preferred_version_only=settings.preferred_version_only)

    infos = discover(client)
    rows = [("GVR", "KIND", "SCOPE", "VERBS", "WATCHED")]
    for info in infos:
        why = rules.why_excluded(info)
        rows.append((str(info.gvr), info.kind, "Namespaced" if info.namespaced else "Cluster",
                     ",".join(sorted(info.verbs)), "yes" if why is None else f"no: {why}"))
    print_table(rows)
    return 0


def cmd_settings(args: argparse.Namespace) -> int:
    """``syncer settings``: every setting, as the Markdown table ``settings_reference()`` makes."""
    print(settings_reference(), end="")
    return 0


def version_line() -> str:
    """What ``syncer --version`` and ``syncer version`` print: the package and Python versions."""
    return f"kube-syncer {__version__} (python {sys.version.split()[0]})"


def cmd_version(args: argparse.Namespace) -> int:
    """``syncer version``: ``version_line()``."""
    print(version_line())
    return 0
