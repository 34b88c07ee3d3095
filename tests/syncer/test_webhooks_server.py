"""The webhook server without an API server: the AdmissionReview contract, bad input, handler failures and time
limits, mutual TLS, certificate reloads while requests flow, and the self-dial."""

from __future__ import annotations

import asyncio
import base64
import os
import ssl
import time
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable, Iterator

import aiohttp
import orjson
import pytest
from cryptography import x509
from loguru import logger
from prometheus_client import REGISTRY

from syncer.webhook import AdmissionRequest, AdmissionRule, Allow, Deny, MutatingWebhook, ValidatingWebhook, Verdict
from syncer.webhook.certificates import CertificateError, ServingCertificates
from syncer.webhook.server import MAX_BODY, WebhookServer

from tests.helpers import free_port
from tests.tls import CA, client_context, der_of, pem
from tests.webhook_server import Served

RULES = [AdmissionRule(["CREATE"], ["examples.kube-syncer.io"], ["v1"], ["widgets"])]


def review(uid: str = "uid-1", version: str = "v1", obj: Any = None, operation: str = "CREATE") -> bytes:
    """An AdmissionReview request body for a Widget."""
    return orjson.dumps({
        "apiVersion": f"admission.k8s.io/{version}", "kind": "AdmissionReview",
        "request": {"uid": uid, "operation": operation, "name": "w", "namespace": "default",
                    "kind": {"group": "examples.kube-syncer.io", "version": "v1", "kind": "Widget"},
                    "resource": {"group": "examples.kube-syncer.io", "version": "v1", "resource": "widgets"},
                    "object": obj if obj is not None else {"metadata": {"name": "w"}, "spec": {"size": 1}},
                    "userInfo": {"username": "tester"}, "dryRun": False},
    })


async def allow(request: AdmissionRequest) -> Verdict:
    return Allow(warnings=[f"seen {request.operation} {request.resource.resource} by "
                           f"{request.user_info['username']}"])


@pytest.fixture
async def serve(tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[Served]]]:
    started: list[tuple[WebhookServer, ServingCertificates]] = []

    async def start(webhooks: list[Any], cert_dir: str = "", client_ca: str = "") -> Served:
        certs = ServingCertificates(cert_dir, ["127.0.0.1", "localhost"], client_ca)
        await certs.load()
        server = WebhookServer("127.0.0.1", free_port(), webhooks, certs)
        await server.start()
        started.append((server, certs))
        assert certs.ca_bundle is not None
        return Served(server, certs.ca_bundle)

    yield start
    for server, certs in started:
        await server.stop()
        certs.close()


@pytest.fixture
def logs() -> Iterator[list[str]]:
    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(f"{m.record['message']} {m.record['extra']} {m.record['exception']}"),
                      level="DEBUG")
    yield lines
    logger.remove(sink)


# -- the contract -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("version", ["v1", "v1beta1"])
async def test_answers_in_the_version_received_echoing_the_uid(serve, version: str) -> None:
    async def mutate(request: AdmissionRequest) -> Verdict:
        assert (request.review_version, request.name, request.namespace) == (version, "w", "default")
        return Allow(patch=[{"op": "add", "path": "/spec/size", "value": 3}], warnings=["defaulted"])

    served = await serve([MutatingWebhook("m.widgets.example.com", mutate, RULES, review_versions=("v1", "v1beta1")),
                          ValidatingWebhook("v.widgets.example.com", allow, RULES, review_versions=("v1", "v1beta1"))])
    status, body = await served.post("/mutating/m.widgets.example.com", review("u-7", version))
    assert status == 200 and body["apiVersion"] == f"admission.k8s.io/{version}" and body["kind"] == "AdmissionReview"
    response = body["response"]
    assert (response["uid"], response["allowed"], response["patchType"], response["warnings"]) == (
        "u-7", True, "JSONPatch", ["defaulted"])
    assert orjson.loads(base64.b64decode(response["patch"])) == [{"op": "add", "path": "/spec/size", "value": 3}]
    status, body = await served.post("/validating/v.widgets.example.com", review("u-8", version))
    assert body["response"] == {"uid": "u-8", "allowed": True, "warnings": ["seen CREATE widgets by tester"]}


async def test_deny_carries_message_and_code(serve) -> None:
    async def deny(request: AdmissionRequest) -> Verdict:
        return Deny("spec.size is too large", code=422, warnings=["w"])

    served = await serve([ValidatingWebhook("v.widgets.example.com", deny, RULES)])
    _, body = await served.post("/validating/v.widgets.example.com", review())
    assert body["response"] == {"uid": "uid-1", "allowed": False, "warnings": ["w"],
                                "status": {"code": 422, "message": "spec.size is too large"}}


async def test_a_version_the_webhook_does_not_accept_is_a_400(serve) -> None:
    served = await serve([ValidatingWebhook("v.widgets.example.com", allow, RULES)])
    status, body = await served.post("/validating/v.widgets.example.com", review(version="v1beta1"))
    assert (status, body["message"]) == (400, "webhook v.widgets.example.com accepts AdmissionReview v1, got v1beta1")


# -- bad input ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("body, message", [
    (b"\x00garbage", "not an AdmissionReview request: the body is not JSON"),
    (b"[1, 2]", "not an AdmissionReview request: the body is a JSON list, not an AdmissionReview object"),
    (b'{"apiVersion": "v1", "kind": "Pod"}', "not an AdmissionReview request: expected kind AdmissionReview of "
     "admission.k8s.io/v1 or admission.k8s.io/v1beta1, got kind 'Pod' of apiVersion 'v1'"),
    (b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {}}',
     "not an AdmissionReview request: the AdmissionReview has no request with a uid"),
    (b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "u", "resource": "x"}}',
     "not an AdmissionReview request: the AdmissionReview request is malformed"),
])
async def test_garbage_is_a_clear_400(serve, body: bytes, message: str) -> None:
    served = await serve([ValidatingWebhook("v.widgets.example.com", allow, RULES)])
    status, answer = await served.post("/validating/v.widgets.example.com", body)
    assert status == 400 and answer["kind"] == "Status" and answer["code"] == 400
    assert answer["message"].startswith(message), answer


async def test_content_type_size_and_method_are_strict(serve) -> None:
    served = await serve([ValidatingWebhook("v.widgets.example.com", allow, RULES)])
    path = "/validating/v.widgets.example.com"
    status, answer = await served.post(path, review(), content_type="text/plain")
    assert (status, answer["message"]) == (415, "Content-Type must be application/json, got 'text/plain'")
    status, answer = await served.post(path, b" " * (MAX_BODY + 1))
    assert (status, answer["message"]) == (413, f"the body is larger than {MAX_BODY} bytes")
    status, _ = await served.post("/validating/nothing.here.example.com", review())
    assert status == 404
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=client_context(served.ca_pem))) as s:
        async with s.get(served.url + path) as resp:
            assert resp.status == 405


# -- handler failures ---------------------------------------------------------------------------------------
async def test_a_handler_that_raises_is_a_deny_naming_the_error_and_uid(serve, logs: list[str]) -> None:
    async def broken(request: AdmissionRequest) -> Verdict:
        raise KeyError("spec")

    served = await serve([ValidatingWebhook("v.widgets.example.com", broken, RULES)])
    status, body = await served.post("/validating/v.widgets.example.com", review("u-boom"))
    assert status == 200
    assert body["response"] == {"uid": "u-boom", "allowed": False, "status": {
        "code": 500, "message": "internal error in the admission handler: KeyError: 'spec' (request uid u-boom)"}}
    [line] = [x for x in logs if x.startswith("admission handler raised")]
    assert "'uid': 'u-boom'" in line and "KeyError" in line


async def test_a_timeout_raised_by_the_handler_is_its_own_error(serve) -> None:
    async def times_out(request: AdmissionRequest) -> Verdict:
        raise TimeoutError("the policy service did not answer")

    served = await serve([ValidatingWebhook("v.widgets.example.com", times_out, RULES)])
    status, body = await served.post("/validating/v.widgets.example.com", review())
    assert status == 200 and body["response"]["status"] == {"code": 500, "message": (
        "internal error in the admission handler: TimeoutError: the policy service did not answer "
        "(request uid uid-1)")}


@pytest.mark.parametrize("returned, message", [
    (Allow(patch=[{"op": "add", "path": "/x", "value": 1}]),
     "a validating webhook cannot change the object: its Allow() must not carry a patch"),
    ({"allowed": True}, "the handler returned dict, expected Allow(...) or Deny(...)"),
    (Allow(warnings="careful"), "warnings must be a list of strings, got 'careful'"),
])
async def test_a_handler_returning_no_usable_verdict_is_a_deny(serve, returned: Any, message: str) -> None:
    async def wrong(request: AdmissionRequest) -> Any:
        return returned

    served = await serve([ValidatingWebhook("v.widgets.example.com", wrong, RULES)])
    _, body = await served.post("/validating/v.widgets.example.com", review())
    assert body["response"]["status"] == {
        "code": 500, "message": f"internal error in the admission handler: {message} (request uid uid-1)"}


async def test_a_malformed_patch_is_a_deny(serve) -> None:
    async def bad_patch(request: AdmissionRequest) -> Verdict:
        return Allow(patch=[{"op": "add", "path": "/spec/size"}])

    served = await serve([MutatingWebhook("m.widgets.example.com", bad_patch, RULES)])
    _, body = await served.post("/mutating/m.widgets.example.com", review())
    assert "patch operation 0 ({'op': 'add', 'path': '/spec/size'}) needs a 'value'" in \
        body["response"]["status"]["message"]


async def test_a_slow_handler_is_cut_before_the_api_server_gives_up(serve, logs: list[str]) -> None:
    cancelled = asyncio.Event()

    async def hang(request: AdmissionRequest) -> Verdict:
        try:
            await asyncio.sleep(3600)
        finally:
            cancelled.set()
        return Allow()

    served = await serve([ValidatingWebhook("v.widgets.example.com", hang, RULES, timeout_seconds=2)])
    started = time.monotonic()
    status, body = await served.post("/validating/v.widgets.example.com", review("u-slow"))
    took = time.monotonic() - started
    # 2 s declared: the handler gets 1.6 s, and the answer is a failed call (504), for failurePolicy to decide.
    assert (status, body["code"]) == (504, 504) and 1.5 < took < 1.95, took
    assert body["message"] == "admission webhook v.widgets.example.com did not answer within 1.6s (request uid u-slow)"
    assert cancelled.is_set()
    # The API server's own ?timeout= wins over the declaration when it is shorter.
    started = time.monotonic()
    status, body = await served.post("/validating/v.widgets.example.com", review(), query="?timeout=1s")
    assert status == 504 and "within 0.8s" in body["message"] and time.monotonic() - started < 1.5
    assert any("did not answer within" in x and "'uid': 'u-slow'" in x for x in logs)


# -- mutual TLS ---------------------------------------------------------------------------------------------
async def test_client_certificates_are_required_when_a_client_ca_is_set(serve, tmp_path: Path) -> None:
    clients = CA.new("api-server-clients")
    (tmp_path / "client-ca.crt").write_bytes(pem(clients.cert))
    for name, ca in (("good", clients), ("stranger", CA.new("stranger"))):
        cert, key = ca.issue("kube-apiserver", server=False)
        (tmp_path / f"{name}.crt").write_bytes(cert)
        (tmp_path / f"{name}.key").write_bytes(key)
    served = await serve([ValidatingWebhook("v.widgets.example.com", allow, RULES)],
                         client_ca=str(tmp_path / "client-ca.crt"))
    path = "/validating/v.widgets.example.com"
    status, body = await served.post(path, review())
    assert status == 401 and "client certificate signed by the CA of setting 'webhooks.client_ca_file'" in \
        body["message"]
    good = client_context(served.ca_pem, tmp_path / "good.crt", tmp_path / "good.key")
    status, body = await served.post(path, review(), context=good)
    assert (status, body["response"]["allowed"]) == (200, True)
    stranger = client_context(served.ca_pem, tmp_path / "stranger.crt", tmp_path / "stranger.key")
    with pytest.raises((aiohttp.ClientError, ssl.SSLError)):
        await served.post(path, review(), context=stranger)
    assert await served.server.self_dial() == ""  # the readiness dial needs no client certificate


# -- certificates ---------------------------------------------------------------------------------------------
async def peer_der(port: int, ca_pem: bytes) -> bytes:
    _, writer = await asyncio.open_connection("127.0.0.1", port, ssl=client_context(ca_pem))
    der = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
    writer.close()
    await writer.wait_closed()
    return bytes(der)


async def test_rotation_of_file_certificates_while_requests_flow(serve, tmp_path: Path) -> None:
    ca = CA.new()
    secret = tmp_path / "secret"
    first = ca.write_secret(secret, "first")
    slow_started = asyncio.Event()

    async def handler(request: AdmissionRequest) -> Verdict:
        if request.uid == "slow":
            slow_started.set()
            await asyncio.sleep(1.5)
        return Allow()

    served = await serve([ValidatingWebhook("v.widgets.example.com", handler, RULES)], cert_dir=str(secret))
    certs = served.server.certificates
    assert await peer_der(served.server.port, served.ca_pem) == der_of(first) == certs.leaf_der
    path = "/validating/v.widgets.example.com"
    results: list[int] = []
    stop = asyncio.Event()

    async def traffic(context: ssl.SSLContext, force_close: bool) -> None:
        # One client reconnecting for every request (new handshakes), one keeping its connection alive.
        connector = aiohttp.TCPConnector(ssl=context, force_close=force_close)
        async with aiohttp.ClientSession(connector=connector) as session:
            while not stop.is_set():
                async with session.post(served.url + path, data=review(),
                                        headers={"Content-Type": "application/json"}) as resp:
                    results.append(resp.status)

    context = client_context(served.ca_pem)
    flows = [asyncio.create_task(traffic(context, force)) for force in (True, False)]
    slow = asyncio.create_task(served.post(path, review("slow")))
    try:
        await slow_started.wait()
        # Written as a Secret update lands without the kubelet's atomic swap: the certificate first, the key a
        # moment later. The mismatched pair in between must not be used.
        second_cert, second_key = ca.issue("second")
        (secret / "tls.crt").write_bytes(second_cert)
        for _ in range(3):
            assert await certs.reload() is False and "still serving the previous one" in certs.last_error
        assert await peer_der(served.server.port, served.ca_pem) == der_of(first)
        (secret / "tls.key").write_bytes(second_key)
        os.utime(secret / "tls.key")
        assert await certs.reload() is True and certs.last_error == "" and certs.reloads == 1
        assert await peer_der(served.server.port, served.ca_pem) == der_of(second_cert) == certs.leaf_der
        await asyncio.sleep(0.3)
    finally:
        stop.set()
        await asyncio.gather(*flows)
    assert (await slow)[0] == 200  # in flight across the reload
    assert len(results) > 20 and set(results) == {200}
    assert certs.status()["not_after"] and certs.status()["reloads"] == 1


async def test_self_signed_certificate_names_the_hosts_and_ca_verifies_it(serve) -> None:
    served = await serve([ValidatingWebhook("v.widgets.example.com", allow, RULES)])
    assert await served.server.self_dial() == ""
    context = client_context(served.ca_pem)  # checks the host name 127.0.0.1 against the certificate
    status, _ = await served.post("/validating/v.widgets.example.com", review(), context=context)
    assert status == 200 and served.server.certificates.source == "self-signed"
    shown = served.server.certificates.status()  # our CA ends when the certificate it signed does
    assert shown["ca_not_after"] == shown["not_after"] != ""


async def test_unusable_certificate_files_name_the_setting(tmp_path: Path) -> None:
    (tmp_path / "tls.crt").write_text("not a certificate")
    (tmp_path / "tls.key").write_text("not a key")
    with pytest.raises(CertificateError, match=r"^setting 'webhooks.cert_dir': cannot load tls.crt/tls.key from "):
        await ServingCertificates(str(tmp_path), ["127.0.0.1"]).load()
    with pytest.raises(CertificateError, match=r"^setting 'webhooks.hosts': a self-signed certificate needs at least"):
        await ServingCertificates("", []).load()


async def test_self_dial_notices_another_certificate(serve, tmp_path: Path) -> None:
    ca = CA.new()
    ca.write_secret(tmp_path)
    served = await serve([ValidatingWebhook("v.widgets.example.com", allow, RULES)], cert_dir=str(tmp_path))
    certs = served.server.certificates
    assert await served.server.self_dial() == ""
    other = ServingCertificates("", ["127.0.0.1"])
    await other.load()
    certs.context.current = other.context.current  # the listener now serves a certificate that is not loaded
    assert "TLS self-dial of 127.0.0.1" in await served.server.self_dial()
    other.close()


async def test_a_certificate_of_a_new_ca_waits_until_promoted(tmp_path: Path) -> None:
    """With staged CA changes, the certificate of a new CA is not served until promote(); meanwhile the bundle the
    clients need holds both CAs. A ca.crt that does not verify tls.crt (files written one by one) is not loaded."""
    old_ca, new_ca = CA.new("old"), CA.new("new")
    secret = tmp_path / "secret"
    old_cert = old_ca.write_secret(secret)
    certs = ServingCertificates(str(secret), ["127.0.0.1"], stage_ca_changes=True)
    await certs.load()
    try:
        new_cert, new_key = new_ca.issue("next")
        (secret / "tls.crt").write_bytes(new_cert)
        (secret / "tls.key").write_bytes(new_key)
        assert await certs.reload() is False and "tls.crt is not issued by a certificate of ca.crt" in certs.last_error
        (secret / "ca.crt").write_bytes(pem(new_ca.cert))
        assert await certs.reload() is True and certs.pending is not None
        assert certs.leaf_der == der_of(old_cert) and certs.ca_bundle == pem(old_ca.cert)
        assert certs.trusted_bundle == pem(old_ca.cert) + pem(new_ca.cert)
        assert certs.status()["rotation"].startswith("pending")
        assert certs.promote(object()) is False  # not the pending one: nothing changes
        assert certs.promote(certs.pending) is True and certs.pending is None
        assert certs.leaf_der == der_of(new_cert) and certs.trusted_bundle == pem(new_ca.cert)
        assert certs.reloads == 1
    finally:
        certs.close()


async def test_the_served_certificates_expiry_is_exported(tmp_path: Path) -> None:
    """syncer_webhook_certificate_expiry_timestamp_seconds: the earlier of the leaf's and its CA's expiry (what
    deploy/monitoring/alerts.yaml alerts on)."""
    ca = CA.new()
    leaf = x509.load_pem_x509_certificate(ca.write_secret(tmp_path))
    certs = ServingCertificates(str(tmp_path), ["127.0.0.1"])
    await certs.load()
    expected = min(leaf.not_valid_after_utc, ca.cert.not_valid_after_utc).timestamp()
    assert REGISTRY.get_sample_value("syncer_webhook_certificate_expiry_timestamp_seconds") == expected
