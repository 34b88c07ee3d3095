"""retry_on_conflict, create_or_update/create_or_patch, finalizers and owner references."""

from __future__ import annotations

import asyncio
import copy
import time
from typing import Any, Iterator

import kubernetes
import pytest

from controllers import (
    AlreadyOwnedError, OperationResult, Request, RetryBackoff, add_finalizer, create_or_patch, create_or_update,
    has_finalizer, owner_requests, remove_finalizer, retry_on_conflict, semantic_equal, set_controller_reference,
    set_owner_reference,
)
from informers import GVR, AlreadyExists, ApiClient, ApiError, Conflict, NotFound, ResourceClient

from tests.helpers import CONFIGMAPS
from tests.kube import configmap, install_crd, widget


@pytest.fixture(scope="module")
def widgets_gvr(admin_client: kubernetes.client.ApiClient) -> Iterator[GVR]:
    gvr = install_crd(admin_client, "Namespaced", "Widget", "widgets")
    yield gvr
    kubernetes.client.ApiextensionsV1Api(admin_client).delete_custom_resource_definition(f"{gvr.resource}.{gvr.group}")


def conflict() -> Conflict:
    return Conflict(409, "Conflict", "the object has been modified")


class RacingClient(ResourceClient):
    """A client whose first read is followed by another writer's merge patch, before the caller can write."""

    def __init__(self, api: ApiClient, gvr: GVR, race: dict[str, Any]) -> None:
        super().__init__(api, gvr)
        self.race: dict[str, Any] | None = race

    async def get(self, name: str, namespace: str | None = None) -> dict[str, Any]:
        obj = await super().get(name, namespace)
        if self.race is not None:
            await self.patch(name, self.race, type="merge", namespace=namespace)
            self.race = None
        return obj


# -- retry_on_conflict ----------------------------------------------------------------------------------------


async def test_retry_on_conflict_tries_five_times_10ms_apart() -> None:
    calls: list[float] = []

    async def always() -> None:
        calls.append(time.monotonic())
        raise conflict()

    with pytest.raises(Conflict):
        await retry_on_conflict(always)
    gaps = [b - a for a, b in zip(calls, calls[1:])]
    assert len(calls) == 5 and all(0.0095 <= g < 0.05 for g in gaps), gaps

    outcomes: list[Exception | str] = [conflict(), conflict(), "done"]

    async def twice() -> str:
        outcome = outcomes.pop(0)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    assert await retry_on_conflict(twice) == "done" and not outcomes
    calls.clear()
    with pytest.raises(Conflict):
        await retry_on_conflict(always, RetryBackoff(steps=1))
    assert len(calls) == 1


@pytest.mark.parametrize("error", [AlreadyExists(409, "AlreadyExists"), NotFound(404), ApiError(500), KeyError()])
async def test_retry_on_conflict_raises_other_errors_at_once(error: Exception) -> None:
    calls = 0

    async def fail() -> None:
        nonlocal calls
        calls += 1
        raise error

    with pytest.raises(type(error)):
        await retry_on_conflict(fail)
    assert calls == 1


async def test_retry_on_conflict_rereads_and_wins_against_a_concurrent_writer(api: ApiClient, namespace: str) -> None:
    cms = ResourceClient(api, CONFIGMAPS)
    stale = await cms.create(configmap("counter", namespace, n="0"))
    await cms.patch("counter", {"data": {"other": "x"}}, type="merge", namespace=namespace)
    reads = 0

    async def increment() -> dict[str, Any]:
        nonlocal reads
        current = stale if reads == 0 else await cms.get("counter", namespace)
        reads += 1
        current["data"]["n"] = str(int(current["data"]["n"]) + 1)
        return await cms.update(current)

    result = await retry_on_conflict(increment)
    assert reads == 2 and result["data"] == {"n": "1", "other": "x"}


# -- create_or_update / create_or_patch -----------------------------------------------------------------------


async def test_create_or_update_results(api: ApiClient, namespace: str) -> None:
    cms = ResourceClient(api, CONFIGMAPS)

    def want_x(value: str):
        def mutate(cm: dict[str, Any]) -> None:
            cm.setdefault("data", {})["x"] = value
        return mutate

    template = configmap("cu", namespace)
    created, result = await create_or_update(cms, template, want_x("1"))
    assert result is OperationResult.CREATED and created["data"] == {"x": "1"}
    assert template == configmap("cu", namespace)  # the template is not mutated
    same, result = await create_or_update(cms, template, want_x("1"))
    assert result is OperationResult.UNCHANGED
    assert same["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
    updated, result = await create_or_update(cms, template, want_x("2"))
    assert result is OperationResult.UPDATED and updated["data"] == {"x": "2"}
    assert (await cms.get("cu", namespace))["data"] == {"x": "2"}

    def rename(cm: dict[str, Any]) -> None:
        cm["metadata"]["name"] = "elsewhere"

    with pytest.raises(ValueError, match="must not change"):
        await create_or_update(cms, template, rename)
    # the update is optimistic: a write between its read and its update is a Conflict, which a retry absorbs
    racing = RacingClient(api, CONFIGMAPS, {"data": {"y": "race"}})
    with pytest.raises(Conflict):
        await create_or_update(racing, template, want_x("3"))
    racing.race = {"data": {"y": "race again"}}
    final, result = await retry_on_conflict(lambda: create_or_update(racing, template, want_x("3")))
    assert result is OperationResult.UPDATED and final["data"] == {"x": "3", "y": "race again"}


async def test_create_or_patch_results(api: ApiClient, namespace: str, widgets_gvr: GVR) -> None:
    client = ResourceClient(api, widgets_gvr)

    def want(size: int | None = None, phase: str | None = None):
        def mutate(w: dict[str, Any]) -> None:
            if size is not None:
                w["spec"]["size"] = size
            if phase is not None:
                w.setdefault("status", {})["phase"] = phase
        return mutate

    template = widget(widgets_gvr, "cp", namespace, size=1)
    created, result = await create_or_patch(client, template, want(size=2))
    assert result is OperationResult.CREATED and created["spec"]["size"] == 2
    _, result = await create_or_patch(client, template, want(size=2))
    assert result is OperationResult.UNCHANGED
    patched, result = await create_or_patch(client, template, want(size=3))
    assert result is OperationResult.UPDATED and patched["spec"]["size"] == 3 and "status" not in patched
    both, result = await create_or_patch(client, template, want(size=4, phase="Growing"))
    assert result is OperationResult.UPDATED_STATUS
    assert both["spec"]["size"] == 4 and both["status"] == {"phase": "Growing"}
    status_only, result = await create_or_patch(client, template, want(phase="Ready"))
    assert result is OperationResult.UPDATED_STATUS_ONLY and status_only["status"] == {"phase": "Ready"}
    server = await client.get("cp", namespace)
    assert server["spec"]["size"] == 4 and server["status"] == {"phase": "Ready"}
    # the patch carries only what mutate changed: a write between its read and its patch survives, no conflict
    racing = RacingClient(api, widgets_gvr, {"metadata": {"labels": {"keep": "me"}}})
    after, result = await create_or_patch(racing, template, want(size=5))
    assert result is OperationResult.UPDATED
    assert after["spec"]["size"] == 5 and after["metadata"]["labels"] == {"keep": "me"}


def record_writes(api: ApiClient) -> list[tuple[str, str]]:
    """(method, path) of every write ``api`` sends from now on."""
    writes: list[tuple[str, str]] = []
    original = api.request

    async def request(method, path, params=None, body=None, *args, **kwargs):
        if method != "GET":
            writes.append((method, path))
        return await original(method, path, params, body, *args, **kwargs)

    api.request = request  # type: ignore[method-assign]
    return writes


def test_semantic_equality_omits_empty_values_only_where_the_server_does() -> None:
    from controllers.equality import Omissions

    # nulls are empty maps and lists; the metadata's empty maps and lists are left out by every server
    assert semantic_equal({"spec": {"a": None}}, {"spec": {"a": {}}})
    assert semantic_equal({"metadata": {"name": "x", "labels": {}, "finalizers": []}}, {"metadata": {"name": "x"}})
    assert semantic_equal({"spec": {"a": None}}, {"spec": {}})
    # elsewhere a {} may mean something (a namespaceSelector of every namespace, a custom resource's field)
    assert not semantic_equal({"spec": {"namespaceSelector": {}}}, {"spec": {}})
    assert not semantic_equal({"x": 1}, {"x": True}) and semantic_equal({"x": 1}, {"x": 1.0})
    # ... until the server's answer to a write shows that it leaves that one out
    learned = Omissions()
    learned.learn("configmaps", {"data": {}, "spec": {"items": [{"tags": []}], "keep": {}}},
                  {"spec": {"items": [{}], "keep": {}}})
    omitted = learned.of("configmaps")
    assert semantic_equal({"data": {}}, {}, omitted)
    assert semantic_equal({"spec": {"items": [{"tags": []}]}}, {"spec": {"items": [{}]}}, omitted)
    assert not semantic_equal({"spec": {"keep": {}}}, {"spec": {}}, omitted)
    assert not semantic_equal({"data": {}}, {}, learned.of("secrets"))


@pytest.mark.parametrize("upsert", [create_or_update, create_or_patch])
async def test_empty_maps_and_lists_settle_unchanged_and_send_nothing(api: ApiClient, namespace: str,
                                                                      upsert: Any) -> None:
    # The server stores no empty data, labels, annotations or finalizers: comparing the mutated object with the
    # stored one as apimachinery's Semantic.DeepEqual does, they are the same object.
    cms = ResourceClient(api, CONFIGMAPS)

    def mutate(cm: dict[str, Any]) -> None:
        cm["data"] = {}
        cm["metadata"]["labels"] = {}
        cm["metadata"]["annotations"] = {}
        cm["metadata"]["finalizers"] = []

    name = "empty-" + upsert.__name__.replace("_", "-")
    created, result = await upsert(cms, configmap(name, namespace), mutate)
    assert result is OperationResult.CREATED
    assert "data" not in created and "labels" not in created["metadata"]
    writes = record_writes(api)
    for _ in range(2):
        same, result = await upsert(cms, configmap(name, namespace), mutate)
        assert result is OperationResult.UNCHANGED
        assert same["metadata"]["resourceVersion"] == created["metadata"]["resourceVersion"]
    assert writes == []

    def label(cm: dict[str, Any]) -> None:
        mutate(cm)
        cm["metadata"]["labels"] = {"a": ""}  # an empty string is a value

    _, result = await upsert(cms, configmap(name, namespace), label)
    assert result is OperationResult.UPDATED and len(writes) == 1
    assert (await cms.get(name, namespace))["metadata"]["labels"] == {"a": ""}


# -- finalizers -----------------------------------------------------------------------------------------------


async def test_add_and_remove_finalizer(api: ApiClient, namespace: str) -> None:
    cms = ResourceClient(api, CONFIGMAPS)
    cm = await cms.create(configmap("fin", namespace))
    assert not has_finalizer(cm, "example.com/cleanup")
    added = await add_finalizer(cms, cm, "example.com/cleanup")
    assert has_finalizer(added, "example.com/cleanup")
    again = await add_finalizer(cms, added, "example.com/cleanup")  # present: no write
    assert again["metadata"]["resourceVersion"] == added["metadata"]["resourceVersion"]
    removed = await remove_finalizer(cms, again, "example.com/cleanup")
    assert "finalizers" not in removed["metadata"]
    assert "finalizers" not in (await cms.get("fin", namespace))["metadata"]


async def test_finalizer_changes_survive_concurrent_writers(api: ApiClient, namespace: str) -> None:
    cms = ResourceClient(api, CONFIGMAPS)
    stale = await cms.create(configmap("busy", namespace))
    # another writer changes the object after our read: our patch conflicts, is re-done on a fresh read
    await cms.patch("busy", {"metadata": {"labels": {"writer": "other"}}, "data": {"d": "1"}}, type="merge",
                    namespace=namespace)
    mine = await add_finalizer(cms, copy.deepcopy(stale), "example.com/a")
    assert mine["metadata"]["finalizers"] == ["example.com/a"]
    assert mine["metadata"]["labels"] == {"writer": "other"} and mine["data"] == {"d": "1"}
    # two finalizers added at once from the same stale read: neither overwrites the other
    await asyncio.gather(add_finalizer(cms, copy.deepcopy(stale), "example.com/b"),
                         add_finalizer(cms, copy.deepcopy(stale), "example.com/c"))
    full = await cms.get("busy", namespace)
    assert sorted(full["metadata"]["finalizers"]) == ["example.com/a", "example.com/b", "example.com/c"]
    # and concurrent removals from one read, which another write has made stale, only take out their own
    await cms.patch("busy", {"data": {"d": "2"}}, type="merge", namespace=namespace)
    await asyncio.gather(remove_finalizer(cms, copy.deepcopy(full), "example.com/a"),
                         remove_finalizer(cms, copy.deepcopy(full), "example.com/b"))
    assert (await cms.get("busy", namespace))["metadata"]["finalizers"] == ["example.com/c"]


async def test_removing_the_last_finalizer_of_a_deleted_object_lets_it_go(api: ApiClient, namespace: str) -> None:
    cms = ResourceClient(api, CONFIGMAPS)
    cm = await add_finalizer(cms, await cms.create(configmap("going", namespace)), "example.com/cleanup")
    deleting = await cms.delete("going", namespace)
    assert deleting is not None and deleting["metadata"]["deletionTimestamp"]
    with pytest.raises(ApiError):  # no new finalizers on an object being deleted
        await add_finalizer(cms, deleting, "example.com/late")
    await remove_finalizer(cms, cm, "example.com/cleanup")  # stale read: conflict, re-read, remove
    with pytest.raises(NotFound):
        await cms.get("going", namespace)


# -- owner references -----------------------------------------------------------------------------------------


def obj(kind: str, name: str, namespace: str | None = "ns", api_version: str = "example.com/v1",
        uid: str | None = None) -> dict[str, Any]:
    meta = {"name": name, "uid": uid or f"uid-{name}", **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": api_version, "kind": kind, "metadata": meta}


def test_controller_reference_rules() -> None:
    owner, child = obj("Widget", "w"), obj("ConfigMap", "c", api_version="v1")
    set_controller_reference(owner, child)
    ref = {"apiVersion": "example.com/v1", "kind": "Widget", "name": "w", "uid": "uid-w", "controller": True,
           "blockOwnerDeletion": True}
    assert child["metadata"]["ownerReferences"] == [ref]
    set_controller_reference(owner, child)  # idempotent
    assert child["metadata"]["ownerReferences"] == [ref]
    # the same owner at another version, recreated (new uid): the reference is updated in place
    set_controller_reference(obj("Widget", "w", api_version="example.com/v2", uid="new"), child)
    assert child["metadata"]["ownerReferences"] == [ref | {"apiVersion": "example.com/v2", "uid": "new"}]
    with pytest.raises(AlreadyOwnedError, match="already controlled by Widget 'w'") as owned:
        set_controller_reference(obj("Widget", "other"), child)
    assert owned.value.owner["name"] == "w"
    # a plain owner reference next to it is fine, and does not count as a controller
    set_owner_reference(obj("Gadget", "g"), child)
    assert [r["kind"] for r in child["metadata"]["ownerReferences"]] == ["Widget", "Gadget"]
    assert "controller" not in child["metadata"]["ownerReferences"][1]


def test_owner_scope_rules() -> None:
    with pytest.raises(ValueError, match="cluster-scoped object cannot have a namespaced owner"):
        set_controller_reference(obj("Widget", "w"), obj("Node", "n", namespace=None))
    with pytest.raises(ValueError, match="owner must be in the object's namespace"):
        set_owner_reference(obj("Widget", "w", namespace="a"), obj("ConfigMap", "c", namespace="b"))
    cluster_owner = obj("Gadget", "g", namespace=None)
    child = obj("ConfigMap", "c")
    set_controller_reference(cluster_owner, child)  # a cluster-scoped owner may own a namespaced object
    set_owner_reference(cluster_owner, obj("Node", "n", namespace=None))
    with pytest.raises(ValueError, match="apiVersion, kind"):
        set_owner_reference({"metadata": {"name": "x"}}, child)


def test_owner_requests_maps_to_owners_of_one_kind() -> None:
    child = obj("ConfigMap", "c", api_version="v1")
    set_owner_reference(obj("Widget", "plain"), child)
    set_controller_reference(obj("Widget", "boss", api_version="example.com/v2"), child)
    set_owner_reference(obj("Widget", "foreign", api_version="other.io/v1"), child)
    set_owner_reference(obj("Gadget", "g", namespace=None), child)
    assert owner_requests(child, "example.com/v1", "Widget") == [Request("plain", "ns"), Request("boss", "ns")]
    assert owner_requests(child, "example.com/v1", "Widget", controller_only=True) == [Request("boss", "ns")]
    assert owner_requests(child, "example.com/v1", "Gadget", namespaced=False) == [Request("g")]
    assert owner_requests(obj("ConfigMap", "orphan"), "example.com/v1", "Widget") == []


async def test_server_accepts_the_owner_references(api: ApiClient, namespace: str, widgets_gvr: GVR) -> None:
    owner = await ResourceClient(api, widgets_gvr).create(widget(widgets_gvr, "owner", namespace))
    child = configmap("child", namespace)
    set_controller_reference(owner, child)
    created = await ResourceClient(api, CONFIGMAPS).create(child)
    assert owner_requests(created, widgets_gvr.group_version, "Widget", controller_only=True) == [
        Request("owner", namespace)]
