"""The README's examples, run as written against the real control plane, so that they cannot drift.

- The Python snippets of "## Using it" run verbatim in a process of their own, with top-level ``await`` as in
  ``python -m asyncio`` and ``$KUBECONFIG`` naming the test control plane.
- The plugin of "### Write your own plugin" is deploy/plugin-example/syncer_backup.py, character for character,
  and runs with the README's settings under ``python -m syncer run``.
- The UnionController sketch of "Union informers" (a ``py`` block) follows a NamespaceView, and stops cleanly.
- examples/settings.toml loads, and its ``include`` covers what the example plugins require.
- The tests of "### Testing your own controllers" (its ``conftest.py`` and ``test_backup.py``, next to the plugin
  above) pass under pytest in a project of its own, with an empty configuration and no warning.

(The example plugins themselves run in tests/syncer/test_syncer.py, examples/crd_lifecycle.py there too.)
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import kubernetes

from informers.resource_filter import ResourceFilter
from syncer.plugins import load_plugins
from syncer.settings import load_settings
from syncer.testing import ControlPlane
from syncer.testing.pytest_plugin import kube_client
from tests.sidecar import wait_until

ROOT = Path(__file__).resolve().parents[2]


def readme_blocks(language: str) -> dict[str, list[str]]:
    """The ``language`` code blocks of README's "## Using it", by the ``###`` heading they are under."""
    text = (ROOT / "README.md").read_text()
    using = text.split("\n## Using it\n", 1)[1].split("\n## ", 1)[0]
    blocks: dict[str, list[str]] = {}
    for section in re.split(r"\n(?=### )", using):
        heading = section.partition("\n")[0].removeprefix("### ")
        found = re.findall(rf"^```{language}\n(.*?)^```$", section, re.S | re.M)
        if found:
            blocks[heading] = found
    return blocks


def snippet(heading: str) -> str:
    [code] = readme_blocks("python")[heading]
    return code


# Runs a snippet file as a module whose top level may ``await`` (as ``python -m asyncio`` does), until it ends or
# Ctrl-C cancels it, and then reports the tasks it left behind.
RUNNER = """
import ast, asyncio, sys

code = compile(open(sys.argv[1]).read(), sys.argv[1], "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


async def main():
    try:
        awaitable = eval(code, {"__name__": "__main__"})
        if awaitable is not None:
            await awaitable
    finally:
        print("tasks left:", len(asyncio.all_tasks() - {asyncio.current_task()}), flush=True)

try:
    asyncio.run(main())
except KeyboardInterrupt:
    pass
"""


def start_snippet(heading: str, tmp_path: Path, cp: ControlPlane,
                  code: str | None = None) -> tuple[subprocess.Popen[str], Path]:
    """A process running the README snippet under ``heading`` (or ``code``), with $KUBECONFIG naming ``cp``."""
    (tmp_path / "snippet.py").write_text(code if code is not None else snippet(heading))
    (tmp_path / "runner.py").write_text(RUNNER)
    log = tmp_path / "snippet.log"
    proc = subprocess.Popen([sys.executable, "runner.py", "snippet.py"], cwd=tmp_path, text=True,
                            env={**os.environ, "KUBECONFIG": str(cp.kubeconfig)}, stdout=open(log, "w"),
                            stderr=subprocess.STDOUT)
    return proc, log


def test_the_readme_python_snippets_are_the_ones_tested() -> None:
    assert {h: len(b) for h, b in readme_blocks("python").items()} == {
        "Informers (`informers`)": 1, "Controllers (`controllers`)": 1, "Write your own plugin": 1,
        "Testing your own controllers": 2}


def test_informers_snippet(tmp_path: Path, control_plane: ControlPlane) -> None:
    proc, log = start_snippet("Informers (`informers`)", tmp_path, control_plane)
    assert proc.wait(60) == 0, log.read_text()
    assert "tasks left: 0" in log.read_text()


def test_controllers_snippet_runs_a_working_controller(tmp_path: Path, control_plane: ControlPlane,
                                                       namespace: str,
                                                       admin_client: kubernetes.client.ApiClient) -> None:
    proc, log = start_snippet("Controllers (`controllers`)", tmp_path, control_plane)
    core = kubernetes.client.CoreV1Api(admin_client)
    events = kubernetes.client.EventsV1Api(admin_client)
    try:
        core.create_namespaced_config_map(namespace, {"metadata": {"name": "plain"}, "data": {"k": "v"}})
        core.create_namespaced_config_map(namespace, {"metadata": {"name": "greet-me", "labels": {
            "example.com/greet": "true"}}, "data": {"k": "v"}})
        wait_until(lambda: core.read_namespaced_config_map("greet-me", namespace).data == {
            "k": "v", "greeting": "hello"}, "the labelled ConfigMap greeted", proc, log)
        wait_until(lambda: any(e.reason == "Greeted" and e.regarding.name == "greet-me"
                               for e in events.list_namespaced_event(namespace).items), "its Event", proc, log)
        assert core.read_namespaced_config_map("plain", namespace).data == {"k": "v"}
        proc.send_signal(signal.SIGINT)  # Ctrl-C: the snippet's finally stops the manager and the factory
        assert proc.wait(30) == 0, log.read_text()
        assert "tasks left: 0" in log.read_text() and "greeted" in log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_union_controller_sketch_follows_the_views(tmp_path: Path, control_plane_factory: Any) -> None:
    """The UnionController block of "Union informers" (a ``py`` block, pasteable into ``python -m asyncio``)."""
    [code] = [b for b in readme_blocks("py")["Informers (`informers`)"] if "UnionController" in b]
    cp = control_plane_factory()
    api = kube_client(cp)
    kubernetes.client.ApiextensionsV1Api(api).create_custom_resource_definition(
        json.loads((ROOT / "examples" / "crds" / "namespaceview.json").read_text()))
    core, custom = kubernetes.client.CoreV1Api(api), kubernetes.client.CustomObjectsApi(api)
    core.create_namespace({"metadata": {"name": "team-a"}})
    core.create_namespaced_config_map("team-a", {"metadata": {"name": "settings"}})
    view = {"apiVersion": "examples.kube-syncer.io/v1", "kind": "NamespaceView", "metadata": {"name": "a"},
            "spec": {"namespace": "team-a"}}
    for attempt in range(100):  # until the CRD is served
        try:
            custom.create_namespaced_custom_object("examples.kube-syncer.io", "v1", "default", "namespaceviews", view)
            break
        except kubernetes.client.ApiException:
            if attempt == 99:
                raise
            time.sleep(0.2)
    proc, log = start_snippet("", tmp_path, cp, code)
    try:
        wait_until(lambda: "default/a sees settings" in log.read_text(), "the view's ConfigMap", proc, log)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0, log.read_text()
        assert "tasks left: 0" in log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_example_settings_load_and_cover_the_plugins() -> None:
    settings = load_settings(str(ROOT / "examples" / "settings.toml"))
    controllers = load_plugins(settings.plugins, settings.plugin_settings, entry_points=False).controllers
    assert set(controllers) == {"configmap-mirror", "widget-status"}
    rules = ResourceFilter(settings.include, settings.exclude)
    assert {str(g): rules.why_rules_exclude(g) for c in controllers.values() for g in c.required_gvrs} == {
        "configmaps.v1": None, "namespaces.v1": None, "widgets.v1.examples.kube-syncer.io": None}


def test_multicluster_provider_settings_load(tmp_path: Path, monkeypatch: Any) -> None:
    """The README's ClusterProfile and namespace provider settings load as pasted (the access-provider file at a
    path of the test's)."""
    for name in [k for k in os.environ if k.startswith("SYNCER_")]:
        monkeypatch.delenv(name)
    profile, namespaces = readme_blocks("toml")["Multi-cluster"]
    [access] = readme_blocks("json")["Multi-cluster"]
    (tmp_path / "access.json").write_text(access)
    (tmp_path / "profile.toml").write_text(profile.replace("/etc/kube-syncer/access-providers.json",
                                                           str(tmp_path / "access.json")))
    (tmp_path / "namespaces.toml").write_text(namespaces)
    clusters = load_settings(str(tmp_path / "profile.toml")).clusters
    assert clusters.providers == ("cluster-profile",) and clusters.cluster_profile.namespaces == ("fleet",)
    clusters = load_settings(str(tmp_path / "namespaces.toml")).clusters
    assert clusters.host_namespaces.label_selector == "kube-syncer.io/tenant=true"


# -- the plugin of "Write your own plugin", run by `syncer run` ---------------------------------------------


def controller_state(port: int, name: str) -> str:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=2) as r:
            return next((c["state"] for c in json.load(r)["controllers"] if c["name"] == name), "")
    except OSError:
        return ""


def test_plugin_section_is_the_packaged_plugin() -> None:
    assert snippet("Write your own plugin") == (ROOT / "deploy" / "plugin-example" / "syncer_backup.py").read_text()


def test_plugin_section_runs_with_its_settings(tmp_path: Path, control_plane: ControlPlane, namespace: str,
                                               admin_client: kubernetes.client.ApiClient) -> None:
    [settings] = readme_blocks("toml")["Write your own plugin"]
    (tmp_path / "backup.py").write_text(snippet("Write your own plugin"))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # Top-level keys go before the README's tables: where the cluster is, and a free port for /status.
    (tmp_path / "mine.toml").write_text(f'kubeconfig = "{control_plane.kubeconfig}"\n'
                                        f'http_bind = "127.0.0.1:{port}"\n{settings}')
    check = subprocess.run([sys.executable, "-m", "syncer", "check-config", "--settings", "mine.toml"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert check.returncode == 0 and "plugins OK: 1 controller(s): backup" in check.stdout, check.stderr
    assert "WARNING" not in check.stderr, check.stderr
    log = tmp_path / "syncer.log"
    proc = subprocess.Popen([sys.executable, "-m", "syncer", "run", "--settings", "mine.toml"], cwd=tmp_path,
                            stdout=open(log, "w"), stderr=subprocess.STDOUT)
    core = kubernetes.client.CoreV1Api(admin_client)

    def backup() -> Any:
        try:
            return core.read_namespaced_config_map("app-backup", namespace)
        except kubernetes.client.ApiException as e:
            if e.status == 404:
                return None
            raise

    try:
        wait_until(lambda: controller_state(port, "backup") == "running", "the controller", proc, log)
        core.create_namespaced_config_map(namespace, {"metadata": {"name": "app", "labels": {
            "example.com/backup": "true"}}, "data": {"k": "v"}})
        wait_until(lambda: backup() is not None and backup().data == {"k": "v"}, "the copy", proc, log)
        [ref] = backup().metadata.owner_references
        assert (ref.kind, ref.name, ref.controller) == ("ConfigMap", "app", True)
        core.patch_namespaced_config_map("app-backup", namespace, {"data": {"k": "changed by hand"}})
        wait_until(lambda: backup().data == {"k": "v"}, "the copy restored (owns)", proc, log)
        core.delete_namespaced_config_map("app-backup", namespace)
        wait_until(lambda: backup() is not None, "the copy recreated (owns)", proc, log)
        events = kubernetes.client.EventsV1Api(admin_client)
        wait_until(lambda: any(e.reason == "BackedUp" and e.regarding.name == "app"
                               for e in events.list_namespaced_event(namespace).items), "the Event", proc, log)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# -- the tests of "Testing your own controllers", in a project of their own ---------------------------------------
def test_testing_section_passes_in_a_project_with_an_empty_configuration(tmp_path: Path) -> None:
    conftest, tests = readme_blocks("python")["Testing your own controllers"]
    (tmp_path / "conftest.py").write_text(conftest)
    (tmp_path / "test_backup.py").write_text(tests)
    (tmp_path / "backup.py").write_text(snippet("Write your own plugin"))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # the project's own, empty: not our setup.cfg
    [command] = [line for line in readme_blocks("sh")["Testing your own controllers"][0].splitlines()
                 if line.startswith("pytest ")]
    argv = command.partition("#")[0].split()
    # The repository's root on the path, as in the walk-through, for ``examples``; pytest as the venv's module.
    run = subprocess.run([sys.executable, "-m", *argv, "-p", "no:cacheprovider", "-W", "error"], cwd=tmp_path,
                         capture_output=True, text=True, timeout=240, env={**os.environ, "PYTHONPATH": str(ROOT)})
    out = run.stdout + run.stderr
    assert run.returncode == 0 and "2 passed" in out, out
    assert "warning" not in out.lower(), out


def test_the_read_your_writes_sketch_defines_a_controller() -> None:
    """The read-your-writes block of "Controllers" (a ``py`` block: a fragment for a ControllerManager) runs as
    written and declares a controller of ConfigMaps (the behaviour itself: tests/controllers/
    test_read_your_writes_integration.py)."""
    text = (ROOT / "README.md").read_text()
    section = text.split("**Read your own writes.**", 1)[1]
    [code] = re.findall(r"^```py\n(.*?)^```$", section, re.S | re.M)[:1]
    scope: dict[str, Any] = {}
    exec(compile(code, "README read-your-writes", "exec"), scope)
    assert [str(g) for g in scope["counter"].required_gvrs] == ["configmaps.v1"]
