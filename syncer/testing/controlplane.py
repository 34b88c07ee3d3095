"""A real etcd + kube-apiserver on loopback, for tests, examples and local runs.

Every instance has its own temporary directory (``<name>-cp-*``: PKI, tokens, kubeconfig, etcd data, logs) and
free ports, so several control planes can run side by side. The processes run in their own process group and
die with the Python process that started them, even if it is SIGKILLed:

- they are spawned with ``PR_SET_PDEATHSIG`` (SIGKILL) by one daemon thread of this module that lives as long
  as the process. The kernel sends that signal when the *thread* that forked the child exits, so spawning
  from the caller's thread would kill the apiserver as soon as a short-lived thread (``threading.Thread``,
  ``asyncio.to_thread``) that called ``restart_apiserver()`` ends.
- an ``atexit`` hook stops the control planes and removes their directories on a normal exit.
- a process killed before its ``atexit`` hook ran leaves its directory behind; each directory records its
  owner (PID, start time, PID namespace), and the next ``ControlPlane`` created by the same user removes the
  directories whose owner is gone.

By default the apiserver ends open watches as soon as it is told to stop
(``--shutdown-watch-termination-grace-period``), so it exits in about a second instead of waiting for them
until it is SIGKILLed; ``graceful_shutdown=True`` keeps kube-apiserver's default shutdown sequence.
"""

from __future__ import annotations

import atexit
import base64
import ctypes
import datetime
import ipaddress
import json
import os
import queue
import secrets
import shutil
import signal
import socket
import ssl
import stat
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
import weakref
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from pathlib import Path
from typing import Any, BinaryIO, Callable, Sequence

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

from .assets import Assets, ensure_assets

ADMIN_USER = "kube-syncer-admin"
RESTRICTED_USER = "kube-syncer-restricted"
_LOG_TAIL_LINES = 40
# The apiserver ends open watches as soon as it is told to stop, instead of waiting up to --request-timeout for
# their clients. It ends them at 200 or more per second; the 2 s bound only matters with hundreds of watches.
_FAST_SHUTDOWN_FLAGS = ["--shutdown-watch-termination-grace-period=2s"]
_SPAWN_TIMEOUT = 30.0
_KILL_TIMEOUT = 10.0
_OWNER_FILE = "owner.json"


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


def _die_with(parent: int) -> Callable[[], None]:
    """A ``preexec_fn`` that makes the kernel SIGKILL the child when the thread that forked it exits."""

    def preexec() -> None:
        _libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        # The parent may have died between fork and prctl, in which case the signal would never come.
        if os.getppid() != parent:
            os._exit(1)

    return preexec


_Proc = subprocess.Popen[bytes]


class _Spawner:
    """Runs every ``Popen`` of this module on one daemon thread that lives as long as the process.

    ``PR_SET_PDEATHSIG`` is tied to the thread that forks, not to the process: a child forked by a thread that
    then exits is SIGKILLed right away. A daemon thread is never joined, so it exits only with the process.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[tuple[Callable[[], _Proc], Future[_Proc]]] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def popen(self, argv: list[str], log: BinaryIO, cwd: Path) -> _Proc:
        """Start ``argv`` (output to the open file ``log``) from the helper thread; wait at most 30 s for it."""
        future: Future[_Proc] = Future()

        def call() -> _Proc:
            return subprocess.Popen(
                argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                preexec_fn=_die_with(os.getpid()), process_group=0, cwd=cwd,
            )

        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="kube-syncer-spawner", daemon=True)
                self._thread.start()
        self._jobs.put((call, future))
        try:
            return future.result(timeout=_SPAWN_TIMEOUT)
        except FutureTimeout:
            raise ControlPlaneError(f"starting {argv[0]} took more than {_SPAWN_TIMEOUT:.0f}s") from None

    def _run(self) -> None:
        while True:
            call, future = self._jobs.get()
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(call())
                except BaseException as e:
                    future.set_exception(e)


_spawner = _Spawner()


def _new_spawner_after_fork() -> None:
    # A forked child has no helper thread (only the forking thread survives a fork) and must not share the queue.
    global _spawner
    _spawner = _Spawner()


os.register_at_fork(after_in_child=_new_spawner_after_fork)


def _identity(pid: int) -> dict[str, Any] | None:
    """What tells process ``pid`` apart from a later one that reuses its PID; None if it is gone (or a zombie)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        namespace = os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None
    if fields[0] == "Z":
        return None
    # fields[19] is starttime (field 22 of proc_pid_stat(5)), in clock ticks since boot.
    return {"pid": pid, "start_time": fields[19], "pid_namespace": namespace}


def _remove_orphaned_dirs() -> None:
    """Remove control-plane directories of this user whose owner process is gone.

    A directory without a readable owner record is left alone (another user, an older version, or an owner
    that has just created it); so is one owned from another PID namespace, where the PID cannot be checked.
    """
    me = _identity(os.getpid())
    if me is None:
        return
    for directory in Path(tempfile.gettempdir()).glob("*-cp-*"):
        try:
            info = directory.lstat()
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
                continue
            owner = json.loads((directory / _OWNER_FILE).read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(owner, dict) or owner.get("pid_namespace") != me["pid_namespace"]:
            continue
        if not isinstance(owner.get("pid"), int) or _identity(owner["pid"]) != owner:
            shutil.rmtree(directory, ignore_errors=True)


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

    ``graceful_shutdown`` (read at every apiserver start, so it can be changed between restarts): False makes
    the apiserver end open watches as soon as it is told to stop, so it exits in about a second;
    True keeps kube-apiserver's default sequence, where open watches are left to their clients and hold the
    shutdown up to its ``--request-timeout`` (60 s): stop it with a ``timeout`` above that to see it exit by
    itself rather than be SIGKILLed. ``extra_apiserver_flags`` come last and override either.
    """

    _live: "weakref.WeakSet[ControlPlane]" = weakref.WeakSet()

    def __init__(
        self,
        extra_apiserver_flags: Sequence[str] = (),
        assets: Assets | None = None,
        start_timeout: float = 60.0,
        name: str = "kube-syncer",
        graceful_shutdown: bool = False,
    ) -> None:
        self.assets = assets or ensure_assets()
        self.extra_apiserver_flags = list(extra_apiserver_flags)
        self.start_timeout = start_timeout
        self.name = name
        self.graceful_shutdown = graceful_shutdown
        _remove_orphaned_dirs()
        self.dir = Path(tempfile.mkdtemp(prefix=f"{name}-cp-"))
        # Written first, so the directory is never without an owner record for longer than needed.
        (self.dir / _OWNER_FILE).write_text(json.dumps(_identity(os.getpid())))
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

    def member_kubeconfig(self, token: str | None = None, server: str | None = None,
                          user: dict[str, Any] | None = None) -> bytes:
        """A one-context kubeconfig for this plane with everything inline, as a kubeconfig Secret carries it: the
        admin token unless ``token`` (or a whole ``user`` entry) is given, ``server`` to go through a proxy."""
        ca = base64.b64encode(self.ca_file.read_bytes()).decode()
        return json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "c", "cluster": {"server": server or self.url, "certificate-authority-data": ca}}],
            "users": [{"name": "u", "user": user if user is not None else {"token": token or self.admin_token}}],
            "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        }).encode()

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
            proc = _spawner.popen(argv, log, self.dir)
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
            *([] if self.graceful_shutdown else _FAST_SHUTDOWN_FLAGS),
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
        try:
            self.stop_apiserver(timeout)
            self._terminate(self._etcd, timeout)
        finally:
            self._etcd = None
            ControlPlane._live.discard(self)
            shutil.rmtree(self.dir, ignore_errors=True)

    def stop_apiserver(self, timeout: float = 10.0) -> int | None:
        """Stop only the apiserver (SIGTERM, then SIGKILL after ``timeout``); etcd and its data stay.

        Returns its exit status (``-9`` if it had to be killed), or None if it was not running.
        """
        status = self._terminate(self._apiserver, timeout)
        self._apiserver = None
        return status

    def start_apiserver(self) -> None:
        """Start the apiserver again on the same port, against the same etcd."""
        if self._apiserver is not None:
            raise ControlPlaneError("the apiserver is already running")
        self._start_apiserver()

    def restart_apiserver(self, timeout: float = 10.0) -> None:
        """Restart the apiserver, keeping etcd and its data; clients reconnect to the same URL.

        Safe from any thread: the new process outlives the calling thread. ``timeout`` is as in ``stop_apiserver``.
        """
        self.stop_apiserver(timeout)
        self.start_apiserver()

    @staticmethod
    def _terminate(proc: subprocess.Popen[bytes] | None, timeout: float) -> int | None:
        if proc is None:
            return None
        if proc.poll() is not None:
            return proc.returncode
        proc.terminate()
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
        try:
            return proc.wait(_KILL_TIMEOUT)
        except subprocess.TimeoutExpired:
            raise ControlPlaneError(f"pid {proc.pid} survived SIGKILL for {_KILL_TIMEOUT:.0f}s") from None

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
