"""A shard group of in-process coordinators for the sharding tests: units that record, across every coordinator,
who runs what and any start inside another tenure; the group's settings; why it has not converged yet."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from syncer.settings import Sharding
from syncer.sharding.coordinator import ShardCoordinator, UnitFence, UnitState


class Recorder:
    """Units named ``u0``..: records, across every coordinator sharing it, who runs what, and any start while
    another tenure's fence is still valid (its work could still write)."""

    def __init__(self, count: int) -> None:
        self.unit_names = {f"u{i}" for i in range(count)}
        self.running: dict[str, str] = {}  # unit -> identity
        self.fences: dict[str, UnitFence] = {}
        self.tenures: list[tuple[str, str, int]] = []  # (unit, holder, transitions) in start order
        self.overlaps: list[str] = []

    def kind_for(self, identity: str, stop_delay: float = 0.0) -> Any:
        recorder = self

        class _Units:
            kind = "test"

            def names(self) -> set[str]:
                return recorder.unit_names

            async def start(self, unit: str, fence: UnitFence) -> None:
                assert fence.valid() and fence.holder == identity and fence.unit == unit
                previous = recorder.fences.get(unit)
                if previous is not None and previous.valid():
                    recorder.overlaps.append(f"{unit}: {identity} started while {previous.holder}'s fence holds")
                recorder.running[unit] = identity
                recorder.fences[unit] = fence
                recorder.tenures.append((unit, identity, fence.transitions))

            async def stop(self, unit: str) -> list[str]:
                await asyncio.sleep(stop_delay)
                if recorder.running.get(unit) == identity:
                    del recorder.running[unit]
                return []

        return _Units()

    def owned(self) -> Counter[str]:
        return Counter(self.running.values())


def unconverged(coordinators: dict[str, ShardCoordinator]) -> list[str]:
    """Why the group of live ``coordinators`` (by identity) has not settled: each must see them all as members,
    every unit must run on exactly one of them, every bucket be owned by exactly one, with loads (in buckets:
    in units without buckets) within one of each other, and no unit be anything but running or elsewhere anywhere
    (``waiting``, handing over, ...). Empty once it has settled."""
    found: list[str] = []
    runners: dict[str, list[str]] = {}
    owners: dict[str, list[str]] = {}
    for identity, c in coordinators.items():
        status = c.status()
        if len(status["members"]) != len(coordinators):
            found.append(f"{identity} sees members {[m['identity'] for m in status['members']]}")
        for u in status["units"]:
            here = runners.setdefault(u["unit"], [])
            if u["state"] == UnitState.RUNNING:
                here.append(identity)
            elif u["state"] != UnitState.ELSEWHERE:
                found.append(f"{identity}: {u['unit']} {u['state']} (holder {u['holder']!r})")
        for b in status["buckets"]:
            owners.setdefault(b["bucket"], [])
            if b["state"] == UnitState.RUNNING:
                owners[b["bucket"]].append(identity)
    found += [f"{u} running on {r or 'nobody'}" for u, r in sorted(runners.items()) if len(r) != 1]
    found += [f"bucket {b} owned by {r or 'nobody'}" for b, r in sorted(owners.items()) if len(r) != 1]
    loads = Counter(dict.fromkeys(coordinators, 0))
    loads.update(r[0] for r in owners.values() if len(r) == 1)
    if loads and max(loads.values()) - min(loads.values()) > 1:
        found.append(f"loads {dict(sorted(loads.items()))}")
    return found


def config(namespace: str, **kw: Any) -> Sharding:
    """Short leases, and a Lease per unit unless ``buckets`` is given."""
    base = dict(enabled=True, group="t", lease_namespace=namespace, lease_duration=3.0, renew_deadline=2.0,
                retry_period=0.5, min_hold=0.0, buckets=0)
    return Sharding(**{**base, **kw})  # type: ignore[arg-type]
