"""The hook through which an ApiClient's requests are traced: a ``RequestTracer`` in a context variable.

The informers know nothing of OpenTelemetry: whoever traces a unit of work (a reconcile, a webhook call; see
``controllers/tracing.py``) sets ``request_tracer`` for it, and every request the ApiClient sends from that
task, and from the tasks it starts, is a span of the tracer's making, which may add headers (W3C ``traceparent``)
before the request is written. Outside such work the tracer is ``NO_REQUEST_TRACER``, which does nothing: an
informer's lists and watches, a Lease's renewals, are no child of any reconcile. client-go has no such hook
(``rest.Config.WrapTransport`` is the place controller-runtime users wrap one in).
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Mapping, Protocol


class RequestSpan(Protocol):
    """One request being traced: told of each resend, of the answer's status code, and of its end."""

    def resent(self) -> None:
        """The request is sent again (a 401 answered with a fresh exec credential)."""

    def answered(self, status: int) -> None:
        """The server answered with ``status`` (the last answer counts)."""

    def end(self, error: BaseException | None) -> None:
        """The request is over: its body read (or its watch closed), or ``error`` raised."""


class RequestTracer(Protocol):
    """Makes the span of each request sent while it is ``request_tracer``."""

    def start(self, host: str, method: str, path: str, params: Mapping[str, str] | None,
              headers: dict[str, str]) -> RequestSpan:
        """The span of a request to ``host`` (``https://host:port``) about to be sent; ``headers`` are the
        request's own, to add propagation headers to."""
        ...


class _NoSpan:
    __slots__ = ()

    def resent(self) -> None:
        """Nothing to note."""

    def answered(self, status: int) -> None:
        """Nothing to note."""

    def end(self, error: BaseException | None) -> None:
        """Nothing to end."""


class _NoTracer:
    """No tracing: every request gets the one span that does nothing, and no header."""

    __slots__ = ()
    _span = _NoSpan()

    def start(self, host: str, method: str, path: str, params: Mapping[str, str] | None,
              headers: dict[str, str]) -> RequestSpan:
        """The span that does nothing."""
        return self._span


NO_REQUEST_TRACER: RequestTracer = _NoTracer()
# Set for the duration of a traced unit of work (``ContextVar.set``/``reset``); tasks started meanwhile inherit it.
request_tracer: ContextVar[RequestTracer] = ContextVar("kube_syncer_request_tracer", default=NO_REQUEST_TRACER)
