"""A real etcd + kube-apiserver on loopback, for tests, examples and local runs.

Each instance has its own temporary directory (``<name>-cp-*``) and free ports. Its processes die with the Python
process, even SIGKILLed: they get ``PR_SET_PDEATHSIG`` and are spawned from one long-lived daemon thread (the
signal fires when the forking *thread* exits); ``atexit`` cleans up, and directories whose recorded owner is gone
are removed by the next ``ControlPlane``. The apiserver ends watches at once on stop (exits in about a second);
``graceful_shutdown=True`` keeps its default sequence.
"""

from __future__ import annotations

import atexit
import base64
import json
import secrets
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from pathlib import Path
from typing import Any, Sequence

from .assets import Assets, ensure_assets
from .credentials import make_pki, member_kubeconfig, write_kubeconfig
from .processes import ControlPlaneError, claim, free_port, leftover_pids, remove_orphaned_dirs, spawn, terminate

__all__ = ["ADMIN_USER", "RESTRICTED_USER", "ControlPlane", "ControlPlaneError", "leftover_pids"]

ADMIN_USER = "kube-syncer-admin"
RESTRICTED_USER = "kube-syncer-restricted"
_LOG_TAIL_LINES = 40
# The apiserver ends open watches as soon as it is told to stop, instead of waiting up to --request-timeout for
# their clients. It ends them at 200 or more per second; the 2 s bound only matters with hundreds of watches.
_FAST_SHUTDOWN_FLAGS = ["--shutdown-watch-termination-grace-period=2s"]


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
        remove_orphaned_dirs()
        self.dir = Path(tempfile.mkdtemp(prefix=f"{name}-cp-"))
        claim(self.dir)  # first, so the directory is never without an owner record for longer than needed
        self.etcd_port = free_port()
        self.etcd_peer_port = free_port()
        self.port = free_port()
        self.admin_token = secrets.token_hex(16)
        self.restricted_token = secrets.token_hex(16)
        self._etcd: subprocess.Popen[bytes] | None = None
        self._apiserver: subprocess.Popen[bytes] | None = None
        make_pki(self.dir)
        (self.dir / "tokens.csv").write_text(
            f'{self.admin_token},{ADMIN_USER},1,"system:masters"\n'
            f"{self.restricted_token},{RESTRICTED_USER},2\n"
        )
        self.kubeconfig = self.dir / "kubeconfig"
        write_kubeconfig(self.kubeconfig, self.name, self.url, self.ca_file,
                         {"admin": self.admin_token, "restricted": self.restricted_token})

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
        return member_kubeconfig(self.ca_file, server or self.url,
                                 user if user is not None else {"token": token or self.admin_token})

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
        return spawn(argv, self.dir / log_name, self.dir)

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
            terminate(self._etcd, timeout)
        finally:
            self._etcd = None
            ControlPlane._live.discard(self)
            shutil.rmtree(self.dir, ignore_errors=True)

    def stop_apiserver(self, timeout: float = 10.0) -> int | None:
        """Stop only the apiserver (SIGTERM, then SIGKILL after ``timeout``); etcd and its data stay.

        Returns its exit status (``-9`` if it had to be killed), or None if it was not running.
        """
        status = terminate(self._apiserver, timeout)
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
