"""Sharding under faults, with in-process shard coordinators against the real API server: rounds of random faults
(a replica paused past its lease while another is killed and replaced), then the group must converge within three
lease durations of the last fault: every unit running on exactly one replica, loads within one of each other (the
bound of ``syncer/rendezvous.py``), no unit ``waiting`` anywhere, and never two tenures' fences valid at once. It
runs with a Lease per unit and with the units hashed into fewer buckets than there are units.

A pause is a replica's loop stopped without releasing anything, as a SIGSTOP would: no renewals, no decisions,
its fences lapse on their own; a kill stops it for good. The seed is the suite's (``--seed``, printed; fixed by
default, so CI repeats one schedule); the faults are timed from the seed, the checks wait for conditions.
"""

from __future__ import annotations

import asyncio
import random
import time
from typing import Any

import pytest

from informers import ApiClient
from syncer.sharding.rendezvous import bucket_of
from syncer.sharding.coordinator import ShardCoordinator
from tests.helpers import eventually
from tests.shard_group import Recorder, config, unconverged

REPLICAS, UNITS, ROUNDS = 4, 24, 3


class Group:
    """The replicas of one shard group in this process, started, paused, resumed and killed by the test."""

    def __init__(self, client: ApiClient, namespace: str, recorder: Recorder, seed: int, buckets: int) -> None:
        self.client, self.namespace, self.recorder, self.seed = client, namespace, recorder, seed
        self.buckets = buckets
        self.live: dict[str, ShardCoordinator] = {}
        self.paused: set[str] = set()
        self._born = 0

    async def add(self) -> str:
        identity = f"r{self._born}"
        self._born += 1
        c = self.live[identity] = ShardCoordinator(self.client, config(self.namespace, buckets=self.buckets), identity,
                                                   self.recorder.kind_for(identity))
        await c.start()
        return identity

    async def pause(self, identity: str) -> None:
        self.paused.add(identity)
        await self.live[identity]._supervisor.cancel("shard coordinator")

    def resume(self, identity: str) -> None:
        self.paused.discard(identity)
        c = self.live[identity]
        c._supervisor.spawn("shard coordinator", c._run)

    async def kill(self, identity: str) -> None:
        """Gone without a word: nothing released, no request finished, the watch closed."""
        c = self.live.pop(identity)
        self.paused.discard(identity)
        await c._supervisor.cancel("shard coordinator")
        for task in list(c._tasks):
            task.cancel()
        await asyncio.gather(*c._tasks, return_exceptions=True)
        await c._group.informer.stop()

    def problems(self) -> list[str]:
        """Why the group has not converged (empty once it has): ``unconverged``, and no unit still running on a
        replica that was killed."""
        return unconverged(self.live) + [f"{u} runs on {who}" for u, who in sorted(self.recorder.running.items())
                                         if who not in self.live]

    async def converged(self, within: float, what: str) -> float:
        """Wait until the group has converged; how long it took."""
        began = time.monotonic()
        try:
            await eventually(lambda: not self.problems(), timeout=within, what=what)
        except AssertionError as e:
            raise AssertionError(f"{e} (seed {self.seed}): {self.problems()}") from None
        return time.monotonic() - began


@pytest.mark.parametrize("buckets", [0, 8])
async def test_shards_converge_after_random_pauses_and_kills(control_plane: Any, namespace: str, seed: int,
                                                             buckets: int) -> None:
    rng = random.Random(seed)
    cfg = config(namespace)
    recorder = Recorder(UNITS)
    async with ApiClient.from_kubeconfig(str(control_plane.kubeconfig)) as client:
        group = Group(client, namespace, recorder, seed, buckets)
        for _ in range(REPLICAS):
            await group.add()
        await group.converged(30, "the group balanced before any fault")
        for round_ in range(ROUNDS):
            paused, killed = rng.sample(sorted(group.live), 2)
            # Past renew_deadline (its fences lapse), not always past lease_duration (the others may not notice).
            pause_for = rng.uniform(cfg.renew_deadline + cfg.retry_period, 4 * cfg.lease_duration)
            kill_at = rng.uniform(0, cfg.lease_duration)
            replace_at = kill_at + rng.uniform(0, 1.5 * cfg.lease_duration)
            plan = sorted([(0.0, "pause", paused), (kill_at, "kill", killed), (replace_at, "replace", killed),
                           (pause_for, "resume", paused)])
            print(f"round {round_}: " + ", ".join(f"{what} {who} at {at:.2f}s" for at, what, who in plan), flush=True)
            began = time.monotonic()
            for at, what, who in plan:
                # The faults are what is timed (from the seed); what follows them is waited for by condition.
                await asyncio.sleep(max(0.0, began + at - time.monotonic()))
                if what == "pause":
                    await group.pause(who)
                elif what == "kill":
                    await group.kill(who)
                elif what == "replace":
                    await group.add()
                else:
                    group.resume(who)
            took = await group.converged(3 * cfg.lease_duration,
                                         f"round {round_}: converged within 3 lease durations of the last fault")
            print(f"MEASURED round {round_}: converged {took:.2f}s after the last fault", flush=True)
            assert recorder.overlaps == [], recorder.overlaps
        for identity in list(group.live):
            await group.live.pop(identity).stop()
    assert recorder.overlaps == [] and recorder.running == {}
    holders: dict[tuple[str, int], str] = {}
    for unit, holder, transitions in recorder.tenures:  # one holder per tenure of a unit's bucket
        assert holders.setdefault((bucket_of(unit, buckets), transitions), holder) == holder, (unit, transitions, seed)
