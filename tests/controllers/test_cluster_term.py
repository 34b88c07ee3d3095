"""A registry of members that outlives the leadership terms (the fleet's warm standby), seen by each term through a
``ClusterTerm``: the term's work starts on the members' synced informers, writes through the term's fence only,
and ends with the term while the members stay (real control plane: the member is a kubeconfig Secret pointing at
the session's own apiserver)."""

from __future__ import annotations

import asyncio
import time

import pytest

from controllers.cluster_controllers import ClusterControllers
from controllers.cluster_registry import ClusterRegistry
from controllers.cluster_term import ClusterTerm
from controllers.fence import CLOSED
from controllers.fleet import FleetLoop
from informers import ApiClient, ClusterNotFound, FenceError
from syncer.fences import TermFence
from syncer.testing import ControlPlane

from tests.controllers.test_multicluster import FleetRecorder, Recorder, Starts
from tests.fleet import delete_secret, kubeconfig, options, put_secret
from tests.helpers import CONFIGMAPS, eventually


def term_fence(term: int) -> TermFence:
    fence = TermFence(term, renew_deadline=600.0)
    fence.renewed(time.monotonic())
    return fence


async def write(client: ApiClient, namespace: str, name: str) -> None:
    await client.request("POST", CONFIGMAPS.path(namespace), body={"metadata": {"name": name}})


async def test_a_term_ends_with_its_fence_and_the_members_stay_warm(api: ApiClient, fleet_ns: str,
                                                                    control_plane: ControlPlane) -> None:
    tasks_before = set(asyncio.all_tasks())
    registry = ClusterRegistry(api, *options(api, fleet_ns), fence=CLOSED, required=[CONFIGMAPS])
    await registry.start()
    terms: list[tuple[ClusterTerm, ClusterControllers, asyncio.Task[None]]] = []
    try:
        await put_secret(api, fleet_ns, "w1", kubeconfig(control_plane))
        await eventually(lambda: registry.list_clusters() == ["w1"], 30, "the member engaged, no term running")
        member = registry.members()["w1"]
        informer = registry.cluster("w1").factory.informers()[0][CONFIGMAPS]  # synced while no term runs
        with pytest.raises(FenceError):  # the registry's own view of a member writes nothing
            await write(registry.clients.cluster("w1"), fleet_ns, "by-registry")

        async def begin(fence: TermFence) -> tuple[ClusterTerm, Starts, Recorder, FleetLoop]:
            term, starts, recorder = ClusterTerm(registry, fence), Starts(CONFIGMAPS), Recorder()
            per_cluster = ClusterControllers({"cm": starts.spec()}, name=f"term {fence.term}", fence=fence)
            loop = FleetLoop(f"fleet {fence.term}", FleetRecorder().spec(CONFIGMAPS), term.clients, fence=fence)
            for handler in (per_cluster, recorder, loop):
                await term.register_cluster_handler(handler)
            await term.start()
            terms.append((term, per_cluster, asyncio.create_task(loop.run())))
            return term, starts, recorder, loop

        async def end(fence: TermFence) -> None:
            fence.close()
            term, per_cluster, loop = terms.pop()
            loop.cancel()
            await asyncio.gather(loop, return_exceptions=True)
            assert await per_cluster.stop() == []
            await term.stop()

        one = term_fence(1)
        term1, starts1, recorder1, loop1 = await begin(one)
        # Told at once, and the controller runs on the informer the standby kept synced.
        assert [name for name, _ in recorder1.added] == ["w1"] and term1.cluster("w1").fence is one
        await eventually(lambda: len(starts1.running) == 1, 30, "term 1's controller running in w1")
        ctx1 = next(iter(starts1.running.values()))
        assert ctx1.informers[CONFIGMAPS] is informer
        await eventually(lambda: loop1.union.clusters() == ["w1"], 10, "w1 joining term 1's fleet loop")
        client1 = term1.clients.cluster("w1")
        await write(client1, fleet_ns, "by-term-1")

        await end(one)
        assert not starts1.running and recorder1.cleaned == ["w1"] and recorder1.removed == ["w1"]
        assert term1.list_clusters() == [] and loop1.union.clusters() == [] and loop1._subs == {}
        with pytest.raises(ClusterNotFound):
            term1.cluster("w1")
        with pytest.raises(FenceError):  # a client of an ended term writes nothing, though its connection lives
            await write(client1, fleet_ns, "by-term-1-late")
        # The member is untouched: same connection, same informer, nothing of term 1 left on its context.
        assert registry.members()["w1"] is member and registry.list_clusters() == ["w1"]
        assert registry.cluster("w1").factory.informers()[0][CONFIGMAPS] is informer
        assert member.ctx is not None and member.ctx._cleanups == []

        two = term_fence(2)
        term2, starts2, recorder2, loop2 = await begin(two)
        await eventually(lambda: len(starts2.running) == 1, 30, "term 2's controller running in w1")
        await eventually(lambda: loop2._subs.get("w1") is informer, 10, "w1 joining term 2's fleet loop")
        assert next(iter(starts2.running.values())).informers[CONFIGMAPS] is informer
        await write(term2.clients.cluster("w1"), fleet_ns, "by-term-2")
        with pytest.raises(FenceError):  # term 1's client stays fenced in term 2
            await write(client1, fleet_ns, "by-term-1-in-term-2")

        # A member leaving during a term: the term's handlers hear it, as from a registry.
        await delete_secret(api, fleet_ns, "w1")
        await eventually(lambda: recorder2.removed == ["w1"], 30, "w1 leaving term 2")
        assert recorder2.cleaned == ["w1"] and not starts2.running and term2.list_clusters() == []
        await end(two)
        assert recorder2.removed == ["w1"]  # told once
        written = await api.request("GET", CONFIGMAPS.path(fleet_ns))
        assert sorted(i["metadata"]["name"] for i in written["items"]
                      if i["metadata"]["name"].startswith("by-")) == ["by-term-1", "by-term-2"]
    finally:
        for term, per_cluster, task in terms:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            await per_cluster.stop()
            await term.stop()
        await registry.stop()
    leaked = {t for t in asyncio.all_tasks() if not t.done()} - tasks_before - {asyncio.current_task()}
    assert not leaked, leaked


async def test_a_term_stopping_while_members_leave_and_join(api: ApiClient, fleet_ns: str,
                                                          control_plane: ControlPlane) -> None:
    # The term's end races the registry's own cleanups of a member leaving and the engagement of one joining:
    # whatever it was told of is cleaned up exactly once, by the time stop() returns, and nothing of the term is
    # left on the members.
    registry = ClusterRegistry(api, *options(api, fleet_ns), fence=CLOSED, required=[CONFIGMAPS])
    await registry.start()
    try:
        for name in ("r1", "r2"):
            await put_secret(api, fleet_ns, name, kubeconfig(control_plane))
        await eventually(lambda: registry.list_clusters() == ["r1", "r2"], 30, "both members engaged")
        for round_ in range(3):
            fence = term_fence(round_ + 1)
            term, recorder = ClusterTerm(registry, fence), Recorder()
            await term.register_cluster_handler(recorder)
            await term.start()
            assert sorted(name for name, _ in recorder.added) == ["r1", "r2"]
            await delete_secret(api, fleet_ns, "r2")
            await put_secret(api, fleet_ns, "r3", kubeconfig(control_plane))
            await asyncio.sleep(0.05 * round_)  # the registry at a different point each round
            fence.close()
            await term.stop()
            assert sorted(recorder.cleaned) == sorted(name for name, _ in recorder.added), recorder.__dict__
            assert all(m.ctx is None or m.ctx._cleanups == [] for m in registry.members().values())
            await eventually(lambda: registry.list_clusters() == ["r1", "r3"], 30, "r2 gone, r3 engaged")
            await delete_secret(api, fleet_ns, "r3")
            await put_secret(api, fleet_ns, "r2", kubeconfig(control_plane))
            await eventually(lambda: registry.list_clusters() == ["r1", "r2"], 30, "r2 back, r3 gone")
    finally:
        await registry.stop()
