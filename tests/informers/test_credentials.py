"""Exec credential plugins against the real control plane: tokens, certificates, expiry, 401, failures, hangs,
cancellation, and no plugin process outliving its request or our process."""

from __future__ import annotations

import asyncio
import base64
import datetime
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from informers import ApiClient, ApiError, CredentialError, ExecPluginError, ExecPluginTimeout
from syncer.testing.controlplane import ADMIN_USER

V1 = "client.authentication.k8s.io/v1"
V1BETA1 = "client.authentication.k8s.io/v1beta1"
USER = "plugin-user"
REPO = Path(__file__).resolve().parents[2]

# Prints an ExecCredential with the Nth token of $TOKENS on its Nth run (the last one from then on), valid for
# $LIFETIME seconds if set, or a client certificate from $CERTS; appends KUBERNETES_EXEC_INFO to $RUNS.
TOKEN_PLUGIN = """#!{python}
import datetime, json, os
with open(os.environ["RUNS"], "a") as f:
    f.write(os.environ["KUBERNETES_EXEC_INFO"] + "\\n")
with open(os.environ["RUNS"]) as f:
    run = len(f.readlines())
info = json.loads(os.environ["KUBERNETES_EXEC_INFO"])
if "CERTS" in os.environ:
    files = os.environ["CERTS"].split(",")
    with open(files[min(run, len(files)) - 1]) as f:
        cert, key = f.read().split("@@")
    status = {{"clientCertificateData": cert, "clientKeyData": key}}
else:
    tokens = os.environ["TOKENS"].split(",")
    status = {{"token": tokens[min(run, len(tokens)) - 1]}}
if os.environ.get("LIFETIME"):
    expiry = datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=float(os.environ["LIFETIME"]))
    status["expirationTimestamp"] = expiry.strftime("%Y-%m-%dT%H:%M:%SZ")
print(json.dumps({{"apiVersion": info["apiVersion"], "kind": "ExecCredential", "status": status}}))
"""

# Records its own pid and that of a child it leaves in the background, then waits forever.
HANGING_PLUGIN = """#!/bin/sh
echo $$ >> "$PIDS"
sleep 1000 &
echo $! >> "$PIDS"
wait
"""


def script(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    path.chmod(0o755)
    return str(path)


def kubeconfig(tmp_path: Path, cp, command: str, env: dict[str, str] | None = None, api_version: str = V1,
               **extra) -> str:
    exec_section = {"apiVersion": api_version, "command": command, "interactiveMode": "Never",
                    "env": [{"name": k, "value": v} for k, v in (env or {}).items()], **extra}
    config = {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "cp", "cluster": {"server": cp.url, "certificate-authority": str(cp.ca_file)}}],
        "users": [{"name": USER, "user": {"exec": exec_section}}],
        "contexts": [{"name": "plugin", "context": {"cluster": "cp", "user": USER}}],
        "current-context": "plugin",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(config))
    return str(path)


def token_client(tmp_path: Path, cp, tokens: list[str], lifetime: float | None = None,
                 api_version: str = V1, **extra) -> tuple[ApiClient, Path]:
    runs = tmp_path / "runs"
    env = {"RUNS": str(runs), "TOKENS": ",".join(tokens), **({"LIFETIME": str(lifetime)} if lifetime else {})}
    command = script(tmp_path, "token-plugin", TOKEN_PLUGIN.format(python=sys.executable))
    return ApiClient.from_kubeconfig(kubeconfig(tmp_path, cp, command, env, api_version, **extra)), runs


def run_count(runs: Path) -> int:
    return len(runs.read_text().splitlines()) if runs.exists() else 0


async def whoami(client: ApiClient) -> str:
    review = await client.request("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
                                  body={"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
    return review["status"]["userInfo"]["username"]


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for a reaper does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_for_pids(path: Path, count: int, timeout: float = 10) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and len(lines := path.read_text().split()) >= count:
            return [int(p) for p in lines]
        time.sleep(0.02)
    raise AssertionError(f"the plugin did not write {count} pids to {path}")


async def wait_gone(pids: list[int], timeout: float = 5) -> None:
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in pids):
        assert time.monotonic() < deadline, f"still running: {[p for p in pids if alive(p)]}"
        await asyncio.sleep(0.02)


# -- working plugins -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("api_version", [V1, V1BETA1])
async def test_token_plugin_runs_on_first_request_only(control_plane, tmp_path, api_version):
    client, runs = token_client(tmp_path, control_plane, [control_plane.admin_token], api_version=api_version)
    async with client:
        assert run_count(runs) == 0, "construction must not run the plugin"
        assert await whoami(client) == ADMIN_USER
        await client.request("GET", "/api")
        assert run_count(runs) == 1
    info = json.loads(runs.read_text())
    assert info == {"apiVersion": api_version, "kind": "ExecCredential", "spec": {"interactive": False}}


async def test_provide_cluster_info(control_plane, tmp_path):
    client, runs = token_client(tmp_path, control_plane, [control_plane.admin_token], provideClusterInfo=True)
    async with client:
        await client.request("GET", "/api")
    cluster = json.loads(runs.read_text())["spec"]["cluster"]
    assert cluster == {"server": control_plane.url,
                       "certificate-authority-data": base64.b64encode(control_plane.ca_file.read_bytes()).decode()}


async def test_concurrent_requests_share_one_run(control_plane, tmp_path):
    client, runs = token_client(tmp_path, control_plane, [control_plane.admin_token])
    async with client:
        await asyncio.gather(*(client.request("GET", "/api") for _ in range(8)))
    assert run_count(runs) == 1


# -- renewal ---------------------------------------------------------------------------------------------------
async def test_token_is_renewed_shortly_before_expiry(control_plane, tmp_path):
    # Valid for 10 more seconds: inside the renewal margin, so every request gets a fresh one.
    client, runs = token_client(tmp_path, control_plane, [control_plane.admin_token], lifetime=10)
    async with client:
        for expected_runs in (1, 2, 3):
            await client.request("GET", "/api")
            assert run_count(runs) == expected_runs


async def test_long_lived_token_is_kept(control_plane, tmp_path):
    client, runs = token_client(tmp_path, control_plane, [control_plane.admin_token], lifetime=3600)
    async with client:
        for _ in range(3):
            await client.request("GET", "/api")
    assert run_count(runs) == 1


async def test_401_reruns_the_plugin_and_sends_again(control_plane, tmp_path):
    client, runs = token_client(tmp_path, control_plane, ["revoked", control_plane.admin_token])
    async with client:
        assert await whoami(client) == ADMIN_USER
        assert run_count(runs) == 2


async def test_401_on_a_watch_reruns_the_plugin(control_plane, tmp_path):
    client, runs = token_client(tmp_path, control_plane, ["revoked", control_plane.admin_token])
    async with client:
        async with client.stream("/api/v1/namespaces", {"watch": "1", "timeoutSeconds": "1"}) as events:
            assert [e async for e in events]  # the ADDED events of the existing namespaces
    assert run_count(runs) == 2


async def test_401_reruns_at_most_once_per_request(control_plane, tmp_path):
    client, runs = token_client(tmp_path, control_plane, ["revoked"])
    async with client:
        with pytest.raises(ApiError) as e:
            await client.request("GET", "/api")
        assert e.value.status == 401
        assert run_count(runs) == 2


# -- client certificates ---------------------------------------------------------------------------------------
def _certificates(directory: Path, names: list[str]) -> tuple[Path, list[str]]:
    """A client CA, and for each name a file with a client certificate (O=system:masters) and key for it."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "exec-test-client-ca")])

    def build(subject, public_key, ca: bool) -> x509.Certificate:
        builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(ca_name).public_key(public_key)
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if not ca:
            builder = builder.add_extension(
                x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        return builder.sign(ca_key, hashes.SHA256())

    ca_file = directory / "client-ca.crt"
    ca_file.write_bytes(build(ca_name, ca_key.public_key(), True).public_bytes(serialization.Encoding.PEM))
    files = []
    for name in names:
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name),
                             x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:masters")])
        cert = build(subject, key.public_key(), False).public_bytes(serialization.Encoding.PEM).decode()
        key_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption()).decode()
        path = directory / f"{name}.pem"
        path.write_text(f"{cert}@@{key_pem}")
        files.append(str(path))
    return ca_file, files


async def test_client_certificate_plugin_and_its_rotation(control_plane_factory, tmp_path):
    ca_file, certs = _certificates(tmp_path, ["cert-user-1", "cert-user-2"])
    cp = control_plane_factory(extra_apiserver_flags=[f"--client-ca-file={ca_file}"])  # the last flag wins
    runs = tmp_path / "runs"
    command = script(tmp_path, "cert-plugin", TOKEN_PLUGIN.format(python=sys.executable))
    path = kubeconfig(tmp_path, cp, command, {"RUNS": str(runs), "CERTS": ",".join(certs), "LIFETIME": "10"})
    async with ApiClient.from_kubeconfig(path) as client:
        assert await whoami(client) == "cert-user-1"
        # Expiring: the next request runs the plugin again and must present the new certificate.
        assert await whoami(client) == "cert-user-2"


# -- failing plugins -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("body,exit_code,message", [
    ("echo 'starting' >&2\necho 'error: token expired, run: login' >&2\nexit 3\n", 3,
     "exited with code 3: error: token expired, run: login"),
    ("exit 1\n", 1, "exited with code 1 and wrote nothing to stderr"),
    ("echo 'not json'\n", None, "printed no ExecCredential JSON on stdout"),
    ("echo '{\"apiVersion\": \"client.authentication.k8s.io/v1beta1\", \"kind\": \"ExecCredential\", "
     "\"status\": {\"token\": \"t\"}}'\n", None, "answered with apiVersion"),
    ("echo '{\"apiVersion\": \"client.authentication.k8s.io/v1\", \"kind\": \"ExecCredential\", "
     "\"status\": {}}'\n", None, "neither status.token nor status.clientCertificateData"),
    ("kill -KILL $$\n", 137, "exited with code 137"),
])
async def test_failing_plugin_raises_one_line_error(control_plane, tmp_path, body, exit_code, message):
    command = script(tmp_path, "failing-plugin", "#!/bin/sh\n" + body)
    async with ApiClient.from_kubeconfig(kubeconfig(tmp_path, control_plane, command)) as client:
        with pytest.raises(ExecPluginError) as e:
            await client.request("GET", "/api")
    assert isinstance(e.value, CredentialError)
    text = str(e.value)
    assert "\n" not in text
    assert text.startswith(f"exec credential plugin {command!r} of kubeconfig user {USER!r} ")
    assert message in text
    assert e.value.exit_code == exit_code


async def test_missing_plugin_command(control_plane, tmp_path):
    command = str(tmp_path / "no-such-plugin")
    async with ApiClient.from_kubeconfig(kubeconfig(tmp_path, control_plane, command)) as client:
        with pytest.raises(ExecPluginError, match="exited with code 127: .*no-such-plugin: No such file"):
            await client.request("GET", "/api")


# -- hanging plugins: timeout, cancellation, our death -----------------------------------------------------------
def hanging_client(tmp_path: Path, cp, timeout: float) -> tuple[ApiClient, Path, str]:
    pids = tmp_path / "pids"
    command = script(tmp_path, "hanging-plugin", HANGING_PLUGIN)
    path = kubeconfig(tmp_path, cp, command, {"PIDS": str(pids)})
    return ApiClient.from_kubeconfig(path, exec_timeout=timeout), pids, command


async def test_hanging_plugin_times_out_and_dies_with_its_children(control_plane, tmp_path):
    started = time.monotonic()
    client, pids, command = hanging_client(tmp_path, control_plane, timeout=1.5)
    assert time.monotonic() - started < 1 and not pids.exists(), "construction must not run the plugin"
    async with client:
        started = time.monotonic()
        with pytest.raises(ExecPluginTimeout) as e:
            await client.request("GET", "/api")
        assert 1.5 <= time.monotonic() - started < 4
    assert str(e.value) == (f"exec credential plugin {command!r} of kubeconfig user {USER!r} did not finish "
                            "within 1.5s and was killed (is it waiting for a login, a prompt or the network?)")
    plugin, child = wait_for_pids(pids, 2)
    await wait_gone([plugin, child])


async def test_a_process_escaping_the_plugin_group_cannot_hang_the_request(control_plane, tmp_path):
    # It keeps our stdout pipe open and survives the group kill: the request must still end at the timeout.
    pids = tmp_path / "pids"
    command = script(tmp_path, "escaping-plugin",
                     '#!/bin/sh\nsetsid sleep 1000 &\necho $! >> "$PIDS"\nexec sleep 1000\n')
    path = kubeconfig(tmp_path, control_plane, command, {"PIDS": str(pids)})
    try:
        async with ApiClient.from_kubeconfig(path, exec_timeout=1) as client:
            started = time.monotonic()
            with pytest.raises(ExecPluginTimeout):
                await client.request("GET", "/api")
            assert time.monotonic() - started < 3
    finally:
        for pid in wait_for_pids(pids, 1):
            os.kill(pid, signal.SIGKILL)


async def test_requests_waiting_for_a_hanging_plugin_fail_together(control_plane, tmp_path):
    client, pids, _ = hanging_client(tmp_path, control_plane, timeout=1)
    async with client:
        started = time.monotonic()
        results = await asyncio.gather(*(client.request("GET", "/api") for _ in range(5)), return_exceptions=True)
        assert time.monotonic() - started < 3
    assert all(isinstance(r, ExecPluginTimeout) for r in results), results
    assert len(pids.read_text().split()) == 2, "one run (plugin and child pid), shared by all five requests"


async def test_cancelling_the_request_kills_the_plugin(control_plane, tmp_path):
    client, pids, _ = hanging_client(tmp_path, control_plane, timeout=60)
    async with client:
        request = asyncio.create_task(client.request("GET", "/api"))
        plugin, child = await asyncio.to_thread(wait_for_pids, pids, 2)
        request.cancel()
        with pytest.raises(asyncio.CancelledError):
            await request
        await wait_gone([plugin, child])


OWNER = """
import asyncio, sys
from informers import ApiClient

async def main():
    async with ApiClient.from_kubeconfig(sys.argv[1], exec_timeout=600) as client:
        await client.request("GET", "/api")

asyncio.run(main())
"""


async def test_plugin_dies_when_its_owner_is_sigkilled(control_plane, tmp_path):
    _, pids, _ = hanging_client(tmp_path, control_plane, timeout=600)
    owner = subprocess.Popen([sys.executable, "-c", OWNER, str(tmp_path / "kubeconfig")], cwd=REPO)
    try:
        plugin, child = await asyncio.to_thread(wait_for_pids, pids, 2)
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    await wait_gone([plugin, child])


async def test_a_token_in_the_kubeconfig_wins_over_exec(control_plane, tmp_path):
    # As in the kubernetes package: user.token is used and the exec section is never run.
    path = kubeconfig(tmp_path, control_plane, str(tmp_path / "never-run"))
    config = json.loads(Path(path).read_text())
    config["users"][0]["user"]["token"] = control_plane.admin_token
    Path(path).write_text(json.dumps(config))
    async with ApiClient.from_kubeconfig(path) as client:
        assert client.exec_plugin is None
        assert await whoami(client) == ADMIN_USER


def test_unsupported_exec_configuration_fails_at_construction(control_plane, tmp_path):
    from kubernetes.config import ConfigException

    with pytest.raises(ConfigException, match="apiVersion 'client.authentication.k8s.io/v1alpha1' is not supp"):
        ApiClient.from_kubeconfig(kubeconfig(tmp_path, control_plane, "true",
                                             api_version="client.authentication.k8s.io/v1alpha1"))
    with pytest.raises(ConfigException, match="interactiveMode Always needs a terminal"):
        ApiClient.from_kubeconfig(kubeconfig(tmp_path, control_plane, "true", interactiveMode="Always"))

