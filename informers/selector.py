"""Kubernetes label selectors: parse the string syntax, convert metav1.LabelSelector objects, match label maps."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

_TOKEN = re.compile(r"\s*(!=|==|=|!|\(|\)|,|[A-Za-z0-9][-A-Za-z0-9_./]*|\S)")
_WORD = re.compile(r"[A-Za-z0-9][-A-Za-z0-9_./]*\Z")
# Kubernetes' own rules for label keys (an optional DNS-subdomain prefix and a name) and values, so that what
# from_spec accepts the API server accepts too, and its text parses back.
_LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]\Z")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
# metav1.LabelSelectorOperator -> our Requirement op.
_OPERATORS = {"In": "in", "NotIn": "notin", "Exists": "exists", "DoesNotExist": "!"}


class SelectorError(ValueError):
    """A malformed label selector; the message quotes the selector and what was expected where."""


@dataclass(frozen=True)
class Requirement:
    """One clause: ``key op values`` with op in ``=``, ``!=``, ``in``, ``notin``, ``exists``, ``!``."""

    key: str
    op: str
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether a label map satisfies this clause."""
        if self.op == "exists":
            return self.key in labels
        if self.op == "!":
            return self.key not in labels
        if self.op in ("=", "in"):
            return labels.get(self.key) in self.values
        # != and notin also match objects without the key, as in Kubernetes.
        return labels.get(self.key) not in self.values


@dataclass(frozen=True)
class LabelSelector:
    """A parsed selector; an empty one matches everything. ``str()`` gives the canonical text."""

    requirements: tuple[Requirement, ...] = ()
    text: str = ""

    @classmethod
    def parse(cls, text: str | None) -> "LabelSelector":
        """Parse ``a=b,c!=d,e in (x,y),f notin (z),g,!h``; raise SelectorError if malformed."""
        if not text or not text.strip():
            return cls()
        return cls(tuple(_Parser(text).parse()), text)

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any] | None) -> "LabelSelector":
        """Convert a ``metav1.LabelSelector`` (``matchLabels`` and ``matchExpressions`` with In, NotIn, Exists,
        DoesNotExist) into a selector whose text is the equivalent string form.

        None and ``{}`` select everything (Go's ``LabelSelectorAsSelector`` turns nil into "nothing"; an absent
        selector in a spec means "no filter" to its users). Malformed input raises SelectorError naming the field
        (``matchExpressions[1].values``) and what was expected.
        """
        if spec is None:
            return cls()
        if not isinstance(spec, Mapping):
            raise SelectorError(f"label selector: expected an object, got {type(spec).__name__}")
        reqs: list[Requirement] = []
        parts: list[str] = []
        match_labels = spec.get("matchLabels")
        if match_labels is not None:
            if not isinstance(match_labels, Mapping):
                raise SelectorError(f"matchLabels: expected an object, got {type(match_labels).__name__}")
            for key in sorted(match_labels, key=str):
                value = match_labels[key]
                _check_key(key, f"matchLabels key {key!r}")
                _check_value(value, f"matchLabels[{key!r}]")
                reqs.append(Requirement(key, "=", frozenset([value])))
                parts.append(f"{key}={value}")
        expressions = spec.get("matchExpressions")
        if expressions is not None:
            if not isinstance(expressions, list):
                raise SelectorError(f"matchExpressions: expected a list, got {type(expressions).__name__}")
            for i, expr in enumerate(expressions):
                req = _expression(expr, f"matchExpressions[{i}]")
                reqs.append(req)
                parts.append(_requirement_text(req))
        return cls(tuple(reqs), ",".join(parts))

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        """Whether a label map (``metadata.labels``, possibly None) satisfies every clause."""
        lbl = labels or {}
        return all(r.matches(lbl) for r in self.requirements)

    def __str__(self) -> str:
        return self.text

    def __bool__(self) -> bool:
        return bool(self.requirements)


def _check_key(key: Any, field: str) -> None:
    if not isinstance(key, str):
        raise SelectorError(f"{field}: a label key must be a string, got {type(key).__name__}")
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix)):
        raise SelectorError(f"{field}: the prefix of label key {key!r} must be a DNS-1123 subdomain")
    if len(name) > 63 or not _LABEL_NAME.match(name):
        raise SelectorError(f"{field}: label key {key!r} must be at most 63 characters (after an optional "
                            "prefix/), alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric")


def _check_value(value: Any, field: str) -> None:
    if not isinstance(value, str):
        raise SelectorError(f"{field}: a label value must be a string, got {type(value).__name__} {value!r}")
    if value and (len(value) > 63 or not _LABEL_NAME.match(value)):
        raise SelectorError(f"{field}: label value {value!r} must be empty or at most 63 characters, "
                            "alphanumerics, '-', '_' or '.', starting and ending with an alphanumeric")


def _expression(expr: Any, field: str) -> Requirement:
    if not isinstance(expr, Mapping):
        raise SelectorError(f"{field}: expected an object with key, operator and values, got {type(expr).__name__}")
    key = expr.get("key")
    if key is None:
        raise SelectorError(f"{field}.key: required")
    _check_key(key, f"{field}.key")
    operator = expr.get("operator")
    op = _OPERATORS.get(operator) if isinstance(operator, str) else None
    if op is None:
        raise SelectorError(f"{field}.operator: {operator!r} is not one of In, NotIn, Exists, DoesNotExist")
    values = expr.get("values")
    if values is None:
        values = []
    if not isinstance(values, list):
        raise SelectorError(f"{field}.values: expected a list of strings, got {type(values).__name__}")
    for j, value in enumerate(values):
        _check_value(value, f"{field}.values[{j}]")
    if op in ("in", "notin") and not values:
        raise SelectorError(f"{field}.values: must be non-empty when operator is {operator}")
    if op in ("exists", "!") and values:
        raise SelectorError(f"{field}.values: must be empty when operator is {operator}")
    return Requirement(key, op, frozenset(values))


def _requirement_text(req: Requirement) -> str:
    if req.op == "exists":
        return req.key
    if req.op == "!":
        return f"!{req.key}"
    return f"{req.key} {req.op} ({','.join(sorted(req.values))})"


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.tokens = [m.group(1) for m in _TOKEN.finditer(text)]
        self.i = 0

    def fail(self, expected: str) -> SelectorError:
        got = self.tokens[self.i] if self.i < len(self.tokens) else "end of input"
        return SelectorError(f"invalid label selector {self.text!r}: expected {expected}, got {got!r}")

    def take(self) -> str | None:
        tok = self.tokens[self.i] if self.i < len(self.tokens) else None
        self.i += 1
        return tok

    def peek(self) -> str | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def word(self, what: str) -> str:
        tok = self.peek()
        if tok is None or not _WORD.match(tok) or tok in ("in", "notin"):
            raise self.fail(what)
        self.i += 1
        return tok

    def parse(self) -> list[Requirement]:
        reqs = []
        while True:
            reqs.append(self.requirement())
            tok = self.take()
            if tok is None:
                return reqs
            if tok != ",":
                self.i -= 1
                raise self.fail("',' or end of input")

    def requirement(self) -> Requirement:
        if self.peek() == "!":
            self.i += 1
            return Requirement(self.word("a label key after '!'"), "!")
        key = self.word("a label key")
        op = self.peek()
        if op is None or op == ",":
            return Requirement(key, "exists")
        self.i += 1
        if op in ("=", "=="):
            return Requirement(key, "=", frozenset([self.value()]))
        if op == "!=":
            return Requirement(key, "!=", frozenset([self.value()]))
        if op in ("in", "notin"):
            return Requirement(key, op, self.value_set())
        self.i -= 1
        raise self.fail("an operator (=, ==, !=, in, notin)")

    def value(self) -> str:
        tok = self.peek()
        if tok is None or tok in (",", ")"):
            return ""
        return self.word("a label value")

    def value_set(self) -> frozenset[str]:
        if self.take() != "(":
            self.i -= 1
            raise self.fail("'(' opening a value set")
        values = set()
        while True:
            values.add(self.value())
            tok = self.take()
            if tok == ")":
                return frozenset(values)
            if tok != ",":
                self.i -= 1
                raise self.fail("',' or ')' in a value set")
