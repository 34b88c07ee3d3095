"""The kubeconfig files provider: contexts as members, per-context digests, files that change, go and come back,
and one context name in two files."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, AsyncIterator

import pytest
from loguru import logger

from controllers.cluster_registry import ClusterRegistry
from controllers.member import MemberOptions
from controllers.provider import ClusterProvider, KubeconfigFile
from controllers.providers.kubeconfig_files import KubeconfigFilesOptions, KubeconfigFilesProvider

from informers import ApiClient
from syncer.testing import ControlPlane, eventually

from tests.helpers import CONFIGMAPS, HandlerLog


def kubeconfig(*contexts: str, token: str = "t", server: str = "https://127.0.0.1:1") -> dict[str, Any]:
    """A kubeconfig with one cluster and one user per context, named after it."""
    return {
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": f"{c}-cluster", "cluster": {"server": server}} for c in contexts],
        "users": [{"name": f"{c}-user", "user": {"token": token}} for c in contexts],
        "contexts": [{"name": c, "context": {"cluster": f"{c}-cluster", "user": f"{c}-user"}} for c in contexts],
    }


def write(path: Path, doc: dict[str, Any] | str) -> None:
    """Write ``path`` anew (a new inode, as an editor or a ConfigMap mount does)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    os.replace(tmp, path)


@pytest.fixture
async def started(tmp_path: Path) -> AsyncIterator[tuple[KubeconfigFilesProvider, list[str], Path, Path]]:
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    provider = KubeconfigFilesProvider(KubeconfigFilesOptions(paths=[str(a), str(b)], reload_interval=0.05))
    changes: list[str] = []  # the names changed was called with
    write(a, kubeconfig("arn:aws:eks:eu-west-1:1:cluster/east", "admin@west"))
    await provider.start(changes.append)
    try:
        assert await provider.wait_synced(5)
        yield provider, changes, a, b
    finally:
        await provider.stop()


def digest(provider: KubeconfigFilesProvider, name: str) -> str:
    config = provider.get(name)
    assert config is not None and isinstance(config.connection, KubeconfigFile)
    return config.connection.entries_digest


async def test_contexts_are_members_and_a_new_context_is_a_new_name(started: Any) -> None:
    provider, changes, a, b = started
    as_protocol: ClusterProvider = provider  # it is one, statically
    assert isinstance(as_protocol, ClusterProvider)
    assert provider.names() == {"arn:aws:eks:eu-west-1:1:cluster/east", "admin@west"}
    config = provider.get("admin@west")
    assert config is not None and config.connection == KubeconfigFile(str(a), "admin@west", digest(provider, "admin@west"))
    assert set(changes) == provider.names()
    assert provider.status()["files"][1] == {"path": str(b), "contexts": [], "error": "No such file or directory"}

    write(a, kubeconfig("arn:aws:eks:eu-west-1:1:cluster/east", "admin@west", "north"))
    await eventually(lambda: "north" in provider.names(), 5, "the new context")
    assert changes[-1] == "north"


async def test_editing_one_context_rotates_only_it(started: Any) -> None:
    provider, changes, a, _ = started
    east, west = digest(provider, "arn:aws:eks:eu-west-1:1:cluster/east"), digest(provider, "admin@west")
    doc = kubeconfig("arn:aws:eks:eu-west-1:1:cluster/east", "admin@west")
    doc["users"][1]["user"]["token"] = "rotated"  # admin@west's user
    del changes[:]
    write(a, doc)
    await eventually(lambda: digest(provider, "admin@west") != west, 5, "the edited context's digest")
    assert digest(provider, "arn:aws:eks:eu-west-1:1:cluster/east") == east
    assert changes == ["admin@west"]

    write(a, doc)  # rewritten, same content: nothing changes
    mtime = a.stat().st_mtime_ns
    await eventually(lambda: provider._files[str(a)].signature is not None and
                     provider._files[str(a)].signature[2] == mtime, 5, "the rewrite read")
    assert changes == ["admin@west"]


async def test_a_removed_file_takes_its_contexts_and_a_fixed_one_brings_them_back(started: Any) -> None:
    provider, changes, a, _ = started
    warnings: list[str] = []
    sink = logger.add(lambda m: warnings.append(m), level="WARNING", format="{message}")
    try:
        a.unlink()
        await eventually(lambda: not provider.names(), 5, "the contexts to leave")
        assert provider.get("admin@west") is None
        assert provider.status()["files"][0]["error"] == "No such file or directory"
        write(a, "contexts: [unclosed")
        await eventually(lambda: "does not parse" in (provider.status()["files"][0]["error"] or ""), 5, "parse error")
        await eventually(lambda: len(warnings) == 2, 5, "one warning per change")
        for _ in range(5):  # checks of the unchanged broken file say nothing more
            provider.check()
        assert len(warnings) == 2, warnings
        assert str(a) in warnings[0] and "No such file" in warnings[0]
    finally:
        logger.remove(sink)
    write(a, kubeconfig("admin@west"))
    await eventually(lambda: provider.names() == {"admin@west"}, 5, "the fixed file's context")
    assert provider.status()["files"][0]["error"] is None


async def test_a_context_in_two_files_is_held_by_the_first_listed(started: Any) -> None:
    provider, _, a, b = started
    write(b, kubeconfig("admin@west", "south"))
    await eventually(lambda: "south" in provider.names(), 5, "the second file")
    config = provider.get("admin@west")
    assert config is not None and isinstance(config.connection, KubeconfigFile) and config.connection.path == str(a)
    [conflict] = provider.conflicts()
    assert (conflict.kind, conflict.key, conflict.cluster) == ("file", f"{b} context admin@west", "admin@west")
    assert conflict.holder == f"file {a}"

    write(a, kubeconfig("arn:aws:eks:eu-west-1:1:cluster/east"))  # the first file lets go: the second holds it
    await eventually(lambda: getattr(provider.get("admin@west"), "source", "").startswith(f"file {b}"), 5,
                     "the second file to hold the name")
    assert provider.conflicts() == []


async def test_only_the_wanted_contexts(tmp_path: Path) -> None:
    path = tmp_path / "config"
    write(path, kubeconfig("one", "two"))
    provider = KubeconfigFilesProvider(KubeconfigFilesOptions(paths=[str(path)], contexts=["two", "three"]))
    await provider.start(lambda _: None)
    try:
        assert await provider.wait_synced(5)
        assert provider.names() == {"two"}
        assert provider.status()["missing_contexts"] == ["three"]
    finally:
        await provider.stop()


@pytest.mark.parametrize("text,error", [
    ("- a\n- b\n", "is not a kubeconfig (a mapping at the top), but a list"),
    ("contexts: {a: 1}\n", "'contexts' is not a list"),
    ("contexts: [{context: {}}]\n", "entry 0 of 'contexts' has no name (a non-empty string)"),
])
async def test_malformed_files_say_why(tmp_path: Path, text: str, error: str) -> None:
    path = tmp_path / "config"
    write(path, text)
    provider = KubeconfigFilesProvider(KubeconfigFilesOptions(paths=[str(path)]))
    provider.check()
    assert provider.names() == set()
    assert provider.status()["files"][0]["error"] == error


async def test_a_context_gained_joins_the_registry_and_a_context_dropped_leaves(
        api: ApiClient, member_plane: ControlPlane, tmp_path: Path) -> None:
    plane = json.loads(member_plane.kubeconfig.read_text())  # contexts admin and restricted, certificate inline
    admin = next(c for c in plane["contexts"] if c["name"] == "admin")
    path = tmp_path / "fleet.yaml"
    write(path, {**plane, "contexts": [admin]})
    provider = KubeconfigFilesProvider(KubeconfigFilesOptions(paths=[str(path)], reload_interval=0.05))
    registry = ClusterRegistry(api, [provider], MemberOptions(sync_timeout=20, probe_interval=3600),
                               required=[CONFIGMAPS])
    members = HandlerLog()
    await registry.register_cluster_handler(members)
    await registry.start()
    try:
        await eventually(lambda: members.added == ["admin"], 60, "the file's context to join")
        write(path, {**plane, "contexts": [admin, {"name": "dev@second", "context": admin["context"]}]})
        await eventually(lambda: members.added == ["admin", "dev@second"], 60, "the new context to join")
        assert registry.cluster("dev@second").client.host == member_plane.url
        write(path, {**plane, "contexts": [admin]})
        await eventually(lambda: members.removed == ["dev@second"], 30, "the dropped context to leave")
        assert registry.list_clusters() == ["admin"]
    finally:
        await registry.stop()
