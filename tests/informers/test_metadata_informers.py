"""Metadata-only informers against the real control plane: the apiserver's content negotiation that they rely
on, a cache of their own next to the full one, and the same keys, labels and resourceVersions as a full
informer of the same GVR through churn and through 410 recovery (ConfigMaps and a custom resource)."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from informers import GVR, ApiClient, ApiError, ReflectorOptions
from informers.reflector import _METADATA_LIST_ACCEPT, _METADATA_WATCH_ACCEPT

from tests.factories import Recorder, counter_sum, factory_for
from tests.helpers import CONFIGMAPS, eventually, server_state
from tests.kube import crd_body
from tests.proxy import Proxy

GADGETS = GVR("metadata-test.example.com", "v1", "gadgets")
PARTIAL = {"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata"}


async def install_gadgets(api: ApiClient) -> None:
    """The custom resource of these tests, once per control plane."""
    try:
        await api.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
                          body=crd_body(GADGETS.group, GADGETS.resource, "Gadget"))
    except ApiError as e:
        if e.status != 409:
            raise

    async def served() -> bool:
        try:
            await api.request("GET", GADGETS.path())
        except ApiError:
            return False
        return True

    await eventually(served, 30, "the gadgets CRD to be served")


def body(gvr: GVR, name: str, labels: dict[str, str], value: str) -> dict[str, Any]:
    if gvr == CONFIGMAPS:
        return {"metadata": {"name": name, "labels": labels}, "data": {"x": value}}
    return {"apiVersion": gvr.group_version, "kind": "Gadget", "metadata": {"name": name, "labels": labels},
            "spec": {"x": value}}


def content_patch(gvr: GVR, value: str) -> dict[str, Any]:
    """A change of the object's content only: a new resourceVersion, the same metadata otherwise."""
    return {"data": {"x": value}} if gvr == CONFIGMAPS else {"spec": {"x": value}}


def view(informer: Any) -> dict[str, tuple[dict[str, str], str]]:
    """key -> (labels, resourceVersion) of the informer's cache."""
    return {k: (dict(o["metadata"].get("labels") or {}), o["metadata"]["resourceVersion"])
            for k in informer.store.keys() for o in (informer.store.get(k),)}


def assert_partial(informer: Any) -> None:
    for obj in informer.store:
        assert set(obj) == {"apiVersion", "kind", "metadata"} and obj["apiVersion"] == PARTIAL["apiVersion"] \
            and obj["kind"] == PARTIAL["kind"], obj


async def churn(api: ApiClient, gvr: GVR, namespace: str, rng: random.Random, names: list[str],
                rounds: int) -> None:
    """Creates, label changes, content-only changes and deletes, in random order."""
    path = gvr.path(namespace)
    for r in range(rounds):
        op = rng.choice(["create", "label", "content", "delete"] if names else ["create"])
        if op == "create":
            name = f"n-{r}"
            await api.request("POST", path, body=body(gvr, name, {"round": str(r)}, "new"))
            names.append(name)
        elif op == "label":
            await api.request("PATCH", f"{path}/{rng.choice(names)}", body={"metadata": {"labels": {"l": str(r)}}})
        elif op == "content":
            await api.request("PATCH", f"{path}/{rng.choice(names)}", body=content_patch(gvr, f"v{r}"))
        else:
            name = names.pop(rng.randrange(len(names)))
            await api.request("DELETE", f"{path}/{name}")


# -- the apiserver's rules ---------------------------------------------------------------------------------
async def test_the_apiserver_serves_metadata_by_accept_and_falls_back_to_whole_objects_not_406(api, namespace):
    """What the reflector's Accept headers rely on (apiserver's NegotiateMediaTypeOptions and
    asPartialObjectMetadataList): the first clause the endpoint can serve wins, 406 only when none is left, so
    client-go's trailing plain ``application/json`` makes a server that cannot transform send whole objects."""
    path = CONFIGMAPS.path(namespace)
    await api.request("POST", path, body=body(CONFIGMAPS, "one", {"a": "b"}, "data"))
    page = await api.request("GET", path, headers={"Accept": _METADATA_LIST_ACCEPT})
    assert page["kind"] == "PartialObjectMetadataList" and page["apiVersion"] == "meta.k8s.io/v1"
    assert [(i["apiVersion"], i["kind"], i["metadata"]["labels"]) for i in page["items"]] == [
        (PARTIAL["apiVersion"], PARTIAL["kind"], {"a": "b"})]
    # A list asked for as a single PartialObjectMetadata: negotiated, then refused by the transform.
    with pytest.raises(ApiError) as refused:
        await api.request("GET", path, headers={"Accept": _METADATA_WATCH_ACCEPT.split(",")[0]})
    assert refused.value.status == 406
    # A transform the endpoint cannot make (an unknown version here): 406 alone, whole objects with the fallback.
    unknown = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v9"
    with pytest.raises(ApiError) as refused:
        await api.request("GET", path, headers={"Accept": unknown})
    assert refused.value.status == 406
    page = await api.request("GET", path, headers={"Accept": f"{unknown},application/json"})
    assert page["kind"] == "ConfigMapList" and page["items"][0]["data"] == {"x": "data"}
    assert _METADATA_LIST_ACCEPT.endswith(",application/json") and _METADATA_WATCH_ACCEPT.endswith(
        ",application/json")


# -- a cache of its own ------------------------------------------------------------------------------------
async def test_a_metadata_informer_is_a_cache_of_partial_objects_next_to_the_full_one(api, namespace):
    path = CONFIGMAPS.path(namespace)
    for i in range(10):
        await api.request("POST", path, body={"metadata": {"name": f"cm-{i}", "labels": {"i": str(i)},
                                                           "annotations": {"note": "x"}},
                                              "data": {"big": "y" * 2000}})
    f = factory_for(api, namespace=namespace)
    full, _ = f.for_resource(CONFIGMAPS)
    meta, lister = f.for_resource(CONFIGMAPS.only_metadata())
    assert meta is not full and f.for_resource(CONFIGMAPS.only_metadata())[0] is meta
    assert set(f.informers()) == {CONFIGMAPS, CONFIGMAPS.only_metadata()}
    f.start()
    try:
        assert await f.wait_for_cache_sync(30) == {CONFIGMAPS: True, CONFIGMAPS.only_metadata(): True}
        assert_partial(meta)
        assert len(meta.store) == 10
        for obj in full.store:
            # the same metadata, managedFields dropped by the factory's transform on both
            assert lister.get(obj["metadata"]["name"], namespace)["metadata"] == obj["metadata"]
            assert "managedFields" not in obj["metadata"]
        # synced by watch-list streaming, which the apiserver serves in metadata form too
        assert meta.reflector.use_watch_list is None
        assert counter_sum(f, "informer_lists_total", gvr="configmaps.v1 (metadata)") == 0
        assert counter_sum(f, "informer_objects", gvr="configmaps.v1 (metadata)") == 10
        assert counter_sum(f, "informer_objects", gvr="configmaps.v1") == 10
        await f.stop_resource(CONFIGMAPS.only_metadata())
        assert set(f.informers()) == {CONFIGMAPS} and full.has_synced()
        assert counter_sum(f, "informer_objects", gvr="configmaps.v1 (metadata)") == 0
        assert counter_sum(f, "informer_objects", gvr="configmaps.v1") == 10
    finally:
        await f.shutdown()


def _ignoring_metadata_accept(client: ApiClient) -> None:
    """Make ``client`` ask for plain JSON where it asked for metadata: the answer of a server that cannot make the
    transform and takes the Accept header's fallback clause."""
    request, stream = client.request, client.stream

    def plain(headers: Any) -> Any:
        return {**headers, "Accept": "application/json"} if headers else headers

    async def plain_request(method, path, params=None, body=None, headers=None, timeout=60.0):
        return await request(method, path, params, body, plain(headers), timeout)

    def plain_stream(path, params, inactivity_timeout=None, *, headers=None):
        return stream(path, params, inactivity_timeout, headers=plain(headers))

    client.request = plain_request  # type: ignore[method-assign]
    client.stream = plain_stream  # type: ignore[method-assign]


@pytest.mark.parametrize("watch_list", [None, False], ids=["watch-list", "list-watch"])
async def test_whole_objects_from_a_server_that_cannot_transform_are_cut_down_to_metadata(control_plane, api,
                                                                                         namespace, watch_list):
    path = CONFIGMAPS.path(namespace)
    for i in range(5):
        await api.request("POST", path, body=body(CONFIGMAPS, f"cm-{i}", {"i": str(i)}, "data"))
    async with ApiClient.from_kubeconfig(str(control_plane.kubeconfig)) as plain_client:
        _ignoring_metadata_accept(plain_client)
        options = ReflectorOptions(watch_list=watch_list)
        served = factory_for(api, namespace=namespace, options=options)
        cut = factory_for(plain_client, namespace=namespace, options=options)
        expected, _ = served.for_resource(CONFIGMAPS.only_metadata())
        got, _ = cut.for_resource(CONFIGMAPS.only_metadata())
        served.start()
        cut.start()
        try:
            assert await expected.wait_for_sync(30) and await got.wait_for_sync(30)
            await api.request("PATCH", f"{path}/cm-1", body={"metadata": {"labels": {"changed": "yes"}}})
            await api.request("DELETE", f"{path}/cm-2")
            await api.request("POST", path, body=body(CONFIGMAPS, "late", {}, "data"))
            state = await server_state(api, CONFIGMAPS, namespace)

            def same() -> bool:
                return {k: rv for k, (_, rv) in view(got).items()} == state and \
                    {k: o for k in got.store.keys() for o in (got.store.get(k),)} == \
                    {k: o for k in expected.store.keys() for o in (expected.store.get(k),)}

            await eventually(same, 20, "the cut-down cache to match the served metadata")
            assert_partial(got)
        finally:
            await asyncio.gather(served.shutdown(), cut.shutdown())


# -- the same keys, labels and resourceVersions ----------------------------------------------------------------
@pytest.mark.parametrize("gvr", [CONFIGMAPS, GADGETS], ids=["configmaps", "crd"])
@pytest.mark.parametrize("watch_list", [None, False], ids=["watch-list", "list-watch"])
async def test_metadata_and_full_informers_agree_through_churn(api, namespace, seed, gvr, watch_list):
    """Both caches equal the server's keys, labels and resourceVersions after random churn, and their handlers
    are told the same events in the same order."""
    if gvr == GADGETS:
        await install_gadgets(api)
    rng = random.Random(seed)
    names = [f"o-{i}" for i in range(20)]
    for name in names:
        await api.request("POST", gvr.path(namespace), body=body(gvr, name, {"start": "yes"}, "data"))

    async def cached() -> bool:  # a list at "0" is the watch cache's, which may lag the writes just made
        return len((await api.request("GET", gvr.path(namespace), {"resourceVersion": "0"}))["items"]) == 20

    await eventually(cached, 10, "the watch cache to hold the objects, so both initial lists hold all 20")
    f = factory_for(api, namespace=namespace, options=ReflectorOptions(watch_list=watch_list))
    full, _ = f.for_resource(gvr)
    meta, _ = f.for_resource(gvr.only_metadata())
    full_events, meta_events = Recorder(), Recorder()
    full.add_event_handler(full_events)
    meta.add_event_handler(meta_events)
    f.start()
    try:
        assert await full.wait_for_sync(30) and await meta.wait_for_sync(30)
        assert meta.reflector.use_watch_list is watch_list
        await eventually(lambda: len(full_events.events) == len(meta_events.events) == 20, 10, "initial adds")
        assert sorted(full_events.events) == sorted(meta_events.events)
        full_events.events.clear()
        meta_events.events.clear()
        await churn(api, gvr, namespace, rng, names, 60)

        async def agree() -> bool:
            objects = await api.request("GET", gvr.path(namespace), {"resourceVersion": ""})
            server = {f"{namespace}/{o['metadata']['name']}": (o["metadata"].get("labels") or {},
                                                               o["metadata"]["resourceVersion"])
                      for o in objects["items"]}
            return view(full) == view(meta) == server

        await eventually(agree, 30, "both caches to match the server")
        await eventually(lambda: len(full_events.events) == len(meta_events.events), 10, "the handlers to settle")
        assert full_events.events == meta_events.events
        assert_partial(meta)
    finally:
        await f.shutdown()


@pytest.mark.parametrize("gvr", [CONFIGMAPS, GADGETS], ids=["configmaps", "crd"])
async def test_metadata_informers_recover_from_410_like_full_ones(control_plane_factory, seed, gvr):
    """Cut off, churn, compaction and an apiserver restart (its new watch cache answers 410 to the last RV):
    full and metadata-only informers, by watch-list and by LIST+WATCH, relist, converge to the same keys, labels
    and resourceVersions, and tell their handlers of the same deletions."""
    rng = random.Random(seed)
    cp = control_plane_factory()
    async with ApiClient.from_kubeconfig(str(cp.kubeconfig)) as admin:
        if gvr == GADGETS:
            await install_gadgets(admin)
        await admin.request("POST", "/api/v1/namespaces", body={"metadata": {"name": "m"}})
        names = [f"o-{i}" for i in range(20)]
        for name in names:
            await admin.request("POST", gvr.path("m"), body=body(gvr, name, {}, "data"))
        proxy = await Proxy(cp.port).start()
        client = ApiClient.from_kubeconfig(str(cp.kubeconfig))
        client.host = f"https://127.0.0.1:{proxy.port}"
        factories = [factory_for(client, namespace="m", options=ReflectorOptions(watch_list=mode))
                     for mode in (None, False)]
        pairs = [(f, f.for_resource(gvr)[0], f.for_resource(gvr.only_metadata())[0]) for f in factories]
        recorders = {}
        for _, *informers in pairs:
            for inf in informers:
                recorders[inf] = Recorder()
                inf.add_event_handler(recorders[inf])
        for f in factories:
            f.start()
        try:
            for f in factories:
                assert all((await f.wait_for_cache_sync(30)).values())
            for rec in recorders.values():
                rec.events.clear()
            proxy.refuse = True
            proxy.cut()
            await eventually(lambda: all(inf.last_error is not None for inf in recorders), 10, "the cut noticed")
            await churn(admin, gvr, "m", rng, names, 40)
            cp.compact()
            await asyncio.to_thread(cp.restart_apiserver)
            proxy.refuse = False

            async def converged() -> bool:
                try:
                    state = await server_state(admin, gvr, "m")
                except (ApiError, OSError):
                    return False
                return all({k: rv for k, (_, rv) in view(inf).items()} == state for inf in recorders) and all(
                    view(full) == view(meta) for _, full, meta in pairs)

            await eventually(converged, 60, "every informer to converge after the 410")
            for f, full, meta in pairs:
                assert counter_sum(f, "informer_relists_total", gvr=str(gvr.only_metadata()), reason="expired") >= 1
                deleted = [sorted(e[1] for e in recorders[inf].events if e[0] in ("delete", "tombstone"))
                           for inf in (full, meta)]
                assert deleted[0] == deleted[1]
                assert_partial(meta)
        finally:
            await asyncio.gather(*(f.shutdown() for f in factories))
            await client.close()
            await proxy.stop()
