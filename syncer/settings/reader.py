"""Reading the raw settings: a TOML file with the ``SYNCER_*`` environment variables over it, as dynaconf reads
them, without importing dynaconf (~3.8 MiB of start-up RSS) unless the settings use one of its own features.

The plain reader covers what settings normally are: a ``.toml`` file of plain values, variables whose names are
keys (``SYNCER_WORKERS``, ``SYNCER_LEADER_ELECTION__ENABLED``) and whose values are TOML literals or strings. It
returns what ``Dynaconf(...).as_dict()`` returns for them (top-level keys upper-cased, a ``__`` path set into the
file's tables with the file's casing, a value replacing the file's), which tests/syncer/test_settings_reader.py
checks case by case against dynaconf. Whatever only dynaconf gives meaning to goes to dynaconf: ``@`` values
(``@int``, ``@json``, ``@merge``, ``@format``, ...), ``dynaconf_*`` keys and merge markers, variables that
configure dynaconf (``*_FOR_DYNACONF``, ``DYNACONF_*`` and their deprecated names), a ``*.local.toml`` or a
``dynaconf_hooks.py`` beside the file, a file dynaconf would not read as TOML, and the few shapes whose outcome depends on dynaconf's merge order
or casing rules (keys differing only in case, one variable's path inside another's, a ``__`` path ending where
the file has a list or table too).
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# Names dynaconf reads for itself, as variables or as keys (which its as_dict() then drops); RENAMED_VARS of
# dynaconf.utils has the old names without the marker.
_DYNACONF_NAMES = re.compile(r".*DYNACONF.*|SETTINGS_MODULE|PROJECT_ROOT|RENAMED_VARS")
_KEY = re.compile(r"[A-Za-z0-9_-]+")
_GLOB = re.compile(r"[*?\[\],;]")  # a glob or a list separator in the file's path


def read_raw(path: str | None, doc: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """The settings of the file ``path`` (already parsed as ``doc``) with the ``<prefix>_*`` variables over them,
    as dynaconf's ``as_dict()`` has them; dynaconf reads them when only it can (see the module's docstring)."""
    env = {k[len(prefix) + 1:]: v for k, v in os.environ.items() if k.startswith(f"{prefix}_")}
    if plain(path, doc, env):
        return _plain(doc, env)
    return read_with_dynaconf(path, prefix)


def read_with_dynaconf(path: str | None, prefix: str) -> dict[str, Any]:
    """The file and the variables read by dynaconf (its errors are raised as they are)."""
    from dynaconf import Dynaconf

    # Absolute: dynaconf looks a relative name up from its caller's directory and its parents first, so
    # ``--settings s.toml`` would read any s.toml above the installed package instead of the one in the
    # working directory.
    return dict(Dynaconf(envvar_prefix=prefix, settings_files=[str(Path(path).resolve())] if path else [],
                         environments=False, merge_enabled=False).as_dict())


def plain(path: str | None, doc: Mapping[str, Any], env: Mapping[str, str]) -> bool:
    """Whether the plain reader gives what dynaconf would for the file ``path`` (parsed: ``doc``) and the
    variables ``env`` (their names without the prefix)."""
    if any(_DYNACONF_NAMES.fullmatch(name) for name in os.environ):
        return False
    if any(_DYNACONF_NAMES.fullmatch(str(key).upper().partition("__")[0]) for key in [*doc, *env]):
        return False
    if path is not None:
        p = Path(path).resolve()
        if p.suffix != ".toml" or _GLOB.search(str(p)) or p.with_name(f"{p.stem}.local.toml").exists() or \
                p.with_name("dynaconf_hooks.py").exists():  # dynaconf runs it after loading the file
            return False
    if not all(_KEY.fullmatch(k) and "." not in k and "__" not in k for k in doc) or not _plain_values(doc):
        return False
    paths = []
    for name, value in env.items():
        parts = name.split("__")
        if not all(_KEY.fullmatch(p) for p in parts) or "dynaconf" in name.lower() or value.startswith("@"):
            return False
        parsed = _literal(value)
        if not _plain_values(parsed):
            return False
        if len(parts) > 1 and isinstance(_at(doc, parts), (list, dict)) and isinstance(parsed, (list, dict)):
            return False  # dynaconf may merge the two, or not, by how its lookup of the path goes
        paths.append([p.lower() for p in parts])
    # One variable's path equal to or inside another's: the outcome would depend on the environment's order.
    return not any(a != b and a[:len(b)] == b or a is not b and a == b for a in paths for b in paths)


def _plain_values(value: Any) -> bool:
    """No ``@`` string, no ``dynaconf`` key or marker, no keys differing only in case, anywhere in ``value``."""
    if isinstance(value, str):
        return not value.startswith("@") and "dynaconf" not in value.lower()
    if isinstance(value, list):
        return all(_plain_values(v) for v in value)
    if isinstance(value, dict):
        keys = [str(k).lower() for k in value]
        return len(set(keys)) == len(keys) and not any("dynaconf" in k for k in keys) and \
            all(_plain_values(v) for v in value.values())
    return True


def _at(doc: Mapping[str, Any], parts: list[str]) -> Any:
    """The file's value at a variable's path (keys matched regardless of case), None if there is none."""
    value: Any = doc
    for part in parts:
        if not isinstance(value, Mapping):
            return None
        value = next((v for k, v in value.items() if k.lower() == part.lower()), None)
    return value


def _literal(value: str) -> Any:
    """A variable's value as dynaconf parses it: ``True``/``False`` as TOML's booleans, then a TOML literal
    (``5``, ``true``, ``["a"]``, ``{ a = 1 }``, ``"quoted"``), else the string itself."""
    if value and value.strip() in ("True", "False"):
        value = value.lower()
    try:
        return tomllib.loads(f"key={value}")["key"]
    except (tomllib.TOMLDecodeError, KeyError):
        return value


def _plain(doc: Mapping[str, Any], env: Mapping[str, str]) -> dict[str, Any]:
    """The file's keys upper-cased at the top level, each variable's value set at its path: a ``__`` path into the
    file's tables (their keys' casing kept; the variable's own for new keys), replacing what is there."""
    raw: dict[str, Any] = {k.upper(): _copy(v) for k, v in doc.items()}
    for name, value in env.items():
        head, *rest = name.split("__")
        tree = raw
        key = head.upper()
        for part in rest:
            if not isinstance(tree.get(key), dict):
                tree[key] = {}
            tree = tree[key]
            key = next((k for k in tree if k.lower() == part.lower()), part)
        tree[key] = _literal(value)
    return raw


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    return [_copy(v) for v in value] if isinstance(value, list) else value
