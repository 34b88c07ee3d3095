"""Namespace views of a shared informer, without an API server: reads from the namespace index, events routed by
namespace (watch events, relists, replays, resyncs), handlers taken back, the view read-only."""

from __future__ import annotations

import asyncio

import pytest

from informers import GVR, FuncHandler
from informers.namespace_view import NamespaceInformer
from informers.store import DeletedFinalStateUnknown
from tests.fakes import LocalInformer

CONFIGMAPS = GVR("", "v1", "configmaps")


def cm(name: str, ns: str, rv: str = "1") -> dict:
    return {"metadata": {"name": name, "namespace": ns, "resourceVersion": rv, "labels": {"app": name}}}


class Heard:
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def on_add(self, obj, initial):
        self.events.append(("add", f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"))

    def on_update(self, old, new):
        self.events.append(("update", f"{new['metadata']['namespace']}/{new['metadata']['name']}"))

    def on_delete(self, obj):
        key = obj.key if isinstance(obj, DeletedFinalStateUnknown) else \
            f"{obj['metadata']['namespace']}/{obj['metadata']['name']}"
        self.events.append(("delete", key))


async def settled(*regs) -> None:
    for _ in range(50):
        if all(r.queue_depth == 0 for r in regs):
            await asyncio.sleep(0)
            return
        await asyncio.sleep(0)


async def test_a_view_reads_its_namespace_only() -> None:
    shared = LocalInformer(CONFIGMAPS)
    try:
        shared.add_indexers({"app": lambda o: [o["metadata"]["labels"]["app"]]})
        shared.replace([cm("x", "a"), cm("y", "a"), cm("x", "b")], "1")
        a = NamespaceInformer(shared, "a")
        assert a.has_synced() and a.gvr == CONFIGMAPS and a.resource_version == shared.resource_version
        assert sorted(o["metadata"]["name"] for o in a.lister.list()) == ["x", "y"]
        assert a.lister.get("x", "a") is shared.store.get("a/x")
        assert a.lister.get("x", "b") is None and a.lister.list(namespace="b") == []
        assert len(a.store) == 2 and "a/x" in a.store and "b/x" not in a.store
        assert sorted(a.store.keys()) == ["a/x", "a/y"]
        assert [o["metadata"]["namespace"] for o in a.lister.by_index("app", "x")] == ["a"]
        with pytest.raises(TypeError, match="read-only"):
            a.store.upsert(cm("z", "a"))
        with pytest.raises(TypeError, match="read-only"):
            a.start()
    finally:
        await shared.stop()


async def test_events_reach_the_handlers_of_their_namespace_only() -> None:
    shared = LocalInformer(CONFIGMAPS)
    try:
        shared.replace([cm("old", "a"), cm("old", "b")], "1")
        everyone, in_a, in_b = Heard(), Heard(), Heard()
        all_reg = shared.add_event_handler(everyone)
        a, b = NamespaceInformer(shared, "a"), NamespaceInformer(shared, "b")
        ra, rb = a.add_event_handler(in_a, name="ctl"), b.add_event_handler(in_b, name="ctl")
        assert (ra.name, rb.name) == ("a/ctl", "b/ctl")  # their metric series and logs apart
        await settled(all_reg, ra, rb)
        assert in_a.events == [("add", "a/old")] and in_b.events == [("add", "b/old")]  # replayed: own namespace
        assert ra.has_synced() and rb.has_synced()
        shared.apply("ADDED", cm("new", "a"))
        shared.apply("MODIFIED", cm("old", "b", rv="2"))
        shared.apply("DELETED", cm("new", "a", rv="3"))
        shared.replace([cm("old", "a", rv="4")], "5")  # a relist: b/old is gone (a tombstone), a/old changed
        await settled(all_reg, ra, rb)
        assert in_a.events == [("add", "a/old"), ("add", "a/new"), ("delete", "a/new"), ("update", "a/old")]
        assert in_b.events == [("add", "b/old"), ("update", "b/old"), ("delete", "b/old")]
        assert len(everyone.events) == 2 + 5  # the informer-wide handler hears every namespace
        assert a.registrations == [ra] and b.registrations == [rb]
        await a.remove_all()
        assert a.registrations == [] and shared.registrations == [all_reg, rb]
        shared.apply("ADDED", cm("later", "a"))
        await settled(all_reg, rb)
        assert in_a.events[-1] == ("update", "a/old")
    finally:
        await shared.stop()


async def test_a_views_resync_replays_its_namespace_only() -> None:
    shared = LocalInformer(CONFIGMAPS)
    try:
        shared.replace([cm("x", "a"), cm("x", "b")], "1")
        updates: list[str] = []
        view = NamespaceInformer(shared, "a")
        view.add_event_handler(FuncHandler(on_update=lambda old, new: updates.append(new["metadata"]["namespace"])),
                               resync_period=0.01)
        for _ in range(100):
            if len(updates) >= 2:
                break
            await asyncio.sleep(0.01)
        assert updates[:2] == ["a", "a"]
        with pytest.raises(ValueError, match="namespace b"):
            view.add_event_handler(Heard(), namespace="b")
    finally:
        await shared.stop()
