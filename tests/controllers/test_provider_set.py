"""ProviderSet: several cluster providers as one, in precedence order (pure logic, fake providers)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from controllers.coordinator import EngageAll
from controllers.fence import OPEN
from controllers.provider import ClusterConfig, UntrustedKubeconfig
from controllers.provider_set import ProviderSet

from tests.helpers import FakeProvider, eventually


def fake(name: str, clusters: dict[str, bytes] | None = None, listed: asyncio.Event | None = None) -> FakeProvider:
    """A provider giving ``clusters`` (name -> kubeconfig), its sources named ``<provider> <cluster>``."""
    return FakeProvider(name, {c: ClusterConfig(c, f"{name} {c}", UntrustedKubeconfig(d))
                               for c, d in (clusters or {}).items()}, listed)


def test_the_first_provider_listed_holds_a_name_and_the_other_claim_is_a_conflict() -> None:
    first, second = fake("secrets", {"east": b"a"}), fake("cluster-api", {"east": b"b", "west": b"c"})
    both = ProviderSet([first, second])
    assert both.get("east") == first.configs["east"] and both.get("west") == second.configs["west"]
    assert both.names() == {"east", "west"}
    (conflict,) = both.conflicts()
    assert (conflict.cluster, conflict.claim, conflict.holder) == ("east", "cluster-api east", "secrets east")
    assert conflict.as_dict()["provider"] == "cluster-api"
    assert "listed before cluster-api" in conflict.message
    assert ProviderSet([second, first]).get("east") == second.configs["east"]  # the order decides, nothing else
    assert both.status() == {"secrets": {"clusters": 1}, "cluster-api": {"clusters": 2}}


def test_a_provider_named_twice_is_refused() -> None:
    with pytest.raises(ValueError, match="secrets"):
        ProviderSet([fake("secrets"), fake("secrets")])


async def test_nothing_is_passed_on_before_every_provider_has_listed() -> None:
    listed = asyncio.Event()
    late = fake("late", {"b": b"1"}, listed=listed)
    early = fake("early", {"a": b"1"})
    both = ProviderSet([early, late])
    seen: list[str] = []
    await both.start(seen.append)
    early.changed("a")
    await asyncio.sleep(0.05)
    assert seen == [] and not both.synced()
    listed.set()
    await eventually(lambda: both.synced(), 5, "synced")
    assert sorted(seen) == ["a", "b"]
    late.configs.pop("b")
    late.changed("b")
    await eventually(lambda: seen.count("b") == 2, 5, "b passed on again")
    await both.stop()
    assert early.stopped and late.stopped


async def test_engage_all_engages_what_the_view_gives_and_disengages_what_it_no_longer_does() -> None:
    view = fake("v", {"a": b"1"})
    calls: list[tuple[str, str]] = []

    class Members:
        def engage(self, config: ClusterConfig, fence: Any) -> None:
            assert fence is OPEN
            calls.append(("engage", config.name))

        def disengage(self, name: str, why: str) -> None:
            calls.append(("disengage", name))

    coordinator = EngageAll()
    coordinator.attach(Members(), view)  # type: ignore[arg-type]
    coordinator.changed("a")
    coordinator.changed("gone")
    assert calls == [("engage", "a"), ("disengage", "gone")]


async def test_a_stopped_set_is_not_started_again() -> None:
    both = ProviderSet([fake("p", {"a": b"1"})])
    seen: list[str] = []
    await both.start(seen.append)
    await both.start(seen.append)  # a second start does nothing
    await eventually(lambda: seen == ["a"], 5, "a passed on once")
    await both.stop()
    with pytest.raises(RuntimeError, match="run once"):
        await both.start(seen.append)


async def test_a_losing_claim_is_logged_once_when_it_changes_never_on_a_read() -> None:
    from loguru import logger

    lines: list[str] = []
    sink = logger.add(lambda m: lines.append(str(m)), level="ERROR", format="{message}")
    try:
        first, second = fake("secrets", {"east": b"a"}), fake("cluster-api", {"east": b"b"})
        both = ProviderSet([first, second])
        for _ in range(3):
            both.get("east"), both.names(), both.conflicts(), both.status()
        assert lines == []  # reads say nothing
        await both.start(lambda _: None)
        await eventually(lambda: both.synced(), 5, "synced")
        second.changed("east")
        await eventually(lambda: both.synced(), 5, "settled again")
        (line,) = lines
        assert "cluster-api east (provider cluster-api) names cluster 'east'" in line and "listed first" in line
        await both.stop()
    finally:
        logger.remove(sink)
