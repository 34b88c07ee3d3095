"""Stores and runnables: recovery retried with backoff and bounded per attempt, concurrent shutdowns within the
deadline, failures restarted and reported; and in the sidecar, seed 001's order (elected -> stores recovered ->
runnables -> controllers), with health in /healthz."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from dataclasses import replace
from typing import Any

import pytest

from controllers import ControllerContext, ManagedController
from controllers.health import HealthItem
from informers import GVR, ApiClient, Backoff
from syncer.plugins import Plugins
from syncer.runnables import Health, Runnables, Stores
from syncer.runtime import Syncer
from syncer.settings import Settings
from syncer.testing import ControlPlane

from tests.helpers import free_port

FAST = lambda: Backoff(initial=0.05, cap=0.1, jitter=0)  # noqa: E731


class FlakyStore:
    """Fails ``failures`` times (or hangs, if ``hang``), then recovers."""

    def __init__(self, name: str, events: list[str], failures: int = 0, hang: bool = False) -> None:
        self.name, self.events, self.failures, self.hang = name, events, failures, hang
        self.attempts = 0

    async def recover(self) -> None:
        self.attempts += 1
        self.events.append(f"recover {self.name} {self.attempts}")
        if self.hang and self.attempts == 1:
            await asyncio.sleep(3600)
        if self.attempts <= self.failures:
            raise ConnectionError(f"{self.name} backend down")
        await asyncio.sleep(0.05)
        self.events.append(f"recovered {self.name}")


class Worker:
    """Runs until shut down; ``shutdown`` takes ``slow`` seconds; ``stubborn``: run() ignores cancellation once."""

    def __init__(self, name: str, events: list[str], slow: float = 0.0, fail_first: bool = False) -> None:
        self.name, self.events, self.slow, self.fail_first = name, events, slow, fail_first
        self.stopped = asyncio.Event()
        self.runs = 0
        self.healthy = Health(True)

    async def run(self) -> None:
        self.runs += 1
        self.events.append(f"run {self.name}")
        if self.fail_first and self.runs == 1:
            raise RuntimeError("first run fails")
        self.stopped = asyncio.Event()
        await self.stopped.wait()

    async def shutdown(self) -> None:
        self.events.append(f"shutdown {self.name}")
        await asyncio.sleep(self.slow)
        self.stopped.set()

    def health(self) -> Health:
        return self.healthy


# -- stores -----------------------------------------------------------------------------------------------------
async def test_stores_recover_together_and_failures_are_retried_and_reported() -> None:
    events: list[str] = []
    flaky = FlakyStore("flaky", events, failures=2)
    stores = Stores([FlakyStore("a", events), flaky], attempt_timeout=5, backoff=FAST)
    task = asyncio.create_task(stores.recover())
    while flaky.attempts < 2:
        await asyncio.sleep(0.01)
    [_, flaky_health] = stores.health()
    assert flaky_health == HealthItem("store flaky", False, "recover() raised ConnectionError: flaky backend down")
    await task
    assert events.index("recover a 1") < events.index("recovered a") and "recovered flaky" in events
    assert [s["state"] for s in stores.status()] == ["recovered", "recovered"]
    assert stores.status()[1]["failures"] == 2 and all(h.healthy for h in stores.health())


async def test_a_hanging_recover_is_bounded_per_attempt_and_retried() -> None:
    events: list[str] = []
    stores = Stores([FlakyStore("slow", events, hang=True)], attempt_timeout=0.3, backoff=FAST)
    started = time.monotonic()
    await stores.recover()
    assert 0.3 <= time.monotonic() - started < 2
    assert stores.status()[0]["last_error"] == ""  # cleared once recovered
    assert events == ["recover slow 1", "recover slow 2", "recovered slow"]


async def test_cancelling_recovery_cancels_every_attempt() -> None:
    events: list[str] = []
    stores = Stores([FlakyStore("x", events, hang=True), FlakyStore("y", events, failures=100)], 60, backoff=FAST)
    task = asyncio.create_task(stores.recover())
    await asyncio.sleep(0.2)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    stores.standby()
    assert [s["state"] for s in stores.status()] == ["standby", "standby"]
    assert {t.get_name() for t in asyncio.all_tasks()} == {asyncio.current_task().get_name()}  # type: ignore


# -- runnables ---------------------------------------------------------------------------------------------------
async def test_runnables_shut_down_concurrently_within_the_deadline() -> None:
    events: list[str] = []
    workers = [Worker(f"w{i}", events, slow=0.5) for i in range(4)]
    runnables = Runnables(workers)
    runnables.start()
    await asyncio.sleep(0.05)
    started = time.monotonic()
    assert await runnables.stop(deadline=2.0) == []
    took = time.monotonic() - started
    assert took < 1.5, f"4 shutdowns of 0.5 s took {took:.2f}s: not concurrent"
    assert sorted(e for e in events if e.startswith("shutdown")) == [f"shutdown w{i}" for i in range(4)]
    assert [s["state"] for s in runnables.status()] == ["standby"] * 4


async def test_a_hanging_shutdown_is_cut_at_the_deadline_and_the_others_are_not_held_up() -> None:
    events: list[str] = []
    quick, hung = Worker("quick", events), Worker("hung", events, slow=3600)
    runnables = Runnables([quick, hung])
    runnables.start()
    await asyncio.sleep(0.05)
    started = time.monotonic()
    assert await runnables.stop(deadline=0.5) == []  # cancelled within the deadline, and it obeyed
    assert 0.25 <= time.monotonic() - started < 0.75
    assert quick.stopped.is_set()
    assert {t.get_name() for t in asyncio.all_tasks()} == {asyncio.current_task().get_name()}  # type: ignore


async def test_a_run_that_ignores_cancellation_is_reported_stuck_and_not_run_twice() -> None:
    release = asyncio.Event()

    class Stubborn:
        name = "stubborn"
        runs = 0

        async def run(self) -> None:
            Stubborn.runs += 1
            while not release.is_set():
                try:
                    await release.wait()
                except asyncio.CancelledError:
                    pass  # swallowed: this is the bug being tested

        async def shutdown(self) -> None:
            pass

    runnables = Runnables([Stubborn()])
    runnables.start()
    await asyncio.sleep(0.05)
    assert await runnables.stop(deadline=0.2) == ["stubborn"]
    assert runnables.health() == [HealthItem("runnable stubborn", False,
                                             "did not stop within 0.2s of shutdown() and cancellation")]
    runnables.start()  # the next term: not a second run() next to the stuck one
    assert Stubborn.runs == 1
    release.set()
    await asyncio.sleep(0.05)
    runnables.start()
    await asyncio.sleep(0.05)
    assert Stubborn.runs == 2
    assert await runnables.stop(deadline=1) == []


async def test_a_failing_run_is_restarted_with_backoff_and_the_others_keep_running() -> None:
    events: list[str] = []
    failing, steady = Worker("failing", events, fail_first=True), Worker("steady", events)
    runnables = Runnables([failing, steady], backoff=lambda: Backoff(initial=0.3, cap=0.3, jitter=0))
    runnables.start()
    await asyncio.sleep(0.1)
    assert runnables.health()[0] == HealthItem("runnable failing", False, "run() raised RuntimeError: first run fails")
    assert runnables.health()[1].healthy and not steady.stopped.is_set()
    await asyncio.sleep(0.4)
    assert failing.runs == 2 and runnables.health()[0].healthy
    steady.healthy = Health(False, "queue full")
    assert runnables.health()[1] == HealthItem("runnable steady", False, "queue full")
    assert await runnables.stop(deadline=1) == []


async def test_stopping_while_a_run_backs_off_does_not_wait_for_the_backoff() -> None:
    events: list[str] = []
    runnables = Runnables([Worker("failing", events, fail_first=True)],
                          backoff=lambda: Backoff(initial=60, cap=60, jitter=0))
    runnables.start()
    await asyncio.sleep(0.05)
    started = time.monotonic()
    assert await runnables.stop(deadline=5) == []
    assert time.monotonic() - started < 0.5


# -- in the sidecar ---------------------------------------------------------------------------------------------
def get(port: int, path: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


async def test_the_sidecar_recovers_stores_before_runnables_and_controllers(control_plane: ControlPlane) -> None:
    events: list[str] = []
    flaky = FlakyStore("index", events, failures=2)
    worker = Worker("reporter", events, slow=0.3)

    def create(ctx: ControllerContext) -> Any:
        events.append("create controller")

        async def start(ctx: ControllerContext) -> None:
            await asyncio.Event().wait()
        return start

    plugins = Plugins({"c": ManagedController([GVR("", "v1", "configmaps")], create)},
                      stores=[FlakyStore("cache", events), flaky], runnables=[worker])
    port = free_port()
    settings = replace(Settings(), kubeconfig=str(control_plane.kubeconfig), include=("core/configmaps",),
                       http_bind=f"127.0.0.1:{port}", shutdown_timeout=4.0)
    syncer = Syncer(settings, ApiClient.from_kubeconfig(str(control_plane.kubeconfig)), plugins, identity="order")
    syncer.stores._backoff = lambda: Backoff(initial=0.4, cap=0.4, jitter=0)
    stop = asyncio.Event()
    run = asyncio.create_task(syncer.run(stop))
    try:
        deadline = time.monotonic() + 30
        while flaky.attempts < 2:
            assert time.monotonic() < deadline and not run.done()
            await asyncio.sleep(0.02)
        code, health = await asyncio.to_thread(get, port, "/healthz")
        assert code == 503 and {"name": "store index", "healthy": False, "message":
                                "recover() raised ConnectionError: index backend down"} in health["controllers"]
        assert "create controller" not in events and "run reporter" not in events
        while "create controller" not in events:
            assert time.monotonic() < deadline and not run.done()
            await asyncio.sleep(0.02)
        code, status = await asyncio.to_thread(get, port, "/status")
        assert [s["state"] for s in status["stores"]] == ["recovered", "recovered"]
        assert status["runnables"][0]["state"] == "running"
        code, health = await asyncio.to_thread(get, port, "/healthz")
        assert code == 200 and {"name": "runnable reporter", "healthy": True, "message": "running"} in \
            health["controllers"]
    finally:
        stop.set()
        await asyncio.wait_for(run, 15)
    recovered = max(events.index("recovered cache"), events.index("recovered index"))
    assert recovered < events.index("run reporter") < events.index("create controller")
    assert events[-1] == "shutdown reporter" and worker.stopped.is_set()


async def test_a_term_that_ends_during_recovery_cancels_it_and_the_next_term_recovers_again(
        control_plane: ControlPlane) -> None:
    events: list[str] = []

    class FirstAttemptHangs:
        name = "index"
        attempts = 0

        async def recover(self) -> None:
            FirstAttemptHangs.attempts += 1
            events.append(f"recover {self.attempts}")
            if self.attempts == 1:
                try:
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:
                    events.append("recovery cancelled")
                    raise

    def create(ctx: ControllerContext) -> Any:
        events.append("create controller")

        async def start(ctx: ControllerContext) -> None:
            await asyncio.Event().wait()
        return start

    lease = f"runnables-{free_port()}"
    plugins = Plugins({"c": ManagedController([GVR("", "v1", "configmaps")], create)},
                      stores=[FirstAttemptHangs()], runnables=[Worker("reporter", events)])
    settings = replace(Settings(), kubeconfig=str(control_plane.kubeconfig), include=("core/configmaps",),
                       http_bind=f"127.0.0.1:{free_port()}", shutdown_timeout=4.0,
                       leader_election=replace(Settings().leader_election, enabled=True, lease_name=lease,
                                               lease_duration=3.0, renew_deadline=2.0, retry_period=0.5))
    client = ApiClient.from_kubeconfig(str(control_plane.kubeconfig))
    syncer = Syncer(settings, client, plugins, identity="recovering")
    stop = asyncio.Event()
    run = asyncio.create_task(syncer.run(stop))
    path = f"/apis/coordination.k8s.io/v1/namespaces/default/leases/{lease}"
    async with ApiClient.from_kubeconfig(str(control_plane.kubeconfig)) as api:
        try:
            deadline = time.monotonic() + 30
            while events != ["recover 1"]:
                assert time.monotonic() < deadline and not run.done(), events
                await asyncio.sleep(0.02)
            body = await api.request("GET", path)
            body["spec"]["holderIdentity"] = "thief"  # another replica takes over mid-recovery
            await api.request("PUT", path, body=body)
            while "create controller" not in events:
                assert time.monotonic() < deadline and not run.done(), events
                await asyncio.sleep(0.02)
        finally:
            stop.set()
            await asyncio.wait_for(run, 15)
        assert events[:4] == ["recover 1", "recovery cancelled", "recover 2", "run reporter"]
        assert events[4:] == ["create controller", "shutdown reporter"]
        assert (await api.request("GET", path))["spec"]["holderIdentity"] == ""  # released at the end
