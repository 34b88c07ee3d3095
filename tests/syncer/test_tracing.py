"""Tracing in the sidecar: a webhook call is a span continuing the caller's trace (with the API requests its
handler makes as children); ``syncer run`` with ``[tracing]`` exports to an OTLP/HTTP receiver and flushes on
stop; tracing on without OpenTelemetry installed is one clear error."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Iterator

import aiohttp
import orjson
import pytest
from opentelemetry.trace import SpanKind, StatusCode

from informers import ApiClient
from syncer.testing import ControlPlane
from syncer.webhook import AdmissionRequest, AdmissionRule, Allow, ValidatingWebhook, Verdict
from syncer.webhook.certificates import ServingCertificates
from syncer.webhook.conversion import Conversion
from syncer.webhook.server import WebhookServer
from tests.controllers.test_tracing import _ids, in_memory
from tests.helpers import free_port
from tests.sidecar import ROOT, sidecar, wait_until
from tests.syncer.test_examples import readme_blocks
from tests.tls import client_context

RULES = [AdmissionRule(["CREATE"], ["examples.kube-syncer.io"], ["v1"], ["widgets"])]
TRACE_ID, PARENT_ID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"


def _thing(version: str) -> dict[str, Any]:
    return {"apiVersion": f"example.com/{version}", "kind": "Thing", "metadata": {"name": "t", "namespace": "ns"}}


def _broken(obj: dict[str, Any]) -> dict[str, Any]:
    raise ValueError("no way back")


THINGS = Conversion("things.example.com", pairs={("v1", "v2"): lambda obj: obj, ("v2", "v1"): _broken})


async def test_webhook_calls_are_server_spans_in_the_callers_trace(api: ApiClient, tmp_path: Path) -> None:
    """An admission call: the API server's ``traceparent`` is the span's parent; the review names the attributes;
    the handler's read through its client is a child span. A conversion: a span too, failed when the converter
    raised (answered as a failed ``result``, with HTTP 200)."""
    async def check(request: AdmissionRequest, client: ApiClient) -> Verdict:
        await client.request("GET", f"/api/v1/namespaces/{request.namespace}")
        return Allow()

    async def post(session: aiohttp.ClientSession, path: str, doc: dict[str, Any]) -> Any:
        async with session.post(f"https://127.0.0.1:{port}{path}", data=orjson.dumps(doc),
                                headers={"Content-Type": "application/json",
                                         "traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}) as resp:
            assert resp.status == 200
            return await resp.json()

    def conversion(version: str, obj: dict[str, Any]) -> dict[str, Any]:
        return {"apiVersion": "apiextensions.k8s.io/v1", "kind": "ConversionReview",
                "request": {"uid": f"c-{version}", "desiredAPIVersion": f"example.com/{version}", "objects": [obj]}}

    certs = ServingCertificates("", ["127.0.0.1"], "")
    await certs.load()
    port = free_port()
    review = {
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "u-1", "operation": "CREATE", "name": "w", "namespace": "default",
                    "kind": {"group": "examples.kube-syncer.io", "version": "v1", "kind": "Widget"},
                    "resource": {"group": "examples.kube-syncer.io", "version": "v1", "resource": "widgets"},
                    "object": {"metadata": {"name": "w"}}, "userInfo": {"username": "tester"}, "dryRun": False}}
    assert certs.ca_bundle is not None
    try:
        with in_memory() as exporter:
            # Made inside: a server takes the tracing installed when it is made.
            server = WebhookServer("127.0.0.1", port, [ValidatingWebhook("v.widgets.example.com", check, RULES)],
                                   certs, api, [THINGS])
            await server.start()
            try:
                connector = aiohttp.TCPConnector(ssl=client_context(certs.ca_bundle), force_close=True)
                async with aiohttp.ClientSession(connector=connector) as session:
                    assert (await post(session, "/validating/v.widgets.example.com", review))["response"]["allowed"]
                    converted = await post(session, THINGS.path, conversion("v2", _thing("v1")))
                    failed = await post(session, THINGS.path, conversion("v1", _thing("v2")))
                    assert converted["response"]["result"]["status"] == "Success"
                    assert failed["response"]["result"]["status"] == "Failure"
            finally:
                await server.stop()
    finally:
        certs.close()
    spans = exporter.get_finished_spans()
    admission = next(s for s in spans if s.name == "admission v.widgets.example.com")
    assert admission.kind == SpanKind.SERVER and admission.status.status_code == StatusCode.UNSET
    assert admission.parent is not None and admission.parent.is_remote
    assert (f"{admission.context.trace_id:032x}", f"{admission.parent.span_id:016x}") == (TRACE_ID, PARENT_ID)
    assert {k: admission.attributes[k] for k in (
        "url.path", "http.response.status_code", "kube_syncer.webhook.outcome", "kube_syncer.admission.operation",
        "kube_syncer.resource", "k8s.namespace.name", "kube_syncer.object.name", "kube_syncer.webhook.uid")} == {
        "url.path": "/validating/v.widgets.example.com", "http.response.status_code": 200,
        "kube_syncer.webhook.outcome": "allowed", "kube_syncer.admission.operation": "CREATE",
        "kube_syncer.resource": "widgets.v1.examples.kube-syncer.io", "k8s.namespace.name": "default",
        "kube_syncer.object.name": "w", "kube_syncer.webhook.uid": "u-1"}
    read = next(s for s in spans if s.kind == SpanKind.CLIENT)
    assert read.parent is not None and read.parent.span_id == admission.context.span_id
    assert (read.name, read.attributes["http.response.status_code"]) == ("get namespaces", 200)
    assert _ids(read).startswith(TRACE_ID)
    ok, broken = sorted((s for s in spans if s.name == "conversion things.example.com"),
                        key=lambda s: s.start_time or 0)
    assert ok.kind == SpanKind.SERVER and f"{ok.context.trace_id:032x}" == TRACE_ID
    assert (ok.status.status_code, ok.attributes["kube_syncer.conversion.desired_api_version"],
            ok.attributes["kube_syncer.conversion.objects"], ok.attributes["kube_syncer.webhook.outcome"]) == (
        StatusCode.UNSET, "example.com/v2", 1, "allowed")
    assert (broken.status.status_code, broken.attributes["kube_syncer.webhook.outcome"]) == (StatusCode.ERROR, "error")


class _Receiver(BaseHTTPRequestHandler):
    """An OTLP/HTTP endpoint that counts the POSTs to /v1/traces (protobuf bodies, not decoded)."""

    posts: list[int] = []

    def do_POST(self) -> None:
        size = int(self.headers.get("Content-Length", "0"))
        self.rfile.read(size)
        if self.path == "/v1/traces":
            self.posts.append(size)
        self.send_response(200 if self.path == "/v1/traces" else 404)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        """Quiet."""


@pytest.fixture
def receiver() -> Iterator[tuple[int, list[int]]]:
    """A local OTLP/HTTP receiver: its port and the sizes of the trace POSTs it got."""
    handler = type("Receiver", (_Receiver,), {"posts": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], handler.posts
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_syncer_run_exports_with_the_tracing_settings_and_flushes_on_stop(
        control_plane: ControlPlane, tmp_path: Path, receiver: tuple[int, list[int]]) -> None:
    """``[tracing]`` enabled with an endpoint: a plugin controller's reconciles are exported by OTLP/HTTP to
    it, at the latest when SIGTERM stops the sidecar (the provider's shutdown flushes the batch)."""
    port, posts = receiver
    http_port = free_port()
    plugin = tmp_path / "traced_plugin.py"
    plugin.write_text(textwrap.dedent("""\
        from controllers import Controller, ManagedController
        from informers import GVR

        CONFIGMAPS = GVR("", "v1", "configmaps")


        async def reconcile(req, rc):
            await rc.client.get(req.name, req.namespace)


        def syncer_controllers(settings):
            return {"traced": ManagedController(
                [CONFIGMAPS], lambda ctx: Controller("traced", reconcile).for_(CONFIGMAPS).run)}
        """))
    # The README's [tracing] table as pasted, with the collector's address this test's receiver, and every trace
    # kept (one in ten of a few reconciles could be none).
    [table] = readme_blocks("toml")["Tracing"]
    assert "http://otel-collector.monitoring:4318" in table and "sampling_ratio = 0.1" in table
    table = table.replace("sampling_ratio = 0.1", "sampling_ratio = 1")
    settings = tmp_path / "s.toml"
    settings.write_text(f'kubeconfig = "{control_plane.kubeconfig}"\nplugins = ["{plugin}"]\n'
                        f'include = ["core/configmaps", "core/namespaces"]\nhttp_bind = "127.0.0.1:{http_port}"\n'
                        + table.replace("http://otel-collector.monitoring:4318", f"http://127.0.0.1:{port}"))
    log = tmp_path / "log"
    with sidecar(settings, log) as proc:
        wait_until(lambda: "tracing: spans of service widget-operator exported with OTLP/HTTP to "
                           f"http://127.0.0.1:{port}/v1/traces, sampling 1" in log.read_text(), "tracing to start",
                   proc, log)
        wait_until(lambda: "started controller" in log.read_text(), "the controller to start", proc, log, 60)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()
    assert posts and all(size > 0 for size in posts), log.read_text()


def test_tracing_on_without_opentelemetry_is_one_clear_error(tmp_path: Path) -> None:
    """With OpenTelemetry not importable (as without the extra), ``tracing.enabled = true`` is refused naming the
    setting and the install command."""
    settings = tmp_path / "s.toml"
    settings.write_text("[tracing]\nenabled = true\n")
    hide = ("import sys\nclass Hide:\n    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] == 'opentelemetry': raise ModuleNotFoundError(name)\n"
            "sys.meta_path.insert(0, Hide())\n"
            "from syncer.settings import load_settings, SettingsError\n"
            f"try:\n    load_settings({str(settings)!r})\nexcept SettingsError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", hide], cwd=ROOT, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.stdout.strip() == (
        "setting 'tracing.enabled' must be true or false, got True (true needs OpenTelemetry, which is not "
        "installed: pip install 'kube-syncer[tracing]'); set it in the settings file or in "
        "SYNCER_TRACING__ENABLED"), out.stderr
