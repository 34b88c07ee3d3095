"""Supervisor and wait_first: pure asyncio logic, no API server."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest

from informers import Backoff, Supervisor, TaskState, wait_first
from tests.helpers import eventually


def fast() -> Backoff:
    return Backoff(initial=0.01, jitter=0.0, cap=0.05)


async def test_a_failing_task_is_restarted_and_its_error_kept() -> None:
    sup = Supervisor()
    runs = 0

    async def body(handle) -> None:
        nonlocal runs
        runs += 1
        if runs < 3:
            raise aiohttp.ServerDisconnectedError()
        await asyncio.Event().wait()

    handle = sup.spawn("discovery loop", body, backoff=fast)
    await eventually(lambda: runs == 3, 5, "two restarts")
    (h,) = sup.health()
    assert h.name == "discovery loop" and h.state is TaskState.RUNNING and h.restarts == 2
    assert "ServerDisconnectedError" in h.last_error and h.healthy and not sup.problems()
    await sup.stop()
    assert handle.task is not None and handle.task.done() and handle.state is TaskState.STOPPED


async def test_an_unexpected_return_is_restarted_and_a_non_restartable_failure_is_dead() -> None:
    sup = Supervisor()
    returns = 0

    async def returns_at_once(handle) -> None:
        nonlocal returns
        returns += 1

    async def dies(handle) -> None:
        raise ValueError("bug")

    sup.spawn("loop", returns_at_once, backoff=fast)
    sup.spawn("once", dies, restart=False)
    await eventually(lambda: returns >= 2, 5, "a restart after returning")
    await eventually(lambda: [p.name for p in sup.problems()] == ["once"], 5, "the dead task reported")
    dead = sup.problems()[0]
    assert dead.state is TaskState.DEAD and dead.last_error == "ValueError: bug"
    assert dead.as_dict()["healthy"] is False
    await sup.stop()


async def test_a_task_busy_for_too_long_is_wedged_and_handled_errors_are_shown() -> None:
    sup = Supervisor()
    release = asyncio.Event()

    async def body(handle) -> None:
        handle.failed(TimeoutError())
        with handle.busy():
            await release.wait()
        handle.succeeded()
        await asyncio.Event().wait()

    handle = sup.spawn("pass", body, wedge_after=0.05)
    await eventually(lambda: bool(sup.problems()), 5, "the wedged task reported")
    assert sup.problems()[0].wedged and sup.health()[0].last_error == "TimeoutError"
    release.set()
    await eventually(lambda: not sup.problems(), 5, "recovery")
    assert handle.last_error == ""
    with pytest.raises(RuntimeError, match="already running"):
        sup.spawn("pass", body)
    await sup.cancel("pass")
    assert sup.health() == []
    await sup.stop()


async def test_wait_first_returns_the_winner_and_cancels_the_rest() -> None:
    stop = asyncio.Event()
    loser_cancelled = asyncio.Event()

    async def loser() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            loser_cancelled.set()
            raise

    async def winner() -> str:
        await asyncio.sleep(0.01)
        return "x"

    assert await wait_first(loser(), winner()) == 1
    assert loser_cancelled.is_set()
    assert await wait_first(stop.wait(), timeout=0.01) is None

    async def boom() -> None:
        raise KeyError("k")

    with pytest.raises(KeyError):
        await wait_first(boom(), stop.wait())
    before = len(asyncio.all_tasks())
    outer = asyncio.create_task(wait_first(loser(), stop.wait()))
    await asyncio.sleep(0.01)
    outer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await outer
    assert len(asyncio.all_tasks()) == before


async def test_an_idle_event_loop_reports_no_lag() -> None:
    import socket

    import aiohttp

    from syncer.http import StatusServer

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = StatusServer(f"127.0.0.1:{port}", lambda: {}, lambda: (True, []), lambda: None)
    await server.start()
    try:
        await asyncio.sleep(2.7)  # two ticks of the 1 s ticker, 0.7 s after the last (what the old code reported)
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/healthz") as resp:
                body = await resp.json()
        assert resp.status == 200 and body["event_loop_lag_seconds"] < 0.35, body
    finally:
        await server.stop()


async def test_a_body_swallowing_its_cancellation_still_ends() -> None:
    sup = Supervisor()
    inside = asyncio.Event()

    async def stubborn(handle) -> None:
        inside.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            return  # swallowed: without care the supervisor would take this for a return and restart it

    sup.spawn("stubborn", stubborn, backoff=fast)
    await inside.wait()
    await asyncio.wait_for(sup.cancel("stubborn"), 2)
    assert sup.health() == []


async def test_wait_first_raises_an_error_finishing_in_the_same_turn_as_the_winner() -> None:
    async def ok() -> None:
        return None

    async def boom() -> None:
        raise KeyError("late")

    with pytest.raises(KeyError):
        await wait_first(ok(), boom())
