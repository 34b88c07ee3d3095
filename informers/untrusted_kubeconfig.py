"""``client_from_untrusted_kubeconfig``: an ApiClient from a kubeconfig someone else wrote, from its inline data only.

``ApiClient.from_kubeconfig`` trusts its kubeconfig as kubectl does: it reads the files the kubeconfig names and runs
its exec plugins and auth providers. A kubeconfig taken from a Secret (one per member cluster of a fleet, say) is
written by whoever may write that Secret, yet used by this process, with this process's files and credentials: a
``tokenFile`` naming our own service-account token would send that token to their server. Istio restricts the
kubeconfigs of its remote clusters for the same reason.

What differs from the kubernetes package's loader, and why:

- Only inline data is read. A field naming a file (``certificate-authority``, ``client-certificate``,
  ``client-key``, ``tokenFile``) is refused, not ignored, so that whoever wrote the kubeconfig learns why the cluster
  was not joined. So are ``auth-provider`` (providers run commands, read files and write refreshed tokens back) and,
  because ``ApiClient`` does not implement them, impersonation (``as``, ``as-uid``, ``as-groups``,
  ``as-user-extra``) and ``proxy-url``: ignoring those would act as another user, or reach the server another way,
  than the kubeconfig says.
- An ``exec`` plugin runs only when its command is exactly one the operator allowed. Allowing a command trusts every
  kubeconfig to run it with arguments and environment of its choosing and with this process's credentials (a cloud
  CLI mints a token from them and hands it to the kubeconfig's server); only the variables that choose which program
  runs or what it loads (``PATH``, ``LD_*``, ``DYLD_*``) are refused.
- Only the chosen context, its cluster and its user are read and checked; other entries are never used.
- The function does no I/O: nothing is connected, the CA, client certificate and key stay in memory (``ApiClient``)
  and are checked there, and the exec plugin first runs on the first request.
- Errors never quote the kubeconfig: YAML errors carry a snippet of the offending line, so only its line and column
  are kept, and an error is raised with no traceback into the frames that hold the kubeconfig (a traceback printed
  with variable values, loguru's ``diagnose``, would show them).
"""

from __future__ import annotations

import base64
import hashlib
import ssl
import urllib.parse
from typing import Any, Collection, TypeVar

import yaml

from . import tls
from .client import ApiClient
from .credentials import API_VERSIONS, DEFAULT_TIMEOUT, ExecPlugin, _cluster_info
from .kubeconfig import ClientConfig, safe_load_yaml

_T = TypeVar("_T")
_KINDS: dict[type, str] = {str: "a string", bool: "true or false", list: "a list", dict: "a mapping"}
# Each field naming a file, and the inline field to use instead.
_PATH_FIELDS = {
    "cluster": {"certificate-authority": "certificate-authority-data"},
    "user": {"client-certificate": "client-certificate-data", "client-key": "client-key-data", "tokenFile": "token"},
}
_UNSUPPORTED = {
    "cluster": {"proxy-url": "a proxy"},
    "user": {"as": "impersonation", "as-uid": "impersonation", "as-groups": "impersonation",
             "as-user-extra": "impersonation"},
}
_MAX_SHOWN = 100


class KubeconfigError(ValueError):
    """A kubeconfig from an untrusted source could not be used; ``str()`` names the source and the field.

    ``source`` says where the kubeconfig came from (e.g. ``secret fleet/c1``), ``field`` is the path of the offending
    field (``users[admin].user.tokenFile``; None: the kubeconfig as a whole). The message never quotes the kubeconfig.
    """

    def __init__(self, source: str, field: str | None, problem: str) -> None:
        super().__init__(f"{source}: {field} {problem}" if field else f"{source} {problem}")
        self.source = source
        self.field = field


class KubeconfigInvalid(KubeconfigError):
    """The kubeconfig is malformed: not YAML, a missing context, cluster, user or server, bad base64 or PEM, ..."""


class KubeconfigRefused(KubeconfigError):
    """The kubeconfig is well formed but asks for what an untrusted one may not: a file, an auth provider, an exec
    command that is not allowed, or a feature ``ApiClient`` does not implement."""


def kubeconfig_hash(data: bytes | str) -> str:
    """The SHA-256 (hex) of a kubeconfig's bytes (a ``str`` as UTF-8).

    Lets a caller recognise an unchanged kubeconfig (a Secret updated for another key, a resync) as a no-op without
    keeping the kubeconfig, and the credentials in it, around to compare.
    """
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def client_from_untrusted_kubeconfig(
    data: bytes | str, *, allowed_exec_commands: Collection[str] = (), context: str | None = None,
    source: str = "kubeconfig", exec_timeout: float = DEFAULT_TIMEOUT,
) -> ApiClient:
    """A client for ``context`` (default: the current context) of a kubeconfig that comes from someone else.

    Raise ``KubeconfigInvalid`` when the kubeconfig is malformed and ``KubeconfigRefused`` when it asks for what an
    untrusted kubeconfig may not (see the module); both name ``source`` and the field. An ``exec`` plugin whose
    ``command`` is one of ``allowed_exec_commands`` (compared exactly, as written) runs on the first request, at most
    ``exec_timeout`` seconds, in this process's working directory. Nothing is connected: use the client as an async
    context manager, or ``close()`` it.
    """
    if isinstance(allowed_exec_commands, str):
        # A string is a collection of its characters: "aws" would allow "a" and "s".
        raise TypeError("allowed_exec_commands is a collection of commands, not one string")
    try:
        return _client(data, frozenset(allowed_exec_commands), context, source, exec_timeout)
    except KubeconfigError as e:
        error = e
    # Raised afresh, without the frames below (and the exceptions they turned into this one): their variables hold
    # the kubeconfig.
    error.__context__ = None
    raise error.with_traceback(None)


def _client(data: bytes | str, allowed_exec_commands: frozenset[str], context: str | None, source: str,
            exec_timeout: float) -> ApiClient:
    doc = _Entry(_parse(data, source), "", source)
    ctx = _named(doc, "context", context if context is not None else doc.required("current-context", str))
    cluster = _named(doc, "cluster", ctx.required("cluster", str))
    user_name = ctx.required("user", str)
    user = _named(doc, "user", user_name)
    _refuse_unsafe(cluster, user)

    server = cluster.required("server", str)
    # Literally lowercase: ApiClient sets up TLS for a host that starts with "https".
    if not server.startswith(("https://", "http://")) or not _is_url(server):
        raise cluster.invalid("server", "is not an https:// (or http://) URL with a host")
    insecure = cluster.get("insecure-skip-tls-verify", bool) or False
    ca = cluster.data("certificate-authority-data")
    if ca is not None and insecure:
        raise cluster.invalid("certificate-authority-data", "is set together with insecure-skip-tls-verify")

    token = user.get("token", str)
    if token is not None and not (token.isascii() and token.isprintable()):
        raise user.invalid("token", "has characters a bearer token cannot have")
    username, password = user.get("username", str), user.get("password", str)
    if password is not None and username is None:
        raise user.invalid("username", "is missing while password is set")
    if username is not None and (":" in username or any(ord(c) > 255 for c in username + (password or ""))):
        raise user.invalid("username", "and password cannot be sent as basic authentication (a ':' in the username, "
                                       "or characters beyond latin-1)")
    cert, key = user.data("client-certificate-data"), user.data("client-key-data")
    if cert is not None and key is not None:
        _check_key_pair(user, cert, key)
    elif cert is not None or key is not None:
        raise user.invalid("client-key-data" if key is None else "client-certificate-data",
                           "is missing while the other half of the key pair is set")
    plugin = (_exec_plugin(user, user_name, cluster, allowed_exec_commands, exec_timeout) if user.is_set("exec")
              else None)
    methods = [m for m, v in (("token", token), ("username/password", username), ("exec", plugin)) if v is not None]
    if len(methods) > 1:
        raise KubeconfigInvalid(source, user.path, f"has more than one way to authenticate ({', '.join(methods)})")

    config = ClientConfig(server)
    config.verify_ssl = not insecure
    if token is not None:
        config.api_key = {"authorization": f"Bearer {token}"}
    config.username, config.password = username, password
    client = ApiClient(config, exec_plugin=plugin, ca_data=ca, client_cert_data=cert, client_key_data=key,
                       tls_server_name=cluster.get("tls-server-name", str))
    _check_tls(client, cluster, user, ca)
    return client


def _check_tls(client: ApiClient, cluster: _Entry, user: _Entry, ca: str | None) -> None:
    """Refuse a CA (or client certificate) that ``ssl`` cannot load, by making the client's TLS context now: the one
    its first dial uses (one per distinct CA and certificate in the process, ``informers.tls``), not a second one."""
    try:
        if client.tls_context() is None and ca is not None:
            tls.client_context(cadata=ca)  # an http:// server: the CA goes unused, but is checked all the same
    except ssl.SSLError:
        try:
            if ca is not None:
                ssl.create_default_context(cadata=ca)
        except ssl.SSLError:
            raise cluster.invalid("certificate-authority-data", "holds no usable PEM certificate") from None
        raise user.invalid("client-certificate-data", "and client-key-data cannot be loaded by ssl") from None


def _refuse_unsafe(cluster: _Entry, user: _Entry) -> None:
    """Refuse file paths, auth providers and what ApiClient does not implement (exec is ``_exec_plugin``'s)."""
    for entry, kind in ((cluster, "cluster"), (user, "user")):
        for path_field, inline in _PATH_FIELDS[kind].items():
            if entry.is_set(path_field):
                raise entry.refused(path_field, "is a file path; an untrusted kubeconfig may carry inline data only "
                                                f"(use {inline})")
        for unsupported, feature in _UNSUPPORTED[kind].items():
            if entry.is_set(unsupported):
                raise entry.refused(unsupported, f"asks for {feature}, which this client does not implement")
    if user.is_set("auth-provider"):
        raise user.refused("auth-provider", "is not allowed in an untrusted kubeconfig (auth providers run commands "
                                            "and read and write files); use token, a client certificate or exec")


def _parse(data: bytes | str, source: str) -> Any:
    try:
        return safe_load_yaml(data)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
        raise KubeconfigInvalid(source, None, f"is not valid YAML{where}") from None
    except (yaml.YAMLError, RecursionError):
        raise KubeconfigInvalid(source, None, "is not valid YAML") from None


def _is_url(server: str) -> bool:
    try:
        url = urllib.parse.urlsplit(server)
        url.port  # raises on a port that is not a number, or out of range
    except ValueError:
        return False
    return bool(url.hostname) and url.username is None and not url.query and not url.fragment


class _Entry:
    """One mapping of the kubeconfig, and its path in messages (``users[admin].user``; ``""``: the document)."""

    def __init__(self, value: Any, path: str, source: str) -> None:
        if not isinstance(value, dict):
            raise KubeconfigInvalid(source, path or None, "is not a YAML mapping")
        self.value: dict[Any, Any] = value
        self.path = path
        self.source = source

    def field(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def invalid(self, key: str, problem: str) -> KubeconfigInvalid:
        return KubeconfigInvalid(self.source, self.field(key), problem)

    def refused(self, key: str, problem: str) -> KubeconfigRefused:
        return KubeconfigRefused(self.source, self.field(key), problem)

    def is_set(self, key: str) -> bool:
        # An empty value is an unset one, as in client-go (omitempty).
        return self.value.get(key) not in (None, "", [], {})

    def get(self, key: str, kind: type[_T]) -> _T | None:
        value = self.value.get(key)
        if value is None or value == "":
            return None
        if not isinstance(value, kind):
            raise self.invalid(key, f"is not {_KINDS[kind]}")
        return value

    def required(self, key: str, kind: type[_T]) -> _T:
        value = self.get(key, kind)
        if value is None:
            raise self.invalid(key, "is missing")
        return value

    def data(self, key: str) -> str | None:
        """A base64 field holding PEM text, decoded."""
        text = self.get(key, str)
        if text is None:
            return None
        try:
            # Line breaks are allowed in base64 as in Go's decoder.
            return base64.b64decode("".join(text.split()), validate=True).decode("ascii")
        except ValueError:
            raise self.invalid(key, "is not base64-encoded PEM") from None


def _named(doc: _Entry, kind: str, name: str) -> _Entry:
    """The ``kind`` (``cluster``) section of the entry called ``name`` in the document's list (``clusters``)."""
    plural = f"{kind}s"
    shown = _shown(name)
    for entry in doc.get(plural, list) or ():
        if isinstance(entry, dict) and entry.get("name") == name:
            return _Entry(entry.get(kind), f"{plural}[{shown}].{kind}", doc.source)
    raise doc.invalid(plural, f"has no entry named {shown}")


def _check_key_pair(user: _Entry, cert_pem: str, key_pem: str) -> None:
    """Refuse a client certificate and key that ``ssl`` would fail on, without writing them to a file to ask it.

    An encrypted key is refused here: ``ssl`` would ask for its passphrase on the terminal, blocking the event loop.
    ``cryptography`` (~15 MiB) is imported only now, for a kubeconfig that has a client certificate.
    """
    from cryptography import x509
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization

    try:
        public = x509.load_pem_x509_certificates(cert_pem.encode())[0].public_key()
    except (ValueError, UnsupportedAlgorithm):
        raise user.invalid("client-certificate-data", "holds no usable PEM certificate") from None
    try:
        key = serialization.load_pem_private_key(key_pem.encode(), password=None)
    except TypeError:
        raise user.invalid("client-key-data", "is an encrypted key (it would need a passphrase)") from None
    except (ValueError, UnsupportedAlgorithm):
        raise user.invalid("client-key-data", "holds no usable PEM private key") from None
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    if public.public_bytes(*spki) != key.public_key().public_bytes(*spki):
        raise user.invalid("client-key-data", "is not the key of client-certificate-data")


def _exec_plugin(user: _Entry, user_name: str, cluster: _Entry, allowed: frozenset[str],
                 timeout: float) -> ExecPlugin:
    """The user's ``exec`` section as an unrun ExecPlugin, if its command is allowed and the section is usable."""
    section = _Entry(user.value["exec"], user.field("exec"), user.source)
    command = section.required("command", str)
    if command not in allowed:
        raise KubeconfigRefused(user.source, section.path, f"runs '{_shown(command)}', which is not in "
                                                           "clusters.allowed_exec_commands")
    if section.get("apiVersion", str) not in API_VERSIONS:
        raise section.invalid("apiVersion", f"is not one of {', '.join(API_VERSIONS)}")
    if section.get("interactiveMode", str) == "Always":
        raise section.invalid("interactiveMode", "is Always, and credentials are fetched without a terminal")
    if not all(isinstance(a, str) for a in section.get("args", list) or ()):
        raise section.invalid("args", "is not a list of strings")
    for i, item in enumerate(section.get("env", list) or ()):
        variable = _Entry(item, section.field(f"env[{i}]"), user.source)
        name = variable.required("name", str)
        if not isinstance(variable.value.get("value"), str):
            raise variable.invalid("value", "is not a string")
        if name == "PATH" or name.startswith(("LD_", "DYLD_")):
            raise variable.refused("name", f"sets {_shown(name)}, which chooses the program that runs or what it "
                                           "loads")
    # Reads no file: certificate-authority, the one path it would open, has been refused.
    info = _cluster_info(cluster.value, "") if section.get("provideClusterInfo", bool) else None
    return ExecPlugin(user_name, section.value, None, info, timeout)


def _shown(name: str) -> str:
    """A name from the kubeconfig as it can appear in a one-line message: shortened, control characters escaped."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in name[:_MAX_SHOWN])
