"""Sharding: rendezvous assignment (pure), the ``[sharding]`` settings, and shard coordinators in one process
against the real API server (join, balance, handover on scale-up and graceful stop, takeover of a dead member's
units after its Leases expire, one tenure at a time per unit)."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time
from collections import Counter
from typing import Any

import pytest

from informers import ApiClient
from syncer.lease import LeaseRecord, Observation
from syncer.sharding.rendezvous import assign, bucket_of
from syncer.settings import SettingsError, UnitKind, load_settings
from syncer.sharding.coordinator import ShardCoordinator, UnitFence, UnitState
from syncer.testing.controlplane import RESTRICTED_USER
from tests.helpers import eventually
from tests.shard_group import Recorder, config, unconverged


# -- assignment ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("units,members", [(50, 3), (50, 4), (50, 5), (12, 5), (200, 3), (7, 7), (3, 5)])
def test_assignment_is_balanced_within_one(units: int, members: int) -> None:
    names = [f"cluster-{i}" for i in range(units)]
    owners = assign(names, [f"replica-{i}_{i * 7919}" for i in range(members)])
    loads = Counter(owners.values())
    assert set(owners) == set(names)
    assert max(loads.values()) <= math.ceil(units / members)
    assert max(loads.values()) - min(loads.values() or [0]) <= 1 or len(loads) < members


@pytest.mark.parametrize("units,members", [(50, 3), (50, 4), (200, 4), (200, 9)])
def test_adding_or_removing_a_member_moves_about_one_in_n(units: int, members: int) -> None:
    names = [f"unit-{i}" for i in range(units)]
    base = [f"m{i}" for i in range(members)]
    before = assign(names, base)
    after_add = assign(names, [*base, "new"])
    after_remove = assign(names, base[1:])
    moved_add = sum(before[u] != after_add[u] for u in names)
    moved_remove = sum(before[u] != after_remove[u] for u in names)
    assert sum(o == "new" for o in after_add.values()) >= units // (members + 1)
    assert moved_add <= 1.5 * units / (members + 1) + 2  # ideal: units / (members + 1); modulo moves ~all
    held = sum(o == "m0" for o in before.values())
    assert held <= moved_remove <= 1.5 * held + 2


def test_assignment_is_the_same_whatever_the_order() -> None:
    names = [f"u{i}" for i in range(30)]
    assert assign(names, ["a", "b", "c"]) == assign(list(reversed(names)), ["c", "a", "b", "a"])
    assert assign(names, []) == {}


# -- leases (pure) ---------------------------------------------------------------------------------------------
def test_expiry_is_judged_on_the_observers_clock_not_the_holders_renew_time() -> None:
    seen = Observation()
    # A renewTime far in the past (the holder's clock is behind): it does not matter, only when we saw it change.
    assert seen.see(LeaseRecord("a", 10, renew_time="2001-01-01T00:00:00.000000Z"), now=100.0)
    assert not seen.expired(now=109.0) and seen.expired(now=110.0)
    assert not seen.see(LeaseRecord("a", 10, renew_time="2001-01-01T00:00:00.000000Z"),
                        now=105.0)  # unchanged: the clock keeps running
    assert seen.expired(now=110.0)
    assert seen.see(LeaseRecord("a", 10, renew_time="2001-01-01T00:00:01.000000Z"), now=111.0)
    assert not seen.free("b", now=120.0) and seen.free("a", now=120.0) and seen.free("b", now=121.0)


def test_a_holder_seen_renewing_again_after_a_quiet_starts_a_new_run() -> None:
    seen = Observation()
    record = LeaseRecord("a", 10, renew_time="t1")
    assert seen.see(record, now=100.0, restart_after=4.0) and seen.since == 100.0
    assert seen.see(dataclasses.replace(record, renew_time="t2"), now=103.0, restart_after=4.0) and seen.since == 100.0
    assert seen.see(dataclasses.replace(record, renew_time="t3"), now=107.5,
                    restart_after=4.0) and seen.since == 107.5  # a pause
    assert seen.see(dataclasses.replace(record, renew_time="t4"), now=120.0) and seen.since == 107.5  # no restart_after


def test_a_new_holder_counts_one_transition_and_a_renewal_none() -> None:
    first = LeaseRecord.created("a", 15)
    assert first.transitions == 0 and first.holder == "a"
    assert first.taken_by("a", 15).transitions == 0
    assert first.taken_by("a", 15).acquire_time == first.acquire_time
    assert first.taken_by("b", 15).transitions == 1
    assert dataclasses.replace(first, holder="").taken_by("a", 15).transitions == 1


# -- settings ----------------------------------------------------------------------------------------------------
def test_sharding_settings_are_checked(tmp_path: Any) -> None:
    def load(text: str) -> Any:
        path = tmp_path / "s.toml"
        path.write_text(text)
        return load_settings(str(path))

    s = load('[sharding]\nenabled = true\nlease_duration = "8s"\nrenew_deadline = "5s"\nretry_period = "1s"\n'
             'min_hold = "0s"\n').sharding
    assert s.enabled and s.unit_kind(False) == "controllers" and s.unit_kind(True) == "clusters" and s.min_hold == 0
    assert s.unit_kind(False) is UnitKind.CONTROLLERS and f"{s.unit_kind(True)}" == "clusters"
    for text, named in [
        ('[sharding]\nrenew_deadline = "20s"\n', "sharding.renew_deadline"),
        ('[sharding]\nretry_period = "12s"\n', "sharding.retry_period"),
        ('[sharding]\nunits = "clusters"\n', "sharding.units"),
        ('[clusters]\nenabled = true\n[sharding]\nunits = "controllers"\n', "sharding.units"),
        ('[sharding]\ngroup = "Not_A_Label"\n', "sharding.group"),
        ('[sharding]\nlease_namespace = ""\n', "sharding.lease_namespace"),
        ('[sharding]\nmin_hold = "-1s"\n', "sharding.min_hold"),
        ('[sharding]\nenable = true\n', "sharding.enable"),
    ]:
        with pytest.raises(SettingsError, match=named.replace(".", r"\.")):
            load(text)


# -- coordinators against the API server -------------------------------------------------------------------------


async def test_coordinators_balance_hand_over_and_take_over(control_plane: Any, namespace: str) -> None:
    recorder = Recorder(12)
    async with ApiClient.from_kubeconfig(str(control_plane.kubeconfig)) as client:
        tasks_before = len(asyncio.all_tasks())
        coordinators = {f"r{i}": ShardCoordinator(client, config(namespace), f"r{i}", recorder.kind_for(f"r{i}"))
                        for i in range(3)}
        for c in coordinators.values():
            await c.start()
        await eventually(lambda: sorted(recorder.owned().values()) == [4, 4, 4], timeout=30,
                         what="12 units over 3 replicas, 4 each")
        assert all(c.status()["owned"] == 4 and len(c.status()["members"]) == 3 for c in coordinators.values())

        # Scale up: the fourth member gets 3, each moved unit handed over (stopped, released) before it starts.
        coordinators["r3"] = ShardCoordinator(client, config(namespace), "r3", recorder.kind_for("r3", 0.2))
        await coordinators["r3"].start()
        await eventually(lambda: sorted(recorder.owned().values()) == [3, 3, 3, 3], timeout=30,
                         what="12 units over 4 replicas")

        # A graceful stop hands its units over at once: well before its Leases could expire.
        began = time.monotonic()
        await coordinators.pop("r0").stop()
        await eventually(lambda: sum(recorder.owned().values()) == 12 and "r0" not in recorder.owned(), timeout=30)
        assert time.monotonic() - began < 3.0, "a graceful stop must not wait for the lease duration"

        # A dead member (no renewals, nothing released): its units move after the lease duration.
        dead = coordinators.pop("r1")
        await dead._supervisor.cancel("shard coordinator")
        began = time.monotonic()
        await eventually(lambda: "r1" not in {c.status()["units"][0]["holder"] for c in coordinators.values()} and
                         all(recorder.running.get(u) not in (None, "r1") for u in recorder.unit_names) and
                         not any(u["state"] == "waiting" for c in coordinators.values() for u in c.status()["units"]),
                         timeout=30, what="r1's units taken over")
        took = time.monotonic() - began
        assert 1.5 <= took < 3.0 + 0.5 + 4.0, took  # expired (3 s after its last renewal) + retry + slack
        # r1 still believes it holds them until its fences close: they close renew_deadline after its last renewal.
        assert all(dead.fence_for(u) is None or not dead.fence_for(u).valid()  # type: ignore[union-attr]
                   for u in recorder.unit_names)
        await dead.stop()

        for c in coordinators.values():
            await c.stop()
        assert recorder.running == {} and recorder.overlaps == []
        # One holder per tenure, and a unit's tenures in order.
        holders: dict[tuple[str, int], str] = {}
        last: dict[str, int] = {}
        for unit, holder, transitions in recorder.tenures:
            assert holders.setdefault((unit, transitions), holder) == holder, (unit, transitions)
            assert transitions >= last.get(unit, -1)
            last[unit] = transitions
        await asyncio.sleep(0)
        assert len(asyncio.all_tasks()) <= tasks_before


async def test_a_replica_whose_credentials_may_not_coordinate_is_unhealthy_at_once(control_plane: Any,
                                                                                  namespace: str) -> None:
    # RBAC does not get better by waiting: no grace period (a lease of 30 s would have given 90 s of "healthy").
    recorder = Recorder(2)
    cfg = config(namespace, lease_duration=30.0, renew_deadline=20.0, retry_period=0.5)
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
    async with ApiClient.from_kubeconfig(str(control_plane.kubeconfig)) as admin, \
            ApiClient.from_kubeconfig(str(control_plane.kubeconfig), context="restricted") as restricted:
        c = ShardCoordinator(restricted, cfg, "r0", recorder.kind_for("r0"))
        await c.start()
        try:
            def health() -> tuple[bool, str]:
                [h] = c.health()
                return h.healthy, h.message

            await eventually(lambda: not health()[0], 10, "unhealthy without list/watch")
            assert health()[1].startswith(f"cannot list or watch Leases in namespace {namespace!r}: 403 Forbidden")
            await admin.request("POST", f"{rbac}/roles", body={
                "metadata": {"name": "leases"}, "rules": [{"apiGroups": ["coordination.k8s.io"],
                                                          "resources": ["leases"], "verbs": ["get", "list", "watch"]}]})
            await admin.request("POST", f"{rbac}/rolebindings", body={
                "metadata": {"name": "leases"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                                            "name": "leases"},
                "subjects": [{"kind": "User", "name": RESTRICTED_USER}]})
            await eventually(lambda: health()[1].startswith(f"cannot create Leases in namespace {namespace!r}: 403"),
                             15, "unhealthy: may list but not create")
            assert not health()[0]
            role = await admin.request("GET", f"{rbac}/roles/leases")
            role["rules"][0]["verbs"] += ["create", "update", "delete"]
            await admin.request("PUT", f"{rbac}/roles/leases", body=role)
            await eventually(lambda: health()[0] and sum(recorder.owned().values()) == 2, 15, "healthy and working")
        finally:
            await c.stop()


async def test_a_unit_whose_lease_is_taken_stops_at_once(control_plane: Any, namespace: str) -> None:
    recorder = Recorder(1)
    async with ApiClient.from_kubeconfig(str(control_plane.kubeconfig)) as client:
        c = ShardCoordinator(client, config(namespace, lease_duration=30.0, renew_deadline=20.0), "only",
                             recorder.kind_for("only"))
        await c.start()
        await eventually(lambda: recorder.running == {"u0": "only"})
        fence = c.fence_for("u0")
        assert fence is not None and fence.valid()
        lease = c._buckets[c.bucket("u0")].lease
        path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{lease}"
        obj = await client.request("GET", path)
        await client.request("PUT", path, body=LeaseRecord.of(obj).taken_by("intruder", 30).to_object())
        await eventually(lambda: not fence.valid() and recorder.running == {}, timeout=10,
                         what="the taken unit stopped well before renew_deadline")
        assert c.status()["units"][0]["state"] in (UnitState.WAITING, UnitState.ELSEWHERE)
        await c.stop()


# -- the sidecar, controllers as units -----------------------------------------------------------------------------
def test_sidecars_share_controllers_and_hand_them_over_on_sigterm(control_plane: Any, tmp_path: Any,
                                                                  sidecars: Any) -> None:
    import signal
    import subprocess
    import sys
    import uuid
    from pathlib import Path

    group = f"g{uuid.uuid4().hex[:8]}"
    writer = str(Path(__file__).resolve().parents[1] / "plugins" / "shard_writer.py")
    extra = ('watch = "required"\n[sharding]\nenabled = true\n'
             f'group = "{group}"\nlease_duration = "6s"\nrenew_deadline = "4s"\nretry_period = "0.5s"\n'
             'min_hold = "0s"\n')
    plugins = ("examples.plugins.widget_status", "examples.plugins.configmap_mirror", writer)
    cars = [sidecars(str(control_plane.kubeconfig), name=f"s{i}-{group}", extra=extra, plugins=plugins)
            for i in range(2)]

    def running(car: Any) -> set[str]:
        doc = car.status().get("sharding") or {}
        return {u["unit"] for u in doc.get("units", []) if u["state"] == "running"}

    names = {"widget-status", "configmap-mirror", "shard-writer"}
    cars[0].wait(lambda: running(cars[0]) | running(cars[1]) == names and not running(cars[0]) & running(cars[1])
                 and {len(running(c)) for c in cars} == {1, 2}
                 and all(len((c.status().get("sharding") or {}).get("members", [])) == 2 for c in cars),
                 "3 controllers over 2 replicas, balanced")
    out = subprocess.run([sys.executable, "-m", "syncer", "status", "--url",
                          f"http://127.0.0.1:{cars[0].port}/status"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert "SHARD MEMBER" in out.stdout and "CONTROLLER UNIT" in out.stdout and "(this replica)" in out.stdout
    for name in running(cars[0]):
        assert name in out.stdout
    # The controllers this replica runs show in its CONTROLLER table (a controller elsewhere does not).
    assert {c["name"] for c in cars[0].status()["controllers"]} == running(cars[0])

    began = time.monotonic()
    cars[1].proc.send_signal(signal.SIGTERM)
    assert cars[1].proc.wait(30) == 0, cars[1].log[-3000:]
    cars[0].wait(lambda: running(cars[0]) == names, "every controller on the remaining replica", timeout=20)
    assert time.monotonic() - began < 6.0, "handed over, not left to expire"
    assert "handing bucket" in cars[1].log


async def test_units_only_some_replicas_know_are_not_left_unowned(control_plane: Any, namespace: str) -> None:
    """Replicas that disagree on the units (a rollout adding a controller): a unit assigned, in the view of the
    replicas that know it, to one that does not, is rescued after a lease duration instead of staying unowned;
    once every replica knows every unit, the rescued ones go back to their assigned members and loads even out."""
    old, new = Recorder(6), Recorder(6)
    new.unit_names = old.unit_names | {f"n{i}" for i in range(6)}
    async with ApiClient.from_kubeconfig(str(control_plane.kubeconfig)) as client:
        coordinators = [ShardCoordinator(client, config(namespace), f"old{i}", old.kind_for(f"old{i}"))
                        for i in range(2)]
        coordinators.append(ShardCoordinator(client, config(namespace), "new", new.kind_for("new")))
        for c in coordinators:
            await c.start()
        # "new" knows all 12; the new units it assigns to old0/old1 are taken by nobody else: it rescues them.
        await eventually(lambda: set(new.running) >= {f"n{i}" for i in range(6)} and
                         len(old.running) + len([u for u in new.running if u.startswith("u")]) == 6,
                         timeout=30, what="every unit running somewhere")
        old.unit_names = new.unit_names  # the rollout is over: everyone knows the new units
        group = {c.identity: c for c in coordinators}
        try:
            await eventually(lambda: not unconverged(group), timeout=3 * 3.0,
                             what="within 3 lease durations, every unit on its assigned member, 4 each")
        except AssertionError as e:
            raise AssertionError(f"{e}: {unconverged(group)}") from None
        # Each went back in one step: handing it over did not make its rescuer rescue it again.
        assert sorted(unit for unit, _, _ in new.tenures if unit.startswith("n")) == sorted(
            f"n{i}" for i in range(6)), new.tenures
        for c in coordinators:
            await c.stop()
        assert old.overlaps == [] and new.overlaps == []


async def test_a_replica_joins_over_a_member_lease_it_already_has(control_plane: Any, namespace: str) -> None:
    """The member Lease exists already (a create whose answer was lost): the replica takes it over and joins."""
    from syncer.sharding.group import GROUP_LABEL, ROLE_LABEL, member_lease

    recorder = Recorder(2)
    path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
    async with ApiClient.from_kubeconfig(str(control_plane.kubeconfig)) as client:
        await client.request("POST", path, body=LeaseRecord.created(
            "someone-else", 3, namespace=namespace, name=member_lease("t", "again"),
            labels={GROUP_LABEL: "t", ROLE_LABEL: "member"}).to_object())
        c = ShardCoordinator(client, config(namespace), "again", recorder.kind_for("again"))
        await c.start()
        await eventually(lambda: recorder.running == {"u0": "again", "u1": "again"}, timeout=20)
        assert c.live_members() == ["again"]
        await c.stop()
        leases = await client.request("GET", path)
        assert not [item for item in leases["items"] if item["metadata"]["name"].startswith("t-member-")]


async def test_a_deleted_unit_lease_is_not_taken_while_its_holder_may_still_work(control_plane: Any,
                                                                               namespace: str) -> None:
    """Someone deletes the unit Leases (a cleanup) while their holder is not their assigned member: the assigned
    member waits for what the Lease last said to expire instead of creating it at once; the holder stops at once."""
    recorder = Recorder(4)
    path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
    async with ApiClient.from_kubeconfig(str(control_plane.kubeconfig)) as client:
        first = ShardCoordinator(client, config(namespace, min_hold=120.0), "first", recorder.kind_for("first"))
        await first.start()
        await eventually(lambda: recorder.owned() == Counter({"first": 4}), timeout=20)
        second = ShardCoordinator(client, config(namespace, min_hold=120.0), "second", recorder.kind_for("second"))
        await second.start()
        await eventually(lambda: len(second.live_members()) == 2 and
                         any(u["assigned"] == "second" for u in second.status()["units"]), timeout=20)
        leases = await client.request("GET", path, params={"labelSelector": "kube-syncer.io/shard-role=unit"})
        for item in leases["items"]:
            await client.request("DELETE", f"{path}/{item['metadata']['name']}")
        await eventually(lambda: "second" in recorder.owned() and sum(recorder.owned().values()) == 4, timeout=20,
                         what="the units running again, some on their assigned member")
        for c in (first, second):
            await c.stop()
        assert recorder.overlaps == []
        # The recreated Leases continue their tenures' count: it never goes back, and a count is one holder's.
        holders: dict[tuple[str, int], str] = {}
        counts: dict[str, list[int]] = {}
        for unit, holder, transitions in recorder.tenures:
            assert holders.setdefault((unit, transitions), holder) == holder, recorder.tenures
            counts.setdefault(unit, []).append(transitions)
        assert all(c == sorted(c) for c in counts.values()), counts
        assert any(c[-1] > 0 for c in counts.values())  # some moved to "second", one transition on


# -- buckets ---------------------------------------------------------------------------------------------------
def test_units_hash_into_a_bounded_number_of_stable_buckets() -> None:
    names = [f"cluster-{i}" for i in range(10_000)]
    buckets = {bucket_of(n, 64) for n in names}
    assert len(buckets) == 64 and {b.split("-of-")[1] for b in buckets} == {"64"}
    assert sorted(buckets)[0] == "01-of-64" and sorted(buckets)[-1] == "64-of-64"
    # A unit's bucket depends on its name and the count only: never on which other units exist.
    assert [bucket_of(n, 64) for n in names[:100]] == [bucket_of(n, 64) for n in reversed(names[:100])][::-1]
    assert bucket_of("cluster-1", 0) == "cluster-1" and bucket_of("x", 1000).endswith("-of-1000")
    sizes = Counter(bucket_of(n, 64) for n in names)
    assert max(sizes.values()) < 2 * 10_000 / 64  # a hash spreads them: no bucket twice the mean
    # Controllers are few: each has a Lease of its own whatever the setting.
    s = load_settings(None).sharding
    assert s.buckets == 60 and s.bucket_count(UnitKind.CLUSTERS) == 60 and s.bucket_count(UnitKind.CONTROLLERS) == 0


def test_the_bucket_setting_is_checked(tmp_path: Any) -> None:
    path = tmp_path / "s.toml"
    for value in ("-1", "1025", "true", '"8"'):
        path.write_text(f"[sharding]\nbuckets = {value}\n")
        with pytest.raises(SettingsError, match=r"sharding\.buckets.*an integer from 0 to 1024"):
            load_settings(str(path))
    path.write_text("[sharding]\nbuckets = 0\n")
    assert load_settings(str(path)).sharding.buckets == 0


async def test_buckets_move_whole_and_units_follow_their_bucket(control_plane: Any, namespace: str) -> None:
    """40 units in 8 buckets over 3 replicas: the buckets are balanced within one; each unit runs exactly once,
    under its bucket's tenure; a unit added to a held bucket starts there, one removed stops there (the bucket
    stays); a dead replica's buckets are taken whole once their Leases expire, every unit exactly once."""
    recorder = Recorder(40)
    cfg = config(namespace, buckets=8)
    path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"
    async with ApiClient.from_kubeconfig(str(control_plane.kubeconfig)) as client:
        group = {f"r{i}": ShardCoordinator(client, cfg, f"r{i}", recorder.kind_for(f"r{i}")) for i in range(3)}
        for c in group.values():
            await c.start()
        try:
            await eventually(lambda: not unconverged(group), timeout=30, what="40 units in 8 buckets over 3")
        except AssertionError as e:
            raise AssertionError(f"{e}: {unconverged(group)}") from None
        c0 = group["r0"]
        buckets = {b["bucket"]: b for b in c0.status()["buckets"]}
        assert len(buckets) == 8 and sum(b["units"] for b in buckets.values()) == 40
        # One Lease per bucket (and per member): not per unit.
        leases = await client.request("GET", path)
        roles = Counter(i["metadata"]["labels"]["kube-syncer.io/shard-role"] for i in leases["items"])
        assert roles == Counter({"bucket": 8, "member": 3}), roles
        for u, who in recorder.running.items():
            fence = group[who].fence_for(u)
            assert fence is not None and fence.bucket == bucket_of(u, 8) == group[who].bucket(u)
            assert fence.transitions == buckets[fence.bucket]["transitions"]

        # A new unit starts where its bucket is held, under that tenure; a removed one stops, its bucket stays.
        holder = {b: d["holder"] for b, d in buckets.items()}
        recorder.unit_names = recorder.unit_names | {"new-unit"}
        await eventually(lambda: recorder.running.get("new-unit") == holder[bucket_of("new-unit", 8)], timeout=10)
        gone = next(iter(sorted(recorder.unit_names - {"new-unit"})))
        recorder.unit_names = recorder.unit_names - {gone}
        await eventually(lambda: gone not in recorder.running, timeout=10)
        assert {d["bucket"]: d["holder"] for d in c0.status()["buckets"]} == holder

        # A dead replica: its buckets are taken whole after they expire; every unit running exactly once.
        dead = group.pop("r1")
        dead_units = {u for u, who in recorder.running.items() if who == "r1"}
        assert dead_units
        await dead._supervisor.cancel("shard coordinator")
        await eventually(lambda: all(recorder.running.get(u) in group for u in dead_units) and
                         not unconverged(group), timeout=30, what="r1's buckets taken over, every unit once")
        await dead.stop()
        for c in group.values():
            await c.stop()
        assert recorder.running == {} and recorder.overlaps == []
        holders: dict[tuple[str, int], str] = {}
        for unit, who, transitions in recorder.tenures:
            assert holders.setdefault((bucket_of(unit, 8), transitions), who) == who, (unit, transitions)


async def test_replicas_with_different_bucket_counts_never_both_take(control_plane: Any, namespace: str) -> None:
    """A replica that hashes into another number of buckets (a rollout changing the setting) would fence a unit
    with another Lease: while both live, the newcomer takes nothing; once the other is gone it takes everything."""
    recorder = Recorder(6)
    async with ApiClient.from_kubeconfig(str(control_plane.kubeconfig)) as client:
        old = ShardCoordinator(client, config(namespace, buckets=4), "old", recorder.kind_for("old"))
        await old.start()
        await eventually(lambda: recorder.owned() == Counter({"old": 6}), timeout=20)
        new = ShardCoordinator(client, config(namespace, buckets=2), "new", recorder.kind_for("new"))
        await new.start()
        await eventually(lambda: len(new.live_members()) == 2 and len(old.live_members()) == 2, timeout=20)
        await asyncio.sleep(2.0)  # past the newcomer's settling: it decides, and takes nothing
        assert recorder.owned() == Counter({"old": 6}) and new.status()["owned"] == 0
        await old.stop()
        await eventually(lambda: recorder.owned() == Counter({"new": 6}), timeout=20, what="new takes all once alone")
        await new.stop()
        assert recorder.overlaps == []


async def test_unit_starts_run_a_bounded_number_at_once(control_plane: Any, namespace: str) -> None:
    """A replica taking many buckets at once brings their units up a bounded number at a time (hundreds of member
    clusters connecting and syncing together would starve its event loop, Lease renewals included)."""
    from syncer.sharding.coordinator import STARTS_AT_ONCE

    recorder = Recorder(3 * STARTS_AT_ONCE)
    units = recorder.kind_for("only")
    start, in_flight = units.start, [0, 0]

    async def slow_start(unit: str, fence: UnitFence) -> None:
        in_flight[0] += 1
        in_flight[1] = max(in_flight)
        try:
            await asyncio.sleep(0.1)
            await start(unit, fence)
        finally:
            in_flight[0] -= 1

    units.start = slow_start
    async with ApiClient.from_kubeconfig(str(control_plane.kubeconfig)) as client:
        c = ShardCoordinator(client, config(namespace, buckets=4), "only", units)
        await c.start()
        await eventually(lambda: len(recorder.running) == 3 * STARTS_AT_ONCE, timeout=20)
        await c.stop()
    assert in_flight[1] == STARTS_AT_ONCE and recorder.overlaps == []


async def test_a_replica_is_told_its_units_before_it_takes_them(control_plane: Any, namespace: str) -> None:
    # What the warm standby of sharded controllers rests on (``Prepares``): a unit handed over is assigned to its
    # new owner (which starts watching what it needs) before that owner takes it.
    recorder = Recorder(6)
    events: list[tuple[str, str, Any]] = []

    def preparing(identity: str, stop_delay: float = 0.0) -> Any:
        inner = recorder.kind_for(identity, stop_delay)

        class _Units:
            kind = "test"

            def names(self) -> set[str]:
                return inner.names()

            async def start(self, unit: str, fence: Any) -> None:
                events.append((identity, "start", unit))
                await inner.start(unit, fence)

            async def stop(self, unit: str) -> list[str]:
                return await inner.stop(unit)

            def assigned(self, units: frozenset[str]) -> None:
                events.append((identity, "assigned", units))

        return _Units()

    def last_assigned(identity: str) -> frozenset[str] | None:
        told = [units for who, what, units in events if who == identity and what == "assigned"]
        return told[-1] if told else None

    async with ApiClient.from_kubeconfig(str(control_plane.kubeconfig)) as client:
        coordinators = {i: ShardCoordinator(client, config(namespace), i, preparing(i, 0.5)) for i in ("r0", "r1")}
        for c in coordinators.values():
            await c.start()
        await eventually(lambda: not unconverged(coordinators), timeout=30, what="6 units over 2 replicas")
        for i in coordinators:
            assert last_assigned(i) == {u for u, who in recorder.running.items() if who == i}, events
        coordinators["r2"] = ShardCoordinator(client, config(namespace), "r2", preparing("r2"))
        await coordinators["r2"].start()
        await eventually(lambda: not unconverged(coordinators), timeout=30, what="6 units over 3 replicas")
        moved = {u for u, who in recorder.running.items() if who == "r2"}
        assert moved and last_assigned("r2") == moved
        for unit in moved:  # told (while its old owner drained it for 0.5 s) before it started it
            told = next(n for n, (who, what, units) in enumerate(events)
                        if who == "r2" and what == "assigned" and unit in units)
            assert told < events.index(("r2", "start", unit)), events
        for c in coordinators.values():
            await c.stop()
        assert all(last_assigned(i) == frozenset() for i in coordinators), events


class _StoppingUnits:
    """Units whose stop answers stuck controllers ("stuck"), hangs ("hangs") or raises ("fails")."""

    kind = UnitKind.CONTROLLERS

    def names(self) -> set[str]:
        return {"stuck", "hangs", "fails"}

    async def start(self, unit: str, fence: UnitFence) -> None:
        pass

    async def stop(self, unit: str) -> list[str]:
        if unit == "hangs":
            await asyncio.Future()
        if unit == "fails":
            raise RuntimeError("boom")
        return ["reconciler"]


async def test_what_a_unit_leaves_running_is_typed_and_names_its_unit() -> None:
    from kubernetes.client import Configuration

    from syncer.workload import Stuck, StuckKind

    c = ShardCoordinator(ApiClient(Configuration()), config("ns"), "r0", _StoppingUnits(), stop_timeout=0.05)
    assert await c._stopped("stuck") == [Stuck(StuckKind.CONTROLLER, "reconciler", unit="stuck")]
    (hangs,) = await c._stopped("hangs")
    assert (hangs.kind, hangs.unit, str(hangs)) == (StuckKind.UNIT, "hangs", "unit hangs (did not stop within 0.05s)")
    (fails,) = await c._stopped("fails")
    assert fails.kind is StuckKind.UNIT and fails.unit == "fails" and "boom" in fails.detail
