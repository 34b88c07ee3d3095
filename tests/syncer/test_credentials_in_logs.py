"""No credential reaches what the sidecar shows: its logs at TRACE (text and JSON, over HTTP/2 and HTTP/1.1), its
status (``/status`` and ``syncer status``), ``/metrics``, ``/debug/tasks`` and ``/debug/stalls``.

The sidecar is a multi-cluster ``syncer run`` whose members come from kubeconfig Secrets with every kind of
credential: a bearer token, a client certificate and key, an exec plugin's token, and a wrong token (so that
failed requests are logged too). Every credential planted, the management cluster's included, is then looked for
in everything the process wrote or answered.
"""

from __future__ import annotations

import base64
import datetime
import json
import logging
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from loguru import logger

from informers import ApiClient
from syncer.logs import MASK, redact, setup_logging
from syncer.testing import ControlPlane
from syncer.testing.credentials import member_kubeconfig

from tests.helpers import free_port
from tests.sidecar import ROOT, sidecar, status_of, wait_until

SECRETS = "/api/v1/namespaces/{}/secrets"
EXEC_PLUGIN = """#!/bin/sh
printf '{"apiVersion":"client.authentication.k8s.io/v1","kind":"ExecCredential","status":{"token":"%s"}}' "$TOKEN"
"""


def _client_pki(directory: Path) -> tuple[Path, bytes, bytes]:
    """A client CA file, and a client certificate (O=system:masters) and key it signed, as PEM."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "logs-test-client-ca")])
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "cert-member"),
                         x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:masters")])

    def signed(name: x509.Name, public_key: Any, ca: bool) -> bytes:
        cert = (x509.CertificateBuilder().subject_name(name).issuer_name(ca_name).public_key(public_key)
                .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=1))
                .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        return cert.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)

    ca_file = directory / "client-ca.crt"
    ca_file.write_bytes(signed(ca_name, ca_key.public_key(), True))
    key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    return ca_file, signed(subject, key.public_key(), False), key_pem


def _pem_body(pem: bytes) -> str:
    """A stretch of a PEM block's base64 body: what a leaked certificate or key would show."""
    return "".join(pem.decode().splitlines()[1:-1])[10:50]


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.fixture(scope="module")
def workload(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A member plane that also trusts a client CA of the test's, and that client's certificate and key."""
    directory = tmp_path_factory.mktemp("logs-pki")
    ca_file, cert, key = _client_pki(directory)
    plane = ControlPlane(name="logs-member", extra_apiserver_flags=[f"--client-ca-file={ca_file}"])
    try:
        plane.start()
        yield plane, cert, key
    finally:
        plane.stop()


@pytest.mark.parametrize("log_format,http2", [("text", True), ("json", False)], ids=["text-http2", "json-http1"])
async def test_no_credential_in_logs_status_metrics_or_debug(
        control_plane: ControlPlane, workload: Any, api: ApiClient, namespace: str, tmp_path: Path,
        log_format: str, http2: bool) -> None:
    plane, cert, key = workload
    async with ApiClient.from_kubeconfig(str(plane.kubeconfig)) as member_api:  # the exec member's user: an admin
        binding = {"metadata": {"name": "restricted-admin"},
                   "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
                   "subjects": [{"kind": "User", "name": "kube-syncer-restricted"}]}
        try:
            await member_api.request("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", body=binding)
        except Exception:
            pass  # made by the other parameter's run
    plugin = tmp_path / "exec-plugin"
    plugin.write_text(EXEC_PLUGIN)
    plugin.chmod(0o755)
    wrong_token = "0123456789abcdef-planted-wrong-token"
    users = {
        "token": {"token": plane.admin_token},
        "cert": {"client-certificate-data": _b64(cert), "client-key-data": _b64(key)},
        "exec": {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": str(plugin),
                          "interactiveMode": "Never", "env": [{"name": "TOKEN", "value": plane.restricted_token}]}},
        "wrong": {"token": wrong_token},
    }
    for name, user in users.items():
        kubeconfig = member_kubeconfig(plane.ca_file, plane.url, user)
        await api.request("POST", SECRETS.format(namespace), body={
            "metadata": {"name": name, "labels": {"kube-syncer.io/kubeconfig": "true"}},
            "data": {"kubeconfig": _b64(kubeconfig)}})
    port = free_port()
    settings = tmp_path / "settings.toml"
    settings.write_text(
        f'kubeconfig = "{control_plane.kubeconfig}"\nplugins = ["examples.plugins.configmap_mirror"]\n'
        f'include = ["core/configmaps", "core/namespaces"]\nhttp_bind = "127.0.0.1:{port}"\n'
        f'log_level = "TRACE"\nlog_format = "{log_format}"\nhttp2 = {json.dumps(http2)}\n'
        f'debug_endpoints = true\nshutdown_timeout = "10s"\n'
        f'[clusters]\nenabled = true\nnamespaces = ["{namespace}"]\nallowed_exec_commands = ["{plugin}"]\n'
        f'sync_timeout = "20s"\n')
    log = tmp_path / "syncer.log"
    shown: dict[str, str] = {}
    with sidecar(settings, log) as proc:
        def members() -> dict[str, bool]:
            try:
                return {m["name"]: m["ready"] for m in status_of(port)["clusters"]["clusters"]}
            except OSError:
                return {}

        wait_until(lambda: all(members().get(n) for n in ("token", "cert", "exec")), "the members to be ready",
                   proc, log, timeout=90)
        for path in ("/status", "/metrics", "/debug/tasks", "/debug/stalls", "/healthz", "/readyz"):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
                    shown[path] = r.read().decode()
            except urllib.error.HTTPError as e:  # /readyz may say the wrong member is not ready
                shown[path] = e.read().decode()
        status = subprocess.run([sys.executable, "-m", "syncer", "status", "--url", f"http://127.0.0.1:{port}/status"],
                                cwd=ROOT, capture_output=True, text=True, timeout=60)
        shown["syncer status"] = status.stdout + status.stderr
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    shown["log"] = log.read_text()
    assert "TRACE" in shown["log"] or '"level":"TRACE"' in shown["log"] or "DEBUG" in shown["log"]
    assert "wrong" in shown["syncer status"]
    planted = {
        "management admin token": control_plane.admin_token,
        "management restricted token": control_plane.restricted_token,
        "member admin token": plane.admin_token,
        "exec plugin token": plane.restricted_token,
        "wrong token": wrong_token,
        "client certificate": _pem_body(cert),
        "client key": _pem_body(key),
        "client certificate (base64)": _b64(cert)[20:60],
        "client key (base64)": _b64(key)[20:60],
    }
    found = [f"{what} in {where}" for where, text in shown.items() for what, secret in planted.items()
             if secret in text]
    assert not found, found


def test_wire_libraries_stay_at_warning_and_lines_are_redacted(capfd: pytest.CaptureFixture[str]) -> None:
    try:
        setup_logging("TRACE", "text")
        hpack_log = logging.getLogger("hpack.hpack")
        hpack_log.debug("Adding %s=%s to the header table", b"authorization", b"Bearer planted-one")
        logging.getLogger("aiohttp.client").debug("headers %s", {"Authorization": "Bearer planted-two"})
        assert capfd.readouterr().err == ""
        setup_logging("INFO", "json", {"hpack": "debug"})
        hpack_log.debug("Adding %s=%s to the header table", b"authorization", b"Bearer planted-three")
        hpack_log.debug("Encoded header block to %s", b"\x82\x87A\x81\xf3planted-four")
        logger.info("kubeconfig user {}", {"token": "planted-five", "client-key-data": "LS0tLS1CRUdJTiBFQyB"})
        err = capfd.readouterr().err
        lines = [json.loads(line) for line in err.splitlines()]
        assert [line["logger"] for line in lines][:2] == ["hpack.hpack", "hpack.hpack"]
        assert "planted" not in err and "LS0tLS1" not in err
        assert lines[1]["message"] == "Encoded header block to <17 bytes>"
        assert lines[0]["message"] == f"Adding b'authorization'=b'{MASK}' to the header table"
    finally:
        setup_logging()


@pytest.mark.parametrize("text,expected", [
    ("Authorization: Bearer abc.def-123", f"Authorization: {MASK}"),
    ("{'Authorization': 'Basic dXNlcjpwYXNz', 'Accept': 'x'}", f"{{'Authorization': '{MASK}', 'Accept': 'x'}}"),
    ('{"headers":"{\\"authorization\\": \\"opaque\\", \\"a\\": 1}"}',
     f'{{"headers":"{{\\"authorization\\": \\"{MASK}\\", \\"a\\": 1}}"}}'),
    ("(b'proxy-authorization', b'Bearer zzzzzzzz')", f"(b'proxy-authorization', b'{MASK}')"),
    ("Cookie=session=abc; Path=/", f"Cookie={MASK}; Path=/"),
    ("refresh token Bearer eyJhbGciOi", f"refresh token Bearer {MASK}"),
    ('{"token":"abc","id-token": "d e", "kind":"x"}', f'{{"token":"{MASK}","id-token": "{MASK}", "kind":"x"}}'),
    ("-----BEGIN EC PRIVATE KEY-----\nMHcCAQEE\n-----END EC PRIVATE KEY-----", MASK),
    ("client-certificate-data: LS0tLS1CRUdJTiBDRVJU", f"client-certificate-data: {MASK}"),
    ("kubeconfig Secret ns/name: no key 'kubeconfig'; tokens=3", "kubeconfig Secret ns/name: no key 'kubeconfig'; "
     "tokens=3"),
])
def test_redact(text: str, expected: str) -> None:
    assert redact(text) == expected
