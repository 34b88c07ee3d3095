"""Issue 10: objects from an informer's cache (listers, handlers, tombstones) are read-only, and copies are not."""

from __future__ import annotations

import asyncio
import copy
import json
import pickle

import orjson
import pytest
from prometheus_client import CollectorRegistry

from controllers import set_controller_reference
from informers import (
    GVR, DeletedFinalStateUnknown, DynamicSharedInformerFactory, FrozenDict, FrozenList, FuncHandler, InformerMetrics,
    ReadOnlyError, ReflectorOptions, SharedIndexInformer, deep_copy,
)
from informers.frozen import READ_ONLY_ENV, freeze

from tests.helpers import CONFIGMAPS, create_configmaps, eventually


def pod(name="p", rv="1", labels=None):
    """An object with dicts in lists and lists in lists, as pods have."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "ns", "resourceVersion": rv, "labels": labels or {"app": "web"},
                         "finalizers": ["example.com/f"]},
            "spec": {"containers": [{"name": "c", "ports": [{"containerPort": 80}], "args": ["a", "b"]}],
                     "matrix": [[1, 2], [3]]},
            "status": {"phase": "Running", "ready": True, "restarts": 0, "started": None}}


def frozen_throughout(value) -> bool:
    if isinstance(value, dict):
        return type(value) is FrozenDict and all(frozen_throughout(v) for v in value.values())
    if isinstance(value, list):
        return type(value) is FrozenList and all(frozen_throughout(v) for v in value)
    return True


def mutable_throughout(value) -> bool:
    if isinstance(value, dict):
        return type(value) is dict and all(mutable_throughout(v) for v in value.values())
    if isinstance(value, list):
        return type(value) is list and all(mutable_throughout(v) for v in value)
    return True


# -- the frozen types ----------------------------------------------------------------------------------------
def test_frozen_objects_read_compare_and_serialise_like_the_decoded_ones():
    plain = pod()
    obj = freeze(pod())
    assert frozen_throughout(obj)
    assert obj == plain and obj["spec"]["containers"] == plain["spec"]["containers"]
    assert isinstance(obj, dict) and isinstance(obj["metadata"]["finalizers"], list)
    assert obj["metadata"]["name"] == "p" and obj.get("nope") is None
    assert obj["metadata"].get("labels") == {"app": "web"}
    assert "spec" in obj and len(obj) == 5 and list(obj) == list(plain) and dict(obj.items()) == plain
    assert [c["name"] for c in obj["spec"]["containers"]] == ["c"] and obj["spec"]["matrix"][1] == [3]
    assert repr(obj) == repr(plain)  # logs look as before
    assert orjson.dumps(obj) == orjson.dumps(plain)
    assert json.dumps(obj) == json.dumps(plain)
    assert freeze(obj) is obj  # frozen once: the informer's second freeze is a type check


@pytest.mark.parametrize("mutate,refused", [
    (lambda o: o.__setitem__("kind", "Other"), "FrozenDict.__setitem__('kind')"),
    (lambda o: o["metadata"]["labels"].__setitem__("x", "y"), "FrozenDict.__setitem__('x')"),
    (lambda o: o["metadata"].__delitem__("labels"), "FrozenDict.__delitem__('labels')"),
    (lambda o: o["metadata"].setdefault("annotations", {}), "FrozenDict.setdefault('annotations')"),
    (lambda o: o["metadata"].pop("labels"), "FrozenDict.pop('labels')"),
    (lambda o: o["metadata"].popitem(), "FrozenDict.popitem"),
    (lambda o: o["metadata"].update(name="q"), "FrozenDict.update"),
    (lambda o: o["status"].clear(), "FrozenDict.clear"),
    (lambda o: o["status"].__ior__({"phase": "Failed"}), "FrozenDict.__ior__"),
    (lambda o: o["metadata"]["finalizers"].append("x"), "FrozenList.append"),
    (lambda o: o["metadata"]["finalizers"].remove("example.com/f"), "FrozenList.remove"),
    (lambda o: o["metadata"]["finalizers"].__setitem__(0, "x"), "FrozenList.__setitem__(0)"),
    (lambda o: o["metadata"]["finalizers"].__delitem__(0), "FrozenList.__delitem__(0)"),
    (lambda o: o["metadata"]["finalizers"].__iadd__(["x"]), "FrozenList.__iadd__"),
    (lambda o: o["metadata"]["finalizers"].__imul__(2), "FrozenList.__imul__"),
    (lambda o: o["spec"]["containers"][0]["args"].extend(["c"]), "FrozenList.extend"),
    (lambda o: o["spec"]["containers"][0]["args"].insert(0, "c"), "FrozenList.insert"),
    (lambda o: o["spec"]["containers"][0]["args"].pop(), "FrozenList.pop"),
    (lambda o: o["spec"]["containers"][0]["args"].clear(), "FrozenList.clear"),
    (lambda o: o["spec"]["containers"][0]["args"].sort(), "FrozenList.sort"),
    (lambda o: o["spec"]["containers"][0]["args"].reverse(), "FrozenList.reverse"),
    (lambda o: o["spec"]["containers"][0]["ports"][0].__setitem__("containerPort", 8080),
     "FrozenDict.__setitem__('containerPort')"),
    (lambda o: o["spec"]["matrix"][0].append(3), "FrozenList.append"),
])
def test_every_change_is_refused_naming_the_operation_and_the_way_out(mutate, refused):
    obj = freeze(pod())
    with pytest.raises(ReadOnlyError) as e:
        mutate(obj)
    assert str(e.value).startswith(f"{refused} refused: objects from an informer's cache are read-only")
    assert "informers.deep_copy(obj)" in str(e.value)
    assert isinstance(e.value, TypeError)  # what Python raises for other immutable containers
    assert obj == pod()


def test_augmented_assignment_on_a_cached_value_is_refused():
    obj = freeze(pod())
    with pytest.raises(ReadOnlyError):
        obj["metadata"]["finalizers"] += ["x"]
    with pytest.raises(ReadOnlyError):
        obj["metadata"]["labels"] |= {"x": "y"}
    assert obj == pod()


def test_deep_copies_are_plain_and_mutable_and_leave_the_cached_object_alone():
    obj = freeze(pod())
    for mine in (deep_copy(obj), copy.deepcopy(obj)):
        assert mine == obj and mutable_throughout(mine)
        mine["metadata"]["labels"]["x"] = "y"
        mine["metadata"]["finalizers"].append("x")
        mine["spec"]["containers"][0]["ports"][0]["containerPort"] = 8080
        assert obj == pod()
    assert deep_copy(obj["metadata"]["finalizers"]) == ["example.com/f"]


def test_shallow_copies_have_a_mutable_top_level_over_frozen_contents():
    obj = freeze(pod())
    for top in (dict(obj), obj.copy(), copy.copy(obj), {**obj}, obj | {"extra": 1}):
        assert type(top) is dict
        top["status"] = {"phase": "Failed"}  # replacing a part is fine...
        with pytest.raises(ReadOnlyError):
            top["metadata"]["labels"]["x"] = "y"  # ...changing a shared one is not
    for top_list in (list(obj["metadata"]["finalizers"]), copy.copy(obj["metadata"]["finalizers"]),
                     obj["metadata"]["finalizers"] + ["x"]):
        assert type(top_list) is list
        top_list.append("y")
    assert obj == pod()


def test_pickling_keeps_objects_frozen():
    obj = freeze(pod())
    back = pickle.loads(pickle.dumps(obj))
    assert back == obj and frozen_throughout(back)


def test_helpers_that_only_read_a_cached_object_accept_it_and_those_that_edit_it_refuse_it():
    owner = freeze({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "o", "namespace": "ns", "uid": "u1"}})
    child = {"metadata": {"name": "c", "namespace": "ns"}}
    set_controller_reference(owner, child)  # the cached owner is only read
    assert child["metadata"]["ownerReferences"][0]["uid"] == "u1"
    with pytest.raises(ReadOnlyError):
        set_controller_reference(owner, freeze(pod()))  # it edits its second argument: give it a deep_copy
    mine = deep_copy(freeze(pod()))
    set_controller_reference(owner, mine)
    assert mine["metadata"]["ownerReferences"][0]["name"] == "o"


# -- informers, listers and handlers -------------------------------------------------------------------------
class Seen:
    """A handler that records every object it is given and tries to change each one."""

    name = "seen"

    def __init__(self) -> None:
        self.objs: list = []
        self.refused = 0

    def _see(self, obj) -> None:
        self.objs.append(obj)
        try:
            obj["metadata"].setdefault("annotations", {})["touched"] = "yes"
        except ReadOnlyError:
            self.refused += 1

    def on_add(self, obj, is_in_initial_list):
        self._see(obj)

    def on_update(self, old, new):
        self._see(old)
        self._see(new)

    def on_delete(self, obj):
        self._see(obj.obj if isinstance(obj, DeletedFinalStateUnknown) else obj)


def local_informer(**kw) -> SharedIndexInformer:
    """A real informer fed by the test in place of a reflector (no API server)."""
    inf = SharedIndexInformer(None, GVR("", "v1", "pods"), metrics=InformerMetrics.for_registry(CollectorRegistry()),
                              **kw)
    inf.reflector.run = asyncio.Event().wait
    return inf


async def test_listers_indexers_and_every_handler_event_see_frozen_objects():
    inf = local_informer(indexers={"app": lambda o: [o["metadata"]["labels"].get("app", "")]})
    seen = Seen()
    reg = inf.add_event_handler(seen)
    inf.start()
    try:
        inf.replace([pod("a"), pod("b", labels={"app": "db"}), pod("gone")], "1")
        inf.apply("MODIFIED", pod("a", rv="2"))
        inf.apply("ADDED", pod("c"))
        inf.apply("DELETED", pod("c", rv="3"))
        inf.replace([pod("a", rv="2"), pod("b", labels={"app": "db"})], "4")  # "gone" vanished: a tombstone
        await reg.wait_for_sync(5)
        # 3 adds, 1 update (old and new), 1 add, 1 delete, 1 tombstone
        await eventually(lambda: len(seen.objs) == 8, 5, "every event handled")
        assert seen.refused == 8 and all(frozen_throughout(o) for o in seen.objs)

        lister = inf.lister
        a = lister.get("a", "ns")
        assert frozen_throughout(a) and a["metadata"]["resourceVersion"] == "2"
        assert "annotations" not in a["metadata"]  # no handler managed to change the cache
        assert sorted(o["metadata"]["name"] for o in lister.list()) == ["a", "b"]
        assert [o["metadata"]["name"] for o in lister.list("ns", "app=db")] == ["b"]
        assert [o["metadata"]["name"] for o in lister.by_index("app", "web")] == ["a"]
        assert all(frozen_throughout(o) for o in lister.list() + lister.by_index("app", "db"))
        with pytest.raises(ReadOnlyError, match=r"FrozenDict.__setitem__\('app'\) refused"):
            lister.get("b", "ns")["metadata"]["labels"]["app"] = "web"
        assert [o["metadata"]["name"] for o in lister.by_index("app", "db")] == ["b"]  # the index still holds

        late = Seen()  # a late handler is replayed the cache itself
        late_reg = inf.add_event_handler(late, name="late")
        await late_reg.wait_for_sync(5)
        assert late.refused == 2 and all(any(o is c for c in lister.list()) for o in late.objs)
    finally:
        await inf.stop()


async def test_the_environment_switch_leaves_objects_as_decoded(monkeypatch):
    monkeypatch.setenv(READ_ONLY_ENV, "0")
    inf = local_informer()
    inf.replace([pod("a")], "1")
    inf.apply("ADDED", pod("b"))
    assert all(mutable_throughout(o) for o in inf.lister.list())
    monkeypatch.setenv(READ_ONLY_ENV, "1")
    assert frozen_throughout(local_informer().reflector._transform(pod()))  # read per informer, when created


async def test_transforms_see_mutable_objects_and_their_result_is_frozen():
    def label(obj):
        obj["metadata"].setdefault("labels", {})["transformed"] = "yes"
        return obj

    inf = local_informer(transform=label)
    out = inf.reflector._transform(pod())  # what the reflector applies to each decoded object
    assert out["metadata"]["labels"]["transformed"] == "yes" and frozen_throughout(out)


# -- against the API server ----------------------------------------------------------------------------------
@pytest.mark.parametrize("watch_list", [True, False], ids=["watch-list", "list-watch"])
async def test_objects_synced_and_watched_from_the_server_are_read_only(api, namespace, watch_list):
    await create_configmaps(api, namespace, 5)
    factory = DynamicSharedInformerFactory(api, namespace=namespace, metrics_registry=CollectorRegistry(),
                                           options=ReflectorOptions(watch_list=watch_list))
    inf, lister = factory.for_resource(CONFIGMAPS)
    seen = Seen()
    inf.add_event_handler(seen)
    updates: list = []
    inf.add_event_handler(FuncHandler(on_update=lambda old, new: updates.append(new), name="updates"))
    factory.start()
    try:
        assert (await factory.wait_for_cache_sync(30))[CONFIGMAPS]
        assert inf.reflector.use_watch_list is watch_list
        await eventually(lambda: len(seen.objs) == 5, 10, "the initial adds")
        path = CONFIGMAPS.path(namespace, "cm-0")
        await api.request("PATCH", path, body={"data": {"k": "v2"}})
        await eventually(lambda: bool(updates), 10, "the update")
        await eventually(lambda: seen.refused == 7, 10, "the update handled")  # 5 adds, the update's old and new
        assert all(frozen_throughout(o) for o in seen.objs + updates + lister.list())

        cm = lister.get("cm-0", namespace)
        assert cm["data"]["k"] == "v2" and "managedFields" not in cm["metadata"]  # the default transform ran
        assert "annotations" not in cm["metadata"]
        with pytest.raises(ReadOnlyError):
            cm["data"]["k"] = "local"
        assert orjson.loads(orjson.dumps(cm)) == cm

        # The way to write: a mutable copy, sent back as is.
        mine = deep_copy(cm)
        mine["data"]["k"] = "v3"
        written = await api.request("PUT", path, body=mine)
        assert written["data"]["k"] == "v3"
        await eventually(lambda: lister.get("cm-0", namespace)["data"]["k"] == "v3", 10, "the write seen")
        assert cm["data"]["k"] == "v2"  # what a reader already holds does not change under it
    finally:
        await factory.shutdown()
