"""The opt-in debug endpoints: every task's stack, and where the event loop was when it stalled."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from syncer.http import StatusServer
from tests.helpers import free_port


def block_the_loop_for_a_while() -> None:
    time.sleep(0.4)  # what a plugin must never do: the stall the watchdog is for


async def serve(debug: bool) -> tuple[StatusServer, str]:
    port = free_port()
    server = StatusServer(f"127.0.0.1:{port}", lambda: {}, lambda: (True, []), lambda: None, debug=debug)
    await server.start()
    return server, f"http://127.0.0.1:{port}"


async def test_tasks_and_stalls_are_dumped_when_enabled() -> None:
    server, url = await serve(debug=True)
    parked = asyncio.create_task(asyncio.Event().wait(), name="parked-for-the-dump")
    try:
        await asyncio.sleep(0.1)
        block_the_loop_for_a_while()
        async with aiohttp.ClientSession() as http:
            for _ in range(100):  # the stall is closed once the heartbeat runs again
                async with http.get(f"{url}/debug/stalls") as resp:
                    stalls = (await resp.json())["stalls"]
                if stalls and stalls[-1]["seconds"] is not None:
                    break
                await asyncio.sleep(0.05)
            assert stalls[-1]["seconds"] >= 0.3 and "block_the_loop_for_a_while" in stalls[-1]["stack"], stalls
            async with http.get(f"{url}/debug/tasks") as resp:
                dump = await resp.text()
        assert "--- parked-for-the-dump (pending)" in dump and "debug: event loop heartbeat" in dump
    finally:
        parked.cancel()
        await server.stop()
    assert server.stall_watch is not None and server.stall_watch._thread is not None
    assert not server.stall_watch._thread.is_alive()


async def test_no_debug_endpoints_unless_enabled() -> None:
    server, url = await serve(debug=False)
    try:
        async with aiohttp.ClientSession() as http:
            async with http.get(f"{url}/debug/tasks") as resp:
                assert resp.status == 404
    finally:
        await server.stop()


async def test_a_failed_start_leaves_no_watchdog_running() -> None:
    server, url = await serve(debug=False)
    taken = StatusServer(f"127.0.0.1:{server.port}", lambda: {}, lambda: (True, []), lambda: None, debug=True)
    try:
        with pytest.raises(OSError):
            await taken.start()
        assert taken.stall_watch is not None and taken.stall_watch._thread is None
        assert not any(t.get_name() == "debug: event loop heartbeat" for t in asyncio.all_tasks())
    finally:
        await server.stop()
