"""The fleet example: examples/fleet_demo.py run as users run it (three control planes, every step of its story),
and the fleet_report plugin's hook and reconciler on their own, against fakes, in about a second."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from controllers.fleet import FleetContext, FleetController
from controllers.reconcile import Request
from examples.plugins import fleet_report
from informers import UnionInformer
from syncer.plugins import PluginError, load_plugins

ROOT = Path(__file__).resolve().parents[2]


def test_fleet_demo_script() -> None:
    proc = subprocess.run([sys.executable, "examples/fleet_demo.py"], cwd=ROOT, capture_output=True, text=True,
                          timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    for line in (
        "Connected  True",
        "widget-status in east: waiting",
        "widget-status: east running; fleet loop's clusters: ['east']; report: {'clusters': 'east', 'east': '0'}",
        "report: {'clusters': 'east', 'east': '1'}",
        "w1 Ready in east: size is 3",
        "widget-status: east running, west waiting; report: {'clusters': 'east', 'east': '1'}",
        "report: {'clusters': 'east,west', 'east': '1', 'west': '0'}",
        "east stayed in the fleet throughout",
        "w2 Ready in east: size is 5",
        "report: {'clusters': 'east,west', 'east': '2', 'west': '0'}",
        "clusters up: ['east']; widget-status runs in: ['east']",
        "report: {'clusters': 'east', 'east': '2'}",
        "done",
    ):
        assert line in out, f"{line!r} not in the output:\n{out}"
    assert "FAILED" not in out


def test_hook_declares_one_fleet_controller_over_widgets() -> None:
    plugins = load_plugins(["examples.plugins.fleet_report"], {"fleet_report": {"namespace": "reports"}},
                           entry_points=False)
    assert plugins.controllers == {}  # no per-cluster controller
    [(name, spec)] = plugins.fleet.items()
    assert name == "fleet-widgets" and isinstance(spec, FleetController)
    assert spec.gvr == fleet_report.WIDGETS
    # Report keys are ConfigMap data keys, whatever the cluster is called in the union.
    assert [fleet_report._data_key(c) for c in ("east", "", "a/b")] == ["east", "local", "ab"]
    with pytest.raises(PluginError, match="namespace"):
        load_plugins(["examples.plugins.fleet_report"], {"fleet_report": {"namespace": ""}}, entry_points=False)


class FakeApi:
    """Records the requests of the report's ResourceClient and answers with the object sent."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, dict[str, str], Any]] = []

    async def request(self, method: str, path: str, params: Any = None, body: Any = None, headers: Any = None,
                      timeout: Any = None) -> Any:
        self.calls.append((method, path, dict(params or {}), body))
        return body


class FakeLister:
    def __init__(self, count: int) -> None:
        self.count = count

    def get(self, name: str, namespace: str | None = None) -> Any:
        return None

    def list(self, namespace: str | None = None, selector: Any = None) -> list[Any]:
        return [{"metadata": {"name": f"w{i}", "namespace": "default"}} for i in range(self.count)]


class FakeSub:
    """A cluster's informer as the union needs it when no handler is registered: a lister."""

    def __init__(self, count: int) -> None:
        self.lister = FakeLister(count)


async def test_report_follows_widgets_and_membership() -> None:
    api = FakeApi()
    union = UnionInformer()
    ctx = FleetContext("fleet-widgets", fleet_report.WIDGETS, union, clients=None,  # type: ignore[arg-type]
                       management=api)  # type: ignore[arg-type]
    spec = fleet_report.syncer_fleet_controllers({"namespace": "reports"})["fleet-widgets"]
    made: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    async def loop_run() -> None:  # create() is called from the FleetLoop's run task, which lives as long as it
        made.set_result(spec.create(ctx))
        await asyncio.Event().wait()

    runner = asyncio.create_task(loop_run())
    reconciler = await made
    follower = fleet_report._followers[ctx]

    def written() -> list[Any]:
        return [body["data"] for _, _, _, body in api.calls]

    async def until(expected: list[Any]) -> None:
        async with asyncio.timeout(5):
            while written() != expected:
                await asyncio.sleep(0.02)

    try:
        await until([{"clusters": ""}])  # the follower's first report: no cluster serves Widgets
        method, path, params, body = api.calls[0]
        assert (method, path) == ("PATCH", "/api/v1/namespaces/reports/configmaps/fleet-widgets")
        assert params == {"fieldManager": "fleet-report", "force": "true"}
        assert body["kind"] == "ConfigMap" and body["metadata"]["namespace"] == "reports"

        await union.add("east", FakeSub(2))  # type: ignore[arg-type]
        await reconciler.reconcile("east", Request("w0", "default"))
        assert written()[-1] == {"clusters": "east", "east": "2"}
        await reconciler.reconcile_deletion("east", Request("w9", "default"))
        assert len(api.calls) == 2  # the same report is not written again

        # A cluster joining or leaving sends no Widget event: the follower notices.
        await union.add("west", FakeSub(0))  # type: ignore[arg-type]
        await until([{"clusters": ""}, {"clusters": "east", "east": "2"},
                     {"clusters": "east,west", "east": "2", "west": "0"}])
        await union.remove("east")
        await until([{"clusters": ""}, {"clusters": "east", "east": "2"},
                     {"clusters": "east,west", "east": "2", "west": "0"}, {"clusters": "west", "west": "0"}])
    finally:
        runner.cancel()
        await asyncio.gather(runner, return_exceptions=True)
    # The follower ends with the task that created it.
    await asyncio.wait([follower], timeout=1)
    assert follower.cancelled()
