"""Kubeconfig ``exec`` credential plugins, run asynchronously, with a timeout, and never left running.

``kubernetes.config.load_kube_config`` runs a user's exec plugin while it loads the kubeconfig: synchronously, without
a timeout (so a plugin waiting for a browser login or an unreachable endpoint hangs the caller forever, silently),
and when the plugin fails it only logs the error and goes on without credentials (the server then answers 403 to an
anonymous user). When the caller dies, the plugin and its children keep running.

``load_kubeconfig`` lets the kubernetes package load everything else (files and ``$KUBECONFIG`` merging, contexts,
tokens, auth providers, client certificates, CA, insecure-skip-tls-verify) and hands the chosen user's ``exec``
section to an ``ExecPlugin`` instead, which runs the plugin on the first request that needs a credential, under a
timeout, and raises a ``CredentialError`` naming the command and the kubeconfig user when it fails or hangs.
``ApiClient.from_kubeconfig`` calls it only for what ``kubeconfig.py`` does not load itself (the package is imported
then, and not before).
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import json
import os
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Mapping

API_VERSIONS = ("client.authentication.k8s.io/v1", "client.authentication.k8s.io/v1beta1")
DEFAULT_TIMEOUT = 30.0
# A credential is renewed this long before its expirationTimestamp: a request started just before expiry would
# otherwise reach the server (whose clock may differ from ours) with an expired token.
_EXPIRY_SKEW = 30.0
_CLUSTER_CONFIG_EXTENSION = "client.authentication.k8s.io/exec"
_MAX_STDERR_LINE = 300

# The plugin is started through this small Python program (the "shim"), our direct child, which runs the plugin in
# a process group of its own. The shim asks the kernel for SIGTERM when its parent dies (PR_SET_PDEATHSIG; the
# "parent" is the thread that spawned it, the event loop's), and on SIGTERM, sent by the kernel or by us on timeout
# or cancellation, it SIGKILLs the plugin's whole group and exits. PDEATHSIG alone on the plugin would not do: it is
# not inherited by the plugin's own children, and a plain SIGKILL of the plugin leaves them running. When the plugin
# exits, whatever it left in its group is killed as well (before the plugin is reaped, so the group id cannot have
# been reused): it would otherwise keep our stdout pipe open. The shim exits with the plugin's exit code (128+N when
# a signal N killed it, as a shell reports it).
_SHIM = """\
import os, signal, sys
parent, argv = int(sys.argv[1]), sys.argv[2:]
plugin = 0
def stop(signum, frame):
    if plugin:
        os.killpg(plugin, signal.SIGKILL)
    os._exit(128 + signum)
signal.signal(signal.SIGTERM, stop)
if sys.platform == "linux":
    import ctypes
    ctypes.CDLL(None).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
if os.getppid() != parent:  # the parent died before PR_SET_PDEATHSIG took effect
    sys.exit(1)
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # no SIGTERM between the spawn and `plugin = ...`
try:
    plugin = os.posix_spawnp(argv[0], argv, os.environ, setpgroup=0, setsigmask=(),
                             setsigdef=(signal.SIGPIPE, signal.SIGXFSZ))
except OSError as e:
    sys.stderr.write(f"{argv[0]}: {e.strerror}\\n")
    sys.exit(127)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
os.waitid(os.P_PID, plugin, os.WEXITED | os.WNOWAIT)
os.killpg(plugin, signal.SIGKILL)
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # the group is dead: exit with the plugin's status
code = os.waitstatus_to_exitcode(os.waitpid(plugin, 0)[1])
sys.exit(code if code >= 0 else 128 - code)
"""


class CredentialError(Exception):
    """Credentials for the API server could not be obtained; ``str()`` is one line meant for the user."""


class ExecPluginError(CredentialError):
    """An exec credential plugin failed: it exited non-zero, was killed, could not start, or printed no usable
    ExecCredential. The kubernetes package logs this and goes on anonymously; here the request that needed the
    credential fails with it.

    ``exit_code`` is the plugin's exit code (128+N: killed by signal N; None: it did not run or did not exit by
    itself), ``stderr`` the last line it wrote to stderr.
    """

    def __init__(self, command: str, user: str, problem: str, exit_code: int | None = None, stderr: str = "") -> None:
        super().__init__(f"exec credential plugin {command!r} of kubeconfig user {user!r} {problem}")
        self.command = command
        self.user = user
        self.exit_code = exit_code
        self.stderr = stderr


class ExecPluginTimeout(ExecPluginError):
    """An exec credential plugin did not finish within the timeout; it was killed with its process group."""

    def __init__(self, command: str, user: str, timeout: float) -> None:
        super().__init__(command, user, f"did not finish within {timeout:g}s and was killed "
                                        "(is it waiting for a login, a prompt or the network?)")
        self.timeout = timeout


@dataclass(frozen=True, eq=False)
class Credential:
    """The ``status`` of one ExecCredential: a bearer token and/or a client certificate.

    ``client_cert`` holds the certificate and its key as PEM text (the form ``ssl`` loads); ``refresh_at`` is the
    ``time.monotonic()`` after which the plugin runs again (None: no expirationTimestamp, kept until a 401).
    """

    token: str | None
    client_cert: str | None
    refresh_at: float | None

    def stale(self) -> bool:
        """Whether the credential expires within the renewal margin."""
        return self.refresh_at is not None and time.monotonic() >= self.refresh_at


def load_client_certificate(context: ssl.SSLContext, pem: str) -> None:
    """Load a client certificate and key given as PEM text into ``context``.

    ``ssl`` only reads them from a file, so they are written to a private (0600) temporary file that is deleted as
    soon as they are loaded; the kubernetes package keeps its copies on disk until the process exits.
    """
    with tempfile.NamedTemporaryFile("w", suffix=".pem") as f:
        f.write(pem)
        f.flush()
        context.load_cert_chain(f.name)


class ExecPlugin:
    """The ``exec`` section of one kubeconfig user; ``get()`` returns a credential, running the plugin when needed.

    Differs from the kubernetes package's ``ExecProvider``: the plugin runs in the requesting task, at most
    ``timeout`` seconds, never interactively, and its process group dies with the request or with us (``_SHIM``);
    concurrent requests share one run and its outcome; a failure raises ``ExecPluginError``; the credential is renewed
    ``_EXPIRY_SKEW`` seconds before expiry and when the server rejects it (``get(rejected=...)``, as client-go on 401).
    """

    def __init__(self, user: str, config: Mapping[str, Any], cwd: str | None = None,
                 cluster: Mapping[str, Any] | None = None, timeout: float = DEFAULT_TIMEOUT) -> None:
        """``config`` is the user's ``exec`` section, ``cwd`` the plugin's working directory (the package runs it
        in the kubeconfig file's directory, so relative commands resolve there), ``cluster`` what the plugin is
        given as ``spec.cluster`` when the section says ``provideClusterInfo``.
        """
        command, api_version = config.get("command"), config.get("apiVersion")
        if not isinstance(command, str) or not command:
            raise config_error(f"kubeconfig user {user!r}: exec has no command")
        if api_version not in API_VERSIONS:
            raise config_error(f"kubeconfig user {user!r}: exec apiVersion {api_version!r} is not supported "
                                  f"(supported: {', '.join(API_VERSIONS)})")
        if config.get("interactiveMode") == "Always":
            raise config_error(f"kubeconfig user {user!r}: exec interactiveMode Always needs a terminal, and "
                                  "credentials are fetched without one")
        self.user = user
        self.command = command
        self.args = [str(a) for a in config.get("args") or ()]
        self.env = {str(e["name"]): str(e["value"]) for e in config.get("env") or ()}
        self.api_version: str = api_version
        self.cwd = cwd
        self.timeout = timeout
        spec: dict[str, Any] = {"interactive": False}
        if cluster is not None:
            spec["cluster"] = cluster
        self._exec_info = json.dumps({"apiVersion": api_version, "kind": "ExecCredential", "spec": spec})
        self._lock = asyncio.Lock()
        self._outcome: Credential | CredentialError | None = None

    @property
    def current(self) -> Credential | None:
        """The credential of the last run, if it succeeded."""
        return self._outcome if isinstance(self._outcome, Credential) else None

    async def get(self, rejected: Credential | None = None) -> Credential:
        """The current credential; the plugin runs first if there is none, it is stale, or it is ``rejected``.

        Raise ``ExecPluginError`` (``ExecPluginTimeout``) when the run fails. A caller whose run is cancelled leaves
        no outcome, so the next waiter runs the plugin itself.
        """
        seen = self._outcome
        if isinstance(seen, Credential) and seen is not rejected and not seen.stale():
            return seen
        async with self._lock:
            outcome = self._outcome
            if outcome is None or outcome is seen:
                try:
                    outcome = await self._run()
                except CredentialError as e:
                    outcome = e
                self._outcome = outcome
        if isinstance(outcome, CredentialError):
            raise outcome
        return outcome

    async def _run(self) -> Credential:
        env = {**os.environ, **self.env, "KUBERNETES_EXEC_INFO": self._exec_info}
        loop = asyncio.get_running_loop()
        try:
            # A session of its own: a Ctrl-C in our terminal must not kill the shim before it kills the plugin.
            transport, run = await loop.subprocess_exec(
                _Run, sys.executable, "-I", "-S", "-c", _SHIM, str(os.getpid()), self.command, *self.args,
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                env=env, cwd=self.cwd, start_new_session=True,
            )
        except OSError as e:
            raise self._error(f"could not be started: {e}") from None
        try:
            async with asyncio.timeout(self.timeout):
                await run.finished
        except TimeoutError:
            raise ExecPluginTimeout(self.command, self.user, self.timeout) from None
        finally:
            await _stop(transport, run)
        code = transport.get_returncode()
        if code:
            line = _last_line(bytes(run.stderr))
            what = f"exited with code {code}" if code > 0 else f"was killed by signal {-code}"
            raise self._error(f"{what}: {line}" if line else f"{what} and wrote nothing to stderr", code, line)
        return self._parse(bytes(run.stdout))

    def _parse(self, out: bytes) -> Credential:
        try:
            response = json.loads(out)
        except ValueError:
            raise self._error("printed no ExecCredential JSON on stdout") from None
        if not isinstance(response, dict) or response.get("kind") != "ExecCredential":
            raise self._error("printed something other than an ExecCredential on stdout")
        if response.get("apiVersion") != self.api_version:
            raise self._error(f"answered with apiVersion {response.get('apiVersion')!r}, not {self.api_version!r}")
        status = response.get("status")
        if not isinstance(status, dict):
            raise self._error("printed an ExecCredential without status")
        token, cert, key = (status.get(k) or None for k in ("token", "clientCertificateData", "clientKeyData"))
        if not all(v is None or isinstance(v, str) for v in (token, cert, key)):
            raise self._error("printed an ExecCredential whose token or certificate is not a string")
        if (cert is None) != (key is None):
            raise self._error("printed only one of status.clientCertificateData and status.clientKeyData")
        if token is None and cert is None:
            raise self._error("printed an ExecCredential with neither status.token nor status.clientCertificateData")
        pem = f"{cert}\n{key}" if cert else None
        if pem is not None:
            try:
                load_client_certificate(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT), pem)
            except ssl.SSLError as e:
                raise self._error(f"printed a client certificate and key that do not load ({e})") from None
        return Credential(token, pem, self._refresh_at(status.get("expirationTimestamp")))

    def _refresh_at(self, stamp: Any) -> float | None:
        if not stamp:
            return None
        try:
            expires = datetime.datetime.fromisoformat(stamp)
        except (TypeError, ValueError):
            raise self._error(f"printed an invalid status.expirationTimestamp {stamp!r}") from None
        if expires.tzinfo is None:
            expires = expires.replace(tzinfo=datetime.timezone.utc)
        # Monotonic from here on: a wall-clock jump must not make a credential look fresh or expired.
        return time.monotonic() + (expires.timestamp() - time.time()) - _EXPIRY_SKEW

    def _error(self, problem: str, exit_code: int | None = None, stderr: str = "") -> ExecPluginError:
        return ExecPluginError(self.command, self.user, problem, exit_code, stderr)


class _Run(asyncio.SubprocessProtocol):
    """Collects the shim's output; ``exited`` when it exits, ``finished`` when its pipes are closed too.

    ``asyncio.subprocess.Process.wait()`` also waits for the pipes, which a process that left the plugin's group
    (``setsid``) may hold forever; with our own protocol the transport can be closed once the shim has exited.
    """

    def __init__(self) -> None:
        loop = asyncio.get_running_loop()
        self.exited: asyncio.Future[None] = loop.create_future()
        self.finished: asyncio.Future[None] = loop.create_future()
        self.stdout = bytearray()
        self.stderr = bytearray()

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        (self.stdout if fd == 1 else self.stderr).extend(data)

    def process_exited(self) -> None:
        self.exited.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self.finished.set_result(None)


async def _stop(transport: asyncio.SubprocessTransport, run: _Run) -> None:
    if transport.get_returncode() is None:
        transport.send_signal(signal.SIGTERM)  # the shim SIGKILLs the plugin's process group, then exits
    try:
        await run.exited
    finally:
        transport.close()  # SIGKILLs the shim only if a second cancellation cut the wait short


def _last_line(stderr: bytes) -> str:
    lines = stderr.decode(errors="replace").strip().splitlines()
    return lines[-1].strip()[:_MAX_STDERR_LINE] if lines else ""


def config_error(message: str) -> Exception:
    """``kubernetes.config.ConfigException(message)``: what the package's loaders raise and callers catch; the
    package is imported only now (see ``kubeconfig.py``)."""
    from kubernetes.config import ConfigException

    return ConfigException(message)


def load_kubeconfig(configuration: Any, path: str | None = None, context: str | None = None,
                    timeout: float = DEFAULT_TIMEOUT) -> ExecPlugin | None:
    """Fill ``configuration`` like ``kubernetes.config.load_kube_config``, but return the user's exec plugin unrun.

    The kubernetes package's merger and loader read ``path`` (default: ``$KUBECONFIG`` or ``~/.kube/config``), select
    ``context`` and load everything as the package does. When the package would use the user's ``exec`` section
    (no auth-provider token and no token first), the loader sees the user without it, and without
    ``username``/``password``, which the package only falls back to when the plugin fails; an ``ExecPlugin`` is
    returned instead. Nothing here runs a process, so loading never blocks on a plugin.
    """
    from kubernetes.config.kube_config import KubeConfigLoader, KubeConfigMerger

    # $KUBECONFIG as it is now: the package's KUBE_CONFIG_DEFAULT_LOCATION froze it when it was imported.
    merger = KubeConfigMerger(path or os.environ.get("KUBECONFIG", "~/.kube/config"))  # type: ignore[no-untyped-call]
    merged = merger.config
    if merged is None:
        raise config_error("Invalid kube-config file. No configuration found.")
    loader = KubeConfigLoader(merged, active_context=context, config_base_path=None,  # type: ignore[no-untyped-call]
                              config_persister=merger.save_changes)
    plugin = _take_exec(merged, loader.current_context, timeout)
    if plugin is not None:
        loader.set_active_context(context)  # type: ignore[no-untyped-call]
    loader.load_and_set(configuration)  # type: ignore[no-untyped-call]
    # The package's own test for "authentication found": a token from an auth provider or the user's token wins
    # over exec, as in the package.
    return None if "token" in vars(loader) else plugin


def _take_exec(merged: Any, current: Mapping[str, Any], timeout: float) -> ExecPlugin | None:
    """The ExecPlugin for the context's user, whose entry in ``merged`` is replaced by one without ``exec``."""
    from kubernetes.config.kube_config import ConfigNode

    name = current["context"].get("user")
    users = merged.value.get("users") or []
    entry = next((u for u in users if u["name"] == name), None)
    if entry is None or "exec" not in (entry.value.get("user") or {}):
        return None
    user = entry.value["user"]
    stripped = {k: v for k, v in user.items() if k not in ("exec", "username", "password")}
    users[users.index(entry)] = ConfigNode(  # type: ignore[no-untyped-call]
        entry.name, {**entry.value, "user": stripped}, entry.path)
    config = user["exec"]
    cluster = None
    if config.get("provideClusterInfo"):
        cluster_entry = merged["clusters"].get_with_name(current["context"]["cluster"])
        cluster = _cluster_info(cluster_entry["cluster"].value, os.path.dirname(os.path.abspath(cluster_entry.path)))
    return ExecPlugin(name, config, os.path.dirname(os.path.abspath(entry.path)), cluster, timeout)


def _cluster_info(cluster: Mapping[str, Any], base: str) -> dict[str, Any]:
    """``spec.cluster`` of client.authentication.k8s.io (v1 and v1beta1 name the fields like the kubeconfig).

    The package passes the kubeconfig's cluster entry as it is; the protocol wants the CA as data (a relative
    ``certificate-authority`` is in ``base``, the directory of the cluster's kubeconfig file) and the
    ``client.authentication.k8s.io/exec`` extension as ``config``.
    """
    info = {k: cluster[k] for k in ("server", "tls-server-name", "insecure-skip-tls-verify", "proxy-url",
                                    "disable-compression") if k in cluster}
    if cluster.get("certificate-authority-data"):
        info["certificate-authority-data"] = cluster["certificate-authority-data"]
    elif cluster.get("certificate-authority"):
        with open(os.path.join(base, cluster["certificate-authority"]), "rb") as f:
            info["certificate-authority-data"] = base64.b64encode(f.read()).decode()
    for extension in cluster.get("extensions") or ():
        if extension.get("name") == _CLUSTER_CONFIG_EXTENSION:
            info["config"] = extension.get("extension")
    return info
