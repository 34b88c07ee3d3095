"""The webhook server: declared admission webhooks and CRD conversions (``conversion.py``) served over TLS by aiohttp,
on every replica.

Differs from controller-runtime's and kopf's:

- Every failure has its own ``Status`` answer (400, 413 over 7 MiB, 415), never a 500 trace; a handler that raises
  or returns no verdict is a deny naming the error and the request uid, logged with both.
- A slow handler is cancelled just before the API server's ``timeout`` and answered 504, so ``failurePolicy``
  applies with our message and nothing runs on unowned (kopf lets it run).
- Client certificates are optional in the handshake and required per request (401), so the failure is explained.
- Answers are counted per webhook by outcome for ``/status`` (a deny is an HTTP 200); each request is a span.
- ``self_dial`` checks the listener serves the loaded certificate (controller-runtime's ``StartedChecker``).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import ssl
import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Sequence

import orjson
from aiohttp import web
from loguru import logger
from prometheus_client import Counter, Gauge, Histogram

from controllers.tracing import Span, current_tracing
from informers import ApiClient

from .certificates import ServingCertificates
from .conversion import Conversion, ConversionError, conversion_response, parse_conversion_review
from .declaration import MAX_TIMEOUT, MutatingWebhook, Webhook, handler_timeout
from .review import AdmissionRequest, Allow, Deny, ReviewError, Verdict, check_patch, parse_review, review_response

MAX_BODY = 7 * 1024 * 1024
_DIAL_TIMEOUT = 5.0
_REQUESTS = Counter("controller_runtime_webhook_requests_total", "Admission requests by webhook path and HTTP code.",
                    ["webhook", "code"])
_LATENCY = Histogram("controller_runtime_webhook_latency_seconds", "Admission request latency by webhook path.",
                     ["webhook"])
_IN_FLIGHT = Gauge("controller_runtime_webhook_requests_in_flight", "Admission requests being served.", ["webhook"])
_log = logger.bind(component="webhook server")


@dataclass
class WebhookStats:
    """One webhook's requests: how many, how they were answered (``errors``: a handler that raised, timed out or
    returned no verdict, and requests we could not take), and how long the answers took."""

    requests: int = 0
    allowed: int = 0
    denied: int = 0
    errors: int = 0
    latency_sum: float = 0.0
    latency_max: float = 0.0

    def count(self, outcome: str, seconds: float) -> None:
        """One request answered: ``outcome`` is ``allowed``, ``denied`` or ``error``."""
        self.requests += 1
        if outcome == "allowed":
            self.allowed += 1
        elif outcome == "denied":
            self.denied += 1
        else:
            self.errors += 1
        self.latency_sum += seconds
        self.latency_max = max(self.latency_max, seconds)

    def as_dict(self) -> dict[str, Any]:
        """The counts, and the mean and longest latency in seconds (None before the first request)."""
        return {"requests": self.requests, "allowed": self.allowed, "denied": self.denied, "errors": self.errors,
                "latency_seconds": {"mean": round(self.latency_sum / self.requests, 6) if self.requests else None,
                                    "max": round(self.latency_max, 6) if self.requests else None}}


class _Refused(Exception):
    """A request we cannot take: answered with ``code`` and ``message`` as a ``Status``."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class WebhookServer:
    """Serves ``webhooks`` and ``conversions`` at their paths on ``host:port`` with ``certificates``' TLS context."""

    def __init__(self, host: str, port: int, webhooks: Sequence[Webhook], certificates: ServingCertificates,
                 client: ApiClient | None = None, conversions: Sequence[Conversion] = ()) -> None:
        """``client`` is handed to handlers that take it (``async def handler(request, client)``): a check against
        what is already in the cluster (one object per key, say) needs to read it, on every replica."""
        self.host, self.port = host, port
        self.client = client
        self.webhooks = list(webhooks)
        self.conversions = list(conversions)
        self.certificates = certificates
        self.require_client_cert = bool(certificates.client_ca_file)
        # by path; a conversion's "allowed" counts the reviews converted
        self.stats = {path: WebhookStats() for path in [*(w.path for w in self.webhooks),
                                                         *(c.path for c in self.conversions)]}
        self._runner: web.AppRunner | None = None
        self._tracing = current_tracing()

    async def start(self) -> None:
        """Bind and serve (OSError if the address is taken)."""
        app = web.Application(client_max_size=MAX_BODY)
        for webhook in self.webhooks:
            app.router.add_post(webhook.path, self._route(webhook.path, f"admission {webhook.name}",
                                                          functools.partial(self._serve, webhook)))
        for conversion in self.conversions:
            app.router.add_post(conversion.path, self._route(conversion.path, f"conversion {conversion.crd}",
                                                             functools.partial(self._convert, conversion)))
        # In-flight requests end within their handler's timeout: stopping waits that long, not aiohttp's 60 s.
        grace = max((w.timeout_seconds for w in self.webhooks), default=1) + 1.0
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=grace)
        await self._runner.setup()
        try:
            await web.TCPSite(self._runner, self.host, self.port, ssl_context=self.certificates.context).start()
        except BaseException:
            await self._runner.cleanup()
            self._runner = None
            raise

    async def stop(self) -> None:
        """Stop accepting; requests in flight are answered first (each within its handler timeout)."""
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()

    async def self_dial(self) -> str:
        """What is wrong with a TLS handshake with our own listener ("" if it sees the certificate now loaded)."""
        host = loopback_for(self.host)
        bundle = self.certificates.ca_bundle
        context = ssl.create_default_context(cadata=bundle.decode()) if bundle else ssl.create_default_context()
        # The certificate names the hosts the API server uses, which need not include this dial's address.
        context.check_hostname = False
        if not bundle:
            context.verify_mode = ssl.CERT_NONE
        try:
            async with asyncio.timeout(_DIAL_TIMEOUT):
                _, writer = await asyncio.open_connection(host, self.port, ssl=context)
        except (OSError, TimeoutError) as e:
            return f"TLS self-dial of {host}:{self.port} failed: {type(e).__name__}: {e}"
        try:
            ssl_object = writer.get_extra_info("ssl_object")
            served = ssl_object.getpeercert(binary_form=True) if ssl_object is not None else None
        finally:
            writer.close()
            try:
                await writer.wait_closed()
            except OSError:
                pass  # the server may drop a connection that sent nothing: the handshake is what counted
        if served != self.certificates.leaf_der:
            return f"TLS self-dial of {host}:{self.port} saw another certificate than the one loaded"
        return ""

    def _route(self, path: str, name: str, serve: Callable[[web.Request, Span], Awaitable[tuple[web.Response, str]]]
               ) -> Callable[[web.Request], Awaitable[web.Response]]:
        stats = self.stats[path]
        tracing = self._tracing

        async def handle(request: web.Request) -> web.Response:
            started = time.monotonic()
            _IN_FLIGHT.labels(path).inc()
            try:
                with tracing.served(name, request.headers, {"url.path": path}) as span:
                    try:
                        response, outcome = await serve(request, span)
                    except _Refused as e:
                        response, outcome = _failed(e.code, str(e))
                    span.set("http.response.status_code", response.status)
                    span.set("kube_syncer.webhook.outcome", outcome)
                    if outcome == "error":
                        span.fail(_Answered(f"answered with an error (HTTP {response.status}); see the log"))
            finally:
                _IN_FLIGHT.labels(path).dec()
            elapsed = time.monotonic() - started
            _REQUESTS.labels(path, str(response.status)).inc()
            _LATENCY.labels(path).observe(elapsed)
            stats.count(outcome, elapsed)
            return response
        return handle

    async def _body(self, request: web.Request) -> bytes:
        """The request's JSON body; _Refused without the client certificate required, of another type, too large."""
        if self.require_client_cert and not (request.transport and request.transport.get_extra_info("peercert")):
            raise _Refused(401, "a client certificate signed by the CA of setting 'webhooks.client_ca_file' is "
                                "required (configure the API server's AdmissionConfiguration kubeConfigFile)")
        if request.content_type != "application/json":
            raise _Refused(415, f"Content-Type must be application/json, got {request.content_type!r}")
        try:
            return await request.read()
        except web.HTTPRequestEntityTooLarge:
            raise _Refused(413, f"the body is larger than {MAX_BODY} bytes") from None

    async def _convert(self, conversion: Conversion, request: web.Request, span: Span) -> tuple[web.Response, str]:
        """A ConversionReview's answer: the objects converted (outcome ``allowed``), or a failed ``result`` saying
        why (``error``); never an HTTP error for a converter's failure, so that its message reaches the client."""
        body = await self._body(request)
        try:
            review = parse_conversion_review(body)
        except ReviewError as e:
            raise _Refused(400, f"not a ConversionReview request: {e}") from None
        group, _, version = review.desired_api_version.partition("/")
        span.set("kube_syncer.conversion.desired_api_version", review.desired_api_version)
        span.set("kube_syncer.conversion.objects", len(review.objects))
        span.set("kube_syncer.webhook.uid", review.uid)
        log = _log.bind(conversion=conversion.crd, uid=review.uid)
        timeout = handler_timeout(MAX_TIMEOUT)  # the API server gives a conversion webhook 30 s
        try:
            if group != conversion.group:
                raise ConversionError(f"the webhook of {conversion.crd} was asked for {review.desired_api_version}, "
                                      f"another group: check the CRD's spec.conversion.webhook.clientConfig")
            async with asyncio.timeout(timeout) as deadline:
                converted = [await conversion.convert(obj, version) for obj in review.objects]
        except ConversionError as e:
            if e.__cause__ is not None:
                log.opt(exception=e.__cause__).error("conversion failed: {}", e)
            else:
                log.warning("conversion failed: {}", e)
            return _conversion_failed(review.uid, f"{e} (request uid {review.uid})")
        except TimeoutError:
            if not deadline.expired():
                raise
            log.warning("conversion to {} did not finish within {:g}s", review.desired_api_version, timeout)
            return _conversion_failed(review.uid, f"the conversion of {len(review.objects)} {conversion.crd} object(s) "
                                                  f"to {version} did not finish within {timeout:g}s "
                                                  f"(request uid {review.uid})")
        log.debug("converted {} object(s) to {}", len(converted), review.desired_api_version)
        return web.Response(body=conversion_response(review.uid, converted), content_type="application/json"), \
            "allowed"

    async def _serve(self, webhook: Webhook, request: web.Request, span: Span) -> tuple[web.Response, str]:
        """The answer, and whether the handler allowed, denied, or an error (ours, the request's) answered."""
        body = await self._body(request)
        try:
            review = parse_review(body)
        except ReviewError as e:
            return _failed(400, f"not an AdmissionReview request: {e}")
        _describe(span, review)
        if review.review_version not in webhook.review_versions:
            return _failed(400, f"webhook {webhook.name} accepts AdmissionReview "
                                f"{', '.join(webhook.review_versions)}, got {review.review_version}")
        timeout = _timeout(webhook, request.query.get("timeout", ""))
        log = _log.bind(webhook=webhook.name, uid=review.uid)
        what = f"{review.operation} {review.resource.resource} {_object_name(review)}"
        try:
            async with asyncio.timeout(timeout) as deadline:
                returned: Any = await _call(webhook.handler, review, self.client)
        except Exception as e:
            if isinstance(e, TimeoutError) and deadline.expired():
                log.warning("admission handler did not answer within {:g}s: {}", timeout, what)
                return _failed(504, f"admission webhook {webhook.name} did not answer within {timeout:g}s "
                                    f"(request uid {review.uid})")
            log.opt(exception=e).error("admission handler raised: {}", what)
            problem = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
        else:
            problem = _problem(webhook, returned)
            if problem:
                log.error("admission handler returned no usable verdict: {}: {}", what, problem)
        verdict: Verdict = (Deny(f"internal error in the admission handler: {problem} (request uid {review.uid})",
                                 code=500) if problem else returned)
        log.debug("{}: {}", what,
                  "allowed" if isinstance(verdict, Allow) else f"denied ({verdict.code}: {verdict.message})")
        outcome = "error" if problem else "allowed" if isinstance(verdict, Allow) else "denied"
        return web.Response(body=review_response(review, verdict), content_type="application/json"), outcome


def loopback_for(host: str) -> str:
    """Where to reach a listener bound to ``host`` from this machine: loopback for a wildcard address."""
    return {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)


def _call(handler: Any, review: AdmissionRequest, client: ApiClient | None) -> Awaitable[Verdict]:
    """The handler's answer, with the client when its signature asks for one (a second parameter)."""
    if len(inspect.signature(handler).parameters) >= 2:
        return handler(review, client)  # type: ignore[no-any-return]
    return handler(review)  # type: ignore[no-any-return]


def _timeout(webhook: Webhook, requested: str) -> float:
    """The handler's time: a share of the API server's ``?timeout=10s`` (the configuration it really uses), or
    of the declared ``timeout_seconds`` when the parameter is missing or unreadable."""
    try:
        asked = float(requested.removesuffix("s"))
    except ValueError:
        asked = 0.0
    return handler_timeout(asked if 0 < asked <= MAX_TIMEOUT else webhook.timeout_seconds)


def _problem(webhook: Webhook, verdict: Verdict) -> str:
    """What is wrong with a handler's return value ("" if nothing)."""
    if not isinstance(verdict, (Allow, Deny)):
        return f"the handler returned {type(verdict).__name__}, expected Allow(...) or Deny(...)"
    if isinstance(verdict.warnings, str) or not all(isinstance(w, str) for w in verdict.warnings):
        return f"warnings must be a list of strings, got {verdict.warnings!r}"
    if isinstance(verdict, Allow) and verdict.patch:
        if not isinstance(webhook, MutatingWebhook):
            return "a validating webhook cannot change the object: its Allow() must not carry a patch"
        return check_patch(verdict.patch)
    return ""


class _Answered(Exception):
    """How the span of a request answered with an error is marked failed (the handler's own exception, if any,
    is logged with the request uid)."""


def _describe(span: Span, review: AdmissionRequest) -> None:
    span.set("kube_syncer.admission.operation", review.operation)
    span.set("kube_syncer.resource", str(review.resource))
    span.set("kube_syncer.object.name", review.name)
    if review.sub_resource:
        span.set("kube_syncer.admission.subresource", review.sub_resource)
    if review.namespace:
        span.set("k8s.namespace.name", review.namespace)
    span.set("kube_syncer.webhook.uid", review.uid)
    span.set("kube_syncer.admission.dry_run", review.dry_run)


def _object_name(review: AdmissionRequest) -> str:
    name = review.name or "(name to be generated)"
    return f"{review.namespace}/{name}" if review.namespace else name


def _conversion_failed(uid: str, message: str) -> tuple[web.Response, str]:
    return web.Response(body=conversion_response(uid, error=message), content_type="application/json"), "error"


def _failed(code: int, message: str) -> tuple[web.Response, str]:
    return _status(code, message), "error"


def _status(code: int, message: str) -> web.Response:
    """An error answer the API server's client decodes: its message ends up in the rejection it reports."""
    body = {"apiVersion": "v1", "kind": "Status", "status": "Failure", "code": code, "message": message}
    return web.Response(body=orjson.dumps(body), status=code, content_type="application/json")
