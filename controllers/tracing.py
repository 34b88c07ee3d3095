"""Tracing: what a process traces (reconciles, webhook calls and the API requests they make), through a ``Tracing``.

``NO_TRACING``, the default, does nothing and imports nothing; ``otel_tracing.OtelTracing`` makes OpenTelemetry
spans (the ``kube-syncer[tracing]`` extra). The process owner installs one with ``use_tracing`` before it starts
its work, as OpenTelemetry's global tracer provider is set once, but in a context variable: the tasks started
afterwards inherit it, and a test or an embedding application that installs one does not leak it to others. A
``KeyedLoop`` and the webhook server take the current one when they are made. controller-runtime has no tracing
(its #1876); kube-rs wraps its API calls in spans, not its reconciles.

A ``Span`` is a context manager: entered, it is the current span of the task, and the ``request_tracer`` of the
informers (``informers/request_tracing.py``), so that every API request made inside is a child span that
carries ``traceparent``. An exception that leaves it marks it failed.
"""

from __future__ import annotations

from contextvars import ContextVar, Token
from typing import Any, Mapping, Protocol

from informers import GVR

from .reconcile import Request

AttributeValue = str | bool | int | float


class Span(Protocol):
    """One traced unit of work; ``with span:`` makes it current, ``set`` and ``fail`` describe its outcome."""

    def __enter__(self) -> "Span": ...

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: Any) -> None: ...

    def set(self, key: str, value: AttributeValue) -> None:
        """Set attribute ``key``."""

    def fail(self, error: BaseException) -> None:
        """The work failed with ``error`` (handled by the caller: it did not leave the ``with``)."""


class Tracing(Protocol):
    """Makes the spans of a process's units of work."""

    def reconcile(self, controller: str, cluster: str | None, gvr: GVR | None, request: Request) -> Span:
        """A reconcile of ``request`` by ``controller`` (in member ``cluster``, or the local one for None), whose
        primary resource is ``gvr`` (None: it has none)."""
        ...

    def served(self, name: str, headers: Mapping[str, str], attributes: Mapping[str, AttributeValue]) -> Span:
        """A call served (a webhook's), continuing the trace that ``headers`` propagate, if any."""
        ...


class _NoSpan:
    __slots__ = ()

    def __enter__(self) -> "_NoSpan":
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: Any) -> None:
        return None

    def set(self, key: str, value: AttributeValue) -> None:
        """Nothing to set."""

    def fail(self, error: BaseException) -> None:
        """Nothing to mark."""


NO_SPAN: Span = _NoSpan()


class NoTracing:
    """Tracing off: one span that does nothing, for everything."""

    __slots__ = ()
    _span = NO_SPAN

    def reconcile(self, controller: str, cluster: str | None, gvr: GVR | None, request: Request) -> Span:
        """The span that does nothing."""
        return self._span

    def served(self, name: str, headers: Mapping[str, str], attributes: Mapping[str, AttributeValue]) -> Span:
        """The span that does nothing."""
        return self._span


NO_TRACING: Tracing = NoTracing()
_current: ContextVar[Tracing] = ContextVar("kube_syncer_tracing", default=NO_TRACING)


def current_tracing() -> Tracing:
    """The ``Tracing`` installed in this context (``NO_TRACING`` unless ``use_tracing`` was called)."""
    return _current.get()


def use_tracing(tracing: Tracing) -> Token[Tracing]:
    """Install ``tracing`` for this context and the tasks it starts from now on; ``reset_tracing`` undoes it."""
    return _current.set(tracing)


def reset_tracing(token: Token[Tracing]) -> None:
    """Undo the ``use_tracing`` that returned ``token``."""
    _current.reset(token)
