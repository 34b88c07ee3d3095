"""OtelTracing: the ``Tracing`` that makes OpenTelemetry spans (the ``kube-syncer[tracing]`` extra; imported only
when tracing is on).

- A reconcile is a root span ``reconcile <controller>`` (a reconcile starts from a watch event, not from a caller
  whose trace it could join), with the controller, the member cluster, the primary resource, the request and,
  set by the loop, its result and requeue.
- Each API request made inside is a CLIENT span ``<verb> <resource>`` (HTTP semantic conventions plus the
  Kubernetes verb and resource, which no convention names), and the request carries the span's context in the
  propagators' headers: W3C ``traceparent`` by default (``OTEL_PROPAGATORS``). The API server's own spans join
  the trace when it trusts the caller's context (system:masters; others get a link, KEP-647).
- A webhook call is a SERVER span continuing the API server's trace, whose ``traceparent`` it sent.

4xx and 5xx answers and exceptions mark a span as failed (``error.type``), as the HTTP conventions say.
"""

from __future__ import annotations

import urllib.parse
from typing import Any, Mapping

from opentelemetry import context as otel_context
from opentelemetry import propagate, trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from informers import GVR, __version__
from informers.request_tracing import RequestSpan, RequestTracer, request_tracer

from .cluster import display_name
from .reconcile import Request
from .tracing import AttributeValue, Span

_ROOT = otel_context.Context()  # no parent: a reconcile starts a trace of its own
_NAMED_VERBS = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
_NAMESPACE_SUBRESOURCES = ("status", "finalize")  # /api/v1/namespaces/<name>/status is no namespaced resource
_COLLECTION_VERBS = {"GET": "list", "POST": "create", "DELETE": "deletecollection"}


class OtelTracing:
    """Spans of ``tracer_provider`` (the SDK's ``TracerProvider``, or any of the API)."""

    def __init__(self, tracer_provider: trace.TracerProvider) -> None:
        self._tracer = trace.get_tracer("kube-syncer", __version__, tracer_provider=tracer_provider)
        self._requests = _RequestTracer(self._tracer)

    def reconcile(self, controller: str, cluster: str | None, gvr: GVR | None, request: Request) -> Span:
        """The root span of one reconcile."""
        attributes: dict[str, AttributeValue] = {"kube_syncer.controller": controller,
                                                 "kube_syncer.object.name": request.name}
        if cluster is not None:
            attributes["k8s.cluster.name"] = display_name(cluster)
        if gvr is not None:
            attributes["kube_syncer.resource"] = str(gvr)
        if request.namespace:
            attributes["k8s.namespace.name"] = request.namespace
        return _OtelSpan(self._tracer, self._requests, f"reconcile {controller}", SpanKind.INTERNAL, _ROOT,
                         attributes)

    def served(self, name: str, headers: Mapping[str, str], attributes: Mapping[str, AttributeValue]) -> Span:
        """A SERVER span, the child of the span ``headers`` propagate (a root span without one)."""
        return _OtelSpan(self._tracer, self._requests, name, SpanKind.SERVER, propagate.extract(headers),
                         dict(attributes))


class _OtelSpan:
    __slots__ = ("_tracer", "_requests", "_name", "_kind", "_parent", "_attributes", "_span", "_token", "_hook")

    def __init__(self, tracer: trace.Tracer, requests: RequestTracer, name: str, kind: SpanKind,
                 parent: otel_context.Context, attributes: dict[str, AttributeValue]) -> None:
        self._tracer, self._requests, self._name, self._kind = tracer, requests, name, kind
        self._parent, self._attributes = parent, attributes
        self._span: trace.Span = trace.INVALID_SPAN

    def __enter__(self) -> "_OtelSpan":
        self._span = self._tracer.start_span(self._name, self._parent, self._kind, self._attributes)
        self._token = otel_context.attach(trace.set_span_in_context(self._span))
        self._hook = request_tracer.set(self._requests)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: Any) -> None:
        request_tracer.reset(self._hook)
        otel_context.detach(self._token)
        if error is not None:
            self.fail(error)
        self._span.end()

    def set(self, key: str, value: AttributeValue) -> None:
        """Set attribute ``key``."""
        self._span.set_attribute(key, value)

    def fail(self, error: BaseException) -> None:
        """Status ERROR, ``error.type`` and the exception as an event."""
        _failed(self._span, type(error).__qualname__, f"{type(error).__name__}: {error}")
        self._span.record_exception(error)


class _RequestTracer:
    """The child span of each API request, and the propagation headers of its context."""

    __slots__ = ("_tracer",)

    def __init__(self, tracer: trace.Tracer) -> None:
        self._tracer = tracer

    def start(self, host: str, method: str, path: str, params: Mapping[str, str] | None,
              headers: dict[str, str]) -> RequestSpan:
        """A CLIENT span, started now, and its context in ``headers``."""
        url = urllib.parse.urlsplit(host)
        verb, resource, namespace = _kube_request(method, path, params)
        attributes: dict[str, AttributeValue] = {
            "http.request.method": method, "url.full": host + path, "server.address": url.hostname or "",
            "server.port": url.port or (443 if url.scheme == "https" else 80),
            "kube_syncer.request.verb": verb}
        if resource:
            attributes["kube_syncer.request.resource"] = resource
        if namespace:
            attributes["k8s.namespace.name"] = namespace
        span = self._tracer.start_span(f"{verb} {resource}" if resource else method, kind=SpanKind.CLIENT,
                                       attributes=attributes)
        propagate.inject(headers, trace.set_span_in_context(span))
        return _RequestSpan(span)


class _RequestSpan:
    __slots__ = ("_span", "_status", "_resends")

    def __init__(self, span: trace.Span) -> None:
        self._span, self._status, self._resends = span, 0, 0

    def resent(self) -> None:
        """Counted in ``http.request.resend_count``."""
        self._resends += 1
        self._span.set_attribute("http.request.resend_count", self._resends)

    def answered(self, status: int) -> None:
        """``http.response.status_code``."""
        self._status = status
        self._span.set_attribute("http.response.status_code", status)

    def end(self, error: BaseException | None) -> None:
        """Failed on a 4xx or 5xx answer, or on ``error`` when there was none (a connection error)."""
        if self._status >= 400:
            _failed(self._span, str(self._status), f"HTTP {self._status}")
        elif error is not None:
            _failed(self._span, type(error).__qualname__, f"{type(error).__name__}: {error}")
        self._span.end()


def _failed(span: trace.Span, error_type: str, description: str) -> None:
    span.set_attribute("error.type", error_type)
    span.set_status(Status(StatusCode.ERROR, description))


def _kube_request(method: str, path: str, params: Mapping[str, str] | None) -> tuple[str, str, str]:
    """(verb, resource[/subresource], namespace) of a request path, as the API server's request info tells them;
    ("", "", "") verb aside for paths outside ``/api`` and ``/apis`` resources (discovery, ``/version``)."""
    parts = [p for p in path.split("?", 1)[0].split("/") if p]
    if parts[:1] == ["api"]:
        rest = parts[2:]
    elif parts[:1] == ["apis"]:
        rest = parts[3:]
    else:
        return method.lower(), "", ""
    namespace = ""
    if len(rest) >= 3 and rest[0] == "namespaces" and not (len(rest) == 3 and rest[2] in _NAMESPACE_SUBRESOURCES):
        namespace, rest = rest[1], rest[2:]
    if not rest:
        return method.lower(), "", namespace
    resource = "/".join((rest[0], *rest[2:3]))
    if len(rest) > 1:
        verb = _NAMED_VERBS.get(method, method.lower())
    elif method == "GET" and params and params.get("watch") in ("true", "1"):
        verb = "watch"
    else:
        verb = _COLLECTION_VERBS.get(method, method.lower())
    return verb, resource, namespace
