"""Kubeconfig and in-cluster configuration for the common cases, without importing the ``kubernetes`` package.

Importing ``kubernetes`` costs about 30 MiB and 200 ms (bench/RESULTS-imports.md). So ``load`` reads a plain
context itself (token or ``tokenFile``, client certificate, ``exec`` plugin, or username and password), with
``load_kube_config``'s precedence, ``$KUBECONFIG`` merging and relative paths, except that ``*-data`` fields stay
in memory instead of becoming temporary files. Anything else (``auth-provider``, a missing, malformed or
unexpected entry) goes to the package's loader unchanged (``credentials.load_kubeconfig``), errors included.
"""

from __future__ import annotations

import base64
import datetime
import os
from dataclasses import dataclass
from typing import Any, Callable

import yaml

from .credentials import DEFAULT_TIMEOUT, ExecPlugin, _cluster_info, config_error, load_kubeconfig

# libyaml's parser when PyYAML was built with it: the pure-Python one took ~4 ms a kubeconfig, 13 % of the CPU
# of bringing a fleet member up.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def safe_load_yaml(data: Any) -> Any:
    """``yaml.safe_load`` (the same rules and errors), on libyaml when it is there."""
    return yaml.load(data, Loader=_LOADER)

# The package's paths of the pod's service account.
SERVICE_TOKEN_FILENAME = "/var/run/secrets/kubernetes.io/serviceaccount/token"
SERVICE_CERT_FILENAME = "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt"
_TOKEN_REFRESH = datetime.timedelta(minutes=1)


class ClientConfig:
    """The settings of ``kubernetes.client.Configuration`` that ``ApiClient`` reads, with the same names and
    defaults; ``ApiClient`` takes either."""

    def __init__(self, host: str | None = None) -> None:
        """``host``: the API server's URL (default ``http://localhost``, as the package's)."""
        self.host = host or "http://localhost"
        self.ssl_ca_cert: str | None = None
        self.cert_file: str | None = None
        self.key_file: str | None = None
        self.verify_ssl = True
        self.api_key: dict[str, str] = {}
        self.api_key_prefix: dict[str, str] = {}
        self.refresh_api_key_hook: Callable[[Any], None] | None = None
        self.username: str | None = None
        self.password: str | None = None
        self.tls_server_name: str | None = None
        self.proxy: str | None = None


@dataclass(frozen=True)
class Loaded:
    """A loaded kubeconfig: the configuration, the user's exec plugin (unrun) and the PEM data kept in memory."""

    configuration: Any
    exec_plugin: ExecPlugin | None = None
    ca_data: str | None = None
    client_cert_data: str | None = None
    client_key_data: str | None = None


def load(path: str | None = None, context: str | None = None, timeout: float = DEFAULT_TIMEOUT) -> Loaded:
    """The kubeconfig ``path`` (default: ``$KUBECONFIG`` or ``~/.kube/config``) at ``context``, as
    ``credentials.load_kubeconfig`` loads it; the package is imported only when the context is not plain."""
    try:
        return _plain(path or os.environ.get("KUBECONFIG", "~/.kube/config"), context, timeout)
    except _NotPlain:
        pass
    import kubernetes  # what only the package does, and its errors

    configuration = kubernetes.client.Configuration()
    return Loaded(configuration, load_kubeconfig(configuration, path, context, timeout))


class _NotPlain(Exception):
    """The kubeconfig needs the package's loader."""


@dataclass
class _Entry:
    value: dict[str, Any]
    file: str

    def base(self) -> str:
        return os.path.dirname(os.path.abspath(self.file))


def _plain(paths: str, context: str | None, timeout: float) -> Loaded:
    entries: dict[str, dict[str, _Entry]] = {"clusters": {}, "contexts": {}, "users": {}}
    current = None
    files = [os.path.expanduser(p) for p in paths.split(os.pathsep) if p]
    found = [f for f in files if os.path.exists(f)]
    if not found:
        raise _NotPlain
    for file in found:
        try:
            with open(file) as f:
                doc = safe_load_yaml(f)
        except Exception:
            raise _NotPlain from None
        _check(isinstance(doc, dict))
        for kind, named in entries.items():
            items = doc.get(kind) or []
            _check(isinstance(items, list))
            for item in items:
                _check(isinstance(item, dict) and isinstance(item.get("name"), str))
                named.setdefault(item["name"], _Entry(item, file))
        if "current-context" in doc:
            current = doc["current-context"]
    name = context if context is not None else current
    _check(isinstance(name, str) and name in entries["contexts"])
    ctx = _section(entries["contexts"][str(name)], "context")
    cluster_name = ctx.value.get("cluster")
    _check(isinstance(cluster_name, str) and cluster_name in entries["clusters"])
    cluster = _section(entries["clusters"][str(cluster_name)], "cluster")
    user = None
    user_name = ctx.value.get("user")
    if user_name and entries["users"]:
        _check(isinstance(user_name, str))
        if user_name in entries["users"]:
            user = _section(entries["users"][user_name], "user")
    config = ClientConfig()
    loaded: dict[str, Any] = {}
    if user is not None and user.value:
        loaded["exec_plugin"] = _authenticate(config, user, str(user_name), cluster, timeout)
    server = cluster.value.get("server")
    _check(isinstance(server, str))
    config.host = str(server).rstrip("/")
    if config.host.startswith("https"):
        loaded.update(_tls(config, cluster, user))
    if "insecure-skip-tls-verify" in cluster.value:
        _check(isinstance(cluster.value["insecure-skip-tls-verify"], bool))
        config.verify_ssl = not cluster.value["insecure-skip-tls-verify"]
    config.tls_server_name = _optional(cluster.value, "tls-server-name")
    config.proxy = _optional(cluster.value, "proxy-url")
    return Loaded(config, **loaded)


def _authenticate(config: ClientConfig, user: _Entry, name: str, cluster: _Entry, timeout: float
                  ) -> ExecPlugin | None:
    """The package's order: auth-provider (not plain), token or tokenFile, exec, username and password."""
    u = user.value
    _check("auth-provider" not in u)
    token: str | None = None
    if "token" in u:
        token = u["token"]
        _check(isinstance(token, str))
    elif "tokenFile" in u:
        _check(isinstance(u["tokenFile"], str))
        try:
            with open(os.path.normpath(os.path.join(user.base(), u["tokenFile"]))) as f:
                token = f.read()
        except OSError:
            raise _NotPlain from None
    plugin = None
    if "exec" in u:
        _check(isinstance(u["exec"], dict))
        info = None
        if u["exec"].get("provideClusterInfo"):
            try:
                info = _cluster_info(cluster.value, cluster.base())
            except Exception:
                raise _NotPlain from None
        plugin = ExecPlugin(name, u["exec"], user.base(), info, timeout)
    if token:
        config.api_key["BearerToken"] = f"Bearer {token}"
        return None
    if plugin is None and "username" in u and "password" in u:
        _check(isinstance(u["username"], str) and isinstance(u["password"], str))
        try:
            pair = f"{u['username']}:{u['password']}".encode("latin-1")
        except UnicodeEncodeError:
            raise _NotPlain from None
        config.api_key["BearerToken"] = "Basic " + base64.b64encode(pair).decode()
    return plugin


def _tls(config: ClientConfig, cluster: _Entry, user: _Entry | None) -> dict[str, str]:
    """The CA and client certificate of an https server: files by path (relative to the cluster's file, as the
    package resolves them), ``*-data`` as PEM text for ``ApiClient``."""
    data = {}
    if "certificate-authority-data" in cluster.value:
        data["ca_data"] = _pem(cluster.value, "certificate-authority-data")
    elif "certificate-authority" in cluster.value:
        config.ssl_ca_cert = _file(cluster.value, "certificate-authority", cluster.base())
    u = user.value if user is not None else {}
    has = [k for k in ("client-certificate-data", "client-key-data", "client-certificate", "client-key") if k in u]
    if has == ["client-certificate-data", "client-key-data"]:
        data["client_cert_data"] = _pem(u, "client-certificate-data")
        data["client_key_data"] = _pem(u, "client-key-data")
    elif has == ["client-certificate", "client-key"]:
        config.cert_file = _file(u, "client-certificate", cluster.base())
        config.key_file = _file(u, "client-key", cluster.base())
    else:
        _check(not has)
    return data


def _section(entry: _Entry, key: str) -> _Entry:
    section = entry.value.get(key)
    _check(isinstance(section, dict))
    return _Entry(section, entry.file)  # type: ignore[arg-type]


def _optional(value: dict[str, Any], key: str) -> str | None:
    if key not in value:
        return None
    _check(isinstance(value[key], str))
    return str(value[key])


def _pem(value: dict[str, Any], key: str) -> str:
    text = value[key]
    _check(isinstance(text, str) and bool(text))
    try:
        return base64.standard_b64decode(text).decode("ascii")
    except ValueError:
        raise _NotPlain from None


def _file(value: dict[str, Any], key: str, base: str) -> str:
    name = value[key]
    _check(isinstance(name, str) and bool(name))
    path = os.path.normpath(os.path.join(base, name))
    _check(os.path.isfile(path))
    return path


def _check(plain: bool) -> None:
    if not plain:
        raise _NotPlain


def in_cluster(token_file: str = SERVICE_TOKEN_FILENAME, cert_file: str = SERVICE_CERT_FILENAME) -> ClientConfig:
    """The pod's service account, as ``kubernetes.config.load_incluster_config`` loads it: host from
    ``$KUBERNETES_SERVICE_HOST``/``_PORT``, the token re-read once a minute (by the refresh hook), the same
    errors (``ConfigException``)."""
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
    if host is None or port is None:
        raise config_error("Service host/port is not set.")
    if not host or not port:
        raise config_error("Service host/port is set but empty.")
    config = ClientConfig("https://" + (f"[{host}]:{port}" if ":" in host or "%" in host else f"{host}:{port}"))
    if not os.path.isfile(token_file):
        raise config_error("Service token file does not exist.")
    expires = _read_token(config, token_file)
    if not os.path.isfile(cert_file):
        raise config_error("Service certification file does not exist.")
    with open(cert_file) as f:
        if not f.read():
            raise config_error("Cert file exists but empty.")
    config.ssl_ca_cert = cert_file

    def refresh(configuration: Any) -> None:
        nonlocal expires
        if expires <= datetime.datetime.now():
            expires = _read_token(configuration, token_file)

    config.refresh_api_key_hook = refresh
    return config


def _read_token(config: Any, token_file: str) -> datetime.datetime:
    """Set the token of ``token_file``; when to read it again."""
    with open(token_file) as f:
        content = f.read()
    if not content:
        raise config_error("Token file exists but empty.")
    config.api_key["BearerToken"] = "bearer " + content
    return datetime.datetime.now() + _TOKEN_REFRESH
