"""The ClusterProfile provider against a real control plane, with the Cluster Inventory API's own CRD
(``tests/data/multicluster.x-k8s.io_clusterprofiles.yaml``: kubernetes-sigs/cluster-inventory-api,
``config/crd/bases``, commit 8375ac21498c5d46948b9e0bd19d4bbb8cc2b219), and an exec credential plugin reached as
the operator's access-provider file says."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import sys
from pathlib import Path
from typing import Any, AsyncIterator

import pytest
import yaml

from controllers.cluster_registry import ClusterRegistry
from controllers.member import MemberOptions, connect
from controllers.provider import ClusterConfig, ClusterProvider, UntrustedKubeconfig
from controllers.providers.cluster_profile import (
    AccessProvider, ClusterProfileOptions, ClusterProfileProvider, load_access_providers, profile_kubeconfig,
)
from controllers.providers.watching import ProviderState
from informers import GVR, ApiClient, ApiError
from informers.kubeconfig import ClientConfig
from informers.untrusted_kubeconfig import KubeconfigRefused

from syncer.settings import load_settings
from syncer.testing import ControlPlane, eventually
from syncer.wiring import cluster_providers

from tests.helpers import CONFIGMAPS, HandlerLog, fresh_namespace

CRDS = GVR("apiextensions.k8s.io", "v1", "customresourcedefinitions")
PROFILES = GVR("multicluster.x-k8s.io", "v1alpha1", "clusterprofiles")
CRD_NAME = "clusterprofiles.multicluster.x-k8s.io"
CRD_FILE = Path(__file__).parent.parent / "data" / "multicluster.x-k8s.io_clusterprofiles.yaml"
V1 = "client.authentication.k8s.io/v1"
TOKEN = AccessProvider("token", {"apiVersion": V1, "command": "/bin/true"})
OIDC = AccessProvider("oidc", {"apiVersion": V1, "command": "/usr/bin/oidc-login"})


async def _gone(api: ApiClient, path: str) -> bool:
    try:
        await api.request("GET", path)
    except ApiError as e:
        return e.status == 404
    return False


async def remove_crd(api: ApiClient) -> None:
    if not await _gone(api, CRDS.path(None, CRD_NAME)):
        await api.request("DELETE", CRDS.path(None, CRD_NAME))
    await eventually(lambda: _gone(api, CRDS.path(None, CRD_NAME)), 60, "the ClusterProfile CRD to go")
    await eventually(lambda: _gone(api, f"/apis/{PROFILES.group}/{PROFILES.version}"), 30, "discovery to drop it")


async def install_crd(api: ApiClient) -> None:
    if await _gone(api, CRDS.path(None, CRD_NAME)):
        await api.request("POST", CRDS.path(None), body=yaml.safe_load(CRD_FILE.read_text()))

    async def established() -> bool:
        crd = await api.request("GET", CRDS.path(None, CRD_NAME))
        return any(c["type"] == "Established" and c["status"] == "True"
                   for c in (crd.get("status") or {}).get("conditions") or ())

    await eventually(established, 30, "the ClusterProfile CRD to be established")


@pytest.fixture
async def crd(api: ApiClient) -> None:
    await install_crd(api)


@pytest.fixture
async def ns(api: ApiClient) -> AsyncIterator[str]:
    async with fresh_namespace(api, "profiles") as ns:
        yield ns


def condition(status: str) -> dict[str, Any]:
    return {"type": "ControlPlaneHealthy", "status": status, "reason": "Probed", "message": "",
            "lastTransitionTime": "2026-01-01T00:00:00Z"}


async def create_profile(api: ApiClient, namespace: str, name: str, status: dict[str, Any] | None = None,
                         **meta: Any) -> dict[str, Any]:
    """A ClusterProfile as a cluster manager writes it: the spec, then its status through the subresource."""
    profile: dict[str, Any] = await api.request("POST", PROFILES.path(namespace), body={
        "apiVersion": "multicluster.x-k8s.io/v1alpha1", "kind": "ClusterProfile", "metadata": {"name": name, **meta},
        "spec": {"displayName": name, "clusterManager": {"name": "test-manager"}}})
    if status is not None:
        profile = await set_status(api, profile, status)
    return profile


async def set_status(api: ApiClient, profile: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
    profile["status"] = status
    meta = profile["metadata"]
    result: dict[str, Any] = await api.request("PUT", PROFILES.path(meta["namespace"], meta["name"]) + "/status",
                                               body=profile)
    return result


def offering(*names: str, server: str = "https://east.example:6443", field: str = "accessProviders",
             healthy: str = "True") -> dict[str, Any]:
    return {"conditions": [condition(healthy)], "version": {"kubernetes": "v1.33.0"},
            "properties": [{"name": "region", "value": "eu", "lastObservedTime": "2026-01-01T00:00:00Z"}],
            field: [{"name": n, "cluster": {"server": server}} for n in names]}


async def started(api: ApiClient, options: ClusterProfileOptions) -> tuple[ClusterProfileProvider, list[str]]:
    provider = ClusterProfileProvider(api, options)
    changes: list[str] = []
    await provider.start(changes.append)
    assert await provider.wait_synced(30)
    return provider, changes


def kubeconfig_of(config: ClusterConfig | None) -> dict[str, Any]:
    assert config is not None and isinstance(config.connection, UntrustedKubeconfig)
    assert config.connection.data is not None
    doc: dict[str, Any] = json.loads(config.connection.data)
    return doc


async def test_waits_for_the_api_then_picks_profiles_up(api: ApiClient, ns: str) -> None:
    await remove_crd(api)
    provider, changes = await started(api, ClusterProfileOptions(access_providers=[TOKEN], namespaces=[ns],
                                                                  discovery_interval=0.2))
    try:
        as_protocol: ClusterProvider = provider
        assert isinstance(as_protocol, ClusterProvider)
        assert provider.state is ProviderState.NOT_INSTALLED and provider.names() == set()
        assert "not installed" in provider.status()["message"]
        await install_crd(api)
        await create_profile(api, ns, "late", offering("token"))
        await eventually(lambda: provider.get(f"{ns}/late") is not None, 30, "the profile once the CRD is there")
        assert provider.status()["state"] == ProviderState.WATCHING.value
        assert provider.status()["resource"] == "clusterprofiles.v1alpha1.multicluster.x-k8s.io"
        await eventually(lambda: f"{ns}/late" in changes, 10, "changed to be told")
    finally:
        await provider.stop()


async def test_a_healthy_profile_is_a_member_until_deleted(api: ApiClient, crd: None, ns: str) -> None:
    provider, changes = await started(api, ClusterProfileOptions(access_providers=[TOKEN], namespaces=[ns]))
    try:
        profile = await create_profile(api, ns, "east", offering("token", healthy="False"))
        await create_profile(api, ns, "bare")  # no status at all yet
        await eventually(lambda: f"{ns}/east" in changes, 10, "the profile's events")
        await asyncio.sleep(0.3)
        assert provider.names() == set() and provider.get(f"{ns}/east") is None and provider.get(f"{ns}/bare") is None

        await set_status(api, profile, offering("token"))
        await eventually(lambda: provider.names() == {f"{ns}/east"}, 10, "the healthy profile")
        config = provider.get(f"{ns}/east")
        assert config is not None and config.source == f"clusterprofile {ns}/east"
        assert isinstance(config.connection, UntrustedKubeconfig) and config.connection.exec_commands == ("/bin/true",)
        doc = kubeconfig_of(config)
        assert doc["clusters"][0]["cluster"] == {"server": "https://east.example:6443"}
        assert doc["users"][0]["user"]["exec"] == {"apiVersion": V1, "command": "/bin/true",
                                                   "interactiveMode": "Never"}

        del changes[:]
        await api.request("DELETE", PROFILES.path(ns, "east"))
        await eventually(lambda: provider.get(f"{ns}/east") is None, 10, "the deleted profile to leave")
        await eventually(lambda: f"{ns}/east" in changes, 10, "changed to be told")
        assert provider.names() == set()
    finally:
        await provider.stop()


async def test_only_a_changed_way_in_changes_the_config(api: ApiClient, crd: None, ns: str) -> None:
    """A new server rotates the member (a new digest); new properties or version restart nothing."""
    provider, _ = await started(api, ClusterProfileOptions(access_providers=[TOKEN], namespaces=[ns]))
    try:
        profile = await create_profile(api, ns, "east", offering("token"))
        await eventually(lambda: provider.get(f"{ns}/east") is not None, 10, "the member")
        first = provider.get(f"{ns}/east")
        assert first is not None
        status = offering("token")
        status["version"] = {"kubernetes": "v1.34.0"}
        status["properties"][0]["value"] = "us"
        profile = await set_status(api, profile, status)

        def cached_version() -> str:
            cached = provider._profile(ns, "east") or {}
            return str(((cached.get("status") or {}).get("version") or {}).get("kubernetes"))

        await eventually(lambda: cached_version() == "v1.34.0", 10, "the new version in the cache")
        assert getattr(provider.get(f"{ns}/east"), "digest", None) == first.digest
        await set_status(api, profile, offering("token", server="https://east-2.example:6443"))
        await eventually(lambda: getattr(provider.get(f"{ns}/east"), "digest", first.digest) != first.digest, 10,
                         "the new server to change the digest")
    finally:
        await provider.stop()


async def test_the_first_allowed_provider_the_profile_offers_is_used(api: ApiClient, crd: None, ns: str) -> None:
    provider, _ = await started(api, ClusterProfileOptions(access_providers=[OIDC, TOKEN], namespaces=[ns]))
    try:
        await create_profile(api, ns, "both", offering("token", "oidc"))
        await create_profile(api, ns, "old", offering("token", field="credentialProviders"))  # the deprecated field
        await create_profile(api, ns, "other", offering("kubeconfig"))  # none the operator allows
        await eventually(lambda: len(provider.names()) == 3, 10, "three healthy profiles")
        assert kubeconfig_of(provider.get(f"{ns}/both"))["users"][0]["name"] == "oidc"  # the file's order decides
        assert kubeconfig_of(provider.get(f"{ns}/old"))["users"][0]["name"] == "token"
        other = provider.get(f"{ns}/other")
        assert other is not None and isinstance(other.connection, UntrustedKubeconfig)
        assert other.connection.data is None and "oidc, token" in other.connection.where
        assert other.digest == ""
    finally:
        await provider.stop()


async def test_label_selector_and_namespaces_pick_profiles(api: ApiClient, crd: None, ns: str) -> None:
    async with fresh_namespace(api, "profiles-out") as elsewhere:
        provider, _ = await started(api, ClusterProfileOptions(access_providers=[TOKEN], namespaces=[ns],
                                                                     label_selector="fleet=yes"))
        try:
            await create_profile(api, ns, "in", offering("token"), labels={"fleet": "yes"})
            await create_profile(api, ns, "out", offering("token"))
            await create_profile(api, elsewhere, "in", offering("token"), labels={"fleet": "yes"})
            await eventually(lambda: provider.names() == {f"{ns}/in"}, 10, "the selected profile")
            await asyncio.sleep(0.3)
            assert provider.names() == {f"{ns}/in"}
        finally:
            await provider.stop()


def test_profile_data_is_untrusted() -> None:
    accessor = {"name": "token", "cluster": {
        "server": "https://east.example:6443", "insecure-skip-tls-verify": True, "certificate-authority": "/etc/ca",
        "tls-server-name": "elsewhere", "extensions": [{"name": "client.authentication.k8s.io/exec",
                                                        "extension": {"audience": "east"}}]}}
    doc = json.loads(profile_kubeconfig(TOKEN, accessor))
    # Only what the Cluster Inventory API's consumer library reads is taken: no skipped TLS check, no file path.
    assert doc["clusters"][0]["cluster"] == {"server": "https://east.example:6443", "extensions": [
        {"name": "client.authentication.k8s.io/exec", "extension": {"audience": "east"}}]}
    management = ApiClient(ClientConfig("https://127.0.0.1:1"))
    # A proxy is refused (the client implements none), as is an exec command the operator did not configure.
    proxied = profile_kubeconfig(TOKEN, {"cluster": {"server": "https://e:6443", "proxy-url": "http://p:3128"}})
    with pytest.raises(KubeconfigRefused, match="proxy"):
        connect(ClusterConfig("ns/e", "clusterprofile ns/e", UntrustedKubeconfig(proxied, exec_commands=("/bin/true",))),
                management, ())
    plain = profile_kubeconfig(TOKEN, {"cluster": {"server": "https://e:6443"}})
    with pytest.raises(KubeconfigRefused, match="not in clusters.allowed_exec_commands"):
        connect(ClusterConfig("ns/e", "clusterprofile ns/e", UntrustedKubeconfig(plain)), management, ())


def test_the_access_provider_file_is_checked(tmp_path: Path) -> None:
    def loads(doc: Any) -> tuple[AccessProvider, ...]:
        path = tmp_path / "providers.json"
        path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
        return load_access_providers(str(path))

    exec_config = {"apiVersion": V1, "command": "get-token"}
    assert loads({"providers": [{"name": "a", "execConfig": exec_config}]}) == (AccessProvider("a", exec_config),)
    for doc, problem in [
        ("{not json", "cannot be read as JSON"),
        ({"providers": []}, "has no list 'providers'"),
        ({"providers": [{"execConfig": exec_config}]}, r"providers\[0\]: has no name"),
        ({"providers": [{"name": "a", "execConfig": exec_config}, {"name": "a", "execConfig": exec_config}]},
         "second time"),
        ({"providers": [{"name": "a", "execConfig": {"apiVersion": V1}}]}, "has no command"),
        ({"providers": [{"name": "a", "execConfig": {"command": "x", "apiVersion": "v0"}}]}, "apiVersion"),
        ({"providers": [{"name": "a", "execConfig": exec_config, "profileSourcedCLIArgsPolicy": "Append"}]},
         "untrusted"),
    ]:
        with pytest.raises(ValueError, match=problem):
            loads(doc)


PLUGIN = """\
import json, os, sys
with open(os.environ["INFO_FILE"], "w") as f:
    f.write(os.environ.get("KUBERNETES_EXEC_INFO", ""))
json.dump({"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
           "status": {"token": os.environ["TOKEN"]}}, sys.stdout)
"""


async def test_a_profile_joins_the_registry_through_its_access_provider_and_leaves_when_deleted(
        api: ApiClient, crd: None, ns: str, member_plane: ControlPlane, tmp_path: Path) -> None:
    plugin = tmp_path / "get-token"
    plugin.write_text(f"#!{sys.executable}\n{PLUGIN}")
    plugin.chmod(0o755)
    info = tmp_path / "exec-info.json"
    access = AccessProvider("test-token", {
        "apiVersion": V1, "command": str(plugin), "provideClusterInfo": True,
        "env": [{"name": "TOKEN", "value": member_plane.admin_token}, {"name": "INFO_FILE", "value": str(info)}]})
    registry = ClusterRegistry(api, [ClusterProfileProvider(
        api, ClusterProfileOptions(access_providers=[access], namespaces=[ns]))],
                               MemberOptions(sync_timeout=20, probe_interval=3600), required=[CONFIGMAPS])
    members = HandlerLog()
    await registry.register_cluster_handler(members)
    await registry.start()
    name = f"{ns}/east"
    try:
        ca = base64.b64encode(member_plane.ca_file.read_bytes()).decode()
        await create_profile(api, ns, "east", {
            "conditions": [condition("True")],
            "accessProviders": [{"name": "test-token", "cluster": {
                "server": member_plane.url, "certificate-authority-data": ca,
                "extensions": [{"name": "client.authentication.k8s.io/exec", "extension": {"audience": "east"}}]}}]})
        await eventually(lambda: members.added == [name], 60, "the profile's cluster to join")
        assert registry.cluster(name).client.host == member_plane.url
        assert registry.status()["clusters"][0]["source"] == f"clusterprofile {name}"
        # The plugin was told the cluster, with the profile's exec extension as its config.
        cluster_info = json.loads(info.read_text())["spec"]["cluster"]
        assert cluster_info["server"] == member_plane.url and cluster_info["config"] == {"audience": "east"}
        await api.request("DELETE", PROFILES.path(ns, "east"))
        await eventually(lambda: members.removed == [name], 30, "the cluster to leave")
        assert registry.list_clusters() == []
    finally:
        await registry.stop()


def test_the_settings_build_the_provider(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in [k for k in os.environ if k.startswith("SYNCER_")]:
        monkeypatch.delenv(variable)
    (tmp_path / "access.json").write_text(json.dumps({"providers": [{"name": "token", "execConfig": TOKEN.exec}]}))
    (tmp_path / "s.toml").write_text(f'[clusters]\nenabled = true\nproviders = ["cluster-profile"]\n'
                                     f'[clusters.cluster_profile]\nprovider_file = "{tmp_path / "access.json"}"\n'
                                     'namespaces = ["fleet"]\nlabel_selector = "env=prod"\n')
    [provider] = cluster_providers(load_settings(str(tmp_path / "s.toml")), ApiClient(ClientConfig("https://h:1")))
    assert isinstance(provider, ClusterProfileProvider) and provider.name == "cluster-profile"
    assert provider.access_providers == (TOKEN,)
    assert (provider.options.namespaces, provider.options.label_selector) == (("fleet",), "env=prod")
