"""Admission webhooks called by a real kube-apiserver: the sidecar's WebhookService (certificates, server, managed
configurations at ``https://127.0.0.1:<port>/<path>`` with our CA bundle, readiness) and ``syncer run`` with the
example plugin.

One private control plane serves this module (its configurations would otherwise reach into other tests).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable, Iterator

import kubernetes
import pytest
from prometheus_client import REGISTRY

from examples.plugins import widget_webhook
from informers import GVR, ApiClient, ApiError, Invalid, NotFound, ResourceClient, Supervisor
from syncer.settings import Webhooks
from syncer.testing import ControlPlane
from syncer.testing.pytest_plugin import kube_client
from syncer.webhook import AdmissionRequest, AdmissionRule, Allow, Deny, ValidatingWebhook, Verdict
from syncer.webhook import service as service_module
from syncer.webhook.configuration import MANAGED_BY, MANAGED_BY_LABEL, PROBE_NAME
from syncer.webhook.server import WebhookServer
from syncer.webhook.service import WebhookService

from tests.helpers import free_port
from tests.sidecar import readyz, sidecar, status_of
from tests.tls import CA, der_of, mount_secret, pem

ROOT = Path(__file__).resolve().parents[2]
WIDGET_CRD = json.loads((ROOT / "examples" / "crds" / "widget.json").read_text())
WIDGETS = GVR("examples.kube-syncer.io", "v1", "widgets")
CONFIGMAPS = GVR("", "v1", "configmaps")
VALIDATING = GVR("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations")
MUTATING = GVR("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations")


@pytest.fixture(scope="module")
def cp() -> Iterator[ControlPlane]:
    plane = ControlPlane(name="kube-syncer-webhooks").start()
    try:
        ext = kubernetes.client.ApiextensionsV1Api(kube_client(plane))
        ext.create_custom_resource_definition(WIDGET_CRD)
        deadline = time.monotonic() + 30
        while not any(c.type == "Established" and c.status == "True" for c in
                      ext.read_custom_resource_definition(WIDGET_CRD["metadata"]["name"]).status.conditions or []):
            assert time.monotonic() < deadline, "the Widget CRD was not established"
            time.sleep(0.1)
        yield plane
    finally:
        plane.stop()


@pytest.fixture
async def client(cp: ControlPlane) -> AsyncIterator[ApiClient]:
    async with ApiClient.from_kubeconfig(str(cp.kubeconfig)) as api:
        yield api


@pytest.fixture
async def services(client: ApiClient) -> AsyncIterator[Callable[..., Awaitable[WebhookService]]]:
    """Start WebhookServices (each with its own supervisor); all are stopped at the end of the test."""
    started: list[tuple[WebhookService, Supervisor]] = []

    async def start(webhooks: list[Any], wait_ready: bool = True, **settings: Any) -> WebhookService:
        supervisor = Supervisor("test")
        service = WebhookService(Webhooks(bind=f"127.0.0.1:{free_port()}", **settings), webhooks, client,
                                 "test-identity", supervisor)
        started.append((service, supervisor))
        await service.start()
        if wait_ready:
            await until(lambda: service.ready, "the webhooks to be ready", service)
        return service

    yield start
    for service, supervisor in started:
        await service.stop()
        await supervisor.stop()


async def until(check: Callable[[], bool], what: str, service: WebhookService | None = None,
                timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}" + (f": {service.status()}" if service else ""))
        await asyncio.sleep(0.05)


def widget(name: str, spec: dict[str, Any] | None = None, namespace: str = "default") -> dict[str, Any]:
    body: dict[str, Any] = {"apiVersion": "examples.kube-syncer.io/v1", "kind": "Widget",
                            "metadata": {"name": name, "namespace": namespace}}
    if spec is not None:
        body["spec"] = spec
    return body


def configmap(name: str, labels: dict[str, str], namespace: str = "default") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": namespace,
                                                                  "labels": labels}}


class Counted:
    """A validating webhook on ConfigMaps labelled ``test=<label>`` that allows all and counts its calls."""

    def __init__(self, label: str) -> None:
        self.calls = 0
        self.webhook = ValidatingWebhook(f"{label}.configmaps.example.com", self._count,
                                         [AdmissionRule(["CREATE"], [""], ["v1"], ["configmaps"])],
                                         object_selector={"matchLabels": {"test": label}})

    async def _count(self, request: AdmissionRequest) -> Verdict:
        self.calls += 1
        return Allow()


@dataclass
class Traffic:
    """What the dry runs of ``dry_run_traffic`` came to so far."""

    done: int = 0
    failures: list[str] = field(default_factory=list)


@contextlib.asynccontextmanager
async def dry_run_traffic(client: ApiClient, label: str, flows: int = 3) -> AsyncIterator[Traffic]:
    """``flows`` loops of server-side dry-run creates of ConfigMaps labelled ``test=<label>``, until the block ends."""
    configmaps = ResourceClient(client, CONFIGMAPS, namespaced=True)
    traffic, stop = Traffic(), asyncio.Event()

    async def flow() -> None:
        while not stop.is_set():
            try:
                await configmaps.create(configmap(f"c{traffic.done}", {"test": label}), dry_run=True)
                traffic.done += 1
            except ApiError as e:
                traffic.failures.append(str(e))

    tasks = [asyncio.create_task(flow()) for _ in range(flows)]
    try:
        yield traffic
    finally:
        stop.set()
        await asyncio.gather(*tasks)


def requests_served(path: str) -> float:
    """How many requests the webhook server answered at ``path`` (all codes), from its metrics."""
    return sum(sample.value for metric in REGISTRY.collect() if metric.name == "controller_runtime_webhook_requests"
               for sample in metric.samples
               if sample.name.endswith("_total") and sample.labels.get("webhook") == path)


# -- validating and mutating, through the API server -----------------------------------------------------------
async def test_the_api_server_calls_the_example_webhooks(services, client: ApiClient, cp: ControlPlane) -> None:
    seen_versions: list[str] = []

    async def beta(request: AdmissionRequest) -> Verdict:
        seen_versions.append(request.review_version)
        return Allow()

    webhooks = widget_webhook.syncer_webhooks({"max_size": 10, "default_size": 1})
    webhooks.append(ValidatingWebhook("beta.widgets.examples.kube-syncer.io", beta, [widget_webhook.WIDGETS],
                                      review_versions=("v1beta1",)))
    service = await services(webhooks)
    widgets = ResourceClient(client, WIDGETS, namespaced=True)
    with pytest.raises(Invalid) as denied:
        await widgets.create(widget("too-big", {"size": 50}))
    assert denied.value.status == 422
    assert denied.value.message == ('admission webhook "validate.widgets.examples.kube-syncer.io" denied the '
                                    'request: spec.size 50 is above the maximum of 10')
    # kubectl's client (the official one) sees the same code and message.
    custom = kubernetes.client.CustomObjectsApi(kube_client(cp))
    with pytest.raises(kubernetes.client.ApiException) as official:
        await asyncio.to_thread(custom.create_namespaced_custom_object, WIDGETS.group, "v1", "default", "widgets",
                                widget("too-big", {"size": 11}))
    assert official.value.status == 422 and "spec.size 11 is above the maximum of 10" in official.value.body
    # The mutating webhook's JSON patch is applied: a Widget without a size gets the default one.
    created = await widgets.create(widget("defaulted"))
    assert created["spec"] == {"size": 1}
    kept = await widgets.create(widget("sized", {"size": 7}))
    assert kept["spec"] == {"size": 7}
    assert set(seen_versions) == {"v1beta1"}  # answered in the version it came in, or the API server would refuse
    assert service.status()["configurations"] == "managed: kube-syncer"
    for name in ("defaulted", "sized"):
        await widgets.delete(name, "default")


async def test_a_raising_handler_is_a_denial_with_a_clear_message(services, client: ApiClient) -> None:
    async def broken(request: AdmissionRequest) -> Verdict:
        raise RuntimeError("the policy store is unreachable")

    await services([ValidatingWebhook("broken.configmaps.example.com", broken,
                                      [AdmissionRule(["CREATE"], [""], ["v1"], ["configmaps"])],
                                      object_selector={"matchLabels": {"test": "broken"}})],
                   configuration_name="broken")
    with pytest.raises(ApiError) as denied:
        await ResourceClient(client, CONFIGMAPS, namespaced=True).create(configmap("x", {"test": "broken"}),
                                                                         dry_run=True)
    assert denied.value.status == 500
    assert denied.value.message.startswith(
        'admission webhook "broken.configmaps.example.com" denied the request: internal error in the admission '
        "handler: RuntimeError: the policy store is unreachable (request uid ")


async def test_status_counts_each_webhooks_requests_denials_errors_and_latency(services, client: ApiClient) -> None:
    async def judge(request: AdmissionRequest) -> Verdict:
        verdict = (request.object or {})["metadata"]["labels"]["verdict"]
        if verdict == "raise":
            raise RuntimeError("the policy store is unreachable")
        return Deny("not this one") if verdict == "deny" else Allow()

    judged = ValidatingWebhook("judge.configmaps.example.com", judge,
                               [AdmissionRule(["CREATE"], [""], ["v1"], ["configmaps"])],
                               object_selector={"matchLabels": {"test": "judge"}})
    service = await services([judged], configuration_name="judge")
    configmaps = ResourceClient(client, CONFIGMAPS, namespaced=True)
    for verdict, times in (("allow", 3), ("deny", 2), ("raise", 1)):
        for i in range(times):
            try:
                await configmaps.create(configmap(f"{verdict}-{i}", {"test": "judge", "verdict": verdict}),
                                        dry_run=True)
            except ApiError as e:
                assert verdict != "allow", e
    [row] = [w for w in service.status()["webhooks"] if w["name"] == judged.name]
    assert {k: row[k] for k in ("requests", "allowed", "denied", "errors")} == {
        "requests": 6, "allowed": 3, "denied": 2, "errors": 1}, row
    assert 0 < row["latency_seconds"]["mean"] <= row["latency_seconds"]["max"] < 10, row


async def test_a_hanging_handler_gets_the_failure_policy(services, client: ApiClient) -> None:
    async def hang(request: AdmissionRequest) -> Verdict:
        await asyncio.sleep(3600)
        return Allow()

    rules = [AdmissionRule(["CREATE"], [""], ["v1"], ["configmaps"])]
    await services([ValidatingWebhook(f"{policy.lower()}.configmaps.example.com", hang, rules, timeout_seconds=2,
                                      failure_policy=policy, object_selector={"matchLabels": {"test": policy}})
                    for policy in ("Fail", "Ignore")], configuration_name="hanging")
    configmaps = ResourceClient(client, CONFIGMAPS, namespaced=True)
    started = time.monotonic()
    with pytest.raises(ApiError) as rejected:
        await configmaps.create(configmap("x", {"test": "Fail"}), dry_run=True)
    assert rejected.value.status == 500 and time.monotonic() - started < 2.5
    assert rejected.value.message.startswith('Internal error occurred: failed calling webhook '
                                             '"fail.configmaps.example.com": ')
    assert "admission webhook fail.configmaps.example.com did not answer within 1.6s" in rejected.value.message
    admitted = await configmaps.create(configmap("y", {"test": "Ignore"}), dry_run=True)
    assert admitted["metadata"]["name"] == "y"


# -- readiness --------------------------------------------------------------------------------------------------
async def test_ready_only_once_the_api_server_has_called_us(services) -> None:
    service = await services(widget_webhook.syncer_webhooks({}), wait_ready=False, configuration_name="readiness")
    probe_paths = [f"/{kind}/{PROBE_NAME}" for kind in ("validating", "mutating")]
    before = {p: requests_served(p) for p in probe_paths}
    deadline = time.monotonic() + 30
    while not service.ready:
        assert time.monotonic() < deadline, service.status()
        await asyncio.sleep(0.01)
    calls_when_ready = {p: requests_served(p) - before[p] for p in probe_paths}
    assert all(n >= 1 for n in calls_when_ready.values()), calls_when_ready
    assert service.status()["self_dial"] and service.status()["called_by_api_server"]


async def test_not_ready_while_the_api_server_cannot_reach_us(services, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(service_module, "_PROBE_WITHIN", 2.0)
    nobody = free_port()
    service = await services(widget_webhook.syncer_webhooks({}), wait_ready=False, configuration_name="unreachable",
                             url=f"https://127.0.0.1:{nobody}")
    await until(lambda: "did not call the probe webhook" in service.last_error, "the probe to give up", service)
    assert service.dialed and not service.ready
    assert service.health()[0].healthy is False
    assert f"https://127.0.0.1:{nobody}/validating/{PROBE_NAME}" in service.health()[0].message


# -- certificates from files ------------------------------------------------------------------------------------
async def test_rotating_file_certificates_while_the_api_server_calls(services, client: ApiClient,
                                                                     tmp_path: Path) -> None:
    ca = CA.new()
    secret = tmp_path / "secret"
    first = ca.write_secret(secret, "first")
    counted = Counted("rotation")
    service = await services([counted.webhook], cert_dir=str(secret), configuration_name="rotation")
    assert service.certificates.leaf_der == der_of(first)
    async with dry_run_traffic(client, "rotation") as traffic:
        await asyncio.sleep(0.5)
        second_cert, second_key = ca.issue("second")
        (secret / "tls.crt").write_bytes(second_cert)
        await asyncio.sleep(0.3)  # the key comes later, as a non-atomic update would have it
        (secret / "tls.key").write_bytes(second_key)
        await until(lambda: service.certificates.leaf_der == der_of(second_cert), "the reload", service)
        await asyncio.sleep(0.5)
    assert traffic.failures == [] and traffic.done > 10 and counted.calls >= traffic.done
    _, writer = await asyncio.open_connection("127.0.0.1", service.server.port,
                                              ssl=ssl.create_default_context(cadata=pem(ca.cert).decode()))
    assert writer.get_extra_info("ssl_object").getpeercert(binary_form=True) == der_of(second_cert)
    writer.close()
    await writer.wait_closed()
    assert service.certificates.status()["reloads"] == 1


@pytest.fixture
def no_keep_alive(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every answer of the webhook server closes its connection: each call of the API server is a new TLS
    handshake, which kept-alive connections would otherwise spare it."""
    route = WebhookServer._route

    def closing(self: WebhookServer, path: str, name: str, serve: Any) -> Callable[[Any], Awaitable[Any]]:
        handle = route(self, path, name, serve)

        async def close_after(request: Any) -> Any:
            response = await handle(request)
            response.force_close()
            return response
        return close_after

    monkeypatch.setattr(WebhookServer, "_route", closing)


async def test_a_new_ca_is_trusted_before_its_certificate_is_served(services, client: ApiClient, tmp_path: Path,
                                                                    no_keep_alive: None) -> None:
    old_ca, new_ca = CA.new("old-ca"), CA.new("new-ca")
    secret = tmp_path / "secret"
    mount_secret(secret, old_ca)
    counted = Counted("ca-rotation")
    service = await services([counted.webhook], cert_dir=str(secret), configuration_name="ca-rotation")
    validating = ResourceClient(client, VALIDATING, namespaced=False)

    async def bundle() -> bytes:
        [ours] = [e for e in (await validating.get("ca-rotation"))["webhooks"] if e["name"] == counted.webhook.name]
        return base64.b64decode(ours["clientConfig"]["caBundle"])

    async with dry_run_traffic(client, "ca-rotation") as traffic:
        await until(lambda: traffic.done >= 10 or bool(traffic.failures), "traffic before the rotation", service)
        new_cert = mount_secret(secret, new_ca)
        await until(lambda: service.certificates.leaf_der == der_of(new_cert), "the new certificate served", service,
                    timeout=60)
        deadline = time.monotonic() + 30
        while await bundle() != pem(new_ca.cert):  # then the old CA leaves the caBundle
            assert time.monotonic() < deadline, service.status()
            await asyncio.sleep(0.1)
        after = traffic.done
        await until(lambda: traffic.done >= after + 10 or bool(traffic.failures), "traffic after the rotation", service)
    failures = traffic.failures
    assert failures == [], f"{len(failures)} of {traffic.done + len(failures)} requests failed; first: {failures[0]}"
    assert counted.calls >= traffic.done
    _, writer = await asyncio.open_connection("127.0.0.1", service.server.port,
                                              ssl=ssl.create_default_context(cadata=pem(new_ca.cert).decode()))
    assert writer.get_extra_info("ssl_object").getpeercert(binary_form=True) == der_of(new_cert)
    writer.close()
    await writer.wait_closed()


# -- managed configurations --------------------------------------------------------------------------------------
async def test_configurations_are_labelled_and_only_ours_are_touched(services, client: ApiClient,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(service_module, "_UPKEEP_INTERVAL", 0.5)
    validating = ResourceClient(client, VALIDATING, namespaced=False)
    mutating = ResourceClient(client, MUTATING, namespaced=False)
    foreign = await validating.create({"apiVersion": "admissionregistration.k8s.io/v1",
                                       "kind": "ValidatingWebhookConfiguration",
                                       "metadata": {"name": "someone-elses"}, "webhooks": []})
    try:
        service = await services(widget_webhook.syncer_webhooks({}), wait_ready=False,
                                 configuration_name="someone-elses")
        await until(lambda: "exists and was not created by kube-syncer" in service.last_error, "the refusal", service)
        assert "set 'webhooks.configuration_name' to another name" in service.last_error and not service.ready
        await service.stop()
        kept = await validating.get("someone-elses")
        assert kept["metadata"]["resourceVersion"] == foreign["metadata"]["resourceVersion"]
    finally:
        await validating.delete("someone-elses")

    service = await services(widget_webhook.syncer_webhooks({}), configuration_name="ours")
    for rc in (validating, mutating):
        obj = await rc.get("ours")
        assert obj["metadata"]["labels"] == {MANAGED_BY_LABEL: MANAGED_BY}
        assert obj["metadata"]["annotations"]["kube-syncer.io/written-by"] == "test-identity"
    [entry] = [w for w in (await validating.get("ours"))["webhooks"] if w["name"] != PROBE_NAME]
    assert entry["clientConfig"]["url"] == f"https://127.0.0.1:{service.server.port}/validating/" \
                                           "validate.widgets.examples.kube-syncer.io"
    assert (entry["failurePolicy"], entry["sideEffects"], entry["timeoutSeconds"], entry["matchPolicy"]) == (
        "Fail", "None", 10, "Equivalent")
    # Deleted by hand: the upkeep puts it back.
    await validating.delete("ours")
    deadline = time.monotonic() + 10
    while True:
        try:
            await validating.get("ours")
            break
        except NotFound:
            assert time.monotonic() < deadline, "the configuration was not put back"
            await asyncio.sleep(0.1)
    await service.stop()  # what it wrote, it deletes
    for rc in (validating, mutating):
        with pytest.raises(NotFound):
            await rc.get("ours")


async def test_only_the_declared_kinds_get_a_configuration(services, client: ApiClient) -> None:
    # Validating webhooks only: no MutatingWebhookConfiguration of nothing but the probe; one of ours left by
    # plugins that declared mutating webhooks before goes.
    mutating = ResourceClient(client, MUTATING, namespaced=False)
    await mutating.create({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
                           "metadata": {"name": "validating-only", "labels": {MANAGED_BY_LABEL: MANAGED_BY}},
                           "webhooks": []})
    service = await services([Counted("only-validating").webhook], configuration_name="validating-only")
    with pytest.raises(NotFound):
        await mutating.get("validating-only")
    names = [w["name"] for w in (await ResourceClient(client, VALIDATING, namespaced=False).get("validating-only"))
             ["webhooks"]]
    assert names == ["only-validating.configmaps.example.com", PROBE_NAME]
    assert [w.kind for w in service.configurations.probes] == ["validating"]


# -- mutual TLS with the API server ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mtls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ControlPlane, Path]]:
    """A control plane whose API server presents a client certificate to webhooks, and that CA's file."""
    d = tmp_path_factory.mktemp("mtls")
    clients = CA.new("apiserver-webhook-clients")
    cert, key = clients.issue("kube-apiserver", server=False)
    (d / "client-ca.crt").write_bytes(pem(clients.cert))
    (d / "webhook.kubeconfig").write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config",
        "users": [{"name": "*", "user": {"client-certificate-data": base64.b64encode(cert).decode(),
                                         "client-key-data": base64.b64encode(key).decode()}}]}))
    plugin = {"apiVersion": "apiserver.config.k8s.io/v1", "kind": "WebhookAdmissionConfiguration",
              "kubeConfigFile": str(d / "webhook.kubeconfig")}
    (d / "admission.json").write_text(json.dumps({
        "apiVersion": "apiserver.config.k8s.io/v1", "kind": "AdmissionConfiguration",
        "plugins": [{"name": n, "configuration": plugin}
                    for n in ("ValidatingAdmissionWebhook", "MutatingAdmissionWebhook")]}))
    plane = ControlPlane(name="kube-syncer-mtls",
                         extra_apiserver_flags=[f"--admission-control-config-file={d / 'admission.json'}"]).start()
    try:
        yield plane, d / "client-ca.crt"
    finally:
        plane.stop()


async def test_mutual_tls_with_the_api_server(mtls: tuple[ControlPlane, Path], tmp_path: Path) -> None:
    plane, client_ca = mtls
    stranger = CA.new("not-the-apiserver")
    (tmp_path / "stranger-ca.crt").write_bytes(pem(stranger.cert))

    async def deny(request: AdmissionRequest) -> Verdict:
        return Deny("seen over mutual TLS")

    rules = [AdmissionRule(["CREATE"], [""], ["v1"], ["configmaps"])]
    async with ApiClient.from_kubeconfig(str(plane.kubeconfig)) as api:
        configmaps = ResourceClient(api, CONFIGMAPS, namespaced=True)
        for i, (ca_file, expect) in enumerate(((client_ca, "seen over mutual TLS"),
                                               (tmp_path / "stranger-ca.crt", "failed calling webhook"))):
            supervisor = Supervisor("mtls")
            service = WebhookService(Webhooks(bind=f"127.0.0.1:{free_port()}", client_ca_file=str(ca_file),
                                              configuration_name=f"mtls-{i}"),
                                     [ValidatingWebhook("mtls.configmaps.example.com", deny, rules,
                                                        object_selector={"matchLabels": {"test": "mtls"}})],
                                     api, "mtls", supervisor)
            await service.start()
            try:
                if ca_file == client_ca:
                    await until(lambda: service.ready, "readiness over mutual TLS", service)
                # The API server loads configurations asynchronously: ask until it applies this one.
                deadline = time.monotonic() + 30
                while True:
                    try:
                        await configmaps.create(configmap("x", {"test": "mtls"}), dry_run=True)
                    except ApiError as e:
                        message = e.message
                        break
                    assert time.monotonic() < deadline, "the configuration was never applied"
                    await asyncio.sleep(0.1)
                assert expect in message, message
                if ca_file != client_ca:  # a client certificate we do not trust: the API server cannot call us
                    assert not service.called
            finally:
                await service.stop()
                await supervisor.stop()


# -- the sidecar -----------------------------------------------------------------------------------------------
def test_syncer_run_serves_the_example_plugin(cp: ControlPlane, tmp_path: Path) -> None:
    port, webhook_port = free_port(), free_port()
    settings = tmp_path / "s.toml"
    settings.write_text(f'kubeconfig = "{cp.kubeconfig}"\nplugins = ["examples.plugins.widget_webhook"]\n'
                        f'include = ["core/configmaps"]\nhttp_bind = "127.0.0.1:{port}"\n'
                        f'[webhooks]\nbind = "127.0.0.1:{webhook_port}"\nconfiguration_name = "sidecar"\n'
                        '[plugin_settings.widget_webhook]\nmax_size = 5\n')
    log = tmp_path / "sidecar.log"
    custom = kubernetes.client.CustomObjectsApi(kube_client(cp))
    admission = kubernetes.client.AdmissionregistrationV1Api(kube_client(cp))
    with sidecar(settings, log) as proc:
        deadline = time.monotonic() + 60
        while readyz(port) != 200:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        status = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=5).read())
        assert status["webhooks"]["ready"] and status["webhooks"]["called_by_api_server"]
        with pytest.raises(kubernetes.client.ApiException) as denied:
            custom.create_namespaced_custom_object(WIDGETS.group, "v1", "default", "widgets", widget("w", {"size": 6}),
                                                   dry_run="All")
        assert denied.value.status == 422 and "spec.size 6 is above the maximum of 5" in denied.value.body
        created = custom.create_namespaced_custom_object(WIDGETS.group, "v1", "default", "widgets", widget("w"),
                                                         dry_run="All")
        assert created["spec"] == {"size": 1}
        rows = {w["name"]: w for w in status_of(port)["webhooks"]["webhooks"]}
        validate = rows["validate.widgets.examples.kube-syncer.io"]
        assert (validate["requests"], validate["allowed"], validate["denied"], validate["errors"]) == (2, 1, 1, 0)
        assert rows["default.widgets.examples.kube-syncer.io"]["allowed"] == 2
        assert validate["latency_seconds"]["max"] >= validate["latency_seconds"]["mean"] > 0
        shown = subprocess.run([sys.executable, "-m", "syncer", "status", "--url",
                                f"http://127.0.0.1:{port}/status"], cwd=ROOT, capture_output=True, text=True)
        [row] = [ln.split() for ln in shown.stdout.splitlines() if ln.startswith("validate.widgets")]
        assert row[:6] == ["validate.widgets.examples.kube-syncer.io", "validating", "2", "1", "1", "0"], shown.stdout
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, log.read_text()
    assert "webhooks ready: the API server called us" in log.read_text()
    names = [c.metadata.name for c in admission.list_validating_webhook_configuration().items]
    assert "sidecar" not in names, "the sidecar deletes the configurations it wrote when it stops"


@pytest.mark.parametrize("election", [False, True], ids=["election-off", "election-on"])
def test_a_fatal_exit_deletes_the_configurations_first(cp: ControlPlane, tmp_path: Path, election: bool) -> None:
    """SIGTERM with a runnable that ignores its cancellation ends in exit code 1; the `failurePolicy: Fail`
    configuration must not outlive the server it points at, and the error line says what is true in this mode."""
    port, webhook_port, name = free_port(), free_port(), f"fatal-exit-{'on' if election else 'off'}"
    settings = tmp_path / "s.toml"
    plugin = ROOT / "tests" / "plugins" / "stuck_runnable_webhook.py"
    settings.write_text(f'kubeconfig = "{cp.kubeconfig}"\nplugins = ["{plugin}"]\n'
                        f'include = ["core/configmaps"]\nhttp_bind = "127.0.0.1:{port}"\nshutdown_timeout = 4\n'
                        f'[webhooks]\nbind = "127.0.0.1:{webhook_port}"\nconfiguration_name = "{name}"\n'
                        f'[leader_election]\nenabled = {str(election).lower()}\nlease_name = "{name}"\n')
    log = tmp_path / "sidecar.log"
    admission = kubernetes.client.AdmissionregistrationV1Api(kube_client(cp))
    core = kubernetes.client.CoreV1Api(kube_client(cp))
    matching = kubernetes.client.V1ConfigMap(metadata=kubernetes.client.V1ObjectMeta(
        generate_name="fatal-", labels={"test": "fatal-exit"}))
    with sidecar(settings, log) as proc:
        deadline = time.monotonic() + 60
        while not (readyz(port) == 200 and [r["state"] for r in status_of(port)["runnables"]] == ["running"]):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        assert name in [c.metadata.name for c in admission.list_validating_webhook_configuration().items]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 1, log.read_text()
    output = log.read_text()
    # What the issue saw: every matching create failed with "failed calling webhook ... dial tcp".
    core.create_namespaced_config_map("default", matching, dry_run="All")
    assert name not in [c.metadata.name for c in admission.list_validating_webhook_configuration().items]
    assert name not in [c.metadata.name for c in admission.list_mutating_webhook_configuration().items]
    assert "deleted ValidatingWebhookConfiguration " + name in output, output[-3000:]
    [error] = [line for line in output.splitlines() if line.startswith("error: ")]
    assert "runnable stubborn did not stop within 2s" in error, output[-3000:]
    if election:
        assert "the lease default/" + name + " is not released" in error, error
    else:
        assert "lease" not in error.replace("no lease is held", "") and "leadership term" not in error, error
        assert "leader election is off: no lease is held" in error, error


