"""The ``syncer`` command line: run, check-config, discover, status, version, controlplane.

User mistakes (settings, plugins, kubeconfig) end with one ``error:`` line and exit code 2, before anything
connects to the API server.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import importlib.metadata
import json
import os
import signal
import sys
import threading
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable, Sequence

from loguru import logger

from controllers.cluster import display_name
from informers import GVR, ApiClient, ApiError, CredentialError, DiscoveryClient, ResourceFilter
from informers.client import CONNECTION_ERRORS
from informers.discovery import not_served

from .logs import logs_after, setup_logging
from .plugins import PluginError, Plugins, load_plugins
from .settings import (
    SETTINGS_ENV, Settings, SettingsError, env_var, load_settings, origin_of, settings_reference,
)

EXIT_USAGE = 2
EXIT_INTERRUPTED = 128 + signal.SIGINT
EXIT_BROKEN_PIPE = 128 + signal.SIGPIPE
# The example plugin whose CRD the `run --local` hint suggests installing.
_WIDGET_EXAMPLE = "examples.plugins.widget_status"
# Where `run --local --clusters N` puts the kubeconfig Secrets of its workload planes.
LOCAL_CLUSTERS_NAMESPACE = "kube-syncer-clusters"
MEMBER_LABEL = "kube-syncer.io/kubeconfig=true"


class UsageError(Exception):
    """A mistake of the user's that stops the command with exit code 2."""


def _settings(args: argparse.Namespace) -> Settings:
    path = args.settings or os.environ.get(SETTINGS_ENV) or None
    options = {k: v for k in ("kubeconfig", "context") if (v := getattr(args, k, None))}
    try:
        return load_settings(path, options)
    except SettingsError as e:
        raise UsageError(str(e)) from None


def _client(settings: Settings) -> ApiClient:
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


def _plugins(settings: Settings) -> Plugins:
    # Plugins named by dotted path are usually in the working directory (like `python -m` does).
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        return load_plugins(settings.plugins, settings.plugin_settings, settings.entry_point_plugins)
    except PluginError as e:
        raise UsageError(str(e)) from None


def _refuse_fleet_with_sharding(settings: Settings, plugins: Any) -> None:
    from .runtime import sharding_refusal

    refused = sharding_refusal(settings, plugins)
    if refused:
        raise UsageError(refused)


def event_loop(settings: Settings) -> tuple[Callable[[], asyncio.AbstractEventLoop] | None, str]:
    """The loop factory for ``syncer run`` (None: asyncio's default) and a note on which loop that is and why.

    Only the sidecar picks its loop: it owns the process, whereas library users run the informers on theirs.
    """
    if not settings.uvloop:
        return None, "asyncio (setting 'uvloop' is false)"
    try:
        import uvloop
    except ImportError as e:  # an optional speed-up: its absence must not stop the sidecar
        return None, f"asyncio, not uvloop: it cannot be imported ({e}); install uvloop, or set uvloop = false"
    return uvloop.new_event_loop, f"uvloop {importlib.metadata.version('uvloop')}"


# -- commands --------------------------------------------------------------------------------------------
def _cluster_count(args: argparse.Namespace) -> int:
    """The number of workload planes ``run --local --clusters N`` asks for (0 without the option)."""
    if args.clusters is None:
        return 0
    if not args.local:
        raise UsageError("--clusters starts local workload control planes: it needs --local (against real clusters, "
                         "set [clusters] enabled = true and create the kubeconfig Secrets)")
    if not (args.clusters.isascii() and args.clusters.isdigit()):
        raise UsageError(f"--clusters must be a whole number of workload clusters (0 or more), got {args.clusters!r}")
    return int(args.clusters)


def _start_local_planes(count: int) -> list[Any]:
    """The management control plane and ``count`` workload planes (``workload-<i>``), all started or none.

    The workload planes start on threads beside the management one, so N planes take about as long as one; the
    management plane starts on this thread, so that Ctrl-C interrupts at once as before (the planes still starting
    then die with the process, as every local plane does).
    """
    from .testing import AssetsError, ControlPlane, ControlPlaneError  # test tooling: only when asked for

    planes: list[Any] = [None] * (count + 1)
    errors: list[Exception] = []

    def start(i: int) -> None:
        try:
            planes[i] = ControlPlane(name=f"workload-{i}").start()
        except (AssetsError, ControlPlaneError) as e:
            errors.append(type(e)(f"workload plane workload-{i}: {e}"))

    threads = [threading.Thread(target=start, args=(i,), name=f"start workload-{i}", daemon=True)
               for i in range(1, count + 1)]
    for t in threads:
        t.start()
    try:
        planes[0] = ControlPlane().start()
    except (AssetsError, ControlPlaneError) as e:
        errors.insert(0, e)
    for t in threads:
        t.join()
    if errors:
        _stop_planes([p for p in planes if p is not None])
        raise errors[0]
    return planes


def _stop_planes(planes: Sequence[Any]) -> None:
    """Stop the control planes side by side (each takes a second or two)."""
    threads = [threading.Thread(target=cp.stop, daemon=True) for cp in planes]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def _register_members(management: Any, workloads: Sequence[Any]) -> None:
    """Make each workload plane a member: a kubeconfig Secret ``cluster-<i>`` on the management plane."""
    import kubernetes

    k = kubernetes.client
    with kubernetes.config.new_client_from_config(  # type: ignore[no-untyped-call]
            str(management.kubeconfig), context="admin") as api:
        core = k.CoreV1Api(api)
        core.create_namespace(k.V1Namespace(metadata=k.V1ObjectMeta(name=LOCAL_CLUSTERS_NAMESPACE)))
        for i, cp in enumerate(workloads, 1):
            core.create_namespaced_secret(LOCAL_CLUSTERS_NAMESPACE, k.V1Secret(
                metadata=k.V1ObjectMeta(name=f"cluster-{i}", labels={"kube-syncer.io/kubeconfig": "true"}),
                data={"kubeconfig": base64.b64encode(cp.kubeconfig.read_bytes()).decode()}))


def _install_shipped_crds(management: Any) -> None:
    """The CRDs the project ships (deploy/crds: the cached resources'), on a fresh local plane."""
    import kubernetes

    from .builtin.cached_resources.root import CRDS

    with kubernetes.config.new_client_from_config(  # type: ignore[no-untyped-call]
            str(management.kubeconfig), context="admin") as api:
        for path in sorted(CRDS.glob("*.json")):
            kubernetes.client.ApiextensionsV1Api(api).create_custom_resource_definition(json.loads(path.read_text()))


def _use_local_planes(settings: Settings, planes: Sequence[Any]) -> Settings:
    """The settings for running against local planes: the first is the management plane, the others become
    members. Prints how to reach each plane."""
    cp, workloads = planes[0], planes[1:]
    _install_shipped_crds(cp)
    settings = replace(settings, kubeconfig=str(cp.kubeconfig), context="admin", in_cluster=False)
    example = "apply -f examples/crds/widget.json" if _WIDGET_EXAMPLE in settings.plugins else "api-resources"
    # With members, the plugins' controllers run in them (not here, unless include_local): the hint goes there.
    print(f"local control plane at {cp.url}; kubeconfig: {cp.kubeconfig}" +
          ("" if workloads else f"\n  try: {cp.assets.kubectl} --kubeconfig {cp.kubeconfig} {example}"), flush=True)
    if not workloads:
        return settings
    _register_members(cp, workloads)
    for i, w in enumerate(workloads, 1):
        print(f"workload control plane {w.name} at {w.url}; kubeconfig: {w.kubeconfig}; member cluster-{i} "
              f"(Secret {LOCAL_CLUSTERS_NAMESPACE}/cluster-{i})\n"
              f"  try: {w.assets.kubectl} --kubeconfig {w.kubeconfig} {example}", flush=True)
    clusters = settings.clusters
    # The Secrets made here carry our label: a [clusters] section selecting others must still see them.
    selectors = clusters.label_selectors if MEMBER_LABEL in clusters.label_selectors else \
        (*clusters.label_selectors, MEMBER_LABEL)
    return replace(settings, clusters=replace(clusters, enabled=True, namespaces=(LOCAL_CLUSTERS_NAMESPACE,),
                                              label_selectors=selectors))


def cmd_run(args: argparse.Namespace) -> int:
    from .runtime import ControllersStuck, StartupError, Syncer

    count = _cluster_count(args)
    settings = _settings(args)
    setup_logging(settings.log_level, settings.log_format)
    controllers = _plugins(settings)
    _refuse_fleet_with_sharding(settings, controllers)
    planes: list[Any] = []
    if args.local:
        from .testing import AssetsError, ControlPlaneError  # test tooling: only when asked for

        try:
            planes = _start_local_planes(count)
        except (AssetsError, ControlPlaneError) as e:
            print(f"error: local control plane: {e}", file=sys.stderr)
            return 1
    try:
        if planes:
            import kubernetes  # the local planes are set up with the package's client

            try:
                settings = _use_local_planes(settings, planes)
            except kubernetes.client.ApiException as e:  # a fresh plane refusing this is our bug, not the user's
                print(f"error: registering the workload planes on the local control plane: {e.status} {e.reason}",
                      file=sys.stderr)
                return 1
        client = _client(settings)

        async def main() -> None:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
            try:
                await Syncer(settings, client, controllers, identity=args.identity).run(stop)
            except ControllersStuck as e:
                # asyncio.run would wait forever for the tasks that ignore their cancellation: leave now.
                print(f"error: {e}", file=sys.stderr, flush=True)
                os._exit(1)

        loop_factory, which = event_loop(settings)
        logger.info("event loop: {}", which)
        try:
            with asyncio.Runner(loop_factory=loop_factory) as runner:
                runner.run(main())
        except StartupError as e:
            raise UsageError(str(e)) from None
    finally:
        _stop_planes(planes)
    return 0


def cmd_check_config(args: argparse.Namespace) -> int:
    settings = _settings(args)
    with logs_after(settings.log_level, settings.log_format):
        return _check_config(args, settings)


def _check_config(args: argparse.Namespace, settings: Settings) -> int:
    """check-config's checks and report: the settings as JSON (alone with ``--json``), then what the plugins
    declare, sharding and credentials; warnings follow (``logs_after``)."""
    controllers = _plugins(settings)
    host = None if args.local else _client(settings).host
    # With --kubeconfig, the cluster it names is asked what it serves; otherwise nothing connects.
    served = _served(_client(settings)) if args.kubeconfig and not args.local else None
    rules = ResourceFilter(settings.include, settings.exclude)
    for name, controller in sorted(controllers.controllers.items()):
        for gvr in controller.required_gvrs:
            why = rules.why_rules_exclude(gvr)
            if why:
                logger.warning("controller {} requires {}, which the settings exclude ({}): it would wait forever; "
                               "add it to 'include' or remove it from 'exclude'", name, gvr, why)
            elif served is not None and gvr.full not in served:
                logger.warning("controller {} requires {}, which the API server {} does not serve ({}): it would "
                               "wait until it does", name, gvr, host, not_served(gvr.full, served))
    fleet = sorted(controllers.fleet)
    components = sorted(c.name for c in controllers.components)
    _refuse_fleet_with_sharding(settings, controllers)
    if (fleet or components) and not settings.clusters.enabled:
        logger.warning("fleet controller(s) {} run only in multi-cluster mode; set [clusters] enabled = true",
                       ", ".join(fleet + components))
    print(json.dumps(settings.masked(), indent=2, default=str))
    if args.json:
        return 0
    print(f"plugins OK: {len(controllers.controllers)} controller(s): "
          f"{', '.join(sorted(controllers.controllers)) or '-'}" +
          (f"; {len(fleet)} fleet controller(s): {', '.join(fleet)}" if fleet else "") +
          (f"; {len(components)} fleet component(s): {', '.join(components)}" if components else ""))
    for what, names in (("webhook", [w.path for w in controllers.webhooks]),
                        ("CRD conversion", [f"{c.path} ({c.strategy}: {', '.join(c.versions)})"
                                            for c in controllers.conversions]),
                        ("store", [s.name for s in controllers.stores]),
                        ("runnable", [r.name for r in controllers.runnables])):
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


def _served(client: ApiClient) -> set[GVR]:
    """What ``client``'s API server serves (one discovery pass); UsageError or exit 1 as ``discover`` says."""
    return {info.gvr for info in _discover(client)}


class Unreachable(Exception):
    """The API server could not be asked (exit code 1, not a usage error); the message says why."""


def _discover(client: ApiClient) -> list[Any]:
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


def cmd_discover(args: argparse.Namespace) -> int:
    settings = _settings(args)
    client = _client(settings)
    rules = ResourceFilter(settings.include, settings.exclude, namespaced_only=bool(settings.namespace),
                           preferred_version_only=settings.preferred_version_only)

    infos = _discover(client)
    rows = [("GVR", "KIND", "SCOPE", "VERBS", "WATCHED")]
    for info in infos:
        why = rules.why_excluded(info)
        rows.append((str(info.gvr), info.kind, "Namespaced" if info.namespaced else "Cluster",
                     ",".join(sorted(info.verbs)), "yes" if why is None else f"no: {why}"))
    _table(rows)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    url, origin = args.url, "--url"
    if not url:
        settings = _settings(args)
        host, _, port = settings.http_bind.rpartition(":")
        url = f"http://{'127.0.0.1' if host in ('0.0.0.0', '::', '') else host}:{port}/status"
        origin = _http_bind_origin(settings)
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            doc = json.load(resp)
        election = (f"leader={doc['leader']}  lease holder={doc.get('lease_holder') or '-'}"
                    if doc.get("leader_election") else "leader election off")
        header = f"identity {doc['identity']}  ready={doc['ready']}  {election}\n"
        controllers = [(c["name"], c["state"], str(c.get("restarts", 0)), str(c.get("reconcile_errors", 0)),
                        ",".join(c.get("missing", []) + c.get("not_synced", [])),
                        c.get("last_error") or c.get("last_reconcile_error") or "")
                       for c in doc["controllers"]]
        gvrs = [(g["gvr"], g["state"], g["source"], g["reason"]) for g in doc["gvrs"] if g["state"] != "excluded"]
        troubled = [(t["name"], t["state"] + (" (wedged)" if t.get("wedged") else ""), str(t["restarts"]),
                     t["last_error"]) for t in doc.get("tasks", []) if t["last_error"] or not t["healthy"]]
        fleet = _fleet_tables(doc["clusters"]) if doc.get("clusters") is not None else []
        fleet += _shard_tables(doc["sharding"]) if doc.get("sharding") is not None else []
        fleet += [_webhook_table(doc["webhooks"])] if doc.get("webhooks") else []
    except (urllib.error.URLError, OSError) as e:
        print(f"error: no syncer answering at {url} ({origin}): {e}", file=sys.stderr)
        return 1
    except (ValueError, KeyError, TypeError) as e:  # something else answers there
        print(f"error: {url} did not answer with a syncer status ({type(e).__name__}: {e})", file=sys.stderr)
        return 1
    print(header)
    _table([("CONTROLLER", "STATE", "RESTARTS", "ERRORS", "WAITING FOR", "LAST ERROR"), *controllers])
    print()
    _table([("GVR", "STATE", "SOURCE", "REASON"), *gvrs])
    for rows in fleet:
        print()
        _table(rows)
    if troubled:
        print()
        _table([("BACKGROUND TASK", "STATE", "RESTARTS", "LAST ERROR"), *troubled])
    return 0


def _http_bind_origin(settings: Settings) -> str:
    """Where the address ``status`` asks came from, so that a user whose sidecar runs elsewhere sees why."""
    origin = origin_of("http_bind", settings.source or None)
    if origin:
        return f"http_bind from {origin}"
    where = f"the settings file {settings.source!r} does not set it" if settings.source else "no settings file"
    return (f"http_bind's default: {where}, nor {env_var('http_bind')}; give `status` the settings `run` was "
            f"given (--settings or ${SETTINGS_ENV}, and the environment), or --url")


def _fleet_tables(doc: dict[str, Any]) -> list[list[tuple[str, ...]]]:
    """The multi-cluster part of ``syncer status``: the members, then the conflicts and the fleet controllers
    (those two only when there are any)."""
    tables: list[list[tuple[str, ...]]] = [[("CLUSTER", "STATE", "READY", "SOURCE", "PROBLEM")] + [
        (c["display_name"], c["state"], "yes" if c["ready"] else "no", c["source"], _problem(c))
        for c in doc["clusters"]]]
    if doc["conflicts"]:
        tables.append([("CONFLICTING SECRET", "IGNORED BECAUSE")] + [(c["secret"], c["message"])
                                                                     for c in doc["conflicts"]])
    if doc.get("fleet_controllers"):
        tables.append([("FLEET CONTROLLER", "GVR", "CLUSTERS", "RECONCILES", "ERRORS", "LAST ERROR")] + [
            (f["name"], f["gvr"], ",".join(display_name(n) for n in f["clusters"]) or "-", str(f["reconciles"]),
             str(f["reconcile_errors"]), f.get("last_reconcile_error") or "") for f in doc["fleet_controllers"]])
    return tables


def _shard_tables(doc: dict[str, Any]) -> list[list[tuple[str, ...]]]:
    """The sharding part of ``syncer status``: the live members, then every unit with its state here, the holder
    of its Lease and the member the assignment gives it."""
    owned = {d["identity"]: 0 for d in doc["members"]}
    for u in doc["units"]:
        if u["holder"] in owned:
            owned[u["holder"]] += 1
    members = [("SHARD MEMBER", "UNITS HELD")] + [
        (f"{m}{' (this replica)' if m == doc['identity'] else ''}", str(n)) for m, n in owned.items()]
    units = [(f"{doc['kind'][:-1].upper()} UNIT", "STATE HERE", "LEASE HOLDER", "TRANSITIONS", "ASSIGNED TO")] + [
        (display_name(u["unit"]) if doc["kind"] == "clusters" else u["unit"], u["state"], u["holder"] or "-",
         "-" if u["transitions"] is None else str(u["transitions"]), u["assigned"] or "-") for u in doc["units"]]
    tables = [members, units]
    if doc.get("stuck"):
        tables.append([("STUCK CONTROLLER (lease kept)",)] + [(n,) for n in doc["stuck"]])
    return tables


def _webhook_table(doc: dict[str, Any]) -> list[tuple[str, ...]]:
    """The webhook part of ``syncer status``: each webhook's requests, how they were answered, and latency; a CRD
    conversion's converted reviews are in ALLOWED."""
    def ms(seconds: float | None) -> str:
        return "-" if seconds is None else f"{seconds * 1000:.1f}ms"

    return [("WEBHOOK", "KIND", "REQUESTS", "ALLOWED", "DENIED", "ERRORS", "MEAN", "MAX")] + [
        (w["name"], w["kind"], str(w["requests"]), str(w["allowed"]), str(w["denied"]), str(w["errors"]),
         ms(w["latency_seconds"]["mean"]), ms(w["latency_seconds"]["max"])) for w in doc["webhooks"]] + [
        (c["crd"], "conversion", str(c["requests"]), str(c["converted"]), "-", str(c["errors"]),
         ms(c["latency_seconds"]["mean"]), ms(c["latency_seconds"]["max"])) for c in doc.get("conversions", [])]


def _problem(cluster: dict[str, Any]) -> str:
    """What keeps a member from being ready: its first false condition, as ``Type: message``."""
    for c in cluster["conditions"]:
        if c["status"] == "False":
            return f"{c['type']}: {c['message'] or c['reason']}"
    return ""


def cmd_settings(args: argparse.Namespace) -> int:
    print(settings_reference(), end="")
    return 0


def cmd_version(args: argparse.Namespace) -> int:
    try:
        version = importlib.metadata.version("kube-syncer")
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    print(f"kube-syncer {version} (python {sys.version.split()[0]})")
    return 0


def cmd_controlplane(args: argparse.Namespace) -> int:
    from .testing import AssetsError, ControlPlane, ControlPlaneError  # test tooling: only when asked for

    try:
        cp = ControlPlane(extra_apiserver_flags=args.apiserver_flag).start()
    except (AssetsError, ControlPlaneError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"local control plane ready at {cp.url}\n"
          f"  kubeconfig: {cp.kubeconfig}  (contexts: admin [current], restricted)\n"
          f"  try:        {cp.assets.kubectl} --kubeconfig {cp.kubeconfig} get namespaces\n"
          f"Ctrl-C stops it and removes its data.", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    print("stopping control plane", flush=True)
    cp.stop()
    return 0


def _table(rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``syncer`` console script and ``python -m syncer``."""
    parser = argparse.ArgumentParser(prog="syncer", description="kube-syncer: dynamic Kubernetes controllers")
    sub = parser.add_subparsers(dest="command", required=True)

    def with_settings(p: argparse.ArgumentParser, cluster: bool = True) -> argparse.ArgumentParser:
        p.add_argument("--settings", metavar="FILE", help=f"settings TOML file (default: ${SETTINGS_ENV})")
        if cluster:
            p.add_argument("--kubeconfig", help="kubeconfig file (overrides the setting)")
            p.add_argument("--context", help="kubeconfig context (overrides the setting)")
        return p

    run = with_settings(sub.add_parser("run", help="run the sidecar"))
    run.add_argument("--local", action="store_true", help="start a local control plane and run against it")
    run.add_argument("--identity", help="leader-election identity (default: hostname_uuid)")
    run.add_argument("--clusters", metavar="N",
                     help="with --local: also start N workload control planes and run in multi-cluster mode, each "
                          f"a member through a kubeconfig Secret in namespace {LOCAL_CLUSTERS_NAMESPACE}")
    run.set_defaults(func=cmd_run)
    check = with_settings(sub.add_parser("check-config", help="check settings, plugins and credentials without "
                                         "connecting; print the effective settings"))
    check.add_argument("--local", action="store_true",
                       help="the settings are for `run --local`: skip the credentials, a local control plane brings "
                            "its own")
    check.add_argument("--json", action="store_true", help="print the effective settings as JSON and nothing else")
    check.set_defaults(func=cmd_check_config)
    with_settings(sub.add_parser("discover", help="list served GVRs and whether they would be watched")
                  ).set_defaults(func=cmd_discover)
    status = with_settings(sub.add_parser("status", help="show a running sidecar's status"), cluster=False)
    status.add_argument("--url", help="status URL (default: from http_bind)")
    status.set_defaults(func=cmd_status)
    sub.add_parser("settings", help="list every setting: default, type and range, environment variable"
                   ).set_defaults(func=cmd_settings)
    sub.add_parser("version", help="print the version").set_defaults(func=cmd_version)
    cp = sub.add_parser("controlplane", help="run a local etcd + kube-apiserver until Ctrl-C")
    cp.add_argument("--apiserver-flag", action="append", default=[], metavar="FLAG",
                    help="extra kube-apiserver flag (repeatable)")
    cp.set_defaults(func=cmd_controlplane)
    args = parser.parse_args(argv)
    try:
        code = int(args.func(args))
        sys.stdout.flush()  # a reader that went away shows here, not in the interpreter's final flush
        return code
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except Unreachable as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # Ctrl-C before the command installed its own handling (e.g. while starting)
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        # The reader went away (`syncer discover | head`): stop quietly, as Unix tools do. Point stdout at
        # /dev/null so that the interpreter's final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_BROKEN_PIPE
