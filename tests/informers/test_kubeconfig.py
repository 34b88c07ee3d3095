"""``informers.kubeconfig``: the common kubeconfigs load without the kubernetes package, to exactly what the package's
loader (``credentials.load_kubeconfig``) makes of them; the rest goes to the package, with its errors."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import kubernetes
import pytest

from informers.credentials import ExecPlugin, load_kubeconfig
from informers.kubeconfig import ClientConfig, in_cluster, load

CA = "-----BEGIN CERTIFICATE-----\nCA-PEM\n-----END CERTIFICATE-----\n"
CERT = "-----BEGIN CERTIFICATE-----\nCLIENT-PEM\n-----END CERTIFICATE-----\n"
KEY = "-----BEGIN PRIVATE KEY-----\nKEY-PEM\n-----END PRIVATE KEY-----\n"
SERVER = "https://10.0.0.1:6443/"
EXEC = {"apiVersion": "client.authentication.k8s.io/v1", "command": "get-token", "args": ["--x", 1],
        "env": [{"name": "A", "value": "b"}]}


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


def _doc(cluster: dict[str, Any] | None = None, user: dict[str, Any] | None = None, **top: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Config", "current-context": "c",
            "clusters": [{"name": "k", "cluster": {"server": SERVER, **(cluster or {})}}],
            "users": [{"name": "u", "user": user or {}}],
            "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}], **top}


def _read(path: str | None) -> str | None:
    return Path(path).read_text() if path else None


def _summary(config: Any, plugin: ExecPlugin | None, ca: str | None = None, cert: str | None = None,
             key: str | None = None) -> dict[str, Any]:
    """What a client is made of, with PEM given as a file (the package's temporary ones) or in memory alike."""
    return {
        "host": config.host, "verify_ssl": config.verify_ssl, "api_key": dict(config.api_key),
        "ca": ca or _read(config.ssl_ca_cert), "cert": cert or _read(config.cert_file),
        "key": key or _read(config.key_file), "tls_server_name": config.tls_server_name, "proxy": config.proxy,
        "exec": None if plugin is None else (plugin.user, plugin.command, plugin.args, plugin.env, plugin.cwd,
                                             plugin._exec_info),
    }


def _both(paths: str, context: str | None = None) -> tuple[dict[str, Any], dict[str, Any], ClientConfig]:
    config = kubernetes.client.Configuration()
    package = _summary(config, load_kubeconfig(config, paths, context))
    loaded = load(paths, context)
    assert isinstance(loaded.configuration, ClientConfig), "took the package's path"
    light = _summary(loaded.configuration, loaded.exec_plugin, loaded.ca_data, loaded.client_cert_data,
                     loaded.client_key_data)
    return package, light, loaded.configuration


def _write(path: Path, doc: dict[str, Any]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return str(path)


CASES: dict[str, dict[str, Any]] = {
    "token, CA data": _doc({"certificate-authority-data": _b64(CA)}, {"token": "t0k"}),
    "client certificate data": _doc({"certificate-authority-data": _b64(CA)},
                                    {"client-certificate-data": _b64(CERT), "client-key-data": _b64(KEY)}),
    "basic": _doc({"insecure-skip-tls-verify": True}, {"username": "me", "password": "pä"}),
    "exec, username and password left out": _doc({"tls-server-name": "api.internal", "proxy-url": "http://p:3128"},
                                                 {"exec": {**EXEC, "provideClusterInfo": True}, "username": "me",
                                                  "password": "pw"}),
    "a token wins over exec": _doc({}, {"token": "t0k", "exec": EXEC}),
    "an empty token falls to exec": _doc({}, {"token": "", "exec": EXEC}),
    "http: no TLS files read": _doc({"server": "http://127.0.0.1:8080", "certificate-authority": "missing.crt"},
                                    {"token": "t0k", "client-certificate": "nope", "client-key": "nope"}),
    "an unknown user is anonymous": {**_doc(), "users": [{"name": "other", "user": {"token": "t"}}]},
    "an empty user": _doc({}, {}),
}


@pytest.mark.parametrize("name", CASES)
def test_plain_kubeconfigs_load_as_the_package_loads_them(tmp_path: Path, name: str) -> None:
    package, light, _ = _both(_write(tmp_path / "config", CASES[name]))
    assert light == package


def test_merged_files_relative_paths_and_precedence(tmp_path: Path) -> None:
    """$KUBECONFIG's files: the first entry of a name wins, the last current-context wins; a tokenFile is relative to
    its user's file, the CA and the client certificate to the cluster's (the package's rule)."""
    (tmp_path / "a" / "ca.crt").parent.mkdir()
    (tmp_path / "a" / "ca.crt").write_text(CA)
    (tmp_path / "a" / "client.crt").write_text(CERT)
    (tmp_path / "a" / "client.key").write_text(KEY)
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "token").write_text("from-file\n")
    first = _write(tmp_path / "a" / "config", {
        "current-context": "other", "clusters": [{"name": "k", "cluster": {"server": SERVER,
                                                                          "certificate-authority": "ca.crt"}}],
        "contexts": [{"name": "c", "context": {"cluster": "k", "user": "u"}}], "users": []})
    second = _write(tmp_path / "b" / "config", {
        "current-context": "c", "clusters": [{"name": "k", "cluster": {"server": "https://ignored"}}],
        "contexts": [{"name": "other", "context": {"cluster": "k", "user": "w"}}],
        "users": [{"name": "u", "user": {"tokenFile": "token"}},
                  {"name": "w", "user": {"client-certificate": "client.crt", "client-key": "client.key"}}]})
    paths = os.pathsep.join([first, str(tmp_path / "missing"), second])
    package, light, config = _both(paths)
    assert light == package and light["api_key"] == {"BearerToken": "Bearer from-file\n"}
    assert config.ssl_ca_cert == str(tmp_path / "a" / "ca.crt")  # a file stays a file
    package, light, config = _both(paths, context="other")
    assert light == package and config.cert_file == str(tmp_path / "a" / "client.crt")


def test_pem_data_stays_in_memory(tmp_path: Path) -> None:
    loaded = load(_write(tmp_path / "config", CASES["client certificate data"]))
    assert loaded.configuration.ssl_ca_cert is None and loaded.configuration.cert_file is None
    assert (loaded.ca_data, loaded.client_cert_data, loaded.client_key_data) == (CA, CERT, KEY)


@pytest.mark.parametrize("doc", [
    _doc({}, {"auth-provider": {"name": "custom", "config": {}}, "token": "t0k"}),
    _doc({"certificate-authority-data": ""}, {"token": "t0k"}),
    _doc({}, {"client-certificate-data": _b64(CERT), "client-key": "key.pem", "token": "t"}),
    _doc({"insecure-skip-tls-verify": "yes"}, {"token": "t0k"}),
], ids=["auth-provider", "empty CA data", "mixed data and file", "not a boolean"])
def test_what_is_not_plain_goes_to_the_package(tmp_path: Path, doc: dict[str, Any]) -> None:
    (tmp_path / "key.pem").write_text(KEY)
    config = kubernetes.client.Configuration()
    plugin = load_kubeconfig(config, _write(tmp_path / "config", doc))
    loaded = load(str(tmp_path / "config"))
    assert isinstance(loaded.configuration, kubernetes.client.Configuration)
    assert _summary(loaded.configuration, loaded.exec_plugin) == _summary(config, plugin)


@pytest.mark.parametrize("doc", [
    {**_doc(), "current-context": "nope"},
    _doc({}, {"tokenFile": "missing-token"}),
    _doc({"certificate-authority": "missing.crt"}, {"token": "t"}),
    {**_doc(), "contexts": [{"context": {"cluster": "k"}}]},
    _doc({}, {"exec": {"command": "x", "apiVersion": "v0"}}),
], ids=["unknown context", "missing tokenFile", "missing CA file", "entry without name", "bad exec"])
def test_errors_are_the_packages(tmp_path: Path, doc: dict[str, Any]) -> None:
    path = _write(tmp_path / "config", doc)
    with pytest.raises(Exception) as package:
        load_kubeconfig(kubernetes.client.Configuration(), path)
    with pytest.raises(Exception) as light:
        load(path)
    assert (type(light.value), str(light.value)) == (type(package.value), str(package.value))


def test_in_cluster_as_the_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kubernetes.config.incluster_config import InClusterConfigLoader

    token, ca = tmp_path / "token", tmp_path / "ca.crt"
    token.write_text("sa-token")
    ca.write_text(CA)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "fd00::1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    config = kubernetes.client.Configuration()
    InClusterConfigLoader(str(token), str(ca)).load_and_set(config)  # type: ignore[no-untyped-call]
    light = in_cluster(str(token), str(ca))
    assert (light.host, light.ssl_ca_cert, light.api_key) == (config.host, config.ssl_ca_cert, config.api_key)
    assert light.host == "https://[fd00::1]:443" and light.refresh_api_key_hook is not None
    token.write_text("")
    with pytest.raises(kubernetes.config.ConfigException, match="Token file exists but empty"):
        in_cluster(str(token), str(ca))
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT")
    with pytest.raises(kubernetes.config.ConfigException, match="Service host/port is not set"):
        in_cluster(str(token), str(ca))
