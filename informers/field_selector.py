"""Kubernetes field selectors: parse the string syntax (``spec.nodeName=a,status.phase!=Failed``) and match
objects by it.

The server supports a few fields per resource (``metadata.name`` and ``metadata.namespace`` everywhere); a
selector it is sent must stay within those. Matched here, any dotted path of the object works, a missing field
being the empty string, as the server's own field sets have it. Values escape ``\\``, ``,`` and ``=`` with a
backslash, as apimachinery's ``fields.EscapeValue`` writes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from .selector import SelectorError


@dataclass(frozen=True)
class FieldRequirement:
    """``field op value``, op ``=`` or ``!=`` (``==`` is read as ``=``)."""

    field: str
    op: str
    value: str

    def matches(self, obj: Mapping[str, Any]) -> bool:
        """Whether ``obj``'s field (``""`` when missing, text of a number or boolean otherwise) satisfies this."""
        found: Any = obj
        for part in self.field.split("."):
            found = found.get(part) if isinstance(found, Mapping) else None
        text = "" if found is None else str(found).lower() if isinstance(found, bool) else str(found)
        return (text == self.value) == (self.op == "=")


@dataclass(frozen=True)
class FieldSelector:
    """A parsed field selector: every requirement must hold. Empty selects everything."""

    requirements: tuple[FieldRequirement, ...] = ()

    @classmethod
    def parse(cls, text: str | None) -> "FieldSelector":
        """Parse ``text``; SelectorError quotes it and says what is wrong."""
        requirements = []
        for term in _split(text or "", ","):
            if not term.strip():
                raise SelectorError(f"field selector {text!r}: an empty term")
            key, op, value = _operator(term)
            if not op:
                raise SelectorError(f"field selector {text!r}: term {term!r} is not field=value or field!=value")
            key = key.strip()
            if not key or not all(part and part[0].isalpha() and "\\" not in part for part in key.split(".")):
                raise SelectorError(f"field selector {text!r}: {key!r} is not a field path such as spec.nodeName")
            if _operator(value)[1]:
                raise SelectorError(f"field selector {text!r}: value {value!r} has an unescaped '=' (write \\=)")
            requirements.append(FieldRequirement(key, "!=" if op == "!=" else "=", _unescape(value)))
        return cls(tuple(requirements))

    def matches(self, obj: Mapping[str, Any]) -> bool:
        """Whether ``obj`` satisfies every requirement."""
        return all(r.matches(obj) for r in self.requirements)

    def __str__(self) -> str:
        return ",".join(f"{r.field}{r.op}{_escape(r.value)}" for r in self.requirements)

    def __bool__(self) -> bool:
        return bool(self.requirements)


def _split(text: str, sep: str) -> list[str]:
    """``text`` split at unescaped ``sep`` (escapes kept)."""
    parts, current, escaped = [], "", False
    for ch in text:
        if escaped:
            current += "\\" + ch
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch == sep:
            parts.append(current)
            current = ""
        else:
            current += ch
    if escaped:
        raise SelectorError(f"field selector {text!r}: it ends in a lone backslash")
    return [*parts, current] if text else []


def _operator(term: str) -> tuple[str, str, str]:
    """``term`` split at its first unescaped operator (``!=``, ``==`` or ``=``): key, operator, value."""
    i = 0
    while i < len(term):
        if term[i] == "\\":
            i += 2
            continue
        for op in ("!=", "==", "="):
            if term.startswith(op, i):
                return term[:i], op, term[i + len(op):]
        i += 1
    return term, "", ""


def _unescape(value: str) -> str:
    out, escaped = "", False
    for ch in value:
        if escaped:
            if ch not in "\\,=":
                raise SelectorError(f"field selector value {value!r}: invalid escape \\{ch}")
            out += ch
            escaped = False
        elif ch == "\\":
            escaped = True
        else:
            out += ch
    return out


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=")
