"""The value checks: each turns a raw value (from the file, the environment or an option) into the typed one, or
raises ``Invalid`` describing a good value. A check also gets the settings checked before it, for a limit relative
to another setting; which setting gets which check is ``schema.py``.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any, Callable, Mapping

from informers.selector import LabelSelector, SelectorError

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)?\s*$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def parse_duration(value: Any) -> float:
    """Seconds from ``15s``, ``500ms``, ``2m``, ``1h`` or a number of seconds; ValueError if it is none of them."""
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        m = _DURATION.match(str(value))
        if not m:
            raise ValueError(f"not a duration: {value!r}")
        seconds = float(m.group(1)) * _UNITS[m.group(2)]
    if not math.isfinite(seconds):
        raise ValueError(f"not a finite duration: {value!r}")
    return seconds


class Invalid(Exception):
    """A value a check rejects: ``expect`` describes a good value, ``detail`` (optional) this value's fault."""

    def __init__(self, expect: str, detail: str = "") -> None:
        super().__init__(expect)
        self.expect = expect
        self.detail = detail


# A check gets the raw value and the settings checked so far (for limits relative to another setting).
Check = Callable[[Any, Mapping[str, Any]], Any]


def string(value: Any, done: Mapping[str, Any]) -> str:
    """Any string."""
    if not isinstance(value, str):
        raise Invalid("a string")
    return value


def boolean(value: Any, done: Mapping[str, Any]) -> bool:
    """true or false (not 0 or 1)."""
    if not isinstance(value, bool):
        raise Invalid("true or false")
    return value


def string_list(value: Any) -> tuple[str, ...] | None:
    """The value as a tuple if it is a list of non-empty strings, else None."""
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) and v.strip() for v in value):
        return tuple(str(v) for v in value)
    return None


def strings(what: str) -> Callable[[Any, Mapping[str, Any]], tuple[str, ...]]:
    """A list of non-empty strings, described as a list of ``what``."""
    def check(value: Any, done: Mapping[str, Any]) -> tuple[str, ...]:
        items = string_list(value)
        if items is None:
            raise Invalid(f"a list of {what}")
        return items
    return check


def parsed_strings(what: str, parse: Callable[[str], object], error: type[Exception]) -> Check:
    """A list of strings that ``parse`` accepts; a rejected one is reported with ``parse``'s own message."""
    def check(value: Any, done: Mapping[str, Any]) -> tuple[str, ...]:
        items = strings(what)(value, done)
        for item in items:
            try:
                parse(item)
            except error as e:
                raise Invalid(f"a list of {what}", str(e)) from None
        return items
    return check


def integer(low: int, high: int) -> Check:
    """An integer (not a boolean) from ``low`` to ``high``."""
    def check(value: Any, done: Mapping[str, Any]) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise Invalid(f"an integer from {low} to {high}")
        return value
    return check


def duration(*, zero_means: str = "", below: str = "", at_least: str = "") -> Check:
    """A duration > 0 (or >= 0 when ``zero_means`` says what 0 does), < setting ``below`` and >= setting
    ``at_least`` if given."""
    def check(value: Any, done: Mapping[str, Any]) -> float:
        limit = done[below] if below else math.inf
        floor = done[at_least] if at_least else 0.0
        expect = "a duration " + (f">= 0 (0 {zero_means})" if zero_means else "> 0")
        if below:
            expect += f" and < {below.rpartition('.')[2]} ({format_seconds(limit)})"
        if at_least:
            expect += f" and >= {at_least.rpartition('.')[2]} ({format_seconds(floor)})"
        try:
            seconds = parse_duration(value)
        except ValueError:
            raise Invalid(f"{expect}, like '15s', '500ms' or '2m'") from None
        if not (seconds >= 0 if zero_means else seconds > 0) or seconds >= limit or seconds < floor:
            raise Invalid(expect)
        return seconds
    return check


def format_seconds(value: float) -> str:
    """A duration as the settings write it: ``15s``."""
    return f"{value:g}s"


def dns_name(kind: str, empty_means: str = "") -> Check:
    """A DNS-1123 ``label`` or ``subdomain`` (dot-separated labels), as Kubernetes names must be."""
    max_len = 253 if kind == "subdomain" else 63
    expect = (f"a DNS-1123 {kind} (at most {max_len} characters: lowercase letters, digits and '-'"
              f"{', and dots' if kind == 'subdomain' else ''}, starting and ending with a letter or digit)"
              f"{f', or an empty string for {empty_means}' if empty_means else ''}")

    def check(value: Any, done: Mapping[str, Any]) -> str:
        if value == "" and empty_means:
            return ""
        if not isinstance(value, str) or len(value) > max_len or not all(
                len(label) <= 63 and _DNS_LABEL.match(label)
                for label in (value.split(".") if kind == "subdomain" else [value])):
            raise Invalid(expect)
        return value
    return check


def host_port(value: Any, done: Mapping[str, Any]) -> str:
    """``host:port``, the port from 1 to 65535."""
    host, _, port = value.rpartition(":") if isinstance(value, str) else ("", "", "")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise Invalid("host:port with a port from 1 to 65535, like '127.0.0.1:8080' or '0.0.0.0:8080'")
    return str(value)


def choice(options: tuple[str, ...]) -> Check:
    """One of ``options``, in any case; returned as written in ``options``."""
    def check(value: Any, done: Mapping[str, Any]) -> str:
        for option in options:
            if isinstance(value, str) and value.strip().lower() == option.lower():
                return option
        raise Invalid(f"one of {', '.join(options)} (any case)")
    return check


def existing(kind: str) -> Check:
    """The path of an existing ``kind`` ("file" or "directory"), or ``""`` for none."""
    def check(value: Any, done: Mapping[str, Any]) -> str:
        expect = f"the path of an existing {kind} or an empty string"
        if not isinstance(value, str):
            raise Invalid(expect)
        if value and not (Path(value).is_dir() if kind == "directory" else Path(value).is_file()):
            raise Invalid(expect, "it does not exist")
        return value
    return check


def auto_or_boolean(value: Any, done: Mapping[str, Any]) -> bool | str:
    """true, false or ``"auto"``."""
    if isinstance(value, bool):
        return value
    if value == "auto":
        return "auto"
    raise Invalid("true, false or \"auto\"")


def dns_labels(value: Any, done: Mapping[str, Any]) -> tuple[str, ...]:
    """A list of namespace names (DNS-1123 labels); ``[]`` for all namespaces."""
    expect = "a list of namespace names (DNS-1123 labels), or [] for all namespaces"
    if not isinstance(value, (list, tuple)):
        raise Invalid(expect)
    label = dns_name("label")
    for v in value:
        try:
            label(v, done)
        except Invalid:
            raise Invalid(expect, f"{v!r} is not a DNS-1123 label") from None
    return tuple(value)


def label_selector(value: Any, done: Mapping[str, Any]) -> str:
    """A label selector (``""``: every object)."""
    expect = "a label selector, like 'env=prod,tier!=test', or an empty string for every object"
    if not isinstance(value, str):
        raise Invalid(expect)
    try:
        LabelSelector.parse(value)
    except SelectorError as e:
        raise Invalid(expect, str(e)) from None
    return value
