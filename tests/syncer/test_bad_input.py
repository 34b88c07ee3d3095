"""Bad input to the `syncer` CLI: one `error:` line naming the culprit and the fix, exit code 2, and never a
traceback. Everything `run` rejects, `check-config` rejects first with the same line.

The CLI runs as users run it, `python -m syncer` in a subprocess. Most tests use a kubeconfig pointing at a
closed port (127.0.0.1:1): a command that got past validation would start connecting and retry until the
subprocess time-out, so an exit within it proves the mistake was caught before anything connected.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field, fields
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Iterator

import pytest

from controllers.providers.cluster_api import ClusterAPIOptions
from controllers.providers.cluster_profile import ClusterProfileOptions
from controllers.providers.kubeconfig_files import KubeconfigFilesOptions
from controllers.providers.namespaces import HostNamespacesOptions
from syncer.settings import Clusters, LeaderElection, Settings, SettingsError, Sharding, Tracing, Webhooks, load_settings
from syncer.settings.providers import PROVIDER_CHECKS, PROVIDER_TABLES
from syncer.testing import ControlPlane
from tests.helpers import free_port

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT = 20


def clean_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The test process's environment without anything that configures the syncer, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SYNCER_") and k != "KUBECONFIG"}
    return {**env, **(extra or {})}


def syncer(*args: str, env: dict[str, str] | None = None, stdout: int = subprocess.PIPE) -> subprocess.Popen[str]:
    """Start `python -m syncer ARGS` in the repository, with a clean environment plus ``env``."""
    return subprocess.Popen([sys.executable, "-m", "syncer", *args], cwd=ROOT, env=clean_env(env), text=True,
                            stdout=stdout, stderr=subprocess.PIPE)


def finish(proc: subprocess.Popen[str]) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate(timeout=TIMEOUT)
        raise AssertionError(f"{proc.args} did not exit within {TIMEOUT}s (it got past validation?):\n{err}")
    return proc.returncode, out, err


@pytest.fixture
def closed_kubeconfig(tmp_path: Path) -> Path:
    """A kubeconfig (context ``admin``) for an API server on a port nothing listens on."""
    path = tmp_path / "closed.kubeconfig"
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "admin",
        "clusters": [{"name": "closed", "cluster": {"server": "https://127.0.0.1:1"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "admin", "context": {"cluster": "closed", "user": "u"}}],
    }))
    return path


@dataclass(frozen=True)
class Case:
    """Settings text (the closed kubeconfig is added unless it sets ``kubeconfig``), optionally a plugin file
    (``@PLUGIN@`` in the text is its path), environment and options, and the exact error line. ``@KUBECONFIG@``
    and ``@SETTINGS@`` in the expected line stand for the kubeconfig and the settings file."""

    settings: str
    expected: str
    plugin: str = ""
    env: dict[str, str] = field(default_factory=dict)
    options: tuple[str, ...] = ()


_DURATION = "like '15s', '500ms' or '2m'"
_LABEL = ("a DNS-1123 label (at most 63 characters: lowercase letters, digits and '-', starting and ending with a "
          "letter or digit)")
_GVR_PLUGIN = ("from controllers import ManagedController\n"
               "def syncer_controllers(settings):\n"
               "    return {'mirror': ManagedController(['configmaps.v1'], lambda ctx: None)}\n")

CASES: dict[str, Case] = {
    # the values of the issue
    "include-rule": Case(
        'include = ["configmaps"]',
        "setting 'include' must be a list of resource rules, got ['configmaps'] (invalid resource rule "
        "'configmaps': use group/version/resource or group/resource (globs allowed, 'core' for the core group), "
        "e.g. 'apps/deployments' or '*.k8s.io/*'); set it in the settings file or in SYNCER_INCLUDE"),
    "plugin-settings-entry": Case(
        'plugin_settings = {configmap_mirror = "x"}',
        "setting 'plugin_settings' must be a table of per-plugin tables ([plugin_settings.<plugin name>]), got "
        "{'configmap_mirror': 'x'} (plugin_settings.configmap_mirror is a str, not a table); set it in the "
        "settings file or in SYNCER_PLUGIN_SETTINGS"),
    "http-bind-port": Case(
        'http_bind = "127.0.0.1:99999"',
        "setting 'http_bind' must be host:port with a port from 1 to 65535, like '127.0.0.1:8080' or "
        "'0.0.0.0:8080', got '127.0.0.1:99999'; set it in the settings file or in SYNCER_HTTP_BIND"),
    "tracing-endpoint": Case(
        '[tracing]\nendpoint = "otel-collector:4318"',
        "setting 'tracing.endpoint' must be an http:// or https:// URL without query or fragment, like "
        "'http://otel-collector:4318', or an empty string for the OTEL_EXPORTER_OTLP_ENDPOINT environment "
        "variable's, got 'otel-collector:4318'; set it in the settings file or in SYNCER_TRACING__ENDPOINT"),
    "tracing-sampling-ratio": Case(
        "[tracing]\nsampling_ratio = 10",
        "setting 'tracing.sampling_ratio' must be a number from 0 to 1 (0.1: one trace in ten), or unset for the "
        "OTEL_TRACES_SAMPLER environment variable's sampler, got 10; set it in the settings file or in "
        "SYNCER_TRACING__SAMPLING_RATIO"),
    "retry-period-zero": Case(
        '[leader_election]\nretry_period = "0s"',
        "setting 'leader_election.retry_period' must be a duration > 0 and < renew_deadline (10s), got '0s'; "
        "set it in the settings file or in SYNCER_LEADER_ELECTION__RETRY_PERIOD"),
    "shutdown-timeout-zero": Case(
        "shutdown_timeout = 0",
        "setting 'shutdown_timeout' must be a duration > 0, got 0; set it in the settings file or in "
        "SYNCER_SHUTDOWN_TIMEOUT"),
    "workers-bool": Case(
        "workers = true",
        "setting 'workers' must be an integer from 1 to 1000, got True; set it in the settings file or in "
        "SYNCER_WORKERS"),
    "workers-huge": Case(
        "workers = 100000",
        "setting 'workers' must be an integer from 1 to 1000, got 100000; set it in the settings file or in "
        "SYNCER_WORKERS"),
    "lease-name": Case(
        '[leader_election]\nlease_name = "Bad Name!"',
        "setting 'leader_election.lease_name' must be a DNS-1123 subdomain (at most 253 characters: lowercase "
        "letters, digits and '-', and dots, starting and ending with a letter or digit), got 'Bad Name!'; set it "
        "in the settings file or in SYNCER_LEADER_ELECTION__LEASE_NAME"),
    "namespace": Case(
        'namespace = "Bad_NS"',
        f"setting 'namespace' must be {_LABEL}, or an empty string for all namespaces, got 'Bad_NS'; set it in "
        "the settings file or in SYNCER_NAMESPACE"),
    "string-gvr": Case(
        'plugins = ["@PLUGIN@"]',
        "plugin '@PLUGIN@': controller 'mirror': required GVR 'configmaps.v1' is a str, not a GVR; use "
        "GVR.parse('configmaps.v1') (from informers import GVR)", plugin=_GVR_PLUGIN),
    "settings-env-points-nowhere": Case(
        "", "settings file 'missing.toml' does not exist", env={"SYNCER_SETTINGS": "missing.toml"}),
    # every other setting: type and range
    "kubeconfig-missing": Case(
        'kubeconfig = "/missing/kubeconfig"',
        "setting 'kubeconfig' must be the path of an existing kubeconfig file, got '/missing/kubeconfig' (it does "
        "not exist); set it in the settings file or in SYNCER_KUBECONFIG"),
    "kubeconfig-type": Case(
        "kubeconfig = 1",
        "setting 'kubeconfig' must be a string, got 1; set it in the settings file or in SYNCER_KUBECONFIG"),
    "context-type": Case(
        "context = 5", "setting 'context' must be a string, got 5; set it in the settings file or in SYNCER_CONTEXT"),
    "in-cluster-type": Case(
        'in_cluster = "yes"',
        "setting 'in_cluster' must be true or false, got 'yes'; set it in the settings file or in "
        "SYNCER_IN_CLUSTER"),
    "plugins-type": Case(
        'plugins = "examples.plugins.widget_status"',
        "setting 'plugins' must be a list of plugin modules (dotted paths or .py files), got "
        "'examples.plugins.widget_status'; set it in the settings file or in SYNCER_PLUGINS"),
    "entry-point-plugins-type": Case(
        'entry_point_plugins = "yes"',
        "setting 'entry_point_plugins' must be true (all installed), false (none) or a list of entry point names, "
        "got 'yes'; set it in the settings file or in SYNCER_ENTRY_POINT_PLUGINS"),
    "exclude-type": Case(
        "exclude = [1]",
        "setting 'exclude' must be a list of resource rules, got [1]; set it in the settings file or in "
        "SYNCER_EXCLUDE"),
    "preferred-version-only-type": Case(
        "preferred_version_only = 1",
        "setting 'preferred_version_only' must be true or false, got 1; set it in the settings file or in "
        "SYNCER_PREFERRED_VERSION_ONLY"),
    "rediscovery-zero": Case(
        'rediscovery_interval = "0s"',
        "setting 'rediscovery_interval' must be a duration > 0, got '0s'; set it in the settings file or in "
        "SYNCER_REDISCOVERY_INTERVAL"),
    "resync-negative": Case(
        'resync = "-1s"',
        f"setting 'resync' must be a duration >= 0 (0 turns resync off), {_DURATION}, got '-1s'; set it in the "
        "settings file or in SYNCER_RESYNC"),
    "workers-string": Case(
        'workers = "many"',
        "setting 'workers' must be an integer from 1 to 1000, got 'many'; set it in the settings file or in "
        "SYNCER_WORKERS"),
    "check-permissions-type": Case(
        'check_permissions = "true"',
        "setting 'check_permissions' must be true or false, got 'true'; set it in the settings file or in "
        "SYNCER_CHECK_PERMISSIONS"),
    "http-bind-type": Case(
        "http_bind = 8080",
        "setting 'http_bind' must be host:port with a port from 1 to 65535, like '127.0.0.1:8080' or "
        "'0.0.0.0:8080', got 8080; set it in the settings file or in SYNCER_HTTP_BIND"),
    "log-level": Case(
        'log_level = "loud"',
        "setting 'log_level' must be one of TRACE, DEBUG, INFO, SUCCESS, WARNING, ERROR, CRITICAL (any case), got "
        "'loud'; set it in the settings file or in SYNCER_LOG_LEVEL"),
    "log-format": Case(
        'log_format = "xml"',
        "setting 'log_format' must be one of text, json (any case), got 'xml'; set it in the settings file or in "
        "SYNCER_LOG_FORMAT"),
    "shutdown-timeout-inf": Case(
        "shutdown_timeout = inf",
        f"setting 'shutdown_timeout' must be a duration > 0, {_DURATION}, got inf; set it in the settings file "
        "or in SYNCER_SHUTDOWN_TIMEOUT"),
    "start-timeout": Case(
        'start_timeout = "soon"',
        f"setting 'start_timeout' must be a duration > 0, {_DURATION}, got 'soon'; set it in the settings file "
        "or in SYNCER_START_TIMEOUT"),
    "leader-election-type": Case(
        "leader_election = true",
        "setting 'leader_election' must be a table [leader_election] of settings, got True; set it in the "
        "settings file or in SYNCER_LEADER_ELECTION"),
    "leader-enabled-type": Case(
        '[leader_election]\nenabled = "on"',
        "setting 'leader_election.enabled' must be true or false, got 'on'; set it in the settings file or in "
        "SYNCER_LEADER_ELECTION__ENABLED"),
    "lease-namespace": Case(
        '[leader_election]\nlease_namespace = "Kube System"',
        f"setting 'leader_election.lease_namespace' must be {_LABEL}, got 'Kube System'; set it in the settings "
        "file or in SYNCER_LEADER_ELECTION__LEASE_NAMESPACE"),
    "lease-duration-zero": Case(
        '[leader_election]\nlease_duration = "0s"',
        "setting 'leader_election.lease_duration' must be a duration > 0, got '0s'; set it in the settings file "
        "or in SYNCER_LEADER_ELECTION__LEASE_DURATION"),
    "renew-deadline-range": Case(
        '[leader_election]\nrenew_deadline = "20s"',
        "setting 'leader_election.renew_deadline' must be a duration > 0 and < lease_duration (15s), got '20s'; "
        "set it in the settings file or in SYNCER_LEADER_ELECTION__RENEW_DEADLINE"),
    "renew-deadline-default-too-long": Case(
        '[leader_election]\nlease_duration = "5s"',
        "setting 'leader_election.renew_deadline' must be a duration > 0 and < lease_duration (5s), got its "
        "default '10s'; set it in the settings file or in SYNCER_LEADER_ELECTION__RENEW_DEADLINE"),
    "plugin-settings-type": Case(
        'plugin_settings = "x"',
        "setting 'plugin_settings' must be a table of per-plugin tables ([plugin_settings.<plugin name>]), got "
        "'x'; set it in the settings file or in SYNCER_PLUGIN_SETTINGS"),
    # multi-cluster mode ([clusters]) and what gets informers (watch)
    "clusters-namespace": Case(
        '[clusters]\nnamespaces = ["Bad_NS"]',
        "setting 'clusters.namespaces' must be a list of namespace names (DNS-1123 labels), or [] for all "
        "namespaces, got ['Bad_NS'] ('Bad_NS' is not a DNS-1123 label); set it in the settings file or in "
        "SYNCER_CLUSTERS__NAMESPACES"),
    "clusters-label-selector": Case(
        '[clusters]\nlabel_selectors = ["env in (prod"]',
        "setting 'clusters.label_selectors' must be a list of label selectors, like "
        "'kube-syncer.io/kubeconfig=true', got ['env in (prod'] (invalid label selector 'env in (prod': expected "
        "',' or ')' in a value set, got 'end of input'); set it in the settings file or in "
        "SYNCER_CLUSTERS__LABEL_SELECTORS"),
    "clusters-secret-types-not-a-list": Case(
        '[clusters]\nsecret_types = "solo.io/kubeconfig"',
        "setting 'clusters.secret_types' must be a list of Secret types, got 'solo.io/kubeconfig'; set it in the "
        "settings file or in SYNCER_CLUSTERS__SECRET_TYPES"),
    "clusters-watch": Case(
        '[clusters]\nwatch = "some"',
        "setting 'clusters.watch' must be one of required, all (any case), got 'some'; set it in the settings "
        "file or in SYNCER_CLUSTERS__WATCH"),
    "clusters-watch-env": Case(
        "", "setting 'clusters.watch' must be one of required, all (any case), got 'everything'; fix environment "
        "variable SYNCER_CLUSTERS__WATCH (it overrides the settings file)",
        env={"SYNCER_CLUSTERS__WATCH": "everything"}),
    "watch": Case(
        'watch = "everything"',
        "setting 'watch' must be one of all, required (any case), got 'everything'; set it in the settings file or "
        "in SYNCER_WATCH"),
    "clusters-provider-unknown": Case(
        '[clusters]\nproviders = ["secrets", "capi"]',
        "setting 'clusters.providers' must be a list of cluster providers, each at most once, in precedence order: "
        "secrets, cluster-api, kubeconfig-files, cluster-profile, host-namespaces (any case); [] only with "
        "include_local = true, got ['secrets', 'capi'] ('capi' is not a cluster provider); set it in the settings file or in SYNCER_CLUSTERS__PROVIDERS"),
    "clusters-kubeconfig-file-missing": Case(
        '[clusters]\nproviders = ["kubeconfig-files"]\n[clusters.kubeconfig_files]\npaths = ["/nowhere/fleet.yaml"]',
        "setting 'clusters.kubeconfig_files.paths' must be a list of paths of existing kubeconfig files ('~' "
        "expanded), not empty while \"kubeconfig-files\" is in clusters.providers, got ['/nowhere/fleet.yaml'] "
        "('/nowhere/fleet.yaml' does not exist); set it in the settings file or in "
        "SYNCER_CLUSTERS__KUBECONFIG_FILES__PATHS"),
    "clusters-type": Case(
        "clusters = true",
        "setting 'clusters' must be a table [clusters] of settings, got True; set it in the settings file or in "
        "SYNCER_CLUSTERS"),
    "clusters-unknown": Case(
        "[clusters]\nenable = true",
        "unknown setting 'clusters.enable' in settings file '@SETTINGS@' (did you mean 'enabled'?); known settings "
        "in [clusters] are allowed_exec_commands, cluster_api, cluster_profile, enabled, host_namespaces, "
        "include_local, kubeconfig_files, label_selectors, namespaces, probe_interval, providers, secret_types, "
        "sync_timeout, watch"),
    # the file itself, unknown names, environment variables, options
    "broken-toml": Case(
        "workers = [\n", "settings file '@SETTINGS@' is not valid TOML: Invalid value (at end of document)"),
    "sharding-renew-deadline": Case(
        '[sharding]\nenabled = true\nlease_duration = "8s"\nrenew_deadline = "8s"',
        "setting 'sharding.renew_deadline' must be a duration > 0 and < lease_duration (8s), got '8s'; set it in "
        "the settings file or in SYNCER_SHARDING__RENEW_DEADLINE"),
    "sharding-cluster-units": Case(
        '[sharding]\nenabled = true\nunits = "clusters"',
        "setting 'sharding.units' must be \"auto\" or \"controllers\" while [clusters] is off, got 'clusters' "
        "(clusters are units only in multi-cluster mode: set [clusters] enabled = true); set it in the settings "
        "file or in SYNCER_SHARDING__UNITS"),
    "sharding-fleet-controllers": Case(
        'plugins = ["examples.plugins.fleet_report"]\n[clusters]\nenabled = true\n[sharding]\nenabled = true',
        "fleet controller(s) fleet-widgets need every member cluster in one process: they cannot run with "
        "[sharding] enabled (turn it off, or remove their plugin)"),
    "unknown": Case(
        "wokers = 2",
        "unknown setting 'wokers' in settings file '@SETTINGS@' (did you mean 'workers'?); known settings are "
        "check_permissions, clusters, context, debug_endpoints, entry_point_plugins, exclude, field_selectors, "
        "full_rediscovery_interval, http2, http_bind, in_cluster, include, kubeconfig, leader_election, log_format, "
        "log_level, log_libraries, namespace, "
        "plugin_settings, plugins, preferred_version_only, priority_queue, read_your_writes, rediscovery_interval, resync, sharding, "
        "shutdown_timeout, "
        "start_timeout, tracing, uvloop, warm_standby, watch, webhooks, workers"),
    "unknown-nested": Case(
        "[leader_election]\nenable = true",
        "unknown setting 'leader_election.enable' in settings file '@SETTINGS@' (did you mean 'enabled'?); "
        "known settings in [leader_election] are enabled, lease_duration, lease_name, lease_namespace, "
        "renew_deadline, retry_period"),
    "env-range": Case(
        "", "setting 'workers' must be an integer from 1 to 1000, got 0; fix environment variable SYNCER_WORKERS "
        "(it overrides the settings file)", env={"SYNCER_WORKERS": "0"}),
    "env-unknown": Case(
        "", "unknown setting 'leader_election.foo' in environment variable SYNCER_LEADER_ELECTION__FOO; known "
        "settings in [leader_election] are enabled, lease_duration, lease_name, lease_namespace, renew_deadline, "
        "retry_period", env={"SYNCER_LEADER_ELECTION__FOO": "1"}),
    "option-kubeconfig-missing": Case(
        "", "setting 'kubeconfig' must be the path of an existing kubeconfig file, got '/missing/path' (it does not "
        "exist); fix the --kubeconfig option", options=("--kubeconfig", "/missing/path")),
    "option-context-unknown": Case(
        "", "kubeconfig @KUBECONFIG@ has no context 'nope' (it has: admin); fix the 'context' setting or "
        "--context", options=("--context", "nope")),
    "kubeconfig-env-missing": Case(
        'in_cluster = false\nkubeconfig = ""',
        "kubeconfig /nowhere/config ($KUBECONFIG) does not exist; set the 'kubeconfig' setting or --kubeconfig, or "
        "in_cluster = true inside a pod", env={"KUBECONFIG": "/nowhere/config"}),
    "kubeconfig-garbage": Case(
        'kubeconfig = "@SETTINGS@"\nworkers = 3',
        "kubeconfig @SETTINGS@: not a valid kubeconfig ('str' object does not support item assignment); check "
        "the 'kubeconfig' / 'context' / 'in_cluster' settings"),
    # plugins
    "plugin-syntax-error": Case(
        'plugins = ["@PLUGIN@"]', "plugin '@PLUGIN@' has a syntax error at @PLUGIN@:2: '{' was never closed",
        plugin="def syncer_controllers(s):\n    return {\n"),
    "plugin-missing-hook": Case(
        'plugins = ["@PLUGIN@"]', "plugin '@PLUGIN@' has no function syncer_controllers(settings) returning its "
        "controllers", plugin="X = 1\n"),
    "plugin-raises-on-import": Case(
        'plugins = ["@PLUGIN@"]', "plugin '@PLUGIN@' raised on import: RuntimeError: boom at import (@PLUGIN@:1)",
        plugin="raise RuntimeError('boom at import')\n"),
    "plugin-hook-raises": Case(
        'plugins = ["@PLUGIN@"]', "plugin '@PLUGIN@': syncer_controllers() raised KeyError: 'suffix' (@PLUGIN@:2)",
        plugin="def syncer_controllers(settings):\n    return {settings['suffix']: None}\n"),
    "plugin-wrong-return": Case(
        'plugins = ["@PLUGIN@"]', "plugin '@PLUGIN@': syncer_controllers() returned list, expected a dict of name -> "
        "ManagedController", plugin="def syncer_controllers(s):\n    return [1]\n"),
    "plugin-unknown-module": Case(
        'plugins = ["no.such.plugin"]',
        "plugin 'no.such.plugin' not found: no module named 'no' (is it on PYTHONPATH or installed?)"),
    "entry-point-not-installed": Case(
        'entry_point_plugins = ["nothere"]',
        "setting 'entry_point_plugins' names 'nothere', which no installed package advertises in entry point "
        "group 'syncer.controllers' (installed: none); fix the setting"),
}


def _write_case(case: Case, tmp_path: Path, kubeconfig: Path) -> tuple[Path, str]:
    """Write the case's files; return the settings file and the expected line with the paths filled in."""
    settings, plugin = tmp_path / "settings.toml", tmp_path / "plug.py"
    text = case.settings.replace("@PLUGIN@", str(plugin)).replace("@SETTINGS@", str(settings))
    if not text.lstrip().startswith(("kubeconfig", "in_cluster")):
        text = f'kubeconfig = "{kubeconfig}"\n{text}'
    settings.write_text(text + "\n")
    if case.plugin:
        plugin.write_text(case.plugin)
    expected = (case.expected.replace("@PLUGIN@", str(plugin)).replace("@SETTINGS@", str(settings))
                .replace("@KUBECONFIG@", str(kubeconfig)))
    return settings, f"error: {expected}"


@pytest.mark.parametrize("name", CASES)
def test_bad_input_exits_2_with_one_clear_line(name: str, tmp_path: Path, closed_kubeconfig: Path) -> None:
    case = CASES[name]
    settings, expected = _write_case(case, tmp_path, closed_kubeconfig)
    where = () if "SYNCER_SETTINGS" in case.env else ("--settings", str(settings))
    procs = {command: syncer(command, *where, *case.options, env=case.env) for command in ("check-config", "run")}
    for command, proc in procs.items():
        code, out, err = finish(proc)
        assert (code, err.splitlines()) == (2, [expected]), (command, out)


def test_every_setting_is_type_checked_and_documented(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A wrong type for any setting (here: a table) is rejected naming the setting; each one is documented."""
    for name in [k for k in os.environ if k.startswith("SYNCER_")]:
        monkeypatch.delenv(name)
    tables = {"leader_election": LeaderElection, "webhooks": Webhooks, "clusters": Clusters,
              "clusters.cluster_api": ClusterAPIOptions, "clusters.kubeconfig_files": KubeconfigFilesOptions,
              "clusters.cluster_profile": ClusterProfileOptions, "clusters.host_namespaces": HostNamespacesOptions,
              "sharding": Sharding, "tracing": Tracing}
    assert set(tables) == {"leader_election", "webhooks", "clusters", *PROVIDER_TABLES, "sharding", "tracing"}
    names = [f.name for f in fields(Settings) if f.name not in ("source", *tables)]
    # A provider's options may hold more than its settings (a discovery interval): its kind's checks say which.
    names += [f"{t}.{f.name}" for t, cls in tables.items() for f in fields(cls)
              if f"{t}.{f.name}" not in tables and (t not in PROVIDER_TABLES or f"{t}.{f.name}" in PROVIDER_CHECKS)]
    for name in names:
        table, _, key = name.rpartition(".")
        (tmp_path / "s.toml").write_text(f"[{table}]\n" * bool(table) + f"{key} = {{bogus = 1}}\n")
        with pytest.raises(SettingsError, match=rf"^setting '{name}' must be .*, got \{{"):
            load_settings(str(tmp_path / "s.toml"))
        assert f"``{key}``" in ((tables[table] if table else Settings).__doc__ or ""), name


_PROVIDERS = ("a list of cluster providers, each at most once, in precedence order: secrets, cluster-api, "
              "kubeconfig-files, cluster-profile, host-namespaces (any case); [] only with include_local = true")
_PROVIDER_FILE = ("the path of a JSON access-provider file ({\"providers\": [{\"name\": ..., \"execConfig\": {...}}]}), "
                  "required while \"cluster-profile\" is in clusters.providers")
_PATHS = ("a list of paths of existing kubeconfig files ('~' expanded), not empty while \"kubeconfig-files\" is in "
          "clusters.providers")
PROVIDER_CASES = {
    "duplicate": ('[clusters]\nproviders = ["secrets", "Secrets"]',
                  f"setting 'clusters.providers' must be {_PROVIDERS}, got ['secrets', 'Secrets'] ('Secrets' is listed "
                  "twice)"),
    "none-without-local": ('[clusters]\nproviders = []',
                           f"setting 'clusters.providers' must be {_PROVIDERS}, got [] (without a provider and with "
                           "include_local = false no member could ever join: list a provider, or set include_local = "
                           "true)"),
    "not-a-list": ('[clusters]\nproviders = "secrets"',
                   f"setting 'clusters.providers' must be {_PROVIDERS}, got 'secrets'"),
    "files-without-paths": ('[clusters]\nproviders = ["secrets", "kubeconfig-files"]',
                            f"setting 'clusters.kubeconfig_files.paths' must be {_PATHS}, got its default [] "
                            "(clusters.providers lists \"kubeconfig-files\": name at least one file)"),
    "path-a-directory": ('[clusters.kubeconfig_files]\npaths = ["@DIR@"]',
                         f"setting 'clusters.kubeconfig_files.paths' must be {_PATHS}, got ['@DIR@'] ('@DIR@' is not "
                         "a file)"),
    "contexts-empty-name": ('[clusters.kubeconfig_files]\ncontexts = [""]',
                            "setting 'clusters.kubeconfig_files.contexts' must be a list of context names, or [] for "
                            "every context, got ['']"),
    "reload-interval-zero": ('[clusters.kubeconfig_files]\nreload_interval = "0s"',
                             "setting 'clusters.kubeconfig_files.reload_interval' must be a duration > 0, got '0s'"),
    "cluster-api-namespace": ('[clusters.cluster_api]\nnamespaces = ["Bad_NS"]',
                              "setting 'clusters.cluster_api.namespaces' must be a list of namespace names (DNS-1123 "
                              "labels), or [] for all namespaces, got ['Bad_NS'] ('Bad_NS' is not a DNS-1123 label)"),
    "cluster-api-selector": ('[clusters.cluster_api]\nlabel_selector = "env in (prod"',
                             "setting 'clusters.cluster_api.label_selector' must be a label selector, like "
                             "'env=prod,tier!=test', or an empty string for every object, got 'env in (prod' (invalid "
                             "label selector 'env in (prod': expected ',' or ')' in a value set, got 'end of input')"),
    "cluster-api-ready-only": ('[clusters.cluster_api]\nready_only = "yes"',
                               "setting 'clusters.cluster_api.ready_only' must be true or false, got 'yes'"),
    "cluster-api-unknown-key": ('[clusters.cluster_api]\nnamespace = ["a"]',
                                "unknown setting 'clusters.cluster_api.namespace' in settings file '@SETTINGS@' (did "
                                "you mean 'namespaces'?); known settings in [clusters.cluster_api] are label_selector, "
                                "namespaces, ready_only"),
    "cluster-api-not-a-table": ('[clusters]\ncluster_api = 3',
                                "setting 'clusters.cluster_api' must be a table [clusters.cluster_api] of settings, "
                                "got 3"),
    "profile-without-file": ('[clusters]\nproviders = ["cluster-profile"]',
                             f"setting 'clusters.cluster_profile.provider_file' must be {_PROVIDER_FILE}, got its "
                             "default '' (clusters.providers lists \"cluster-profile\": name the file)"),
    "profile-file-missing": ('[clusters.cluster_profile]\nprovider_file = "/nowhere/providers.json"',
                             f"setting 'clusters.cluster_profile.provider_file' must be {_PROVIDER_FILE}, got "
                             "'/nowhere/providers.json' ('/nowhere/providers.json' does not exist)"),
    "profile-file-no-command": ('[clusters.cluster_profile]\nprovider_file = "@DIR@/providers.json"',
                                f"setting 'clusters.cluster_profile.provider_file' must be {_PROVIDER_FILE}, got "
                                "'@DIR@/providers.json' (@DIR@/providers.json: providers[0].execConfig: has no "
                                "command)"),
    "profile-namespace": ('[clusters.cluster_profile]\nnamespaces = ["Bad_NS"]',
                          "setting 'clusters.cluster_profile.namespaces' must be a list of namespace names (DNS-1123 "
                          "labels), or [] for all namespaces, got ['Bad_NS'] ('Bad_NS' is not a DNS-1123 label)"),
    "host-namespaces-in-one-namespace": (
        'namespace = "team-a"\n[clusters]\nenabled = true\nproviders = ["host-namespaces"]',
        "setting 'clusters.providers' must be a list of cluster providers, each at most once, in precedence order: "
        "secrets, cluster-api, kubeconfig-files, cluster-profile, host-namespaces (any case); [] only with "
        "include_local = true, got ['host-namespaces'] (\"host-namespaces\" makes members of the namespaces its "
        "label_selector selects, but namespace = 'team-a' keeps every informer in that one: unset namespace)"),
    "host-namespaces-selector": ('[clusters.host_namespaces]\nlabel_selector = "tenant in ("',
                                 "setting 'clusters.host_namespaces.label_selector' must be a label selector, like "
                                 "'env=prod,tier!=test', or an empty string for every object, got 'tenant in (' "
                                 "(invalid label selector 'tenant in (': expected ',' or ')' in a value set, got 'end of "
                                 "input')"),
}


@pytest.mark.parametrize("name", PROVIDER_CASES)
def test_cluster_provider_settings_are_checked(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each mistake in the cluster providers' settings names the setting and the culprit."""
    for variable in [k for k in os.environ if k.startswith("SYNCER_")]:
        monkeypatch.delenv(variable)
    text, expected = (t.replace("@DIR@", str(tmp_path)).replace("@SETTINGS@", str(tmp_path / "s.toml"))
                      for t in PROVIDER_CASES[name])
    (tmp_path / "s.toml").write_text(text + "\n")
    (tmp_path / "providers.json").write_text('{"providers": [{"name": "a", "execConfig": {}}]}')
    with pytest.raises(SettingsError) as raised:
        load_settings(str(tmp_path / "s.toml"))
    assert str(raised.value).partition("; set it in")[0] == expected


def test_local_alone_may_provide_the_members(tmp_path: Path) -> None:
    """With include_local, an empty provider list is the management cluster alone."""
    (tmp_path / "s.toml").write_text("[clusters]\nenabled = true\ninclude_local = true\nproviders = []\n")
    clusters = load_settings(str(tmp_path / "s.toml")).clusters
    assert clusters.providers == () and clusters.include_local


def test_clusters_option_needs_local_and_a_count(tmp_path: Path, closed_kubeconfig: Path) -> None:
    """`run --clusters N` is checked before anything starts: no control plane (there are no binaries here)."""
    (tmp_path / "s.toml").write_text(f'kubeconfig = "{closed_kubeconfig}"\n')
    runs = {
        ("--clusters", "2"): "error: --clusters starts local workload control planes: it needs --local (against "
                             "real clusters, set [clusters] enabled = true and create the kubeconfig Secrets)",
        ("--local", "--clusters", "two"): "error: --clusters must be a whole number of workload clusters (0 or "
                                          "more), got 'two'",
        ("--local", "--clusters=-1"): "error: --clusters must be a whole number of workload clusters (0 or more), "
                                      "got '-1'",
    }
    procs = {args: syncer("run", "--settings", str(tmp_path / "s.toml"), *args,
                          env={"KUBE_SYNCER_ASSETS": "/nowhere"}) for args in runs}
    for args, proc in procs.items():
        code, _, err = finish(proc)
        assert (code, err.splitlines()) == (2, [runs[args]]), (args, err)


def test_settings_env_var_names_the_file_and_env_overrides_work(closed_kubeconfig: Path) -> None:
    env = {"SYNCER_SETTINGS": "examples/settings.toml", "KUBECONFIG": str(closed_kubeconfig),
           "SYNCER_LEADER_ELECTION__ENABLED": "true", "SYNCER_LOG_LEVEL": "debug"}
    code, out, err = finish(syncer("check-config", env=env))
    assert code == 0, err
    effective = json.loads(out[:out.rindex("}") + 1])
    assert effective["leader_election"]["enabled"] is True and effective["log_level"] == "DEBUG"
    assert "plugins OK: 2 controller(s): configmap-mirror, widget-status" in out
    assert "credentials OK: API server https://127.0.0.1:1 (not contacted)" in out


def test_unmatched_plugin_settings_table_is_warned_about(tmp_path: Path, closed_kubeconfig: Path) -> None:
    (tmp_path / "s.toml").write_text(f'kubeconfig = "{closed_kubeconfig}"\n'
                                     'plugins = ["examples.plugins.widget_status"]\n'
                                     '[plugin_settings.configmap_mirorr]\nlabel = "a=b"\n')
    code, out, err = finish(syncer("check-config", "--settings", str(tmp_path / "s.toml")))
    assert code == 0, err
    assert err.count("\n") == 1 and ("WARNING [plugin_settings.configmap_mirorr] matches no loaded plugin and is "
                                     "ignored; loaded plugins: widget_status") in err


def test_entry_point_plugins_can_be_chosen_or_switched_off(tmp_path: Path, closed_kubeconfig: Path) -> None:
    dist = tmp_path / "fakeplug-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fakeplug\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[syncer.controllers]\nfake = fakeplug_mod\n")
    (tmp_path / "fakeplug_mod.py").write_text(
        "from controllers import ManagedController\n"
        "def syncer_controllers(settings):\n    return {'fake': ManagedController([], lambda ctx: None)}\n")
    env = {"PYTHONPATH": str(tmp_path), "KUBECONFIG": str(closed_kubeconfig)}
    for value, loaded in (("true", "1 controller(s): fake"), ('["fake"]', "1 controller(s): fake"),
                          ("false", "0 controller(s): -"), ("[]", "0 controller(s): -")):
        code, out, err = finish(syncer("check-config", env={**env, "SYNCER_ENTRY_POINT_PLUGINS": value}))
        assert code == 0 and f"plugins OK: {loaded}" in out, (value, err)
    code, _, err = finish(syncer("check-config", env={**env, "SYNCER_ENTRY_POINT_PLUGINS": '["fake", "other"]'}))
    assert code == 2 and err == ("error: setting 'entry_point_plugins' names 'other', which no installed package "
                                 "advertises in entry point group 'syncer.controllers' (installed: fake); "
                                 "fix the setting\n")


def test_taken_http_port_exits_2(tmp_path: Path, closed_kubeconfig: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        (tmp_path / "s.toml").write_text(f'kubeconfig = "{closed_kubeconfig}"\nhttp_bind = "127.0.0.1:{port}"\n')
        code, _, err = finish(syncer("run", "--settings", str(tmp_path / "s.toml")))
    assert code == 2, err
    assert f"error: setting 'http_bind': cannot listen on 127.0.0.1:{port}" in err and "Traceback" not in err


@pytest.fixture
def not_a_syncer() -> Iterator[int]:
    """An HTTP server on a free port that answers something other than a syncer status."""
    class Hello(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"<html>hello</html>")

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()


def test_no_command_ends_in_a_traceback(tmp_path: Path, closed_kubeconfig: Path, not_a_syncer: int) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('include = ["configmaps"]\n')
    good = tmp_path / "good.toml"
    good.write_text(f'kubeconfig = "{closed_kubeconfig}"\n')
    runs = {  # arguments -> (exit code, a part of the error line)
        ("run", "--settings", str(bad)): (2, "setting 'include'"),
        ("check-config", "--settings", str(bad)): (2, "setting 'include'"),
        ("discover", "--settings", str(bad)): (2, "setting 'include'"),
        ("status", "--settings", str(bad)): (2, "setting 'include'"),
        ("discover", "--settings", str(good)): (1, "cannot reach the API server https://127.0.0.1:1"),
        ("status", "--url", "http://127.0.0.1:1/status"): (1, "no syncer answering at http://127.0.0.1:1/status"),
        ("status", "--url", f"http://127.0.0.1:{not_a_syncer}/"): (1, "did not answer with a syncer status"),
        ("controlplane",): (1, "KUBE_SYNCER_ASSETS=/nowhere lacks executable"),
        ("run", "--local", "--settings", str(good)): (1, "local control plane: KUBE_SYNCER_ASSETS=/nowhere"),
        ("discover", "--settings", "/nowhere.toml"): (2, "settings file '/nowhere.toml' does not exist"),
    }
    procs = {args: syncer(*args, env={"KUBE_SYNCER_ASSETS": "/nowhere"}) for args in runs}
    for args, proc in procs.items():
        code, _, err = finish(proc)
        assert "Traceback" not in err, (args, err)
        expected_code, part = runs[args]
        assert code == expected_code and err.startswith("error: ") and part in err, (args, code, err)


def test_closed_pipe_ends_quietly(control_plane: ControlPlane) -> None:
    """`syncer discover | head` where head is gone: no traceback, exit 141 like other Unix tools."""
    read, write = os.pipe()
    os.close(read)
    try:
        proc = syncer("discover", "--kubeconfig", str(control_plane.kubeconfig), stdout=write)
    finally:
        os.close(write)
    code, _, err = finish(proc)
    assert (code, err) == (128 + signal.SIGPIPE, "")


def test_ctrl_c_while_the_local_control_plane_starts(tmp_path: Path) -> None:
    """SIGINT while `run --local` starts etcd and the apiserver: one line, exit 130, nothing left running."""
    (tmp_path / "s.toml").write_text(f'http_bind = "127.0.0.1:{free_port()}"\n')
    proc = syncer("run", "--local", "--settings", str(tmp_path / "s.toml"))
    deadline = time.monotonic() + TIMEOUT
    while not (spawned := _children(proc.pid)):  # etcd is spawned: the control plane is starting
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"no control plane process appeared: {proc.communicate()}")
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    code, out, err = finish(proc)
    assert (code, err) == (130, "interrupted\n"), out
    # the kernel kills them as their parent exits, asynchronously: wait (bounded) until none is running
    deadline = time.monotonic() + 10
    while running := [pid for pid in spawned if _running(pid)]:
        assert time.monotonic() < deadline, f"control plane processes left running: {running}"
        time.sleep(0.05)


def test_started_processes_see_ctrl_c_as_in_a_foreground_run() -> None:
    """The processes the tests start get SIGINT's default action (Python: KeyboardInterrupt), as Ctrl-C at a
    terminal reaches them, even when the suite is a background job with SIGINT ignored (tests/conftest.py)."""
    probe = [sys.executable, "-c",
             "import signal; print(signal.getsignal(signal.SIGINT) is signal.default_int_handler)"]
    assert subprocess.run(probe, capture_output=True, text=True, timeout=TIMEOUT).stdout == "True\n"


def test_the_suite_run_as_a_background_job_still_gets_ctrl_c_to_its_processes() -> None:
    """`pytest &` from a script starts the suite with SIGINT ignored, which its processes would inherit."""
    test = f"{Path(__file__).relative_to(ROOT)}::test_started_processes_see_ctrl_c_as_in_a_foreground_run"
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as the shell starts a background job
    try:
        suite = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test], cwd=ROOT,
                                 env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    finally:
        signal.signal(signal.SIGINT, previous)
    out, _ = suite.communicate(timeout=120)
    assert suite.returncode == 0, out


def _running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie waiting to be reaped."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_local_hint_fits_the_settings(tmp_path: Path) -> None:
    """`run --local` suggests installing the example CRD only when the example plugin that needs it is loaded."""
    (tmp_path / "s.toml").write_text(f'http_bind = "127.0.0.1:{free_port()}"\n')
    proc = syncer("run", "--local", "--settings", str(tmp_path / "s.toml"))
    assert proc.stdout is not None and proc.stderr is not None
    try:
        lines = [proc.stdout.readline(), proc.stdout.readline()]
        while (log := proc.stderr.readline()) and "serving /healthz" not in log:
            pass  # SIGTERM stops the sidecar gracefully once it runs
    finally:
        proc.send_signal(signal.SIGTERM)
        code, _, err = finish(proc)
    assert lines[0].startswith("local control plane at https://127.0.0.1:"), (lines, err)
    assert lines[1].startswith("  try: ") and lines[1].endswith(" api-resources\n"), lines
    assert code == 0, err


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # The command name (2nd field) is in parentheses and may contain spaces: the parent pid follows it.
            if int(stat.read_text().rpartition(")")[2].split()[1]) == pid:
                found.append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):  # the process ended meanwhile
            pass
    return found


def test_cli_does_not_import_test_tooling() -> None:
    code = ("import sys\nfrom syncer.cli import main\nmain(['version'])\n"
            "print(sorted(m for m in sys.modules if m.startswith('syncer.testing')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=TIMEOUT,
                         env=clean_env())
    assert out.stdout.splitlines()[-1] == "[]", out.stderr


def test_check_config_masks_and_discover_lists(tmp_path: Path, control_plane: ControlPlane) -> None:
    (tmp_path / "s.toml").write_text(
        f'kubeconfig = "{control_plane.kubeconfig}"\ninclude = ["core/configmaps"]\n'
        '[plugin_settings.x]\napi_token = "s3cret"\n')
    code, out, err = finish(syncer("check-config", "--settings", str(tmp_path / "s.toml")))
    assert code == 0 and "s3cret" not in out and '"api_token": "***"' in out, err
    assert '"solo.io/kubeconfig"' in out  # clusters.secret_types names types, not secrets
    code, out, err = finish(syncer("discover", "--settings", str(tmp_path / "s.toml")))
    assert code == 0, err
    lines = {line.split()[0]: line for line in out.splitlines()[1:]}
    assert lines["configmaps.v1"].endswith("yes")
    assert "no: matches no include rule" in lines["secrets.v1"]
    code, out, _ = finish(syncer("version"))
    assert code == 0 and out.startswith("kube-syncer ")


def test_a_required_gvr_the_settings_exclude_is_warned_about(tmp_path: Path, closed_kubeconfig: Path) -> None:
    (tmp_path / "s.toml").write_text(f'kubeconfig = "{closed_kubeconfig}"\n'
                                     'plugins = ["examples.plugins.configmap_mirror"]\n'
                                     'include = ["core/namespaces"]\n')
    code, out, err = finish(syncer("check-config", "--settings", str(tmp_path / "s.toml")))
    assert code == 0, err
    assert ("WARNING controller configmap-mirror requires configmaps.v1, which the settings exclude (matches no "
            "include rule): it would wait forever; add it to 'include' or remove it from 'exclude'") in err


def test_a_controller_waiting_because_of_the_settings_says_why(tmp_path: Path, control_plane: ControlPlane) -> None:
    from tests.sidecar import Sidecar

    car = Sidecar(tmp_path, str(control_plane.kubeconfig), plugins=("examples.plugins.configmap_mirror",),
                  extra='exclude = ["core/configmaps"]\n')
    try:
        why = "configmaps.v1 (excluded: excluded by rule core/*/configmaps)"
        car.wait(lambda: any(why in c.get("missing", []) for c in car.status().get("controllers", [])),
                 "the reason in /status")
        car.wait(lambda: "controller configmap-mirror waits for configmaps.v1: excluded: excluded by rule "
                         "core/*/configmaps" in car.log, "the reason in the log")
        code, out, err = finish(syncer("status", "--url", f"http://127.0.0.1:{car.port}/status"))
        assert code == 0 and why in out, out + err
        assert car.log.count("waits for configmaps.v1") == 1
    finally:
        car.stop()


def test_a_controller_waiting_for_a_gvr_nobody_serves_is_warned_about(tmp_path: Path,
                                                                      control_plane: ControlPlane) -> None:
    # Not a GVR that a CRD is about to serve: one WARNING with the closest served names, in /status and
    # `syncer status` too; check-config asks the cluster when given --kubeconfig.
    from tests.sidecar import Sidecar

    why = "configmaps.v2 (not served: no CRD or APIService provides it; did you mean configmaps.v1?)"
    car = Sidecar(tmp_path, str(control_plane.kubeconfig), plugins=("tests.plugins.wrong_version",))
    try:
        car.wait(lambda: any(why in c.get("missing", []) for c in car.status().get("controllers", [])),
                 "the reason in /status")
        car.wait(lambda: "WARNING controller wrong-version waits for configmaps.v2: not served" in car.log,
                 "the warning")
        code, out, err = finish(syncer("status", "--url", f"http://127.0.0.1:{car.port}/status"))
        assert code == 0 and why in out, out + err
        assert car.log.count("waits for configmaps.v2") == 1
    finally:
        car.stop()
    (tmp_path / "s.toml").write_text('plugins = ["tests.plugins.wrong_version"]\ninclude = ["core/configmaps"]\n')
    code, out, err = finish(syncer("check-config", "--settings", str(tmp_path / "s.toml"), "--kubeconfig",
                                   str(control_plane.kubeconfig)))
    assert code == 0, err
    assert ("controller wrong-version requires configmaps.v2, which the API server https://127.0.0.1:"
            in err and "does not serve (not served: no CRD or APIService provides it; did you mean configmaps.v1?)"
            in err), err
    assert "answered: it serves" in out


def test_the_readme_lists_every_setting_as_enforced() -> None:
    code, out, err = finish(syncer("settings"))
    assert code == 0, err
    readme = (ROOT / "README.md").read_text()
    block = readme.split("<!-- settings:begin -->\n", 1)[1].split("<!-- settings:end -->", 1)[0]
    assert block == out, "README's settings table is stale: paste the output of `syncer settings` into it"


def test_check_config_local_needs_no_credentials(tmp_path: Path) -> None:
    (tmp_path / "s.toml").write_text('plugins = ["examples.plugins.configmap_mirror"]\n'
                                     'include = ["core/configmaps", "core/namespaces"]\n')
    env = {"KUBECONFIG": str(tmp_path / "missing")}
    code, out, err = finish(syncer("check-config", "--local", "--settings", str(tmp_path / "s.toml"), env=env))
    assert code == 0 and "credentials: not checked (--local" in out, out + err
    code, out, err = finish(syncer("check-config", "--settings", str(tmp_path / "s.toml"), env=env))
    assert code == 2 and err.startswith("error: kubeconfig ") and "does not exist" in err, err
