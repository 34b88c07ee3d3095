"""``SYNCER_*`` environment variables over the settings file: values replace (lists too), tables merge key by key,
``@merge`` adds to a list, and the link variables Kubernetes injects for a Service named ``syncer...`` are not
settings."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from loguru import logger

from syncer.settings import SettingsError, load_settings

SERVICE_LINKS = {
    "SYNCER_PORT": "tcp://10.96.0.10:8080", "SYNCER_SERVICE_HOST": "10.96.0.10", "SYNCER_SERVICE_PORT": "8080",
    "SYNCER_SERVICE_PORT_HTTP": "8080", "SYNCER_PORT_8080_TCP": "tcp://10.96.0.10:8080",
    "SYNCER_PORT_8080_TCP_PROTO": "tcp", "SYNCER_PORT_8080_TCP_PORT": "8080", "SYNCER_PORT_8080_TCP_ADDR": "10.96.0.10",
    "SYNCER_WEBHOOK_SERVICE_HOST": "10.96.0.11", "SYNCER_WEBHOOK_PORT": "tcp://10.96.0.11:443",
    "SYNCER_WEBHOOK_PORT_443_TCP_PORT": "443",
}


@pytest.fixture
def settings_file(tmp_path: Path) -> str:
    path = tmp_path / "settings.toml"
    path.write_text('include = ["core/configmaps", "core/namespaces"]\nworkers = 3\n'
                    '[leader_election]\nenabled = true\nlease_name = "from-file"\n')
    return str(path)


def test_service_link_variables_are_not_settings(monkeypatch: pytest.MonkeyPatch, settings_file: str) -> None:
    for name, value in SERVICE_LINKS.items():
        monkeypatch.setenv(name, value)
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m)), level="DEBUG")
    try:
        settings = load_settings(settings_file)
    finally:
        logger.remove(sink)
    assert settings.include == ("core/configmaps", "core/namespaces") and settings.workers == 3
    assert sorted(n for n in SERVICE_LINKS if any(f"variable {n}:" in line for line in lines)) == sorted(SERVICE_LINKS)
    # a table's key that looks like a link is a setting
    monkeypatch.setenv("SYNCER_PLUGIN_SETTINGS__WIDGET__SERVICE_PORT", "8443")
    widget = load_settings(settings_file).plugin_settings["widget"]
    assert {k.lower(): v for k, v in widget.items()} == {"service_port": 8443}
    # a real setting's variable is still one, and a near miss is still a mistake
    monkeypatch.setenv("SYNCER_WORKERS", "5")
    assert load_settings(settings_file).workers == 5
    monkeypatch.setenv("SYNCER_PORTS", "8080")
    with pytest.raises(SettingsError, match="unknown setting 'ports' in environment variable SYNCER_PORTS"):
        load_settings(settings_file)


def test_an_environment_list_replaces_the_files_and_merge_is_explicit(monkeypatch: pytest.MonkeyPatch,
                                                                      settings_file: str) -> None:
    monkeypatch.setenv("SYNCER_INCLUDE", '["core/secrets"]')
    assert load_settings(settings_file).include == ("core/secrets",)
    monkeypatch.setenv("SYNCER_INCLUDE", "[]")
    assert load_settings(settings_file).include == ()
    monkeypatch.setenv("SYNCER_INCLUDE", '@merge ["core/secrets"]')
    assert load_settings(settings_file).include == ("core/configmaps", "core/namespaces", "core/secrets")


def test_a_table_key_from_the_environment_keeps_the_files_other_keys(monkeypatch: pytest.MonkeyPatch,
                                                                     settings_file: str) -> None:
    monkeypatch.setenv("SYNCER_LEADER_ELECTION__LEASE_NAME", "from-env")
    election = load_settings(settings_file).leader_election
    assert election.enabled is True and election.lease_name == "from-env"


def test_cluster_provider_tables_come_from_the_file_and_the_environment(monkeypatch: pytest.MonkeyPatch,
                                                                        tmp_path: Path) -> None:
    """``[clusters.cluster_api]`` and ``[clusters.kubeconfig_files]`` are tables in ``[clusters]``: a key set by a
    ``SYNCER_CLUSTERS__<TABLE>__<KEY>`` variable keeps the file's other keys; paths get ``~`` expanded."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "fleet.yaml").write_text("{}")
    path = tmp_path / "settings.toml"
    path.write_text('[clusters]\nproviders = ["kubeconfig-files", "Secrets"]\n'
                    '[clusters.cluster_api]\nnamespaces = ["capi-system"]\nlabel_selector = "env=prod"\n'
                    '[clusters.kubeconfig_files]\npaths = ["~/fleet.yaml"]\ncontexts = ["east"]\n')
    defaults = load_settings(None).clusters
    assert defaults.providers == ("secrets",) and defaults.cluster_api.namespaces == ()
    assert not defaults.cluster_api.ready_only and defaults.kubeconfig_files.reload_interval == 5.0
    clusters = load_settings(str(path)).clusters
    assert clusters.providers == ("kubeconfig-files", "secrets")
    assert (clusters.cluster_api.namespaces, clusters.cluster_api.label_selector) == (("capi-system",), "env=prod")
    assert clusters.kubeconfig_files.paths == (str(tmp_path / "fleet.yaml"),)
    assert clusters.kubeconfig_files.contexts == ("east",)
    monkeypatch.setenv("SYNCER_CLUSTERS__PROVIDERS", '["cluster-api", "secrets"]')
    monkeypatch.setenv("SYNCER_CLUSTERS__CLUSTER_API__READY_ONLY", "true")
    monkeypatch.setenv("SYNCER_CLUSTERS__KUBECONFIG_FILES__RELOAD_INTERVAL", "2m")
    clusters = load_settings(str(path)).clusters
    assert clusters.providers == ("cluster-api", "secrets")
    assert clusters.cluster_api.ready_only and clusters.cluster_api.namespaces == ("capi-system",)
    assert clusters.kubeconfig_files.reload_interval == 120.0 and clusters.kubeconfig_files.contexts == ("east",)
    monkeypatch.setenv("SYNCER_CLUSTERS__CLUSTER_API__READY_ONLY", "maybe")
    with pytest.raises(SettingsError, match=r"^setting 'clusters.cluster_api.ready_only' must be true or false, got "
                                            r"'maybe'; fix environment variable SYNCER_CLUSTERS__CLUSTER_API__READY_ONLY"):
        load_settings(str(path))


def test_the_priority_queue_is_on_by_default_and_a_setting_turns_it_off(monkeypatch: pytest.MonkeyPatch,
                                                                        settings_file: str, tmp_path: Path) -> None:
    assert load_settings(settings_file).priority_queue is True
    monkeypatch.setenv("SYNCER_PRIORITY_QUEUE", "false")
    assert load_settings(settings_file).priority_queue is False
    monkeypatch.delenv("SYNCER_PRIORITY_QUEUE")
    off = tmp_path / "off.toml"
    off.write_text("priority_queue = false\n")
    assert load_settings(str(off)).priority_queue is False
    off.write_text('priority_queue = "no"\n')
    with pytest.raises(SettingsError, match="setting 'priority_queue' must be true or false, got 'no'"):
        load_settings(str(off))



def test_a_relative_settings_path_is_the_working_directorys(tmp_path: Path) -> None:
    """dynaconf looks a relative settings file up from the invoked script's directory and its parents first (for
    the ``syncer`` command: the virtualenv's bin): a file of that name there must not be read instead."""
    script_dir, cwd = tmp_path / "bin", tmp_path / "work"
    script_dir.mkdir()
    cwd.mkdir()
    (tmp_path / "s.toml").write_text("workers = 3\n")  # above the script, as /tmp/s.toml is above a venv in /tmp
    (cwd / "s.toml").write_text("workers = 5\n")
    script = script_dir / "syncer-like"
    script.write_text("from syncer.settings import load_settings\nprint(load_settings('s.toml').workers)\n")
    out = subprocess.run([sys.executable, str(script)], cwd=cwd, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    assert out.stdout.strip() == "5", out.stderr
