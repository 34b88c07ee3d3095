"""Settings: a TOML file plus ``SYNCER_*`` environment variables, read by dynaconf and validated at start.

Every mistake is reported as a ``SettingsError`` that names the setting, what was wrong and how to fix it.
"""

from __future__ import annotations

import os
import re
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from dynaconf import Dynaconf
from dynaconf.validator import ValidationError, Validator

ENV_PREFIX = "SYNCER"
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


class SettingsError(Exception):
    """A bad setting: the message names it and says how to fix it."""


@dataclass(frozen=True)
class LeaderElection:
    """Lease-based leader election (controller-runtime's defaults)."""

    enabled: bool = False
    lease_name: str = "kube-syncer"
    lease_namespace: str = "default"
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0


@dataclass(frozen=True)
class Settings:
    """The validated, typed settings of a syncer process."""

    kubeconfig: str = ""
    context: str = ""
    in_cluster: bool = False
    plugins: tuple[str, ...] = ()
    include: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    namespace: str = ""
    rediscovery_interval: float = 60.0
    resync: float = 0.0
    workers: int = 2
    check_permissions: bool = False
    http_bind: str = "127.0.0.1:8080"
    log_level: str = "INFO"
    log_format: str = "text"
    shutdown_timeout: float = 20.0
    start_timeout: float = 60.0
    leader_election: LeaderElection = field(default_factory=LeaderElection)
    plugin_settings: dict[str, dict[str, Any]] = field(default_factory=dict)
    source: str = ""

    def masked(self) -> dict[str, Any]:
        """The effective settings as a dict, with anything secret-looking masked."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, LeaderElection):
                value = {g.name: getattr(value, g.name) for g in fields(value)}
            out[f.name] = _mask(f.name, value)
        return out


def _mask(key: str, value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _mask(k, v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_mask(key, v) for v in value]
    if value and re.search(r"token|password|secret|key", key, re.I):
        return "***"
    return value


def parse_duration(value: Any, name: str) -> float:
    """Seconds from ``15s``, ``500ms``, ``2m``, ``1h`` or a plain number; SettingsError names the setting."""
    if isinstance(value, bool):
        raise SettingsError(f"setting {name!r}: expected a duration like '15s' or '500ms', got {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        m = _DURATION.match(str(value))
        if not m:
            raise SettingsError(f"setting {name!r}: expected a duration like '15s', '500ms' or '2m', got {value!r}")
        seconds = float(m.group(1)) * _UNITS[m.group(2)]
    if seconds < 0:
        raise SettingsError(f"setting {name!r}: a duration cannot be negative ({value!r})")
    return seconds


def _where(name: str) -> str:
    return f"set it in the settings file or in {ENV_PREFIX}_{name.upper().replace('.', '__')}"


def _v(names: tuple[str, ...], expect: str, **ops: Any) -> Validator:
    message = f"setting {{name!r}} must be {expect}, got {{value!r}}"
    return Validator(*names, messages={"operations": message}, **ops)


_VALIDATORS = [
    _v(("kubeconfig", "context", "namespace", "http_bind", "log_level", "log_format"), "a string", is_type_of=str),
    _v(("in_cluster", "check_permissions", "leader_election.enabled"), "true or false", is_type_of=bool),
    _v(("workers",), "an integer", is_type_of=int),
    _v(("workers",), "at least 1", gte=1),
    _v(("plugins", "include", "exclude"), "a list of strings", is_type_of=(list, tuple)),
    _v(("log_format",), "'text' or 'json'", is_in=["text", "json"]),
    _v(("log_level",), "a log level (DEBUG, INFO, WARNING, ERROR, ...)",
       is_in=["TRACE", "DEBUG", "INFO", "SUCCESS", "WARNING", "ERROR", "CRITICAL"]),
    _v(("plugin_settings",), "a table of per-plugin tables", is_type_of=dict),
    _v(("leader_election.lease_name", "leader_election.lease_namespace"), "a string", is_type_of=str),
]


def load_settings(path: str | None = None, overrides: dict[str, Any] | None = None) -> Settings:
    """Read ``path`` (if given) and ``SYNCER_*`` variables, validate, and return typed Settings."""
    names: dict[str, str] = {}  # setting -> where it came from, to name the culprit of an unknown one
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise SettingsError(f"settings file {path!r} does not exist")
        try:
            doc = tomllib.loads(p.read_text())
        except (OSError, ValueError) as e:
            raise SettingsError(f"settings file {path!r} is not valid TOML: {e}") from None
        names.update((k.lower(), f"settings file {path!r}") for k in doc)
    names.update((k[len(ENV_PREFIX) + 1:].split("__")[0].lower(), f"environment variable {k}")
                 for k in os.environ if k.startswith(ENV_PREFIX + "_"))
    known = {f.name for f in fields(Settings)} - {"source"}
    for name, origin in sorted(names.items()):
        if name not in known:
            raise SettingsError(f"unknown setting {name!r} in {origin}: known settings are {', '.join(sorted(known))}")
    raw = Dynaconf(envvar_prefix=ENV_PREFIX, settings_files=[path] if path else [], environments=False,
                   merge_enabled=True)
    for key, value in (overrides or {}).items():
        raw.set(key, value)
    try:
        raw.validators.register(*_VALIDATORS)
        raw.validators.validate()
    except ValidationError as e:
        raise SettingsError(_explain(e)) from None
    return _typed(raw, path)


def _explain(e: ValidationError) -> str:
    text = str(e)
    name = re.search(r"setting '([^']+)'", text)
    return f"{text}; {_where(name.group(1))}" if name else text


def _typed(raw: Dynaconf, path: str | None) -> Settings:
    le = raw.get("leader_election") or {}
    unknown_le = sorted(set(le) - {f.name for f in fields(LeaderElection)})
    if unknown_le:
        raise SettingsError(f"unknown setting 'leader_election.{unknown_le[0]}': known are "
                            f"{', '.join(f.name for f in fields(LeaderElection))}")
    leader = LeaderElection(
        enabled=bool(le.get("enabled", False)),
        lease_name=str(le.get("lease_name", "kube-syncer")),
        lease_namespace=str(le.get("lease_namespace", "default")),
        lease_duration=parse_duration(le.get("lease_duration", 15), "leader_election.lease_duration"),
        renew_deadline=parse_duration(le.get("renew_deadline", 10), "leader_election.renew_deadline"),
        retry_period=parse_duration(le.get("retry_period", 2), "leader_election.retry_period"),
    )
    if not leader.retry_period < leader.renew_deadline < leader.lease_duration:
        raise SettingsError("leader_election: retry_period < renew_deadline < lease_duration must hold (got "
                            f"{leader.retry_period:g}s, {leader.renew_deadline:g}s, {leader.lease_duration:g}s)")
    bind = str(raw.get("http_bind", "127.0.0.1:8080"))
    host, _, port = bind.rpartition(":")
    if not host or not port.isdigit():
        raise SettingsError(f"setting 'http_bind': expected host:port, got {bind!r}; {_where('http_bind')}")
    settings = Settings(
        kubeconfig=str(raw.get("kubeconfig", "")),
        context=str(raw.get("context", "")),
        in_cluster=bool(raw.get("in_cluster", False)),
        plugins=tuple(str(p) for p in raw.get("plugins", ())),
        include=tuple(str(p) for p in raw.get("include", ())),
        exclude=tuple(str(p) for p in raw.get("exclude", ())),
        namespace=str(raw.get("namespace", "")),
        rediscovery_interval=parse_duration(raw.get("rediscovery_interval", 60), "rediscovery_interval"),
        resync=parse_duration(raw.get("resync", 0), "resync"),
        workers=int(raw.get("workers", 2)),
        check_permissions=bool(raw.get("check_permissions", False)),
        http_bind=bind,
        log_level=str(raw.get("log_level", "INFO")),
        log_format=str(raw.get("log_format", "text")),
        shutdown_timeout=parse_duration(raw.get("shutdown_timeout", 20), "shutdown_timeout"),
        start_timeout=parse_duration(raw.get("start_timeout", 60), "start_timeout"),
        leader_election=leader,
        plugin_settings={str(k).lower(): dict(v) for k, v in (raw.get("plugin_settings") or {}).items()},
        source=path or "",
    )
    if settings.kubeconfig and not Path(settings.kubeconfig).expanduser().is_file():
        raise SettingsError(f"setting 'kubeconfig': file {settings.kubeconfig!r} does not exist; "
                            f"{_where('kubeconfig')}")
    if settings.rediscovery_interval <= 0:
        raise SettingsError("setting 'rediscovery_interval' must be positive")
    return settings
