"""A union over the ConfigMap informers of several real control planes."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry

from informers import ApiClient, InformerMetrics, SharedIndexInformer, UnionInformer
from syncer.testing import ControlPlane

from tests.helpers import CONFIGMAPS, eventually

NS = "default"


class ClusterInformer(SharedIndexInformer):
    """A ConfigMap informer of one control plane, owning its client: stopping it closes the client."""

    def __init__(self, kubeconfig: str) -> None:
        self.client = ApiClient.from_kubeconfig(kubeconfig)
        super().__init__(self.client, CONFIGMAPS, namespace=NS,
                         metrics=InformerMetrics.for_registry(CollectorRegistry()))

    async def stop(self) -> None:
        try:
            await super().stop()
        finally:
            await self.client.close()


class Seen:
    """One handler for every cluster: ``(cluster, name)`` of each add and delete, and whether an add was initial."""

    def __init__(self) -> None:
        self.adds: dict[tuple[str, str], bool] = {}
        self.deletes: set[tuple[str, str]] = set()

    def on_add(self, obj, is_in_initial_list, cluster):
        self.adds[(cluster, obj["metadata"]["name"])] = is_in_initial_list

    def on_delete(self, obj, cluster):
        self.deletes.add((cluster, obj["metadata"]["name"]))


async def create_cm(cp: ControlPlane, name: str) -> None:
    async with ApiClient.from_kubeconfig(str(cp.kubeconfig)) as api:
        await api.request("POST", CONFIGMAPS.path(NS), body={"metadata": {"name": name}, "data": {"k": "v"}})


async def test_union_over_three_control_planes(control_plane_factory):
    before = asyncio.all_tasks()
    a, b = control_plane_factory(), control_plane_factory()
    registry = CollectorRegistry()
    union = UnionInformer("configmaps", metrics_registry=registry)
    seen = Seen()
    reg = union.add_event_handler(seen)
    subs = {"a": ClusterInformer(str(a.kubeconfig)), "B": ClusterInformer(str(b.kubeconfig))}
    try:
        for name, sub in subs.items():
            await union.add(name, sub)
            sub.start()
        assert await reg.wait_for_sync(30)
        await create_cm(a, "from-a")
        await create_cm(b, "from-b")
        await eventually(lambda: {("a", "from-a"), ("B", "from-b")} <= set(seen.adds), 30, "adds from a and B")
        assert seen.adds[("a", "from-a")] is False and ("B", "from-a") not in seen.adds

        # A plane joining later: its objects are replayed to the handler as initial adds.
        c = await asyncio.to_thread(control_plane_factory)
        await create_cm(c, "before-join")
        subs["c"] = ClusterInformer(str(c.kubeconfig))
        subs["c"].start()
        assert await subs["c"].wait_for_sync(30)
        await union.add("c", subs["c"])
        await eventually(lambda: seen.adds.get(("c", "before-join")) is True, 30, "c's replay")
        assert await reg.wait_for_sync(30)
        assert union.lister.get("before-join", NS).cluster == "c"
        assert [o.cluster for o in union.lister.list(NS)] == ["a", "B", "c"]  # by case-folded name

        # Removing a plane: its events stop and its objects leave the union lister.
        await union.remove("b")
        await subs.pop("B").stop()
        await create_cm(b, "after-removal")
        await create_cm(a, "marker")
        await eventually(lambda: ("a", "marker") in seen.adds, 30, "a's marker")
        assert ("B", "after-removal") not in seen.adds
        assert union.clusters() == ["a", "c"] and all(o.cluster != "B" for o in union.lister.list())

        # One apiserver down: only that cluster is not ready; the union stays synced (client-go semantics).
        await asyncio.to_thread(a.stop_apiserver)
        await eventually(lambda: not union.cluster_ready("a"), 30, "a not ready")
        assert union.cluster_ready("c") and union.has_synced()
        await create_cm(c, "while-a-is-down")
        await eventually(lambda: ("c", "while-a-is-down") in seen.adds, 30, "c still delivers")
        await asyncio.to_thread(a.start_apiserver)
        await eventually(lambda: union.cluster_ready("a"), 60, "a ready again")
        await create_cm(a, "after-restart")
        await eventually(lambda: ("a", "after-restart") in seen.adds, 30, "a delivers again")

        events = {c: registry.get_sample_value("union_informer_events_total", {"union": "configmaps", "cluster": c})
                  for c in ("a", "c")}
        assert events["a"] >= 3 and events["c"] >= 1, events
        assert registry.get_sample_value("union_informer_subs", {"union": "configmaps"}) == 2
    finally:
        for name in list(subs):
            await union.remove(name)
            await subs.pop(name).stop()
    assert asyncio.all_tasks() - before - {asyncio.current_task()} == set()

