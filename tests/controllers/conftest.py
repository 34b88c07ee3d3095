"""Fixtures of the controllers tests."""

from __future__ import annotations

import asyncio
from typing import AsyncIterator, Callable

import pytest

from informers import ApiClient
from tests.fakes import FakeSource
from tests.helpers import fresh_namespace


@pytest.fixture
async def sources() -> AsyncIterator[Callable[..., FakeSource]]:
    """Makes FakeSources; afterwards stops their informers and checks that the test left no task behind."""
    before = asyncio.all_tasks()
    made: list[FakeSource] = []

    def make(hooks: bool = True) -> FakeSource:
        made.append(FakeSource(hooks))
        return made[-1]

    yield make
    for s in made:
        await s.close()
    assert asyncio.all_tasks() - before - {asyncio.current_task()} == set()


@pytest.fixture
async def fleet_ns(api: ApiClient) -> AsyncIterator[str]:
    """A namespace of its own for the test's kubeconfig Secrets (deleted afterwards)."""
    async with fresh_namespace(api, "fleet") as name:
        yield name
