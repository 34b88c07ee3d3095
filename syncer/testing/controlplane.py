"""A real etcd + kube-apiserver on loopback, for tests, examples and local runs.

Processes run in their own process group, die with the Python process that started them (``PR_SET_PDEATHSIG``
plus an ``atexit`` hook), and every instance has its own temporary directory and free ports, so several
control planes can run side by side.
"""

from __future__ import annotations

import atexit
import base64
import ctypes
import datetime
import ipaddress
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from pathlib import Path
from typing import Any, Sequence

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from .assets import Assets, ensure_assets

ADMIN_USER = "kube-syncer-admin"
RESTRICTED_USER = "kube-syncer-restricted"
_LOG_TAIL_LINES = 40


_spawned_pids: list[int] = []


def leftover_pids() -> list[int]:
    """PIDs of etcd/apiserver processes started in this process that are still running (not zombies)."""
    alive = []
    for pid in _spawned_pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            alive.append(pid)
    return alive


class ControlPlaneError(RuntimeError):
    """The control plane failed to start or to answer; the message carries the tail of the process logs."""


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)


def _die_with_parent() -> None:
    # Runs in the child between fork and exec: the kernel SIGKILLs it if the parent dies, even by SIGKILL.
    _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    os.setpgrp()


def _pem_cert(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _pem_key(key: Any) -> bytes:
    return bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )


def _make_pki(directory: Path) -> None:
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-syncer-test-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    serving = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=30))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    (directory / "ca.crt").write_bytes(_pem_cert(ca))
    (directory / "apiserver.crt").write_bytes(_pem_cert(serving))
    (directory / "apiserver.key").write_bytes(_pem_key(key))
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (directory / "sa.key").write_bytes(_pem_key(sa_key))
    (directory / "sa.pub").write_bytes(
        sa_key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )


class ControlPlane:
    """etcd + kube-apiserver on free loopback ports with RBAC, TLS, an admin and a restricted user.

    ``start()`` blocks until etcd is healthy, the apiserver ready and the ``default`` namespace exists.
    ``kubeconfig`` holds two contexts, ``admin`` (current) and ``restricted`` (no RBAC grants).
    """

    _live: "weakref.WeakSet[ControlPlane]" = weakref.WeakSet()

    def __init__(
        self,
        extra_apiserver_flags: Sequence[str] = (),
        assets: Assets | None = None,
        start_timeout: float = 60.0,
        name: str = "kube-syncer",
    ) -> None:
        self.assets = assets or ensure_assets()
        self.extra_apiserver_flags = list(extra_apiserver_flags)
        self.start_timeout = start_timeout
        self.name = name
        self.dir = Path(tempfile.mkdtemp(prefix=f"{name}-cp-"))
        self.etcd_port = _free_port()
        self.etcd_peer_port = _free_port()
        self.port = _free_port()
        self.admin_token = secrets.token_hex(16)
        self.restricted_token = secrets.token_hex(16)
        self._etcd: subprocess.Popen[bytes] | None = None
        self._apiserver: subprocess.Popen[bytes] | None = None
        _make_pki(self.dir)
        (self.dir / "tokens.csv").write_text(
            f'{self.admin_token},{ADMIN_USER},1,"system:masters"\n'
            f"{self.restricted_token},{RESTRICTED_USER},2\n"
        )
        self.kubeconfig = self.dir / "kubeconfig"
        self._write_kubeconfig()

    # -- addresses ---------------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        """The apiserver's base URL."""
        return f"https://127.0.0.1:{self.port}"

    @property
    def etcd_url(self) -> str:
        """etcd's client URL (plain HTTP on loopback)."""
        return f"http://127.0.0.1:{self.etcd_port}"

    @property
    def ca_file(self) -> Path:
        """The CA that signed the apiserver's serving certificate."""
        return self.dir / "ca.crt"

    def _write_kubeconfig(self) -> None:
        ca = base64.b64encode(self.ca_file.read_bytes()).decode()
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": self.name, "cluster": {"server": self.url, "certificate-authority-data": ca}}],
            "users": [
                {"name": "admin", "user": {"token": self.admin_token}},
                {"name": "restricted", "user": {"token": self.restricted_token}},
            ],
            "contexts": [
                {"name": "admin", "context": {"cluster": self.name, "user": "admin"}},
                {"name": "restricted", "context": {"cluster": self.name, "user": "restricted"}},
            ],
            "current-context": "admin",
        }
        # JSON is valid YAML, and the kubernetes client and kubectl both read it.
        self.kubeconfig.write_text(json.dumps(config, indent=2))
        self.kubeconfig.chmod(0o600)

    # -- lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> "ControlPlane":
        """Start etcd and the apiserver and wait until both serve; raise ControlPlaneError on failure."""
        ControlPlane._live.add(self)
        try:
            self._start_etcd()
            self._start_apiserver()
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, argv: list[str], log_name: str) -> subprocess.Popen[bytes]:
        log = open(self.dir / log_name, "ab")
        try:
            proc = subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                preexec_fn=_die_with_parent, cwd=self.dir,
            )
        finally:
            log.close()
        _spawned_pids.append(proc.pid)
        return proc

    def _start_etcd(self) -> None:
        data = self.dir / "etcd-data"
        self._etcd = self._spawn(
            [
                str(self.assets.etcd),
                "--name", "default",
                "--data-dir", str(data),
                "--listen-client-urls", self.etcd_url,
                "--advertise-client-urls", self.etcd_url,
                "--listen-peer-urls", f"http://127.0.0.1:{self.etcd_peer_port}",
                "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.etcd_peer_port}",
                "--initial-cluster", f"default=http://127.0.0.1:{self.etcd_peer_port}",
                "--unsafe-no-fsync",
                "--quota-backend-bytes", str(4 << 30),
                "--log-level", "warn",
            ],
            "etcd.log",
        )
        self._wait(lambda: self._http_ok(f"{self.etcd_url}/health"), "etcd /health", self._etcd)

    def _apiserver_argv(self) -> list[str]:
        d = self.dir
        return [
            str(self.assets.kube_apiserver),
            f"--etcd-servers={self.etcd_url}",
            f"--cert-dir={d / 'certs'}",
            f"--tls-cert-file={d / 'apiserver.crt'}",
            f"--tls-private-key-file={d / 'apiserver.key'}",
            f"--client-ca-file={d / 'ca.crt'}",
            f"--secure-port={self.port}",
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--authorization-mode=RBAC",
            f"--token-auth-file={d / 'tokens.csv'}",
            f"--service-account-issuer={self.url}",
            f"--service-account-key-file={d / 'sa.pub'}",
            f"--service-account-signing-key-file={d / 'sa.key'}",
            "--disable-admission-plugins=ServiceAccount",
            "--allow-privileged=true",
            "--v=0",
            *self.extra_apiserver_flags,
        ]

    def _start_apiserver(self) -> None:
        self._apiserver = self._spawn(self._apiserver_argv(), "apiserver.log")
        self._wait(lambda: self._http_ok(f"{self.url}/readyz"), "kube-apiserver /readyz", self._apiserver)
        self._wait(
            lambda: self._http_ok(f"{self.url}/api/v1/namespaces/default"), "the default namespace", self._apiserver
        )

    def stop(self, timeout: float = 10.0) -> None:
        """Stop both processes (SIGTERM, then SIGKILL after ``timeout``) and delete the data directory."""
        self.stop_apiserver(timeout)
        self._terminate(self._etcd, timeout)
        self._etcd = None
        ControlPlane._live.discard(self)
        shutil.rmtree(self.dir, ignore_errors=True)

    def stop_apiserver(self, timeout: float = 10.0) -> None:
        """Stop only the apiserver; etcd and its data stay."""
        self._terminate(self._apiserver, timeout)
        self._apiserver = None

    def start_apiserver(self) -> None:
        """Start the apiserver again on the same port, against the same etcd."""
        if self._apiserver is not None:
            raise ControlPlaneError("the apiserver is already running")
        self._start_apiserver()

    def restart_apiserver(self) -> None:
        """Restart the apiserver, keeping etcd and its data; clients reconnect to the same URL."""
        self.stop_apiserver()
        self.start_apiserver()

    @staticmethod
    def _terminate(proc: subprocess.Popen[bytes] | None, timeout: float) -> None:
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def __enter__(self) -> "ControlPlane":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def pids(self) -> list[int]:
        """PIDs of the running processes (for leak checks)."""
        return [p.pid for p in (self._etcd, self._apiserver) if p is not None and p.poll() is None]

    # -- etcd --------------------------------------------------------------------------------------------
    def _etcd_call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        req = urllib.request.Request(
            f"{self.etcd_url}{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            result: dict[str, Any] = json.load(resp)
            return result

    def etcd_revision(self) -> int:
        """etcd's current revision."""
        out = self._etcd_call("/v3/kv/range", {"key": base64.b64encode(b"/").decode(), "count_only": True})
        return int(out["header"]["revision"])

    def compact(self, revision: int | None = None) -> int:
        """Compact etcd up to ``revision`` (default: now), so older resourceVersions answer 410 Gone."""
        rev = revision if revision is not None else self.etcd_revision()
        self._etcd_call("/v3/kv/compaction", {"revision": str(rev), "physical": True})
        return rev

    # -- waiting -----------------------------------------------------------------------------------------
    def _ssl_context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))

    def _http_ok(self, url: str) -> bool:
        req = urllib.request.Request(url, headers={"Authorization": f"Bearer {self.admin_token}"})
        ctx = self._ssl_context() if url.startswith("https") else None
        try:
            with urllib.request.urlopen(req, timeout=2, context=ctx) as resp:
                return bool(resp.status == 200)
        except (urllib.error.URLError, OSError, ssl.SSLError):
            return False

    def _wait(self, probe: Any, what: str, proc: subprocess.Popen[bytes]) -> None:
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise ControlPlaneError(f"{what}: process exited with code {proc.returncode}\n{self.log_tail()}")
            if probe():
                return
            time.sleep(0.1)
        raise ControlPlaneError(f"timed out after {self.start_timeout:.0f}s waiting for {what}\n{self.log_tail()}")

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        """The last lines of the etcd and apiserver logs."""
        parts = []
        for name in ("etcd.log", "apiserver.log"):
            path = self.dir / name
            if path.exists():
                tail = path.read_text(errors="replace").splitlines()[-lines:]
                parts.append(f"--- {name} (last {len(tail)} lines) ---\n" + "\n".join(tail))
        return "\n".join(parts)


@atexit.register
def _stop_all() -> None:
    for cp in list(ControlPlane._live):
        cp.stop(timeout=5)
