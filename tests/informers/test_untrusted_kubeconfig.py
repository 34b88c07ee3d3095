"""Kubeconfigs from untrusted sources: what is refused, what is invalid, what is accepted (against a local echo
server and the real control plane), and that no error or log line carries a credential."""

from __future__ import annotations

import base64
import datetime
import hashlib
import json
import ssl
import sys
import traceback
from pathlib import Path
from typing import Any, AsyncIterator

import kubernetes
import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestServer
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from loguru import logger

from informers import (
    ApiClient, KubeconfigError, KubeconfigInvalid, KubeconfigRefused, client_from_untrusted_kubeconfig, kubeconfig_hash,
)

TOKEN = "tok-DISTINCTIVE-5e1f0c9a7b"
PASSWORD = "pw-DISTINCTIVE-77d2"
SOURCE = "secret fleet/c1"
SERVER = "https://127.0.0.1:6443"
V1 = "client.authentication.k8s.io/v1"


# -- test PKI ------------------------------------------------------------------------------------------------------
def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _key_pem(key: ec.EllipticCurvePrivateKey, password: bytes | None = None) -> str:
    encryption = serialization.BestAvailableEncryption(password) if password else serialization.NoEncryption()
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption).decode()


def _pki() -> dict[str, str]:
    """A CA, a client certificate signed by it (CN untrusted-user, O system:masters) and keys, all as PEM."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "untrusted-kubeconfig-test-ca")])

    def build(subject: x509.Name, public_key: Any, ca: bool) -> str:
        builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(ca_name).public_key(public_key)
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if not ca:
            builder = builder.add_extension(
                x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        return builder.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM).decode()

    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "untrusted-user"),
                         x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:masters")])
    return {
        "ca": build(ca_name, ca_key.public_key(), True),
        "cert": build(subject, key.public_key(), False),
        "key": _key_pem(key),
        "encrypted_key": _key_pem(key, b"secret"),
        "other_key": _key_pem(ec.generate_private_key(ec.SECP256R1())),
    }


PKI = _pki()
# The body of the client key: no message may carry any of it.
KEY_BODY = PKI["key"].splitlines()[1]


# -- kubeconfigs ---------------------------------------------------------------------------------------------------
def kubeconfig(cluster: dict[str, Any] | None = None, user: dict[str, Any] | None = None, *,
               drop: tuple[str, ...] = (), **top: Any) -> str:
    """A kubeconfig whose current context ``c`` uses cluster ``c`` (``SERVER``) and user ``u`` (``TOKEN``); the
    given keys replace (None: remove) those of the cluster, the user or the document, ``drop`` removes documents keys.

    It always holds a bystander user with every secret of the test, so that every error path is given them.
    """
    def merged(base: dict[str, Any], changes: dict[str, Any] | None) -> dict[str, Any]:
        return {k: v for k, v in {**base, **(changes or {})}.items() if v is not None}

    doc: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "clusters": [{"name": "c", "cluster": merged({"server": SERVER}, cluster)}],
        "users": [{"name": "u", "user": merged({"token": TOKEN}, user)},
                  {"name": "bystander", "user": {"username": "b", "password": PASSWORD, "token": TOKEN,
                                                 "client-certificate-data": _b64(PKI["cert"]),
                                                 "client-key-data": _b64(PKI["key"])}}],
    }
    doc = merged(doc, top)
    return yaml.safe_dump({k: v for k, v in doc.items() if k not in drop})


def exec_section(command: str, **extra: Any) -> dict[str, Any]:
    return {"exec": {"command": command, "apiVersion": V1, **extra}, "token": None}


CERT_USER = {"token": None, "client-certificate-data": _b64(PKI["cert"]), "client-key-data": _b64(PKI["key"])}

REFUSED = [
    ({"certificate-authority": "/etc/kubernetes/ca.crt"}, None, "clusters[c].cluster.certificate-authority"),
    (None, {"tokenFile": "/var/run/secrets/kubernetes.io/serviceaccount/token"}, "users[u].user.tokenFile"),
    (None, {"client-certificate": "/etc/client.crt"}, "users[u].user.client-certificate"),
    (None, {"client-key": "/etc/client.key"}, "users[u].user.client-key"),
    (None, {"auth-provider": {"name": "oidc", "config": {"idp-certificate-authority": "/etc/ca"}}},
     "users[u].user.auth-provider"),
    (None, {"as": "system:admin"}, "users[u].user.as"),
    (None, {"as-uid": "1"}, "users[u].user.as-uid"),
    (None, {"as-groups": ["system:masters"]}, "users[u].user.as-groups"),
    (None, {"as-user-extra": {"scopes": ["x"]}}, "users[u].user.as-user-extra"),
    ({"proxy-url": "http://proxy:3128"}, None, "clusters[c].cluster.proxy-url"),
    (None, exec_section("aws"), "users[u].user.exec"),
    (None, exec_section("allowed-plugin", env=[{"name": "PATH", "value": "/tmp"}]), "users[u].user.exec.env[0].name"),
    (None, exec_section("allowed-plugin", env=[{"name": "LD_PRELOAD", "value": "/tmp/x.so"}]),
     "users[u].user.exec.env[0].name"),
]

INVALID: list[tuple[str, str | bytes, str | None, str]] = [
    # (id, kubeconfig, field, words of the message)
    ("not-yaml", f"users:\n- name: u\n  user:\n    token: {TOKEN}: x\n", None, "is not valid YAML (line 4, column"),
    ("not-utf8", b"users: \xff\xfe" + TOKEN.encode() + b"\x00", None, "is not valid YAML"),
    ("not-a-mapping", f"- {TOKEN}\n", None, "is not a YAML mapping"),
    ("empty", "", None, "is not a YAML mapping"),
    ("no-current-context", kubeconfig(**{"current-context": None}), "current-context", "is missing"),
    ("no-contexts", kubeconfig(drop=("contexts",)), "contexts", "has no entry named c"),
    ("context-not-mapping", kubeconfig(contexts=[{"name": "c", "context": TOKEN}]), "contexts[c].context",
     "is not a YAML mapping"),
    ("context-without-user", kubeconfig(contexts=[{"name": "c", "context": {"cluster": "c"}}]),
     "contexts[c].context.user", "is missing"),
    ("no-cluster", kubeconfig(drop=("clusters",)), "clusters", "has no entry named c"),
    ("no-user", kubeconfig(contexts=[{"name": "c", "context": {"cluster": "c", "user": "gone"}}]), "users",
     "has no entry named gone"),
    ("no-server", kubeconfig({"server": None}), "clusters[c].cluster.server", "is missing"),
    ("server-not-string", kubeconfig({"server": 6443}), "clusters[c].cluster.server", "is not a string"),
    ("server-scheme", kubeconfig({"server": "ftp://127.0.0.1"}), "clusters[c].cluster.server", "https://"),
    ("server-uppercase", kubeconfig({"server": "HTTPS://127.0.0.1"}), "clusters[c].cluster.server", "https://"),
    ("server-userinfo", kubeconfig({"server": f"https://{TOKEN}@127.0.0.1"}), "clusters[c].cluster.server",
     "https://"),
    ("server-port", kubeconfig({"server": "https://127.0.0.1:http"}), "clusters[c].cluster.server", "https://"),
    ("insecure-not-bool", kubeconfig({"insecure-skip-tls-verify": "yes please"}),
     "clusters[c].cluster.insecure-skip-tls-verify", "is not true or false"),
    ("ca-not-base64", kubeconfig({"certificate-authority-data": "%%%"}),
     "clusters[c].cluster.certificate-authority-data", "is not base64-encoded PEM"),
    ("ca-not-pem", kubeconfig({"certificate-authority-data": _b64(TOKEN)}),
     "clusters[c].cluster.certificate-authority-data", "holds no usable PEM certificate"),
    ("ca-and-insecure", kubeconfig({"certificate-authority-data": _b64(PKI["ca"]), "insecure-skip-tls-verify": True}),
     "clusters[c].cluster.certificate-authority-data", "insecure-skip-tls-verify"),
    ("token-line-break", kubeconfig(user={"token": f"{TOKEN}\nX-Evil: 1"}), "users[u].user.token",
     "has characters"),
    ("token-not-string", kubeconfig(user={"token": ["x"]}), "users[u].user.token", "is not a string"),
    ("password-without-username", kubeconfig(user={"token": None, "password": PASSWORD}),
     "users[u].user.username", "is missing"),
    ("username-colon", kubeconfig(user={"token": None, "username": "a:b", "password": PASSWORD}),
     "users[u].user.username", "basic authentication"),
    ("token-and-basic", kubeconfig(user={"username": "a", "password": PASSWORD}), "users[u].user",
     "more than one way to authenticate (token, username/password)"),
    ("token-and-exec", kubeconfig(user={**exec_section("allowed-plugin"), "token": TOKEN}), "users[u].user",
     "(token, exec)"),
    ("cert-without-key", kubeconfig(user={**CERT_USER, "client-key-data": None}), "users[u].user.client-key-data",
     "is missing"),
    ("key-without-cert", kubeconfig(user={**CERT_USER, "client-certificate-data": None}),
     "users[u].user.client-certificate-data", "is missing"),
    ("cert-not-pem", kubeconfig(user={**CERT_USER, "client-certificate-data": _b64(TOKEN)}),
     "users[u].user.client-certificate-data", "holds no usable PEM certificate"),
    ("key-not-pem", kubeconfig(user={**CERT_USER, "client-key-data": _b64(PKI["cert"])}),
     "users[u].user.client-key-data", "holds no usable PEM private key"),
    ("key-bad-base64", kubeconfig(user={**CERT_USER, "client-key-data": PKI["key"]}),
     "users[u].user.client-key-data", "is not base64-encoded PEM"),
    ("key-encrypted", kubeconfig(user={**CERT_USER, "client-key-data": _b64(PKI["encrypted_key"])}),
     "users[u].user.client-key-data", "encrypted"),
    ("key-mismatch", kubeconfig(user={**CERT_USER, "client-key-data": _b64(PKI["other_key"])}),
     "users[u].user.client-key-data", "is not the key of client-certificate-data"),
    ("exec-not-mapping", kubeconfig(user={"token": None, "exec": "allowed-plugin"}), "users[u].user.exec",
     "is not a YAML mapping"),
    ("exec-api-version", kubeconfig(user=exec_section("allowed-plugin", apiVersion="v0")),
     "users[u].user.exec.apiVersion", "is not one of"),
    ("exec-interactive", kubeconfig(user=exec_section("allowed-plugin", interactiveMode="Always")),
     "users[u].user.exec.interactiveMode", "without a terminal"),
    ("exec-args", kubeconfig(user=exec_section("allowed-plugin", args=["--x", 1])), "users[u].user.exec.args",
     "is not a list of strings"),
    ("exec-env-value", kubeconfig(user=exec_section("allowed-plugin", env=[{"name": "A", "value": 1}])),
     "users[u].user.exec.env[0].value", "is not a string"),
]


def load(data: str | bytes, **kwargs: Any) -> ApiClient:
    return client_from_untrusted_kubeconfig(data, source=SOURCE, allowed_exec_commands=["allowed-plugin"], **kwargs)


# -- refused and invalid -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("cluster,user,field", REFUSED, ids=[r[2] for r in REFUSED])
def test_refused(cluster, user, field):
    with pytest.raises(KubeconfigRefused) as e:
        load(kubeconfig(cluster, user))
    assert e.value.field == field and e.value.source == SOURCE
    assert str(e.value).startswith(f"{SOURCE}: {field} ")


def test_refusal_messages_say_why():
    with pytest.raises(KubeconfigRefused, match=r"users\[u\]\.user\.tokenFile is a file path; an untrusted "
                                                r"kubeconfig may carry inline data only \(use token\)"):
        load(kubeconfig(user={"tokenFile": "/var/run/secrets/kubernetes.io/serviceaccount/token"}))
    with pytest.raises(KubeconfigRefused, match=r"users\[u\]\.user\.exec runs 'aws', which is not in "
                                                r"clusters\.allowed_exec_commands"):
        load(kubeconfig(user=exec_section("aws")))


def test_exec_commands_are_compared_exactly():
    for command in ("/usr/bin/allowed-plugin", "allowed-plugin ", "./allowed-plugin"):
        with pytest.raises(KubeconfigRefused):
            load(kubeconfig(user=exec_section(command)))
    with pytest.raises(TypeError, match="not one string"):
        client_from_untrusted_kubeconfig(kubeconfig(), allowed_exec_commands="allowed-plugin")


@pytest.mark.parametrize("data,field,words", [c[1:] for c in INVALID], ids=[c[0] for c in INVALID])
def test_invalid(data, field, words):
    with pytest.raises(KubeconfigInvalid) as e:
        load(data)
    assert isinstance(e.value, KubeconfigError) and isinstance(e.value, ValueError)
    assert e.value.field == field
    assert str(e.value).startswith(f"{SOURCE}: {field} " if field else f"{SOURCE} ")
    assert words in str(e.value)


def test_names_in_messages_stay_on_one_line():
    with pytest.raises(KubeconfigInvalid) as e:
        load(kubeconfig(**{"current-context": "evil\nINFO forged log line"}))
    assert "\n" not in str(e.value) and "evil\\nINFO" in str(e.value)


def test_no_error_carries_a_secret():
    """Every error path, given a kubeconfig full of secrets: not in the message, the repr, the traceback, nor in a
    loguru line logging the error with variable values (``diagnose``)."""
    lines: list[str] = []
    sink = logger.add(lines.append, level="DEBUG", backtrace=True, diagnose=True, colorize=False)
    cases = [c[1] for c in INVALID] + [kubeconfig(cluster, user) for cluster, user, _ in REFUSED]
    # No local of this frame holds a kubeconfig on the line that calls: diagnose would show it.
    feed = iter(cases)
    try:
        for _ in cases:
            try:
                client_from_untrusted_kubeconfig(next(feed), source=SOURCE, allowed_exec_commands=["allowed-plugin"])
            except KubeconfigError as e:
                logger.exception("joining the cluster failed")
                assert e.__context__ is None and e.__cause__ is None
                texts = [str(e), repr(e), "".join(traceback.format_exception(e))]
            else:
                raise AssertionError("no error")
            for secret in (TOKEN, PASSWORD, KEY_BODY):
                assert not any(secret in text for text in texts), texts
    finally:
        logger.remove(sink)
    assert len(lines) == len(cases)
    assert "Traceback" in lines[0]  # the exception is in the captured output
    for secret in (TOKEN, PASSWORD, KEY_BODY):
        assert not any(secret in line for line in lines)


# -- accepted ------------------------------------------------------------------------------------------------------
def test_client_is_not_connected_and_does_not_show_its_token(tmp_path):
    ran = tmp_path / "ran"
    plugin = _plugin(tmp_path)
    client = client_from_untrusted_kubeconfig(
        kubeconfig({"server": "https://127.0.0.1:1"}, exec_section(plugin, env=[{"name": "RAN", "value": str(ran)}])),
        allowed_exec_commands=[plugin])
    assert client.host == "https://127.0.0.1:1" and not ran.exists()  # the plugin runs on the first request
    token_client = load(kubeconfig())
    assert TOKEN not in repr(token_client) and TOKEN not in str(token_client)


def test_only_the_chosen_context_is_read():
    # The other context's user names a file: not used, so not refused.
    data = kubeconfig(
        contexts=[{"name": "c", "context": {"cluster": "c", "user": "u"}},
                  {"name": "other", "context": {"cluster": "c", "user": "files"}}],
        users=[{"name": "u", "user": {"token": TOKEN}}, {"name": "files", "user": {"tokenFile": "/etc/token"}}])
    assert load(data).host == SERVER
    with pytest.raises(KubeconfigRefused):
        load(data, context="other")
    with pytest.raises(KubeconfigInvalid, match=r"contexts has no entry named missing"):
        load(data, context="missing")


def test_empty_fields_are_unset():
    data = kubeconfig({"certificate-authority": "", "proxy-url": ""}, {"tokenFile": "", "as-groups": []})
    assert load(data).host == SERVER


def test_kubeconfig_hash():
    data = kubeconfig()
    assert kubeconfig_hash(data) == kubeconfig_hash(data.encode()) == hashlib.sha256(data.encode()).hexdigest()
    assert kubeconfig_hash(data) != kubeconfig_hash(data + "\n")


def test_api_client_wants_both_halves_of_a_key_pair():
    with pytest.raises(ValueError, match="go together"):
        ApiClient(kubernetes.client.Configuration(host=SERVER), client_cert_data=PKI["cert"])


@pytest.fixture
async def echo() -> AsyncIterator[str]:
    """A plain-HTTP server answering every GET with the request's Authorization header; yields its URL."""
    async def handler(request: web.Request) -> web.Response:
        return web.json_response({"authorization": request.headers.get("Authorization")})

    app = web.Application()
    app.router.add_get("/{tail:.*}", handler)
    async with TestServer(app, host="127.0.0.1") as server:
        yield f"http://127.0.0.1:{server.port}"


async def test_token_and_basic_auth_are_sent(echo):
    async with load(kubeconfig({"server": echo})) as client:
        assert (await client.request("GET", "/x"))["authorization"] == f"Bearer {TOKEN}"
    async with load(kubeconfig({"server": echo}, {"token": None, "username": "ann", "password": PASSWORD})) as client:
        expected = "Basic " + base64.b64encode(f"ann:{PASSWORD}".encode()).decode()
        assert (await client.request("GET", "/x"))["authorization"] == expected


def _plugin(directory: Path) -> str:
    """An exec plugin writing its KUBERNETES_EXEC_INFO to $RAN and printing a token."""
    path = directory / "plugin"
    path.write_text(f"#!{sys.executable}\n"
                    "import json, os, pathlib\n"
                    "pathlib.Path(os.environ['RAN']).write_text(os.environ['KUBERNETES_EXEC_INFO'])\n"
                    f"print(json.dumps({{'apiVersion': '{V1}', 'kind': 'ExecCredential', "
                    "'status': {'token': 'from-plugin'}}))\n")
    path.chmod(0o755)
    return str(path)


async def test_allowed_exec_plugin_runs_on_first_request(echo, tmp_path):
    ran, plugin = tmp_path / "ran", _plugin(tmp_path)
    user = exec_section(plugin, env=[{"name": "RAN", "value": str(ran)}], provideClusterInfo=True)
    client = client_from_untrusted_kubeconfig(kubeconfig({"server": echo}, user), allowed_exec_commands=[plugin],
                                              exec_timeout=20)
    async with client:
        assert (await client.request("GET", "/x"))["authorization"] == "Bearer from-plugin"
    assert client.exec_plugin is not None and client.exec_plugin.timeout == 20
    assert json.loads(ran.read_text())["spec"]["cluster"]["server"] == echo


# -- against the real control plane --------------------------------------------------------------------------------
async def whoami(client: ApiClient) -> str:
    review = await client.request("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                                  body={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
    return str(review["status"]["userInfo"]["username"])


async def test_control_plane_with_token(control_plane):
    ca = base64.b64encode(control_plane.ca_file.read_bytes()).decode()
    user = {"token": control_plane.admin_token}
    for cluster in ({"server": control_plane.url, "certificate-authority-data": ca},
                    # The serving certificate is for 127.0.0.1 and localhost.
                    {"server": control_plane.url, "certificate-authority-data": ca, "tls-server-name": "localhost"},
                    {"server": control_plane.url, "insecure-skip-tls-verify": True}):
        async with client_from_untrusted_kubeconfig(kubeconfig(cluster, user)) as client:
            assert "gitVersion" in await client.request("GET", "/version")
    for cluster in ({"server": control_plane.url, "certificate-authority-data": ca, "tls-server-name": "other.test"},
                    {"server": control_plane.url}):  # the system CAs did not sign it
        async with client_from_untrusted_kubeconfig(kubeconfig(cluster, user)) as client:
            with pytest.raises(ssl.SSLCertVerificationError):
                await client.request("GET", "/version")


async def test_control_plane_with_client_certificate(control_plane_factory, tmp_path):
    client_ca = tmp_path / "client-ca.crt"
    client_ca.write_text(PKI["ca"])
    cp = control_plane_factory(extra_apiserver_flags=[f"--client-ca-file={client_ca}"])  # the last flag wins
    cluster = {"server": cp.url, "certificate-authority-data": base64.b64encode(cp.ca_file.read_bytes()).decode()}
    async with client_from_untrusted_kubeconfig(kubeconfig(cluster, CERT_USER)) as client:
        assert await whoami(client) == "untrusted-user"
