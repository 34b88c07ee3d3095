"""wait_all: every result in order, or the first failure with the others cancelled and awaited."""

from __future__ import annotations

import asyncio

import pytest

from informers.wait import wait_all


async def test_results_come_back_in_the_order_given_whatever_order_they_finish_in() -> None:
    async def after(delay: float, value: str) -> str:
        await asyncio.sleep(delay)
        return value

    assert await wait_all(after(0.02, "slow"), after(0, "quick")) == ["slow", "quick"]


async def test_the_first_failure_cancels_the_others_and_is_raised() -> None:
    cancelled = asyncio.Event()

    async def forever() -> None:
        try:
            await asyncio.Future()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async def fails() -> None:
        await asyncio.sleep(0)
        raise ConnectionRefusedError("refused")

    with pytest.raises(ConnectionRefusedError, match="refused"):
        await wait_all(forever(), fails())
    assert cancelled.is_set()  # awaited, not only asked to stop


async def test_cancelling_the_call_cancels_every_awaitable() -> None:
    stopped: list[str] = []

    async def forever(name: str) -> None:
        try:
            await asyncio.Future()
        finally:
            stopped.append(name)

    call = asyncio.ensure_future(wait_all(forever("a"), forever("b")))
    await asyncio.sleep(0.01)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    assert sorted(stopped) == ["a", "b"]
