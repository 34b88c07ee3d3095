"""Loading the settings: a TOML file plus ``SYNCER_*`` environment variables, read as dynaconf reads them
(``reader.py``) and validated at load time.

An environment value replaces the file's (lists and scalars; a table's keys are set one by one with
``SYNCER_TABLE__KEY``), as dynaconf does by default and as ``kubectl`` or Helm's ``--set`` would; adding to a
list is explicit: ``SYNCER_INCLUDE='@merge ["core/secrets"]'``. The variables Kubernetes injects for a Service
whose name starts with ``syncer`` (``SYNCER_PORT=tcp://...``, ``SYNCER_SERVICE_HOST``, ...) are not settings:
they are ignored, with a DEBUG line, unless one is a setting's own variable.

Every setting is checked for type and range by one table (``schema.py``), so that ``syncer check-config``
rejects exactly what ``syncer run`` would, before anything connects. A mistake is a ``SettingsError`` whose message
names the setting, what a good value looks like, the bad value, and where to fix it.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import tomllib
from dataclasses import dataclass, fields, replace
from operator import attrgetter
from pathlib import Path
from typing import Any, Mapping

from loguru import logger

from .checks import Invalid, format_seconds
from .reader import read_raw
from .schema import CHECKS, TABLES
from .tables import Settings

ENV_PREFIX = "SYNCER"
# Docker-links style variables of a Service <NAME>: <NAME>_SERVICE_HOST, <NAME>_SERVICE_PORT[_<PORT NAME>],
# <NAME>_PORT, <NAME>_PORT_<port>_<PROTO>[_PROTO|_PORT|_ADDR], with <NAME> upper-cased, "-" as "_".
_SERVICE_LINK = re.compile(rf"{ENV_PREFIX}(?:_[A-Z0-9_]+)?_(?:SERVICE_HOST|SERVICE_PORT(?:_[A-Z0-9_]+)?|PORT"
                           r"(?:_\d+_(?:TCP|UDP|SCTP)(?:_PROTO|_PORT|_ADDR)?)?)")
# The CLI's default for --settings; it names the file, it is not a setting.
SETTINGS_ENV = f"{ENV_PREFIX}_SETTINGS"


class SettingsError(Exception):
    """A bad setting: the message names it and says how to fix it."""



def env_var(name: str) -> str:
    """The environment variable that sets a (dotted) setting: ``leader_election.enabled`` ->
    ``SYNCER_LEADER_ELECTION__ENABLED``."""
    return f"{ENV_PREFIX}_{name.upper().replace('.', '__')}"


def origin_of(name: str, path: str | None) -> str | None:
    """Where setting ``name`` is given when read with the settings file ``path``: its environment variable, the
    file, or None (its default)."""
    if env_var(name) in os.environ:
        return f"environment variable {env_var(name)}"
    if path is not None and name in {_setting_name(k) for k in flatten(_read_toml(path))}:
        return f"settings file {path!r}"
    return None


def _setting_name(key: str) -> str:
    """The setting (as in ``CHECKS``) a dotted key of the file or the environment belongs to: the key of the
    innermost table it is in (``clusters.cluster_api.namespaces``), or its first part outside tables."""
    key = key.lower()
    table = max((t for t in TABLES if key.startswith(f"{t}.")), key=len, default="")
    rest = key[len(table) + 1:] if table else key
    return f"{table}.{rest.partition('.')[0]}" if table else rest.partition(".")[0]


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
    for name, check in CHECKS.items():
        given = name in values
        value = values[name] if given else attrgetter(name)(defaults)
        try:
            checked[name] = check(value, checked)
        except Invalid as e:
            shown = format_seconds(value) if isinstance(value, float) else list(value) if isinstance(value, tuple) \
                else value
            got = repr(value) if given else f"its default {shown!r}"
            detail = f" ({e.detail})" if e.detail else ""
            raise SettingsError(f"setting {name!r} must be {e.expect}, got {got}{detail}; {origins.fix(name)}") \
                from None
    settings: Settings = _build(Settings(), checked)
    return replace(settings, source=path or "")


def _build(default: Any, checked: Mapping[str, Any], prefix: str = "") -> Any:
    """The table ``default`` (a dataclass) with the checked settings under ``prefix``, its tables built likewise."""
    values = {}
    for f in fields(default):
        name = prefix + f.name
        if name in TABLES:
            values[f.name] = _build(getattr(default, f.name), checked, f"{name}.")
        elif name in checked:
            values[f.name] = checked[name]
    return replace(default, **values)


def settings_reference() -> str:
    """Every setting as a Markdown table (name, default, what it must be, environment variable), made from the
    checks that ``load_settings`` runs, so documentation built from it cannot drift from what is enforced: a
    check's own message for a value of the wrong type is its description."""
    defaults = Settings()
    done: dict[str, Any] = {}
    rows = ["| setting | default | must be | environment variable |", "| --- | --- | --- | --- |"]
    for name, check in CHECKS.items():
        default = attrgetter(name)(defaults)
        try:
            check(_NOT_A_VALUE, done)
        except Invalid as e:
            expect = e.expect
        done[name] = check(default, done)
        shown = format_seconds(default) if isinstance(default, float) else json.dumps(
            list(default) if isinstance(default, tuple) else default)
        rows.append(f"| `{name}` | `{shown}` | {expect} | `{env_var(name)}` |")
    return "\n".join(rows) + "\n"


class _NotAValue:
    """What no check accepts: asking a check about it yields the check's description."""


_NOT_A_VALUE = _NotAValue()


def _reject_unknown(values: Mapping[str, Any], origins: _Origins) -> None:
    for name in sorted(set(values) - set(CHECKS)):
        if name in TABLES:
            raise SettingsError(f"setting {name!r} must be a table [{name}] of settings, got {values[name]!r}; "
                                f"{origins.fix(name)}")
        table, _, key = name.rpartition(".")
        known = sorted({n[len(table) + 1:].partition(".")[0] for n in CHECKS if n.startswith(f"{table}.")} if table
                       else {n.partition(".")[0] for n in CHECKS})
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
    own = {env_var(name) for name in CHECKS}
    # A "__" is a table's key (SYNCER_PLUGIN_SETTINGS__WIDGET__PORT), never a Service's name.
    found = frozenset(k for k in os.environ if k not in own and "__" not in k and _SERVICE_LINK.fullmatch(k))
    for name in sorted(found):
        logger.debug("ignoring environment variable {}: a Service's link variable, not a setting", name)
    return found


def _read(path: str | None, ignored: frozenset[str] = frozenset()) -> dict[str, Any]:
    """The raw settings of the file with the environment's over them, by (dotted) setting name, without the
    ``ignored`` variables."""
    doc = _read_toml(path) if path is not None else {}
    try:
        raw = read_raw(path, doc, ENV_PREFIX)
    except Exception as e:  # dynaconf raises many types, e.g. for a bad '@cast' in an environment variable
        raise SettingsError(f"cannot read the settings: {type(e).__name__}: {e}") from None
    for name in ignored:  # read as top-level keys, as every SYNCER_* variable is
        raw.pop(name[len(ENV_PREFIX) + 1:], None)
    values = {_setting_name(k): v for k, v in flatten(raw).items()}
    if "settings" not in {_setting_name(k) for k in flatten(doc)}:
        values.pop("settings", None)  # SETTINGS_ENV was read as a setting too
    return values


def _read_toml(path: str) -> dict[str, Any]:
    p = Path(path)
    if not p.exists():
        raise SettingsError(f"settings file {path!r} does not exist")
    try:
        # As dynaconf reads it: UTF-8 whatever the locale, and no newline translation (a lone CR is not TOML).
        return tomllib.loads(p.read_bytes().decode())
    except OSError as e:
        raise SettingsError(f"settings file {path!r} cannot be read: {e.strerror or e}") from None
    except ValueError as e:  # TOMLDecodeError, or UnicodeDecodeError for a binary file
        raise SettingsError(f"settings file {path!r} is not valid TOML: {e}") from None


def flatten(doc: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Top-level keys, except that each key of a settings table (``[leader_election]``, ``[clusters.cluster_api]``)
    becomes ``table.key``; a table given as something else stays one key, for its check to reject."""
    out: dict[str, Any] = {}
    for key, value in doc.items():
        if f"{prefix}{key}".lower() in TABLES and isinstance(value, Mapping):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out
