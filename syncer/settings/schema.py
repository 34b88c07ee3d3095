"""The schema: every setting with its check, in checking order, and which settings are tables of settings. The
checks that belong to one setting are here; the reusable ones are in ``checks.py``.
"""

from __future__ import annotations

import importlib.util
import urllib.parse
from pathlib import Path
from typing import Any, Mapping

from informers.field_selector import FieldSelector
from informers.gvr import GVR
from informers.resource_filter import Rule
from informers.selector import LabelSelector, SelectorError

from .checks import (
    Check, Invalid, auto_or_boolean, boolean, choice, dns_labels, dns_name, duration, existing, host_port, integer,
    parsed_strings, string, string_list, strings,
)
from .providers import CLUSTER_PROVIDERS, PROVIDER_CHECKS, PROVIDER_TABLES
from .tables import LOG_LEVELS, MAX_BUCKETS, MAX_WORKERS

_resource_rules = parsed_strings("resource rules", Rule.parse, ValueError)


def _entry_point_plugins(value: Any, done: Mapping[str, Any]) -> bool | tuple[str, ...]:
    names = value if isinstance(value, bool) else string_list(value)
    if names is None:
        raise Invalid("true (all installed), false (none) or a list of entry point names")
    return names


def _kubeconfig(value: Any, done: Mapping[str, Any]) -> str:
    path = string(value, done)
    if path and not Path(path).expanduser().is_file():
        raise Invalid("the path of an existing kubeconfig file", "it does not exist")
    return path


def _https_url(value: Any, done: Mapping[str, Any]) -> str:
    if value == "":
        return ""
    parts = urllib.parse.urlsplit(value) if isinstance(value, str) else None
    if parts is None or parts.scheme != "https" or not parts.hostname or parts.query or parts.fragment:
        raise Invalid("an https:// URL without query or fragment, like 'https://127.0.0.1:9443', or an empty "
                      "string for one made of 'webhooks.bind'")
    return str(value)


def _tracing_enabled(value: Any, done: Mapping[str, Any]) -> bool:
    enabled = boolean(value, done)
    # find_spec imports the parent packages only (namespace packages, nothing of the SDK): not when tracing is off.
    if enabled and not all(map(_installed, _TRACING_MODULES)):
        raise Invalid("true or false", "true needs OpenTelemetry, which is not installed: "
                      "pip install 'kube-syncer[tracing]'")
    return enabled


_TRACING_MODULES = ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http")


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def _http_url(value: Any, done: Mapping[str, Any]) -> str:
    parts = urllib.parse.urlsplit(value) if isinstance(value, str) else None
    if value != "" and (parts is None or parts.scheme not in ("http", "https") or not parts.hostname
                        or parts.query or parts.fragment):
        raise Invalid("an http:// or https:// URL without query or fragment, like 'http://otel-collector:4318', or "
                      "an empty string for the OTEL_EXPORTER_OTLP_ENDPOINT environment variable's")
    return str(value)


def _ratio(value: Any, done: Mapping[str, Any]) -> float | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                              or not 0 <= value <= 1):
        raise Invalid("a number from 0 to 1 (0.1: one trace in ten), or unset for the OTEL_TRACES_SAMPLER "
                      "environment variable's sampler")
    return float(value) if value is not None else None


def _field_selectors(value: Any, done: Mapping[str, Any]) -> dict[str, str]:
    expect = "a table of GVR = field selector ([field_selectors] \"pods.v1\" = \"spec.nodeName=node-a\")"
    if not isinstance(value, dict):
        raise Invalid(expect)
    out = {}
    for key, text in value.items():
        try:
            gvr = GVR.parse(str(key))
            selector = FieldSelector.parse(text) if isinstance(text, str) else None
        except ValueError as e:
            raise Invalid(expect, str(e)) from None
        if not selector:
            raise Invalid(expect, f"{key} = {text!r} is not a field selector")
        out[str(gvr)] = str(selector)
    return out


def _log_libraries(value: Any, done: Mapping[str, Any]) -> dict[str, str]:
    expect = (f"a table of standard-library logger name = level ([log_libraries] hpack = \"DEBUG\"), each level "
              f"one of {', '.join(LOG_LEVELS)} (any case)")
    if not isinstance(value, dict):
        raise Invalid(expect)
    out = {}
    for name, level in value.items():
        known = next((v for v in LOG_LEVELS if isinstance(level, str) and level.strip().upper() == v), None)
        if not str(name).strip() or known is None:
            raise Invalid(expect, f"{name} = {level!r} is not a logger name and a level")
        out[str(name).strip()] = known
    return out


def _plugin_tables(value: Any, done: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    expect = "a table of per-plugin tables ([plugin_settings.<plugin name>])"
    if not isinstance(value, dict):
        raise Invalid(expect)
    for name, table in value.items():
        if not isinstance(table, dict):
            raise Invalid(expect, f"plugin_settings.{name} is a {type(table).__name__}, not a table")
    # Plugin names are case-insensitive like setting names (environment variables arrive in upper case).
    return {str(name).lower(): dict(table) for name, table in value.items()}


def _unit_kind(value: Any, done: Mapping[str, Any]) -> str:
    kind = str(choice(("auto", "clusters", "controllers"))(value, done))
    clusters = done.get("clusters.enabled")
    if clusters is None:
        return kind
    if kind == "clusters" and not clusters:
        raise Invalid("\"auto\" or \"controllers\" while [clusters] is off", "clusters are units only in "
                      "multi-cluster mode: set [clusters] enabled = true")
    if kind == "controllers" and clusters:
        raise Invalid("\"auto\" or \"clusters\" in multi-cluster mode", "in multi-cluster mode a cluster, with "
                      "all its controllers, is the unit")
    return kind


def _providers(value: Any, done: Mapping[str, Any]) -> tuple[str, ...]:
    expect = (f"a list of cluster providers, each at most once, in precedence order: {', '.join(CLUSTER_PROVIDERS)} "
              "(any case); [] only with include_local = true")
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise Invalid(expect)
    providers: list[str] = []
    for name in value:
        known = next((p for p in CLUSTER_PROVIDERS if p == name.strip().lower()), None)
        if known is None:
            raise Invalid(expect, f"{name!r} is not a cluster provider")
        if known in providers:
            raise Invalid(expect, f"{name!r} is listed twice")
        providers.append(known)
    if not providers and not done["clusters.include_local"]:
        raise Invalid(expect, "without a provider and with include_local = false no member could ever join: list a "
                      "provider, or set include_local = true")
    if "host-namespaces" in providers and done["namespace"] and done["clusters.enabled"]:
        raise Invalid(expect, f"\"host-namespaces\" makes members of the namespaces its label_selector selects, but "
                      f"namespace = {done['namespace']!r} keeps every informer in that one: unset namespace")
    return tuple(providers)


# Every setting, in checking order (a limit relative to another setting comes after that setting).
CHECKS: dict[str, Check] = {
    "kubeconfig": _kubeconfig,
    "context": string,
    "in_cluster": boolean,
    "plugins": strings("plugin modules (dotted paths or .py files)"),
    "entry_point_plugins": _entry_point_plugins,
    "include": _resource_rules,
    "exclude": _resource_rules,
    "preferred_version_only": boolean,
    "namespace": dns_name("label", empty_means="all namespaces"),
    "rediscovery_interval": duration(),
    "full_rediscovery_interval": duration(at_least="rediscovery_interval"),
    "resync": duration(zero_means="turns resync off"),
    "workers": integer(1, MAX_WORKERS),
    "priority_queue": boolean,
    "read_your_writes": duration(zero_means="turns read-your-writes off"),
    "check_permissions": boolean,
    "http_bind": host_port,
    "log_level": choice(LOG_LEVELS),
    "log_format": choice(("text", "json")),
    "log_libraries": _log_libraries,
    "shutdown_timeout": duration(),
    "start_timeout": duration(),
    "uvloop": boolean,
    "http2": boolean,
    "debug_endpoints": boolean,
    "watch": choice(("all", "required")),
    "warm_standby": boolean,
    "leader_election.enabled": boolean,
    "leader_election.lease_name": dns_name("subdomain"),
    "leader_election.lease_namespace": dns_name("label"),
    "leader_election.lease_duration": duration(),
    "leader_election.renew_deadline": duration(below="leader_election.lease_duration"),
    "leader_election.retry_period": duration(below="leader_election.renew_deadline"),
    "webhooks.bind": host_port,
    "webhooks.cert_dir": existing("directory"),
    "webhooks.hosts": strings("DNS names or IP addresses"),
    "webhooks.client_ca_file": existing("file"),
    "webhooks.manage_configurations": auto_or_boolean,
    "webhooks.configuration_name": dns_name("subdomain"),
    "webhooks.url": _https_url,
    "webhooks.probe_namespace": dns_name("label"),
    "clusters.enabled": boolean,
    "clusters.namespaces": dns_labels,
    "clusters.label_selectors": parsed_strings("label selectors, like 'kube-syncer.io/kubeconfig=true'",
                                                LabelSelector.parse, SelectorError),
    "clusters.secret_types": strings("Secret types"),
    "clusters.include_local": boolean,
    "clusters.providers": _providers,
    "clusters.allowed_exec_commands": strings("commands"),
    "clusters.sync_timeout": duration(),
    "clusters.probe_interval": duration(),
    "clusters.watch": choice(("required", "all")),
    **PROVIDER_CHECKS,
    "sharding.enabled": boolean,
    "sharding.units": _unit_kind,
    "sharding.group": dns_name("label"),
    "sharding.lease_namespace": dns_name("label"),
    "sharding.lease_duration": duration(),
    "sharding.renew_deadline": duration(below="sharding.lease_duration"),
    "sharding.retry_period": duration(below="sharding.renew_deadline"),
    "sharding.min_hold": duration(zero_means="hands units over as soon as the assignment says"),
    "sharding.buckets": integer(0, MAX_BUCKETS),
    "tracing.enabled": _tracing_enabled,
    "tracing.endpoint": _http_url,
    "tracing.service_name": string,
    "tracing.sampling_ratio": _ratio,
    "field_selectors": _field_selectors,
    "plugin_settings": _plugin_tables,
}
# The settings that are tables of settings (checked key by key above), a table's own tables after it.
TABLES = ("leader_election", "webhooks", "clusters", *PROVIDER_TABLES, "sharding", "tracing")
