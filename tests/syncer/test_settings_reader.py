"""The plain settings reader against dynaconf: for every case the plain reader takes, it must return exactly what
dynaconf returns (types, nesting, casing, the environment over the file), and ``load_settings`` must give the same
settings or the same error; what only dynaconf understands must go to dynaconf."""

from __future__ import annotations

import itertools
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import pytest

from syncer.settings import SettingsError, load_settings
from syncer.settings import reader
from syncer.settings.loader import ENV_PREFIX, _read_toml

FILES = {
    "none": None,
    "empty": "",
    "plain": 'include = ["core/configmaps", "core/namespaces"]\nworkers = 3\nlog_level = "DEBUG"\nresync = 30\n',
    "tables": '[leader_election]\nenabled = true\nlease_name = "from-file"\nretry_period = 1.5\n'
              '[clusters]\nenabled = false\n',
    "cased": 'Workers = 4\nLOG_LEVEL = "INFO"\n[Leader_Election]\nLease_Name = "cased"\n',
    "nested": '[plugin_settings.widget]\nport = 80\nItems = [1, 2]\nhost = "h"\n'
              '[plugin_settings.other]\nx = { y = 1 }\n',
    "types": 'workers = 2.5\nuvloop = "yes"\nresync = "30s"\ninclude = "core/configmaps"\n'
             'plugin_settings = { when = 2024-01-01T10:00:00Z, day = 2024-01-01, at = 10:00:00, big = 1e300 }\n',
    "unknown": 'wrokers = 3\n',
    "bad-table": 'leader_election = 5\n',
    "settings-key": 'settings = "x.toml"\nworkers = 1\n',
    "array-of-tables": '[[plugin_settings.list]]\na = 1\n[[plugin_settings.list]]\na = 2\n',
    "unicode": 'plugin_settings = { "naïve" = "çà", "k-e-y" = "v" }\nlease = 1\n',
}
NAMES = ["WORKERS", "log_level", "LOG_LEVEL", "INCLUDE", "LEADER_ELECTION__ENABLED", "LEADER_ELECTION__LEASE_NAME",
         "leader_election__lease_name", "LEADER_ELECTION", "PLUGIN_SETTINGS__WIDGET__PORT",
         "PLUGIN_SETTINGS__Widget__Items", "PLUGIN_SETTINGS__NEW__KEY", "PLUGIN_SETTINGS", "UNKNOWN",
         "CLUSTERS__ENABLED", "SETTINGS", "PORT", "RESYNC", "A___B"]
VALUES = ["5", "True", "False", "true", " True ", "TRUE", "1.5", "1_000", "0x10", "-5", "+5", "1e3", "inf", "nan",
          "007", "'quoted'", '"dq"', "[1, 2]", '["core/secrets"]', "[1, 'a']", "{a = 1}", "{ enabled = true }", "",
          " ", "hello world", "DEBUG", "core/configmaps", "30s", "2024-01-01", "2024-01-01T10:00:00Z", "10:00:00",
          "a=b", "1\nx=2", "[", "naïve"]
PAIRS = [("LEADER_ELECTION__ENABLED", "true", "LEADER_ELECTION__LEASE_NAME", "env"),
         ("WORKERS", "7", "LOG_LEVEL", "ERROR"),
         ("PLUGIN_SETTINGS__WIDGET__PORT", "1", "PLUGIN_SETTINGS__WIDGET__HOST", "'e'"),
         ("PLUGIN_SETTINGS__A__B", "1", "PLUGIN_SETTINGS__C", "[2]"),
         ("CLUSTERS__ENABLED", "true", "LEADER_ELECTION__ENABLED", "false")]
# What only dynaconf understands, or whose outcome hangs on its merge order: each must go to dynaconf.
NOT_PLAIN_FILES = {"cast": 'workers = "@int 5"\n', "merge": 'include = ["dynaconf_merge", "a"]\n',
                   "key": '[leader_election]\ndynaconf_merge = true\n', "dotted": '"leader_election.enabled" = true\n',
                   "dunder": 'LEADER_ELECTION__ENABLED = true\n', "twice": 'workers = 1\nWORKERS = 2\n',
                   "nested-twice": "[plugin_settings]\na = 1\nA = 2\n", "internal": 'project_root = "/"\n'}
NOT_PLAIN_ENV = [{"SYNCER_WORKERS": "@int 5"}, {"SYNCER_INCLUDE": '@merge ["a"]'}, {"SYNCER_LOG_LEVEL": "@format x"},
                 {"DYNACONF_WORKERS": "3"}, {"ENVVAR_PREFIX_FOR_DYNACONF": "OTHER"}, {"SETTINGS_MODULE": "x.toml"},
                 {"SYNCER_DYNACONF_MERGE": "true"}, {"SYNCER_WORKERS": "1", "SYNCER_workers": "2"},
                 {"SYNCER_LEADER_ELECTION": "{enabled=true}", "SYNCER_LEADER_ELECTION__LEASE_NAME": "x"},
                 {"SYNCER_PLUGIN_SETTINGS__WIDGET__ITEMS": "[3]"}, {"SYNCER_A.B": "1"}, {"SYNCER_": "1"},
                 {"SYNCER_SETTINGS_MODULE": "x"}, {"SYNCER_renamed_vars": "1"},
                 {"SYNCER_LEADER_ELECTION__dynaconf_merge": "true"}]


def _typed(value: Any) -> Any:
    """``value`` with every type spelled out (1 == True == 1.0 for ==), dicts regardless of their order."""
    if isinstance(value, dict):
        return ("dict", sorted((str(k), _typed(v)) for k, v in value.items()))
    if isinstance(value, list):
        return ("list", [_typed(v) for v in value])
    if isinstance(value, float) and math.isnan(value):
        return ("float", "nan")
    return (type(value).__name__, repr(value))


def _loaded(path: str | None) -> Any:
    try:
        return repr(load_settings(path))
    except SettingsError as e:
        return f"SettingsError: {e}"


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in list(os.environ):
        if name.startswith(f"{ENV_PREFIX}_") or "DYNACONF" in name:
            monkeypatch.delenv(name)
    return monkeypatch


def _cases() -> Iterator[tuple[str, dict[str, str]]]:
    """Every variable with every value over the files the variables interact with, a few values over the rest."""
    for file in FILES:
        yield file, {}
        values = VALUES if file in ("none", "tables", "cased", "nested") else VALUES[::5]
        for name, value in itertools.product(NAMES, values):
            yield file, {f"{ENV_PREFIX}_{name}": value}
        for a, av, b, bv in PAIRS:
            yield file, {f"{ENV_PREFIX}_{a}": av, f"{ENV_PREFIX}_{b}": bv}


def _write(tmp_path: Path, name: str, text: str | None) -> str | None:
    if text is None:
        return None
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return str(path)


def test_the_plain_reader_reads_what_dynaconf_reads(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Every case the plain reader takes gives dynaconf's dict exactly, and the same settings or error."""
    paths = {name: _write(tmp_path, name, text) for name, text in FILES.items()}
    diffs, plain, compared = [], 0, 0
    for file, env in _cases():
        for name, value in env.items():
            clean_env.setenv(name, value)
        path = paths[file]
        doc = _read_toml(path) if path else {}
        stripped = {k[len(ENV_PREFIX) + 1:]: v for k, v in env.items()}
        if reader.plain(path, doc, stripped):
            plain += 1
            ours, theirs = reader.read_raw(path, doc, ENV_PREFIX), reader.read_with_dynaconf(path, ENV_PREFIX)
            if _typed(ours) != _typed(theirs):
                diffs.append((file, env, ours, theirs))
            elif compared % 7 == 0:  # the whole of load_settings on a sample: the same settings or error
                loaded = _loaded(path)
                with pytest.MonkeyPatch.context() as m:
                    m.setattr(reader, "plain", lambda *_: False)
                    if loaded != _loaded(path):
                        diffs.append((file, env, loaded, "load_settings differs"))
            compared += 1
        for name in env:
            clean_env.delenv(name)
    assert not diffs, "\n".join(map(repr, diffs[:20])) + f"\n({len(diffs)} differences in {plain} cases)"
    assert plain >= 2000, f"only {plain} cases were plain"
    print(f"{plain} plain cases, 0 differences")


def test_the_common_settings_are_read_without_dynaconf(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A plain file with the usual variables (scalars, lists, table keys, link variables) never loads dynaconf."""
    path = _write(tmp_path, "s", FILES["plain"] + FILES["tables"])
    env = {"SYNCER_WORKERS": "5", "SYNCER_INCLUDE": '["core/secrets"]', "SYNCER_LEADER_ELECTION__ENABLED": "false",
           "SYNCER_PLUGIN_SETTINGS__WIDGET__PORT": "8443", "SYNCER_PORT": "tcp://10.96.0.10:8080",
           "SYNCER_SERVICE_HOST": "10.96.0.10"}
    code = ("import sys\nfrom syncer.settings import load_settings\n"
            f"s = load_settings({path!r})\nprint(s.workers, 'dynaconf' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=60,
                         env={**env, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["5", "False"]


@pytest.mark.parametrize("file", sorted(NOT_PLAIN_FILES))
def test_dynaconfs_own_file_features_go_to_dynaconf(clean_env: pytest.MonkeyPatch, tmp_path: Path,
                                                      file: str) -> None:
    path = _write(tmp_path, file, NOT_PLAIN_FILES[file])
    assert not reader.plain(path, _read_toml(path or ""), {})


@pytest.mark.parametrize("env", NOT_PLAIN_ENV, ids=lambda e: ",".join(e))
def test_dynaconfs_own_variables_go_to_dynaconf(clean_env: pytest.MonkeyPatch, tmp_path: Path,
                                                env: dict[str, str]) -> None:
    path = _write(tmp_path, "nested", FILES["nested"] + FILES["tables"])
    for name, value in env.items():
        clean_env.setenv(name, value)
    stripped = {k[len(ENV_PREFIX) + 1:]: v for k, v in env.items() if k.startswith(f"{ENV_PREFIX}_")}
    assert not reader.plain(path, _read_toml(path or ""), stripped)


def test_a_local_file_or_another_format_goes_to_dynaconf(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """dynaconf also reads ``<name>.local.toml`` and runs ``dynaconf_hooks.py`` beside the file, and reads a file by
    its extension."""
    path = _write(tmp_path, "settings", "workers = 3\n")
    assert reader.plain(path, {"workers": 3}, {})
    (tmp_path / "settings.local.toml").write_text("workers = 4\n")
    assert not reader.plain(path, {"workers": 3}, {})
    assert load_settings(path).workers == 4
    (tmp_path / "settings.local.toml").unlink()
    (tmp_path / "dynaconf_hooks.py").write_text("def post(settings):\n    return {'WORKERS': 5}\n")
    assert not reader.plain(path, {"workers": 3}, {})
    assert load_settings(path).workers == 5
    other = tmp_path / "settings.yaml"
    other.write_text("")
    assert not reader.plain(str(other), {}, {})


def test_the_file_is_read_as_dynaconf_reads_it(clean_env: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """UTF-8 whatever the locale, line ends untranslated: a lone CR is not TOML for dynaconf either."""
    path = tmp_path / "cr.toml"
    path.write_bytes(b'workers = 3\rlog_level = "DEBUG"\r')
    with pytest.raises(Exception):
        reader.read_with_dynaconf(str(path), ENV_PREFIX)
    with pytest.raises(SettingsError, match="is not valid TOML"):
        load_settings(str(path))
    path.write_bytes('workers = 3\r\nplugin_settings = { p = { s = """né\r\nb""" } }\r\n'.encode())
    assert load_settings(str(path)).plugin_settings == {"p": {"s": "né\nb"}}
    assert reader.read_with_dynaconf(str(path), ENV_PREFIX)["PLUGIN_SETTINGS"] == {"p": {"s": "né\nb"}}
