"""Settings: a TOML file plus ``SYNCER_*`` environment variables, read by dynaconf and validated at load time.

An environment value replaces the file's (lists and scalars; a table's keys are set one by one with
``SYNCER_TABLE__KEY``), as dynaconf does by default and as ``kubectl`` or Helm's ``--set`` would; adding to a
list is explicit: ``SYNCER_INCLUDE='@merge ["core/secrets"]'``. The variables Kubernetes injects for a Service
whose name starts with ``syncer`` (``SYNCER_PORT=tcp://...``, ``SYNCER_SERVICE_HOST``, ...) are not settings:
they are ignored, with a DEBUG line, unless one is a setting's own variable.

Every setting is checked for type and range here, in one table, so that ``syncer check-config`` rejects exactly
what ``syncer run`` would, before anything connects. A mistake is a ``SettingsError`` whose message names the
setting, what a good value looks like, the bad value, and where to fix it.
"""

from __future__ import annotations

import difflib
import json
import math
import os
import re
import tomllib
import urllib.parse
from dataclasses import dataclass, field, fields
from operator import attrgetter
from pathlib import Path
from typing import Any, Callable, Literal, Mapping

from loguru import logger

from controllers.providers.secrets import DEFAULT_LABEL_SELECTORS, DEFAULT_SECRET_TYPES
from informers.discovering_factory import WatchMode
from informers.field_selector import FieldSelector
from informers.gvr import GVR
from informers.resource_filter import Rule
from informers.selector import LabelSelector, SelectorError

ENV_PREFIX = "SYNCER"
# Docker-links style variables of a Service <NAME>: <NAME>_SERVICE_HOST, <NAME>_SERVICE_PORT[_<PORT NAME>],
# <NAME>_PORT, <NAME>_PORT_<port>_<PROTO>[_PROTO|_PORT|_ADDR], with <NAME> upper-cased, "-" as "_".
_SERVICE_LINK = re.compile(rf"{ENV_PREFIX}(?:_[A-Z0-9_]+)?_(?:SERVICE_HOST|SERVICE_PORT(?:_[A-Z0-9_]+)?|PORT"
                           r"(?:_\d+_(?:TCP|UDP|SCTP)(?:_PROTO|_PORT|_ADDR)?)?)")
# The CLI's default for --settings; it names the file, it is not a setting.
SETTINGS_ENV = f"{ENV_PREFIX}_SETTINGS"
LOG_LEVELS = ("TRACE", "DEBUG", "INFO", "SUCCESS", "WARNING", "ERROR", "CRITICAL")
MAX_WORKERS = 1000
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class SettingsError(Exception):
    """A bad setting: the message names it and says how to fix it."""


@dataclass(frozen=True)
class LeaderElection:
    """Lease-based leader election, table ``[leader_election]`` (controller-runtime's defaults).

    - ``enabled``: run controllers only while holding the Lease (off: every replica runs them).
    - ``lease_name`` (a DNS-1123 subdomain), ``lease_namespace`` (a DNS-1123 label): the Lease object.
    - ``lease_duration``: how long a standby waits after the last renewal before taking over.
    - ``renew_deadline``: the leader gives up if it cannot renew for this long; ``< lease_duration``.
    - ``retry_period``: the interval of acquire and renew attempts; ``< renew_deadline``.
    """

    enabled: bool = False
    lease_name: str = "kube-syncer"
    lease_namespace: str = "default"
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0


@dataclass(frozen=True)
class Webhooks:
    """The admission webhook server, table ``[webhooks]``; it runs, on every replica, when a plugin declares
    webhooks.

    - ``bind``: ``host:port`` it listens on with TLS (in a pod: ``0.0.0.0:9443``, for the API server to reach).
    - ``cert_dir``: a directory with ``tls.crt``, ``tls.key`` and ``ca.crt`` (a mounted cert-manager Secret),
      reloaded when they change; ``""``: a self-signed certificate (and CA) for ``hosts``.
    - ``hosts``: the DNS names and IP addresses of the self-signed certificate.
    - ``client_ca_file``: require client certificates signed by this CA (the API server's, mutual TLS);
      ``""``: none required.
    - ``manage_configurations``: write the ``Validating``/``MutatingWebhookConfiguration`` objects from the
      plugins' declarations: ``true``, ``false`` or ``"auto"`` (when the API server is on loopback, as with
      ``syncer run --local``).
    - ``configuration_name`` (a DNS-1123 subdomain): the name of both objects.
    - ``url``: the ``https://`` base URL the API server calls in them; ``""``: ``https://`` + ``bind``, with
      ``127.0.0.1`` for ``0.0.0.0``.
    - ``probe_namespace`` (a DNS-1123 label): the namespace of the dry-run ConfigMap that shows the API server
      calls the webhooks (nothing is created).
    """

    bind: str = "127.0.0.1:9443"
    cert_dir: str = ""
    hosts: tuple[str, ...] = ("localhost", "127.0.0.1")
    client_ca_file: str = ""
    manage_configurations: bool | Literal["auto"] = "auto"
    configuration_name: str = "kube-syncer"
    url: str = ""
    probe_namespace: str = "default"


@dataclass(frozen=True)
class Clusters:
    """Multi-cluster mode, table ``[clusters]``: member clusters come from kubeconfig Secrets on the cluster the
    sidecar connects to (the management cluster), and the plugins' controllers run in each of them.

    - ``enabled``: on (off: the plugins' controllers run in the one cluster the sidecar connects to).
    - ``namespaces``: where the Secrets are (DNS-1123 labels; ``[]``: all namespaces).
    - ``label_selectors``: each selects Secrets by label; ``secret_types``: each selects Secrets by type.
    - ``include_local``: the management cluster is a member too, named ``""``.
    - ``allowed_exec_commands``: exec credential plugins a kubeconfig may run (exact command names); none by
      default, because a kubeconfig from a Secret is untrusted input.
    - ``sync_timeout``: how long a member may take to connect, discover and sync before its controllers start
      anyway (connect and discovery failures are retried with backoff).
    - ``probe_interval``: how long a member's watches may say nothing (no event, no bookmark, no answer to any
      request) before ``/version`` is asked whether it is still there. Above the API server's bookmark cadence
      (a minute) and the watches' inactivity timeout (150 s, after which a silent watch is reopened) by default,
      so a member with a working watch is never asked: its watches say when it is unreachable.
    - ``watch``: which served GVRs get informers in member clusters, the management cluster included (it runs
      nothing of its own in this mode): ``"required"`` (those some controller requires) or ``"all"``; the
      top-level ``watch`` applies only without ``[clusters]``.
    """

    enabled: bool = False
    namespaces: tuple[str, ...] = ()
    label_selectors: tuple[str, ...] = DEFAULT_LABEL_SELECTORS
    secret_types: tuple[str, ...] = DEFAULT_SECRET_TYPES
    include_local: bool = False
    allowed_exec_commands: tuple[str, ...] = ()
    sync_timeout: float = 30.0
    probe_interval: float = 300.0
    watch: WatchMode = "required"


UnitKind = Literal["clusters", "controllers"]


@dataclass(frozen=True)
class Sharding:
    """Scale-out, table ``[sharding]``: the replicas share the work, each unit of it fenced by its own Lease
    (see ``syncer/shards.py``).

    - ``enabled``: on (off: the leader, or with election off every replica, runs all the controllers).
    - ``units``: what is spread: ``"clusters"`` (each member cluster with its controllers; needs ``[clusters]``
      enabled), ``"controllers"`` (each managed controller; without ``[clusters]``) or ``"auto"`` (whichever
      the mode allows).
    - ``group`` (a DNS-1123 label): names the Leases (``<group>-member-...``, ``<group>-unit-...``) and labels
      them; replicas of one deployment share it, and two deployments in one namespace must not.
    - ``lease_namespace`` (a DNS-1123 label): where the member and unit Leases are.
    - ``lease_duration``, ``renew_deadline`` (< ``lease_duration``), ``retry_period`` (< ``renew_deadline``): as
      for leader election, for every member and unit Lease.
    - ``min_hold``: a unit stays at least this long with the replica that took it before it is handed to another
      (so a member that blips does not make units flap).
    """

    enabled: bool = False
    units: Literal["auto", "clusters", "controllers"] = "auto"
    group: str = "kube-syncer"
    lease_namespace: str = "default"
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0
    min_hold: float = 30.0

    def unit_kind(self, clusters_enabled: bool) -> UnitKind:
        """What is spread, ``auto`` resolved."""
        if self.units == "auto":
            return "clusters" if clusters_enabled else "controllers"
        return self.units


@dataclass(frozen=True)
class Settings:
    """The validated, typed settings of a syncer process. Durations are seconds, written ``15s``, ``500ms``,
    ``2m``, ``1h`` or as a number of seconds, and must be > 0 unless said otherwise.

    - ``kubeconfig``, ``context``: credentials file (default ``$KUBECONFIG`` or ``~/.kube/config``) and context;
      ``in_cluster``: use the pod's service account instead.
    - ``plugins``: plugin modules (dotted paths or ``.py`` files); ``entry_point_plugins``: whether installed
      packages' ``syncer.controllers`` entry points are loaded too: ``true`` (all), ``false`` (none) or a list
      of entry point names; ``plugin_settings``: one table per plugin, ``[plugin_settings.<plugin name>]``.
    - ``field_selectors``: per GVR, a field selector the server filters that GVR's informer by (in every
      cluster), so its cache holds only those objects: controller-runtime's ``cache.Options.ByObject``.
    - ``include``, ``exclude``: resource rules (``group/version/resource`` or ``group/resource``, globs
      allowed) choosing the GVRs that get informers; ``preferred_version_only``: only each group's preferred
      version; ``namespace``: watch one namespace (a DNS-1123 label; ``""`` = all namespaces).
    - ``rediscovery_interval``: how often discovery is re-run while CRD/APIService events cannot say when (they
      cannot be watched, or ``check_permissions`` found a GVR forbidden); ``full_rediscovery_interval`` (at
      least ``rediscovery_interval``): how often it is re-run anyway, as a safety net, while they can (plus up
      to 20 % jitter; in every cluster). ``resync``:
      informer resync period (``0`` = off); ``check_permissions``: skip GVRs the credentials cannot list/watch.
    - ``workers``: reconcile workers per controller, 1 to ``MAX_WORKERS``.
    - ``http_bind``: ``host:port`` (port 1-65535) of the probes, ``/metrics`` and ``/status``.
    - ``log_level`` (any case of ``LOG_LEVELS``), ``log_format`` (``text`` or ``json``).
    - ``shutdown_timeout``: the bound on a graceful stop; ``start_timeout``: the bound on starting the
      controllers after becoming leader.
    - ``uvloop``: run ``syncer run`` on uvloop when it is installed (off: the standard asyncio loop).
    - ``http2``: talk to every API server (the local one and the members) over HTTP/2 when it offers it, one
      connection per server for all requests and watches, as client-go; off: HTTP/1.1, a connection per watch.
      client-go's ``DISABLE_HTTP2`` environment variable turns it off too.
    - ``debug_endpoints``: also serve ``/debug/tasks`` (every asyncio task's stack) and ``/debug/stalls`` (where
      the event loop was when it stalled) on ``http_bind``.
    - ``watch``: which served (and filtered) GVRs get informers: ``"all"``, or ``"required"``: only those some
      controller requires (fewer watches; ``syncer status`` shows the others as idle).
    - ``leader_election``: see ``LeaderElection``; ``webhooks``: see ``Webhooks``; ``clusters``: see
      ``Clusters``; ``sharding``: see ``Sharding``. ``source``: the settings
      file read (not a setting).
    """

    kubeconfig: str = ""
    context: str = ""
    in_cluster: bool = False
    plugins: tuple[str, ...] = ()
    entry_point_plugins: bool | tuple[str, ...] = True
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    preferred_version_only: bool = False
    namespace: str = ""
    rediscovery_interval: float = 60.0
    full_rediscovery_interval: float = 600.0
    resync: float = 0.0
    workers: int = 2
    check_permissions: bool = False
    http_bind: str = "127.0.0.1:8080"
    log_level: str = "INFO"
    log_format: str = "text"
    shutdown_timeout: float = 20.0
    start_timeout: float = 60.0
    uvloop: bool = True
    http2: bool = True
    debug_endpoints: bool = False
    watch: WatchMode = "all"
    leader_election: LeaderElection = field(default_factory=LeaderElection)
    webhooks: Webhooks = field(default_factory=Webhooks)
    clusters: Clusters = field(default_factory=Clusters)
    sharding: Sharding = field(default_factory=Sharding)
    field_selectors: dict[str, str] = field(default_factory=dict)
    plugin_settings: dict[str, dict[str, Any]] = field(default_factory=dict)
    source: str = ""

    def masked(self) -> dict[str, Any]:
        """The effective settings as a dict, with anything secret-looking masked."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, (LeaderElection, Webhooks, Clusters, Sharding)):
                value = {g.name: getattr(value, g.name) for g in fields(value)}
            out[f.name] = _mask(f.name, value)
        return out


def _mask(key: str, value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _mask(k, v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_mask(key, v) for v in value]
    # By the end of the name: "api_token" or "client_secret" are secrets, "secret_types" is not.
    if value and re.search(r"(token|password|secret|key)s?$", key, re.I):
        return "***"
    return value


def parse_duration(value: Any) -> float:
    """Seconds from ``15s``, ``500ms``, ``2m``, ``1h`` or a number of seconds; ValueError if it is none of them."""
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        m = _DURATION.match(str(value))
        if not m:
            raise ValueError(f"not a duration: {value!r}")
        seconds = float(m.group(1)) * _UNITS[m.group(2)]
    if not math.isfinite(seconds):
        raise ValueError(f"not a finite duration: {value!r}")
    return seconds


# -- checks: each turns a raw value into the typed one or raises _Invalid -------------------------------------
class _Invalid(Exception):
    """A value a check rejects: ``expect`` describes a good value, ``detail`` (optional) this value's fault."""

    def __init__(self, expect: str, detail: str = "") -> None:
        super().__init__(expect)
        self.expect = expect
        self.detail = detail


# A check gets the raw value and the settings checked so far (for limits relative to another setting).
_Check = Callable[[Any, Mapping[str, Any]], Any]


def _string(value: Any, done: Mapping[str, Any]) -> str:
    if not isinstance(value, str):
        raise _Invalid("a string")
    return value


def _boolean(value: Any, done: Mapping[str, Any]) -> bool:
    if not isinstance(value, bool):
        raise _Invalid("true or false")
    return value


def _string_list(value: Any) -> tuple[str, ...] | None:
    """The value as a tuple if it is a list of non-empty strings, else None."""
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) and v.strip() for v in value):
        return tuple(str(v) for v in value)
    return None


def _strings(what: str) -> Callable[[Any, Mapping[str, Any]], tuple[str, ...]]:
    def check(value: Any, done: Mapping[str, Any]) -> tuple[str, ...]:
        strings = _string_list(value)
        if strings is None:
            raise _Invalid(f"a list of {what}")
        return strings
    return check


def _parsed_strings(what: str, parse: Callable[[str], object], error: type[Exception]) -> _Check:
    """A list of strings that ``parse`` accepts; a rejected one is reported with ``parse``'s own message."""
    def check(value: Any, done: Mapping[str, Any]) -> tuple[str, ...]:
        items = _strings(what)(value, done)
        for item in items:
            try:
                parse(item)
            except error as e:
                raise _Invalid(f"a list of {what}", str(e)) from None
        return items
    return check


_resource_rules = _parsed_strings("resource rules", Rule.parse, ValueError)


def _entry_point_plugins(value: Any, done: Mapping[str, Any]) -> bool | tuple[str, ...]:
    names = value if isinstance(value, bool) else _string_list(value)
    if names is None:
        raise _Invalid("true (all installed), false (none) or a list of entry point names")
    return names


def _integer(low: int, high: int) -> _Check:
    def check(value: Any, done: Mapping[str, Any]) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise _Invalid(f"an integer from {low} to {high}")
        return value
    return check


def _duration(*, zero_means: str = "", below: str = "", at_least: str = "") -> _Check:
    """A duration > 0 (or >= 0 when ``zero_means`` says what 0 does), < setting ``below`` and >= setting
    ``at_least`` if given."""
    def check(value: Any, done: Mapping[str, Any]) -> float:
        limit = done[below] if below else math.inf
        floor = done[at_least] if at_least else 0.0
        expect = "a duration " + (f">= 0 (0 {zero_means})" if zero_means else "> 0")
        if below:
            expect += f" and < {below.rpartition('.')[2]} ({_seconds(limit)})"
        if at_least:
            expect += f" and >= {at_least.rpartition('.')[2]} ({_seconds(floor)})"
        try:
            seconds = parse_duration(value)
        except ValueError:
            raise _Invalid(f"{expect}, like '15s', '500ms' or '2m'") from None
        if not (seconds >= 0 if zero_means else seconds > 0) or seconds >= limit or seconds < floor:
            raise _Invalid(expect)
        return seconds
    return check


def _seconds(value: float) -> str:
    return f"{value:g}s"


def _dns_name(kind: str, empty_means: str = "") -> _Check:
    """A DNS-1123 ``label`` or ``subdomain`` (dot-separated labels), as Kubernetes names must be."""
    max_len = 253 if kind == "subdomain" else 63
    expect = (f"a DNS-1123 {kind} (at most {max_len} characters: lowercase letters, digits and '-'"
              f"{', and dots' if kind == 'subdomain' else ''}, starting and ending with a letter or digit)"
              f"{f', or an empty string for {empty_means}' if empty_means else ''}")

    def check(value: Any, done: Mapping[str, Any]) -> str:
        if value == "" and empty_means:
            return ""
        if not isinstance(value, str) or len(value) > max_len or not all(
                len(label) <= 63 and _DNS_LABEL.match(label)
                for label in (value.split(".") if kind == "subdomain" else [value])):
            raise _Invalid(expect)
        return value
    return check


def _host_port(value: Any, done: Mapping[str, Any]) -> str:
    host, _, port = value.rpartition(":") if isinstance(value, str) else ("", "", "")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise _Invalid("host:port with a port from 1 to 65535, like '127.0.0.1:8080' or '0.0.0.0:8080'")
    return str(value)


def _choice(options: tuple[str, ...]) -> _Check:
    """One of ``options``, in any case; returned as written in ``options``."""
    def check(value: Any, done: Mapping[str, Any]) -> str:
        for option in options:
            if isinstance(value, str) and value.strip().lower() == option.lower():
                return option
        raise _Invalid(f"one of {', '.join(options)} (any case)")
    return check


def _kubeconfig(value: Any, done: Mapping[str, Any]) -> str:
    path = _string(value, done)
    if path and not Path(path).expanduser().is_file():
        raise _Invalid("the path of an existing kubeconfig file", "it does not exist")
    return path


def _existing(kind: str) -> _Check:
    """The path of an existing ``kind`` ("file" or "directory"), or ``""`` for none."""
    def check(value: Any, done: Mapping[str, Any]) -> str:
        expect = f"the path of an existing {kind} or an empty string"
        if not isinstance(value, str):
            raise _Invalid(expect)
        if value and not (Path(value).is_dir() if kind == "directory" else Path(value).is_file()):
            raise _Invalid(expect, "it does not exist")
        return value
    return check


def _auto_or_boolean(value: Any, done: Mapping[str, Any]) -> bool | str:
    if isinstance(value, bool):
        return value
    if value == "auto":
        return "auto"
    raise _Invalid("true, false or \"auto\"")


def _https_url(value: Any, done: Mapping[str, Any]) -> str:
    if value == "":
        return ""
    parts = urllib.parse.urlsplit(value) if isinstance(value, str) else None
    if parts is None or parts.scheme != "https" or not parts.hostname or parts.query or parts.fragment:
        raise _Invalid("an https:// URL without query or fragment, like 'https://127.0.0.1:9443', or an empty "
                       "string for one made of 'webhooks.bind'")
    return str(value)


def _dns_labels(value: Any, done: Mapping[str, Any]) -> tuple[str, ...]:
    expect = "a list of namespace names (DNS-1123 labels), or [] for all namespaces"
    if not isinstance(value, (list, tuple)):
        raise _Invalid(expect)
    label = _dns_name("label")
    for v in value:
        try:
            label(v, done)
        except _Invalid:
            raise _Invalid(expect, f"{v!r} is not a DNS-1123 label") from None
    return tuple(value)


def _field_selectors(value: Any, done: Mapping[str, Any]) -> dict[str, str]:
    expect = "a table of GVR = field selector ([field_selectors] \"pods.v1\" = \"spec.nodeName=node-a\")"
    if not isinstance(value, dict):
        raise _Invalid(expect)
    out = {}
    for key, text in value.items():
        try:
            gvr = GVR.parse(str(key))
            selector = FieldSelector.parse(text) if isinstance(text, str) else None
        except ValueError as e:
            raise _Invalid(expect, str(e)) from None
        if not selector:
            raise _Invalid(expect, f"{key} = {text!r} is not a field selector")
        out[str(gvr)] = str(selector)
    return out


def _plugin_tables(value: Any, done: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    expect = "a table of per-plugin tables ([plugin_settings.<plugin name>])"
    if not isinstance(value, dict):
        raise _Invalid(expect)
    for name, table in value.items():
        if not isinstance(table, dict):
            raise _Invalid(expect, f"plugin_settings.{name} is a {type(table).__name__}, not a table")
    # Plugin names are case-insensitive like setting names (environment variables arrive in upper case).
    return {str(name).lower(): dict(table) for name, table in value.items()}


def _unit_kind(value: Any, done: Mapping[str, Any]) -> str:
    kind = str(_choice(("auto", "clusters", "controllers"))(value, done))
    clusters = done.get("clusters.enabled")
    if clusters is None:
        return kind
    if kind == "clusters" and not clusters:
        raise _Invalid("\"auto\" or \"controllers\" while [clusters] is off", "clusters are units only in "
                       "multi-cluster mode: set [clusters] enabled = true")
    if kind == "controllers" and clusters:
        raise _Invalid("\"auto\" or \"clusters\" in multi-cluster mode", "in multi-cluster mode a cluster, with "
                       "all its controllers, is the unit")
    return kind


# Every setting, in checking order (a limit relative to another setting comes after that setting).
_CHECKS: dict[str, _Check] = {
    "kubeconfig": _kubeconfig,
    "context": _string,
    "in_cluster": _boolean,
    "plugins": _strings("plugin modules (dotted paths or .py files)"),
    "entry_point_plugins": _entry_point_plugins,
    "include": _resource_rules,
    "exclude": _resource_rules,
    "preferred_version_only": _boolean,
    "namespace": _dns_name("label", empty_means="all namespaces"),
    "rediscovery_interval": _duration(),
    "full_rediscovery_interval": _duration(at_least="rediscovery_interval"),
    "resync": _duration(zero_means="turns resync off"),
    "workers": _integer(1, MAX_WORKERS),
    "check_permissions": _boolean,
    "http_bind": _host_port,
    "log_level": _choice(LOG_LEVELS),
    "log_format": _choice(("text", "json")),
    "shutdown_timeout": _duration(),
    "start_timeout": _duration(),
    "uvloop": _boolean,
    "http2": _boolean,
    "debug_endpoints": _boolean,
    "watch": _choice(("all", "required")),
    "leader_election.enabled": _boolean,
    "leader_election.lease_name": _dns_name("subdomain"),
    "leader_election.lease_namespace": _dns_name("label"),
    "leader_election.lease_duration": _duration(),
    "leader_election.renew_deadline": _duration(below="leader_election.lease_duration"),
    "leader_election.retry_period": _duration(below="leader_election.renew_deadline"),
    "webhooks.bind": _host_port,
    "webhooks.cert_dir": _existing("directory"),
    "webhooks.hosts": _strings("DNS names or IP addresses"),
    "webhooks.client_ca_file": _existing("file"),
    "webhooks.manage_configurations": _auto_or_boolean,
    "webhooks.configuration_name": _dns_name("subdomain"),
    "webhooks.url": _https_url,
    "webhooks.probe_namespace": _dns_name("label"),
    "clusters.enabled": _boolean,
    "clusters.namespaces": _dns_labels,
    "clusters.label_selectors": _parsed_strings("label selectors, like 'kube-syncer.io/kubeconfig=true'",
                                                 LabelSelector.parse, SelectorError),
    "clusters.secret_types": _strings("Secret types"),
    "clusters.include_local": _boolean,
    "clusters.allowed_exec_commands": _strings("commands"),
    "clusters.sync_timeout": _duration(),
    "clusters.probe_interval": _duration(),
    "clusters.watch": _choice(("required", "all")),
    "sharding.enabled": _boolean,
    "sharding.units": _unit_kind,
    "sharding.group": _dns_name("label"),
    "sharding.lease_namespace": _dns_name("label"),
    "sharding.lease_duration": _duration(),
    "sharding.renew_deadline": _duration(below="sharding.lease_duration"),
    "sharding.retry_period": _duration(below="sharding.renew_deadline"),
    "sharding.min_hold": _duration(zero_means="hands units over as soon as the assignment says"),
    "field_selectors": _field_selectors,
    "plugin_settings": _plugin_tables,
}
_TABLES = ("leader_election", "webhooks", "clusters", "sharding")  # settings that are tables of settings (checked key by key above)


def env_var(name: str) -> str:
    """The environment variable that sets a (dotted) setting: ``leader_election.enabled`` ->
    ``SYNCER_LEADER_ELECTION__ENABLED``."""
    return f"{ENV_PREFIX}_{name.upper().replace('.', '__')}"


def origin_of(name: str, path: str | None) -> str | None:
    """Where setting ``name`` is given when read with the settings file ``path``: its environment variable, the
    file, or None (its default)."""
    if env_var(name) in os.environ:
        return f"environment variable {env_var(name)}"
    if path is not None and name in {_setting_name(k) for k in _flatten(_read_toml(path))}:
        return f"settings file {path!r}"
    return None


def _setting_name(key: str) -> str:
    """The setting (as in ``_CHECKS``) a dotted key of the file or the environment belongs to."""
    head, _, rest = key.lower().partition(".")
    return f"{head}.{rest.partition('.')[0]}" if head in _TABLES and rest else head


def load_settings(path: str | None = None, overrides: Mapping[str, Any] | None = None,
                  overrides_origin: str = "") -> Settings:
    """Read ``path`` (if given) and ``SYNCER_*`` variables, check every setting, and return typed Settings.

    ``overrides`` are command-line values (``--kubeconfig``, ``--context``); they win over the file and the
    environment, and a mistake in one names the option, or ``overrides_origin`` when they come from elsewhere
    (``syncer.testing.run_plugin``'s settings).
    """
    ignored = _service_links()
    origins = _Origins(path, {_setting_name(k[len(ENV_PREFIX) + 1:].replace("__", ".")): k
                              for k in os.environ
                              if k.startswith(ENV_PREFIX + "_") and k != SETTINGS_ENV and k not in ignored},
                       frozenset(overrides or ()), overrides_origin)
    values = {**_read(path, ignored), **(overrides or {})}
    _reject_unknown(values, origins)
    checked: dict[str, Any] = {}
    defaults = Settings()
    for name, check in _CHECKS.items():
        given = name in values
        value = values[name] if given else attrgetter(name)(defaults)
        try:
            checked[name] = check(value, checked)
        except _Invalid as e:
            got = repr(value) if given else f"its default {_seconds(value) if isinstance(value, float) else value!r}"
            detail = f" ({e.detail})" if e.detail else ""
            raise SettingsError(f"setting {name!r} must be {e.expect}, got {got}{detail}; {origins.fix(name)}") \
                from None
    return Settings(**{n: v for n, v in checked.items() if "." not in n},
                    leader_election=LeaderElection(**_table(checked, "leader_election")),
                    webhooks=Webhooks(**_table(checked, "webhooks")), clusters=Clusters(**_table(checked, "clusters")),
                    sharding=Sharding(**_table(checked, "sharding")), source=path or "")


def _table(checked: Mapping[str, Any], table: str) -> dict[str, Any]:
    """The checked settings of ``[table]``, by key."""
    return {n.partition(".")[2]: v for n, v in checked.items() if n.startswith(f"{table}.")}


def settings_reference() -> str:
    """Every setting as a Markdown table (name, default, what it must be, environment variable), made from the
    checks that ``load_settings`` runs, so documentation built from it cannot drift from what is enforced: a
    check's own message for a value of the wrong type is its description."""
    defaults = Settings()
    done: dict[str, Any] = {}
    rows = ["| setting | default | must be | environment variable |", "| --- | --- | --- | --- |"]
    for name, check in _CHECKS.items():
        default = attrgetter(name)(defaults)
        try:
            check(_NOT_A_VALUE, done)
        except _Invalid as e:
            expect = e.expect
        done[name] = check(default, done)
        shown = _seconds(default) if isinstance(default, float) else json.dumps(
            list(default) if isinstance(default, tuple) else default)
        rows.append(f"| `{name}` | `{shown}` | {expect} | `{env_var(name)}` |")
    return "\n".join(rows) + "\n"


class _NotAValue:
    """What no check accepts: asking a check about it yields the check's description."""


_NOT_A_VALUE = _NotAValue()


def _reject_unknown(values: Mapping[str, Any], origins: _Origins) -> None:
    for name in sorted(set(values) - set(_CHECKS)):
        if name in _TABLES:
            raise SettingsError(f"setting {name!r} must be a table [{name}] of settings, got {values[name]!r}; "
                                f"{origins.fix(name)}")
        table, _, key = name.rpartition(".")
        known = (sorted(n.partition(".")[2] for n in _CHECKS if n.startswith(f"{table}.")) if table else
                 sorted({n.partition(".")[0] for n in _CHECKS}))
        close = difflib.get_close_matches(key, known, n=1)
        raise SettingsError(f"unknown setting {name!r} in {origins.of(name)}"
                            f"{f' (did you mean {close[0]!r}?)' if close else ''}; known settings"
                            f"{f' in [{table}]' if table else ''} are {', '.join(known)}")


@dataclass(frozen=True)
class _Origins:
    """Where settings were given: the file, ``SYNCER_*`` variables (setting -> variable), command-line options
    (or the overrides' ``options_origin``)."""

    path: str | None
    env: dict[str, str]
    options: frozenset[str]
    options_origin: str = ""

    def of(self, name: str) -> str:
        """Where setting ``name`` was given."""
        if name in self.options:
            return self.options_origin or f"the --{name.replace('_', '-')} option"
        return f"environment variable {self.env[name]}" if name in self.env else f"settings file {self.path!r}"

    def fix(self, name: str) -> str:
        """Where to fix setting ``name``."""
        if name in self.options:
            return f"fix it in {self.options_origin}" if self.options_origin else \
                f"fix the --{name.replace('_', '-')} option"
        if name in self.env:
            return f"fix environment variable {self.env[name]} (it overrides the settings file)"
        return f"set it in the settings file or in {env_var(name)}"


def _service_links() -> frozenset[str]:
    """The ``SYNCER_*`` variables that Kubernetes set for a Service, not the user for a setting."""
    own = {env_var(name) for name in _CHECKS}
    # A "__" is a table's key (SYNCER_PLUGIN_SETTINGS__WIDGET__PORT), never a Service's name.
    found = frozenset(k for k in os.environ if k not in own and "__" not in k and _SERVICE_LINK.fullmatch(k))
    for name in sorted(found):
        logger.debug("ignoring environment variable {}: a Service's link variable, not a setting", name)
    return found


def _read(path: str | None, ignored: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The raw settings of the file with the environment's over them, by (dotted) setting name, without the
    ``ignored`` variables."""
    from dynaconf import Dynaconf  # only reading settings needs it (~5 MiB): not a Settings() made in code

    file_keys = {_setting_name(k) for k in _flatten(_read_toml(path))} if path is not None else set()
    try:
        raw = Dynaconf(envvar_prefix=ENV_PREFIX, settings_files=[path] if path else [], environments=False,
                       merge_enabled=False).as_dict()
    except Exception as e:  # dynaconf raises many types, e.g. for a bad '@cast' in an environment variable
        raise SettingsError(f"cannot read the settings: {type(e).__name__}: {e}") from None
    for name in ignored:  # dynaconf read them as top-level keys
        raw.pop(name[len(ENV_PREFIX) + 1:], None)
    values = {_setting_name(k): v for k, v in _flatten(raw).items()}
    if "settings" not in file_keys:
        values.pop("settings", None)  # dynaconf read SETTINGS_ENV as a setting too
    return values


def _read_toml(path: str) -> dict[str, Any]:
    p = Path(path)
    if not p.exists():
        raise SettingsError(f"settings file {path!r} does not exist")
    try:
        return tomllib.loads(p.read_text())
    except OSError as e:
        raise SettingsError(f"settings file {path!r} cannot be read: {e.strerror or e}") from None
    except ValueError as e:  # TOMLDecodeError, or UnicodeDecodeError for a binary file
        raise SettingsError(f"settings file {path!r} is not valid TOML: {e}") from None


def _flatten(doc: Mapping[str, Any]) -> dict[str, Any]:
    """Top-level keys, except that each key of a settings table (``[leader_election]``) becomes ``table.key``;
    a table given as something else stays one key, for its check to reject."""
    out: dict[str, Any] = {}
    for key, value in doc.items():
        if key.lower() in _TABLES and isinstance(value, Mapping):
            out.update((f"{key}.{k}", v) for k, v in value.items())
        else:
            out[key] = value
    return out
