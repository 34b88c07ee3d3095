"""Plugin discovery through entry points, and losing a held lease (real apiserver)."""

from __future__ import annotations

import asyncio
import sys

import pytest
from prometheus_client import REGISTRY

from controllers import ManagedController
from informers import ApiClient
from syncer.leader import LeaderElector
from syncer.plugins import PluginError, load_plugins
from syncer.settings import LeaderElection


def test_entry_point_plugins_are_found_and_duplicates_rejected(tmp_path, monkeypatch) -> None:
    dist = tmp_path / "fakeplug-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: fakeplug\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[syncer.controllers]\nfake = fakeplug_mod\n")
    (tmp_path / "fakeplug_mod.py").write_text(
        "from controllers import ManagedController\n"
        "def syncer_controllers(settings):\n"
        "    return {'fake-' + settings.get('suffix', 'x'): ManagedController([], lambda ctx: None)}\n")
    (tmp_path / "dup.py").write_text(
        "from controllers import ManagedController\n"
        "def syncer_controllers(settings):\n    return {'fake-y': ManagedController([], lambda ctx: None)}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = load_plugins([], {"fake": {"suffix": "y"}}).controllers
    assert list(found) == ["fake-y"] and isinstance(found["fake-y"], ManagedController)
    with pytest.raises(PluginError, match="defined by both plugin"):
        load_plugins([str(tmp_path / "dup.py")], {"fake": {"suffix": "y"}})
    sys.modules.pop("fakeplug_mod", None)


def test_a_plugin_listed_twice_is_loaded_once(monkeypatch) -> None:
    # The same module by its dotted path twice, or by its path and by its file: one plugin, not a clash of
    # its controller names with themselves; a different module defining the same name still clashes.
    monkeypatch.syspath_prepend(".")
    spec = "examples.plugins.configmap_mirror"
    path = "examples/plugins/configmap_mirror.py"
    for specs in ([spec, spec], [spec, path], [path, f"./{path}"]):
        assert list(load_plugins(specs, entry_points=False).controllers) == ["configmap-mirror"], specs


def test_a_plugin_listed_twice_runs_once(tmp_path, monkeypatch) -> None:
    # Its module-level state (a metric, say) must not be made twice.
    (tmp_path / "once_only.py").write_text(
        "import os\n"
        "with open(os.environ['IMPORTS'], 'a') as f:\n    f.write('x')\n"
        "from controllers import ManagedController\n"
        "def syncer_controllers(settings):\n    return {'once': ManagedController([], lambda ctx: None)}\n")
    imports = tmp_path / "imports"
    monkeypatch.setenv("IMPORTS", str(imports))
    monkeypatch.syspath_prepend(str(tmp_path))
    found = load_plugins(["once_only", str(tmp_path / "once_only.py"), "once_only"], entry_points=False)
    assert list(found.controllers) == ["once"] and imports.read_text() == "x"
    sys.modules.pop("once_only", None)


def master_status(name: str) -> float | None:
    """client-go's leader_election_master_status of the Lease ``name``."""
    return REGISTRY.get_sample_value("leader_election_master_status", {"name": name})


async def test_losing_the_lease_ends_hold_without_exiting(control_plane) -> None:
    config = LeaderElection(enabled=True, lease_name="hold-test", lease_namespace="default", lease_duration=4,
                            renew_deadline=2, retry_period=0.3)
    async with ApiClient.from_kubeconfig(str(control_plane.kubeconfig)) as client:
        elector = LeaderElector(client, config, identity="me")
        assert master_status("hold-test") == 0.0
        await asyncio.wait_for(elector.acquire(), 10)
        assert elector.is_leader and master_status("hold-test") == 1.0
        holding = asyncio.create_task(elector.hold())
        await asyncio.sleep(0.5)
        assert not holding.done()
        lease = await client.request("GET", elector.path)
        lease["spec"]["holderIdentity"] = "intruder"
        lease["spec"]["leaseDurationSeconds"] = 60
        await client.request("PUT", elector.path, body=lease)
        await asyncio.wait_for(holding, 5)  # returns: leadership lost, the caller stops controllers and rejoins
        assert not elector.is_leader and elector.observed_holder == "intruder" and master_status("hold-test") == 0.0
        # rejoining waits while the intruder's lease is fresh
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(elector.acquire(), 1.0)
