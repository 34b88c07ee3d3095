"""Kubernetes label selectors: parse the string syntax and match label maps."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping

_TOKEN = re.compile(r"\s*(!=|==|=|!|\(|\)|,|[A-Za-z0-9][-A-Za-z0-9_./]*|\S)")
_WORD = re.compile(r"[A-Za-z0-9][-A-Za-z0-9_./]*\Z")


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

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        """Whether a label map (``metadata.labels``, possibly None) satisfies every clause."""
        lbl = labels or {}
        return all(r.matches(lbl) for r in self.requirements)

    def __str__(self) -> str:
        return self.text

    def __bool__(self) -> bool:
        return bool(self.requirements)


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
