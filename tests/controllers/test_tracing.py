"""Tracing (``controllers/tracing.py``, ``controllers/otel_tracing.py``) with the SDK's in-memory exporter: a
reconcile in a member cluster (per-member controller and fleet loop) as a span with its API requests as children,
``traceparent`` on the wire (HTTP/2 to the real API server, HTTP/1.1 to a recording server), the request paths'
verbs and resources."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any, Iterator

import h2.connection
import pytest
from aiohttp import web
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from controllers import Controller, ManagedController
from controllers.cluster_controllers import ClusterControllers
from controllers.cluster_registry import ClusterRegistry
from controllers.fleet import FleetController, FleetLoop
from controllers.otel_tracing import OtelTracing, _kube_request
from controllers.reconcile import Request, Result, TerminalError
from controllers.tracing import current_tracing, reset_tracing, use_tracing
from informers import ApiClient, ClientConfig, NotFound
from syncer.testing import ControlPlane
from tests.fleet import kubeconfig, options, put_secret
from tests.informers.test_credentials import token_client
from tests.helpers import CONFIGMAPS, eventually, free_port, fresh_namespace


@contextlib.contextmanager
def in_memory() -> Iterator[InMemorySpanExporter]:
    """OtelTracing into an in-memory exporter, for this context and the tasks it starts."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    token = use_tracing(OtelTracing(provider))
    try:
        yield exporter
    finally:
        reset_tracing(token)
        provider.shutdown()


def _ids(span: ReadableSpan) -> str:
    """The trace and span id of ``span`` as a W3C ``traceparent`` header names them (between version and flags)."""
    ctx = span.get_span_context()
    return f"{ctx.trace_id:032x}-{ctx.span_id:016x}"


def _sent_ids(traceparent: str | None) -> str | None:
    """The ids a ``traceparent`` header names (``00-<trace id>-<parent id>-<flags>``)."""
    return traceparent[3:-3] if traceparent is not None else None


def test_request_paths_name_their_verb_resource_and_namespace() -> None:
    cases = [
        ("GET", "/api/v1/namespaces/ns/configmaps/cm", None, ("get", "configmaps", "ns")),
        ("GET", "/api/v1/namespaces/ns/configmaps", None, ("list", "configmaps", "ns")),
        ("GET", "/apis/apps/v1/deployments", {"watch": "true"}, ("watch", "deployments", "")),
        ("POST", "/apis/example.com/v1/namespaces/ns/widgets", None, ("create", "widgets", "ns")),
        ("PATCH", "/apis/example.com/v1/namespaces/ns/widgets/w/status", None, ("patch", "widgets/status", "ns")),
        ("PUT", "/api/v1/namespaces/ns", None, ("update", "namespaces", "")),
        ("PUT", "/api/v1/namespaces/ns/finalize", None, ("update", "namespaces/finalize", "")),
        ("DELETE", "/api/v1/namespaces/ns/pods", None, ("deletecollection", "pods", "ns")),
        ("POST", "/api/v1/namespaces/ns/pods/p/eviction", None, ("create", "pods/eviction", "ns")),
        ("GET", "/apis/apps/v1", None, ("get", "", "")),
        ("GET", "/version", None, ("get", "", "")),
    ]
    for method, path, params, expected in cases:
        assert _kube_request(method, path, params) == expected, path


async def test_a_member_reconcile_is_a_span_with_its_requests_as_children(
        api: ApiClient, fleet_ns: str, member_plane: ControlPlane, monkeypatch: pytest.MonkeyPatch) -> None:
    """Multi-cluster mode: a per-member Controller's reconcile of one ConfigMap (GET, PATCH, a GET answered 404)
    is a root span with the controller, cluster, GVR, request, result and requeue; each request a CLIENT child
    with its verb, resource and code, whose traceparent went out in the HTTP/2 HEADERS frame. A reconcile that
    fails is a span with status ERROR."""
    sent: list[str] = []
    send_headers = h2.connection.H2Connection.send_headers

    def recording(self: Any, stream_id: int, headers: Any, *args: Any, **kwargs: Any) -> Any:
        sent.extend(bytes(v).decode() for k, v in headers if bytes(k) == b"traceparent")
        return send_headers(self, stream_id, headers, *args, **kwargs)

    monkeypatch.setattr(h2.connection.H2Connection, "send_headers", recording)
    member_api = ApiClient.from_kubeconfig(str(member_plane.kubeconfig))
    async with fresh_namespace(member_api, "traced") as ns:
        await member_api.request("POST", CONFIGMAPS.path(ns), body={"metadata": {"name": "good"}})
        await member_api.request("POST", CONFIGMAPS.path(ns), body={"metadata": {"name": "bad"}})

        async def reconcile(req: Request, rc: Any) -> Result | None:
            if req.namespace != ns:
                return None
            if req.name == "bad":
                raise TerminalError("bad is bad")
            obj = await rc.client.get(req.name, req.namespace)
            if "traced" not in obj["metadata"].get("annotations", {}):
                await rc.client.patch(req.name, {"metadata": {"annotations": {"traced": "yes"}}}, type="merge",
                                      namespace=req.namespace)
            with contextlib.suppress(NotFound):
                await rc.client.get("missing", req.namespace)
            return Result(requeue_after=3600)

        class FleetReconciler:
            async def reconcile(self, cluster: str, request: Request) -> None:
                return None

        per_cluster = ClusterControllers(
            {"traced": ManagedController([CONFIGMAPS], lambda ctx: Controller("traced", reconcile)
                                         .for_(CONFIGMAPS).run)}, name="t")
        with in_memory() as exporter:
            registry = ClusterRegistry(api, *options(api, fleet_ns), required=[CONFIGMAPS])
            fleet = FleetLoop("traced-fleet", FleetController(CONFIGMAPS, lambda ctx: FleetReconciler()),
                              registry.clients, management=api)
            await registry.register_cluster_handler(per_cluster)
            await registry.register_cluster_handler(fleet)
            runner = asyncio.create_task(fleet.run())
            await registry.start()
            try:
                await put_secret(api, fleet_ns, "alpha", kubeconfig(member_plane))

                def reconciles(name: str, controller: str = "traced") -> list[ReadableSpan]:
                    return [s for s in exporter.get_finished_spans() if s.name == f"reconcile {controller}"
                            and s.attributes.get("kube_syncer.object.name") == name
                            and s.attributes.get("k8s.namespace.name") == ns]

                await eventually(lambda: bool(reconciles("good") and reconciles("bad")
                                              and reconciles("good", "traced-fleet")), 60, "the reconciles' spans")
            finally:
                runner.cancel()
                await asyncio.gather(runner, return_exceptions=True)
                await per_cluster.stop()
                await registry.stop()
        await member_api.close()

    first = reconciles("good")[0]
    assert first.parent is None and first.kind == SpanKind.INTERNAL
    assert first.status.status_code == StatusCode.UNSET
    assert dict(first.attributes) == {
        "kube_syncer.controller": "traced", "k8s.cluster.name": "alpha", "kube_syncer.resource": "configmaps.v1",
        "k8s.namespace.name": ns, "kube_syncer.object.name": "good", "kube_syncer.reconcile.result": "requeue_after",
        "kube_syncer.reconcile.requeue": True, "kube_syncer.reconcile.requeue_after": 3600.0}
    children = sorted((s for s in exporter.get_finished_spans()
                       if s.parent is not None and s.parent.span_id == first.context.span_id),
                      key=lambda s: s.start_time or 0)
    # Discovery first (the ResourceClient asks for the resource's scope on first use): spans named by the method.
    discovery = [s for s in children if "kube_syncer.request.resource" not in s.attributes]
    assert discovery and {(s.name, s.attributes["http.response.status_code"]) for s in discovery} == {("GET", 200)}
    children = [s for s in children if s not in discovery]
    assert [(s.name, s.attributes["http.response.status_code"]) for s in children] == [
        ("get configmaps", 200), ("patch configmaps", 200), ("get configmaps", 404)]
    for child in children:
        assert child.kind == SpanKind.CLIENT and child.context.trace_id == first.context.trace_id
        assert child.attributes["k8s.namespace.name"] == ns
        assert child.attributes["server.port"] == int(member_plane.url.rsplit(":", 1)[1])
        assert _ids(child) in map(_sent_ids, sent)  # on the wire, in the request's HEADERS frame
    assert children[2].status.status_code == StatusCode.ERROR and children[2].attributes["error.type"] == "404"
    assert children[0].attributes["kube_syncer.request.verb"] == "get"
    assert children[1].attributes["http.request.method"] == "PATCH"

    failed = reconciles("bad")[0]
    assert failed.status.status_code == StatusCode.ERROR
    assert failed.attributes["kube_syncer.reconcile.result"] == "error"
    assert failed.attributes["error.type"] == "TerminalError"
    assert "kube_syncer.reconcile.requeue" not in failed.attributes  # a terminal error is not retried
    assert [e.name for e in failed.events] == ["exception"]
    fleet_span = reconciles("good", "traced-fleet")[0]
    assert dict(fleet_span.attributes) == {
        "kube_syncer.controller": "traced-fleet", "k8s.cluster.name": "alpha", "kube_syncer.resource": "configmaps.v1",
        "k8s.namespace.name": ns, "kube_syncer.object.name": "good", "kube_syncer.reconcile.result": "success"}
    # The informers' lists and watches made no span: they are no reconcile's.
    assert all(s.name.startswith("reconcile ") or s.parent is not None for s in exporter.get_finished_spans())


async def test_traceparent_reaches_an_http1_server() -> None:
    """Over HTTP/1.1 (``http2=False``), the request made inside a span carries its traceparent; outside any span,
    none."""
    seen: list[str | None] = []

    async def handle(request: web.Request) -> web.Response:
        seen.append(request.headers.get("traceparent"))
        return web.json_response({"kind": "ConfigMap", "metadata": {"name": "cm"}})

    app = web.Application()
    app.router.add_get("/api/v1/namespaces/ns/configmaps/cm", handle)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    client = ApiClient(ClientConfig(f"http://127.0.0.1:{port}"), http2=False)
    try:
        with in_memory() as exporter:
            with current_tracing().reconcile("c", None, CONFIGMAPS, Request("cm", "ns")):
                await client.request("GET", "/api/v1/namespaces/ns/configmaps/cm")
            await client.request("GET", "/api/v1/namespaces/ns/configmaps/cm")
            await asyncio.sleep(0)
        request_span = next(s for s in exporter.get_finished_spans() if s.kind == SpanKind.CLIENT)
        assert list(map(_sent_ids, seen)) == [_ids(request_span), None]
        assert request_span.attributes["url.full"] == f"http://127.0.0.1:{port}/api/v1/namespaces/ns/configmaps/cm"
    finally:
        await client.close()
        await runner.cleanup()


async def test_a_request_sent_again_after_a_401_is_one_span_counting_the_resend(control_plane: ControlPlane,
                                                                                tmp_path: Path) -> None:
    """An exec credential rejected (401) and refreshed: the request's one span says it was sent again and how the
    last answer went."""
    client, _ = token_client(tmp_path, control_plane, ["revoked", control_plane.admin_token])
    async with client:
        with in_memory() as exporter:
            with current_tracing().reconcile("c", None, None, Request("x")):
                await client.request("GET", "/api/v1/namespaces/default")
    [span] = [s for s in exporter.get_finished_spans() if s.kind == SpanKind.CLIENT]
    assert (span.name, span.attributes["http.request.resend_count"], span.attributes["http.response.status_code"],
            span.status.status_code) == ("get namespaces", 1, 200, StatusCode.UNSET)
