"""What ``check-config`` and ``status`` print: the JSON first (alone with ``--json``) and warnings after it; what
the plugins declare; and which address ``status`` asked, and why that one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from syncer.cli import main


@pytest.fixture
def settings_file(tmp_path: Path) -> str:
    path = tmp_path / "s.toml"
    path.write_text('plugins = ["tests.plugins.stuck_runnable_webhook"]\n'
                    'include = ["core/configmaps"]\nexclude = ["core/configmaps"]\n'
                    '[plugin_settings.nothing_of_that_name]\nx = 1\n')
    return str(path)


def test_check_config_prints_the_json_then_what_plugins_declare_then_warnings(settings_file: str, capfd) -> None:
    assert main(["check-config", "--local", "--settings", settings_file]) == 0
    out, err = capfd.readouterr()
    document, _, rest = out.partition("\n}\n")
    assert json.loads(document + "\n}")["source"] == settings_file
    assert "1 webhook(s): /validating/fatal-exit.configmaps.example.com" in rest and "1 runnable(s): stubborn" in rest
    assert "[plugin_settings.nothing_of_that_name] matches no loaded plugin" in err
    # in a terminal, where both streams show as one: the warning after the document
    both = subprocess.run([sys.executable, "-m", "syncer", "check-config", "--local", "--settings", settings_file],
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=True).stdout
    assert both.index("matches no loaded plugin") > both.index("credentials: not checked")


def test_check_config_json_prints_the_json_alone(settings_file: str, capfd) -> None:
    assert main(["check-config", "--local", "--json", "--settings", settings_file]) == 0
    out, _ = capfd.readouterr()
    assert json.loads(out)["include"] == ["core/configmaps"]


def test_status_says_which_address_it_asked_and_why(tmp_path: Path, capfd, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SYNCER_SETTINGS", raising=False)
    monkeypatch.delenv("SYNCER_HTTP_BIND", raising=False)
    assert main(["status"]) == 1
    assert "(http_bind's default: no settings file, nor SYNCER_HTTP_BIND; give `status` the settings" in \
        capfd.readouterr().err
    monkeypatch.setenv("SYNCER_HTTP_BIND", "127.0.0.1:1")
    assert main(["status"]) == 1
    assert "no syncer answering at http://127.0.0.1:1/status (http_bind from environment variable SYNCER_HTTP_BIND)"\
        in capfd.readouterr().err
