"""Declaring webhooks, stores and runnables: the plugin hooks, the declarations' checks, the ``[webhooks]``
settings, and bad input to ``syncer`` about them (one ``error:`` line, exit code 2)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from syncer.plugins import PluginError, Plugins, load_plugins
from syncer.settings import SettingsError, Webhooks, load_settings
from syncer.webhook import AdmissionRequest, AdmissionRule, Allow, MutatingWebhook, ValidatingWebhook, Verdict

from tests.helpers import free_port

ROOT = Path(__file__).resolve().parents[2]
RULES = [AdmissionRule(["CREATE"], [""], ["v1"], ["configmaps"])]

PLUGIN = '''
from syncer.webhook import AdmissionRule, Allow, ValidatingWebhook

async def ok(request):
    return Allow()

class Cache:
    name = "cache"
    async def recover(self):
        pass

class Reporter:
    name = "reporter"
    async def run(self):
        pass
    async def shutdown(self):
        pass

def syncer_webhooks(settings):
    return [ValidatingWebhook(settings.get("name", "v.configmaps.example.com"), ok,
                              [AdmissionRule(["CREATE"], [""], ["v1"], ["configmaps"])])]

def syncer_stores(settings):
    return [Cache()]

def syncer_runnables(settings):
    return [Reporter()]
'''


async def ok(request: AdmissionRequest) -> Verdict:
    return Allow()


def test_a_plugin_may_contribute_webhooks_stores_and_runnables_without_controllers(tmp_path: Path) -> None:
    (tmp_path / "extras.py").write_text(PLUGIN)
    plugins = load_plugins([str(tmp_path / "extras.py")], {"extras": {"name": "x.configmaps.example.com"}},
                           entry_points=False)
    assert isinstance(plugins, Plugins) and plugins.controllers == {}
    assert [w.path for w in plugins.webhooks] == ["/validating/x.configmaps.example.com"]
    assert [s.name for s in plugins.stores] == ["cache"] and [r.name for r in plugins.runnables] == ["reporter"]


def test_example_webhook_plugin_loads_and_checks_its_settings() -> None:
    plugins = load_plugins(["examples.plugins.widget_webhook"], entry_points=False)
    assert [(w.kind, w.name) for w in plugins.webhooks] == [
        ("mutating", "default.widgets.examples.kube-syncer.io"),
        ("validating", "validate.widgets.examples.kube-syncer.io")]
    with pytest.raises(PluginError, match=r"syncer_webhooks\(\) raised ValueError: \[plugin_settings.widget_webhook\] "
                                          r"max_size must be an integer >= 0, got 'big'"):
        load_plugins(["examples.plugins.widget_webhook"], {"widget_webhook": {"max_size": "big"}}, entry_points=False)


@pytest.mark.parametrize("hooks, message", [
    ("def syncer_webhooks(s):\n    return {}\n", "syncer_webhooks() returned dict, expected a list of webhooks"),
    ("def syncer_webhooks(s):\n    return [1]\n",
     "syncer_webhooks() returned an item that is no use: int is not a ValidatingWebhook or MutatingWebhook"),
    ("class S:\n    name = 's'\n    def recover(self): pass\ndef syncer_stores(s):\n    return [S()]\n",
     "syncer_stores() returned an item that is no use: 's': recover must be an 'async def' method"),
    ("class R:\n    async def run(self): pass\ndef syncer_runnables(s):\n    return [R()]\n",
     "syncer_runnables() returned an item that is no use: R has no 'name' string"),
    ("def syncer_runnables(s):\n    raise RuntimeError('no')\n",
     "syncer_runnables() raised RuntimeError: no (@PLUGIN@:2)"),
])
def test_bad_extension_hooks_are_plugin_errors(tmp_path: Path, hooks: str, message: str) -> None:
    (tmp_path / "bad.py").write_text(hooks)
    with pytest.raises(PluginError) as e:
        load_plugins([str(tmp_path / "bad.py")], entry_points=False)
    path = str(tmp_path / "bad.py")
    assert str(e.value) == f"plugin {path!r}: {message.replace('@PLUGIN@', path)}"


def test_the_same_webhook_store_or_runnable_in_two_plugins_is_refused(tmp_path: Path) -> None:
    (tmp_path / "one.py").write_text(PLUGIN)
    (tmp_path / "two.py").write_text(PLUGIN)
    with pytest.raises(PluginError, match=r"^webhook name '/validating/v.configmaps.example.com' is defined by both "
                                          r"plugin '.*one.py' and plugin '.*two.py'; rename one$"):
        load_plugins([str(tmp_path / "one.py"), str(tmp_path / "two.py")], entry_points=False)
    with pytest.raises(PluginError, match=r"^store name 'cache' is defined by both"):
        load_plugins([str(tmp_path / "one.py"), str(tmp_path / "two.py")],
                     {"two": {"name": "other.configmaps.example.com"}}, entry_points=False)


@pytest.mark.parametrize("kwargs, message", [
    ({"name": "short.name"}, "the name must be a fully qualified DNS name of at least three labels"),
    ({"handler": lambda r: Allow()}, "the handler must be an 'async def' function"),
    ({"rules": []}, "rules must be a non-empty list of AdmissionRule"),
    ({"timeout_seconds": 31}, "timeout_seconds must be an integer from 1 to 30, got 31"),
    ({"failure_policy": "fail"}, "failure_policy must be one of Fail, Ignore, got 'fail'"),
    ({"side_effects": "Some"}, "side_effects must be one of None, NoneOnDryRun, got 'Some'"),
    ({"match_policy": "Loose"}, "match_policy must be one of Equivalent, Exact, got 'Loose'"),
    ({"review_versions": ["v2"]}, "review_versions must be a non-empty list among v1, v1beta1, got ['v2']"),
])
def test_declaration_mistakes_are_caught_when_declared(kwargs: dict, message: str) -> None:
    declared = {"name": "v.configmaps.example.com", "handler": ok, "rules": RULES, **kwargs}
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        ValidatingWebhook(**declared)


def test_rule_and_mutating_declaration_checks() -> None:
    with pytest.raises(ValueError, match="AdmissionRule operations must be among CREATE, UPDATE, DELETE, CONNECT"):
        AdmissionRule(["PATCH"], [""], ["v1"], ["pods"])
    with pytest.raises(ValueError, match="AdmissionRule resources must be a non-empty list of strings, got 'pods'"):
        AdmissionRule(["CREATE"], [""], ["v1"], "pods")
    with pytest.raises(ValueError, match="reinvocation_policy must be one of Never, IfNeeded"):
        MutatingWebhook("m.configmaps.example.com", ok, RULES, reinvocation_policy="Always")  # type: ignore[arg-type]
    webhook = MutatingWebhook("m.configmaps.example.com", ok, RULES, timeout_seconds=10)
    assert (webhook.path, webhook.handler_timeout) == ("/mutating/m.configmaps.example.com", 9.0)
    assert ValidatingWebhook("v.configmaps.example.com", ok, RULES, timeout_seconds=1).handler_timeout == 0.8


# -- settings -------------------------------------------------------------------------------------------------
def test_webhooks_settings_defaults_and_overrides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert load_settings(None).webhooks == Webhooks()
    (tmp_path / "s.toml").write_text(f'[webhooks]\nbind = "0.0.0.0:9443"\ncert_dir = "{tmp_path}"\n'
                                     'manage_configurations = false\nhosts = ["webhook.svc", "10.0.0.1"]\n'
                                     'url = "https://webhook.example.com:8443/prefix"\n')
    monkeypatch.setenv("SYNCER_WEBHOOKS__CONFIGURATION_NAME", "my-hooks")
    webhooks = load_settings(str(tmp_path / "s.toml")).webhooks
    assert webhooks == Webhooks(bind="0.0.0.0:9443", cert_dir=str(tmp_path), hosts=("webhook.svc", "10.0.0.1"),
                                manage_configurations=False, configuration_name="my-hooks",
                                url="https://webhook.example.com:8443/prefix")
    assert load_settings(str(tmp_path / "s.toml")).masked()["webhooks"]["bind"] == "0.0.0.0:9443"


@pytest.mark.parametrize("line, message", [
    ('bind = "9443"', "setting 'webhooks.bind' must be host:port with a port from 1 to 65535"),
    ('cert_dir = "/nowhere"', "setting 'webhooks.cert_dir' must be the path of an existing directory or an empty "
                              "string, got '/nowhere' (it does not exist)"),
    ('client_ca_file = "/nowhere/ca.crt"', "setting 'webhooks.client_ca_file' must be the path of an existing file"),
    ('manage_configurations = "yes"', "setting 'webhooks.manage_configurations' must be true, false or \"auto\", "
                                      "got 'yes'"),
    ('url = "http://127.0.0.1:9443"', "setting 'webhooks.url' must be an https:// URL without query or fragment"),
    ('hosts = "localhost"', "setting 'webhooks.hosts' must be a list of DNS names or IP addresses"),
    ('configuration_name = "Bad_Name"', "setting 'webhooks.configuration_name' must be a DNS-1123 subdomain"),
    ('probe_namespace = "a.b"', "setting 'webhooks.probe_namespace' must be a DNS-1123 label"),
    ('bindd = "x"', "unknown setting 'webhooks.bindd' in settings file"),
])
def test_bad_webhooks_settings_name_the_setting(tmp_path: Path, line: str, message: str) -> None:
    (tmp_path / "s.toml").write_text(f"[webhooks]\n{line}\n")
    with pytest.raises(SettingsError) as e:
        load_settings(str(tmp_path / "s.toml"))
    assert str(e.value).startswith(message), str(e.value)


def run_syncer(tmp_path: Path, settings: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "s.toml").write_text(settings)
    return subprocess.run([sys.executable, "-m", "syncer", "run", "--settings", str(tmp_path / "s.toml")], cwd=ROOT,
                          capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "KUBECONFIG": "/nowhere"})


def test_bad_webhooks_setting_is_one_error_line_and_exit_2(tmp_path: Path) -> None:
    done = run_syncer(tmp_path, '[webhooks]\nmanage_configurations = "maybe"\n')
    assert done.returncode == 2
    assert done.stderr.splitlines() == [
        "error: setting 'webhooks.manage_configurations' must be true, false or \"auto\", got 'maybe'; set it in the "
        "settings file or in SYNCER_WEBHOOKS__MANAGE_CONFIGURATIONS"]


def test_a_taken_webhook_port_is_one_error_line_and_exit_2(tmp_path: Path) -> None:
    import socket

    kubeconfig = tmp_path / "closed.kubeconfig"  # an API server nothing listens on: the bind fails first
    kubeconfig.write_text('{"apiVersion": "v1", "kind": "Config", "current-context": "c", "clusters": [{"name": "c", '
                          '"cluster": {"server": "https://127.0.0.1:1"}}], "users": [{"name": "u", "user": {"token": '
                          '"t"}}], "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}')
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = run_syncer(tmp_path, f'kubeconfig = "{kubeconfig}"\nplugins = ["examples.plugins.widget_webhook"]\n'
                                    f'http_bind = "127.0.0.1:{free_port()}"\n[webhooks]\nbind = "127.0.0.1:{port}"\n')
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines()[-1].startswith(
        f"error: setting 'webhooks.bind': cannot listen on 127.0.0.1:{port}: "), done.stderr
