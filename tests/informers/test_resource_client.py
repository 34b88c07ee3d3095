"""ResourceClient, RESTMapper and the typed ApiErrors against the real control plane."""

from __future__ import annotations

import asyncio
import copy
import json
import re
import time
import uuid
from typing import Any, Iterator

import kubernetes
import pytest

from informers import (
    GVR, AlreadyExists, ApiClient, ApiError, Conflict, DiscoveryClient, DiscoveryResult, Forbidden, Gone, Invalid,
    NoMatchError, NotFound, ResourceClient, ResourceInfo, RESTMapper, TooManyRequests, Unauthorized,
    UnsupportedMediaType,
)

from tests.helpers import CONFIGMAPS
from tests.kube import configmap, install_crd, widget


@pytest.fixture(scope="module")
def crds(admin_client: kubernetes.client.ApiClient) -> Iterator[dict[str, GVR]]:
    """A namespaced (Widget) and a cluster-scoped (Gadget) test CRD, both with a status subresource."""
    gvrs = {"namespaced": install_crd(admin_client, "Namespaced", "Widget", "widgets"),
            "cluster": install_crd(admin_client, "Cluster", "Gadget", "gadgets")}
    yield gvrs
    ext = kubernetes.client.ApiextensionsV1Api(admin_client)
    for gvr in gvrs.values():
        ext.delete_custom_resource_definition(f"{gvr.resource}.{gvr.group}")


# -- typed errors ---------------------------------------------------------------------------------------------


def test_error_classes_follow_code_and_reason() -> None:
    cases = {401: Unauthorized, 403: Forbidden, 404: NotFound, 410: Gone, 415: UnsupportedMediaType,
             422: Invalid, 429: TooManyRequests, 500: ApiError}
    for code, cls in cases.items():
        e = ApiError.for_status_code(code, "Whatever", "message")
        assert type(e) is cls and e.status == code and isinstance(e, ApiError)
    assert type(ApiError.for_status_code(409, "AlreadyExists")) is AlreadyExists
    assert type(ApiError.for_status_code(409, "Conflict")) is Conflict
    invalid = ApiError.from_status({"kind": "Status", "code": 422, "reason": "Invalid", "message": "bad",
                                    "details": {"causes": [{"field": "spec.size", "reason": "FieldValueInvalid"}]}})
    assert isinstance(invalid, Invalid) and invalid.causes == [{"field": "spec.size", "reason": "FieldValueInvalid"}]
    gone = ApiError.from_status({"kind": "Status", "code": 410, "reason": "Expired"})
    assert isinstance(gone, Gone) and gone.is_gone
    throttled = ApiError.from_status({"code": 429, "details": {"retryAfterSeconds": 3}})
    assert isinstance(throttled, TooManyRequests) and throttled.retry_after == 3
    assert ApiError(404).causes == []


# -- built-in, namespaced -------------------------------------------------------------------------------------


async def test_configmap_verbs_and_typed_errors(api: ApiClient, namespace: str) -> None:
    cms = ResourceClient(api, CONFIGMAPS, field_manager="tests")
    created = await cms.create(configmap("a", namespace, x="1"))
    assert created["metadata"]["namespace"] == namespace and created["data"] == {"x": "1"}
    with pytest.raises(AlreadyExists):
        await cms.create(configmap("a", namespace))
    got = await cms.get("a", namespace)
    assert got["kind"] == "ConfigMap" and got["metadata"]["uid"] == created["metadata"]["uid"]
    # update: optimistic concurrency on the resourceVersion
    got["data"]["x"] = "2"
    updated = await cms.update(got)
    assert updated["data"] == {"x": "2"}
    stale = copy.deepcopy(got)
    stale["data"]["x"] = "3"
    with pytest.raises(Conflict) as conflict:
        await cms.update(stale)
    assert conflict.value.status == 409 and conflict.value.reason == "Conflict"
    del stale["metadata"]["resourceVersion"]
    with pytest.raises(ValueError, match="resourceVersion"):
        await cms.update(stale)
    # the three classic patch types
    merged = await cms.patch("a", {"data": {"y": "m"}}, type="merge", namespace=namespace)
    assert merged["data"] == {"x": "2", "y": "m"}
    jsoned = await cms.patch("a", [{"op": "remove", "path": "/data/y"}], type="json", namespace=namespace)
    assert jsoned["data"] == {"x": "2"}
    # strategic: the $patch directive means something to it (replace the map) and nothing to a merge patch
    strategic = await cms.patch("a", {"data": {"$patch": "replace", "only": "s"}}, type="strategic",
                                namespace=namespace)
    assert strategic["data"] == {"only": "s"}
    # delete with preconditions
    with pytest.raises(Conflict):
        await cms.delete("a", namespace, uid=str(uuid.uuid4()))
    with pytest.raises(Conflict):
        await cms.delete("a", namespace, resource_version=created["metadata"]["resourceVersion"])
    await cms.delete("a", namespace, uid=created["metadata"]["uid"], propagation_policy="Background",
                     grace_period_seconds=0)
    with pytest.raises(NotFound) as missing:
        await cms.get("a", namespace)
    assert missing.value.status == 404 and isinstance(missing.value, ApiError)
    with pytest.raises(NotFound):
        await cms.delete("a", namespace)


async def test_writes_without_a_field_manager_are_managed_by_kube_syncer(api: ApiClient, namespace: str) -> None:
    # The apiserver names such a write after the User-Agent's product, which is ours, in client-go's form.
    assert re.fullmatch(r"kube-syncer/[^ /]+ \([a-z0-9]+/[a-z0-9]+\)", api.user_agent), api.user_agent
    created = await ResourceClient(api, CONFIGMAPS).create(configmap("no-manager", namespace, a="1"))
    assert [m["manager"] for m in created["metadata"]["managedFields"]] == ["kube-syncer"]
    named = await ResourceClient(api, CONFIGMAPS, field_manager="mine").create(configmap("manager", namespace, a="1"))
    assert [m["manager"] for m in named["metadata"]["managedFields"]] == ["mine"]


async def test_requests_are_counted_as_client_go_counts_them(control_plane) -> None:
    from prometheus_client import REGISTRY

    def sample(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    async with ApiClient.from_kubeconfig(str(control_plane.kubeconfig)) as api:
        host = api.host.split("://", 1)[1]
        await api.request("GET", "/version")
        with pytest.raises(ApiError):
            await api.request("GET", "/api/v1/namespaces/default/configmaps/no-such-thing")
        assert sample("rest_client_requests_total", code="200", method="GET", host=host) == 1
        assert sample("rest_client_requests_total", code="404", method="GET", host=host) == 1
        assert sample("rest_client_request_duration_seconds_count", verb="GET", host=host) == 2
        closed = ApiClient.from_kubeconfig(str(control_plane.kubeconfig))
        closed.host = "https://127.0.0.1:1"
        with pytest.raises(OSError):
            await closed.request("GET", "/version")
        assert sample("rest_client_requests_total", code="<error>", method="GET", host="127.0.0.1:1") == 1
        await closed.close()  # its series leave with it
        assert sample("rest_client_requests_total", code="<error>", method="GET", host="127.0.0.1:1") == 0
        # a second client of the same server (a rotated member, say): closing one never makes a counter fall
        second = ApiClient.from_kubeconfig(str(control_plane.kubeconfig))
        await second.request("GET", "/version")
        assert sample("rest_client_requests_total", code="200", method="GET", host=host) == 2
        await second.close()
        await second.close()
        assert sample("rest_client_requests_total", code="200", method="GET", host=host) == 2
    assert sample("rest_client_requests_total", code="200", method="GET", host=host) == 0


async def test_list_pages_through_and_types_items(api: ApiClient, namespace: str) -> None:
    cms = ResourceClient(api, CONFIGMAPS)
    for i in range(7):
        await cms.create(configmap(f"p{i}", namespace, i=str(i)) | {
            "metadata": {"name": f"p{i}", "namespace": namespace, "labels": {"odd": str(i % 2)}}})
    items = await cms.list(namespace, limit=3)
    names = [o["metadata"]["name"] for o in items]
    assert [n for n in names if n.startswith("p")] == [f"p{i}" for i in range(7)]
    assert all(o["apiVersion"] == "v1" and o["kind"] == "ConfigMap" for o in items)
    odd = await cms.list(namespace, label_selector="odd=1", limit=2)
    assert [o["metadata"]["name"] for o in odd] == ["p1", "p3", "p5"]
    by_field = await cms.list(namespace, field_selector="metadata.name=p4")
    assert [o["metadata"]["name"] for o in by_field] == ["p4"]
    everywhere = await cms.list(label_selector="odd", limit=None)  # all namespaces, one response
    assert {o["metadata"]["name"] for o in everywhere if o["metadata"]["namespace"] == namespace} == \
        {f"p{i}" for i in range(7)}


async def test_list_starts_over_when_its_continue_token_expires() -> None:
    class Pages:
        def __init__(self) -> None:
            self.calls: list[dict[str, str]] = []

        async def request(self, method: str, path: str, params: Any = None, *args: Any, **kw: Any) -> Any:
            self.calls.append(dict(params or {}))
            if "continue" in (params or {}):
                raise ApiError.for_status_code(410, "Expired", "continue token expired")
            if "limit" in (params or {}):
                return {"kind": "ConfigMapList", "apiVersion": "v1", "metadata": {"continue": "t1"},
                        "items": [{"metadata": {"name": "first"}}]}
            return {"kind": "ConfigMapList", "apiVersion": "v1", "metadata": {},
                    "items": [{"metadata": {"name": "first"}}, {"metadata": {"name": "second"}}]}

    pages = Pages()
    cms = ResourceClient(pages, CONFIGMAPS, namespaced=True)  # type: ignore[arg-type]
    items = await cms.list("ns", label_selector="a=b", limit=1)
    assert [o["metadata"]["name"] for o in items] == ["first", "second"]
    assert pages.calls == [{"labelSelector": "a=b", "limit": "1"},
                           {"labelSelector": "a=b", "limit": "1", "continue": "t1"}, {"labelSelector": "a=b"}]


async def test_invalid_objects_give_invalid_with_causes(api: ApiClient, namespace: str, crds) -> None:
    with pytest.raises(Invalid) as bad_name:
        await ResourceClient(api, CONFIGMAPS).create(configmap("Not_A_Name", namespace))
    assert bad_name.value.status == 422 and any(c.get("field") == "metadata.name" for c in bad_name.value.causes)
    widgets = ResourceClient(api, crds["namespaced"])
    with pytest.raises(Invalid) as negative:
        await widgets.create(widget(crds["namespaced"], "w", namespace, size=-1))
    assert [c["field"] for c in negative.value.causes] == ["spec.size"]


async def test_forbidden_and_unauthorized_are_typed(control_plane, namespace: str) -> None:
    async with ApiClient.from_kubeconfig(str(control_plane.kubeconfig), context="restricted") as restricted:
        cms = ResourceClient(restricted, CONFIGMAPS, namespaced=True)
        with pytest.raises(Forbidden) as refused:
            await cms.get("anything", namespace)
        assert refused.value.status == 403
        with pytest.raises(Forbidden):
            await cms.create(configmap("x", namespace))
        restricted.configuration.api_key["authorization"] = "Bearer not-a-token"
        with pytest.raises(Unauthorized):
            await cms.get("anything", namespace)


async def test_gone_for_a_compacted_resource_version_and_list_starts_over(control_plane_factory) -> None:
    # Without a watch cache for ConfigMaps, old resourceVersions and continue tokens are read from etcd, where
    # compaction removes them (the shared control plane's watch cache would still serve them).
    cp = control_plane_factory(extra_apiserver_flags=["--watch-cache-sizes=configmaps#0"])
    async with ApiClient.from_kubeconfig(str(cp.kubeconfig)) as api:
        cms = ResourceClient(api, CONFIGMAPS)
        for i in range(3):
            await cms.create(configmap(f"c{i}", "default"))
        first_page = await api.request("GET", CONFIGMAPS.path("default"), {"limit": "1"})
        for i in range(3):
            await cms.patch(f"c{i}", {"data": {"v": "2"}}, type="merge", namespace="default")
        await asyncio.to_thread(cp.compact)
        with pytest.raises(Gone) as gone:
            await api.request("GET", CONFIGMAPS.path("default"), {
                "resourceVersion": first_page["metadata"]["resourceVersion"], "resourceVersionMatch": "Exact"})
        assert gone.value.is_gone and gone.value.status == 410
        with pytest.raises(Gone):
            await api.request("GET", CONFIGMAPS.path("default"), {
                "limit": "1", "continue": first_page["metadata"]["continue"]})


# -- scope ----------------------------------------------------------------------------------------------------


async def test_wrong_scope_is_a_value_error_naming_the_resource(api: ApiClient, namespace: str, crds) -> None:
    cms = ResourceClient(api, CONFIGMAPS)  # scope from discovery
    with pytest.raises(ValueError, match=r"configmaps\.v1 is namespaced.*'a'"):
        await cms.get("a")
    with pytest.raises(ValueError, match=r"configmaps\.v1 is namespaced"):
        await cms.create(configmap("a", namespace) | {"metadata": {"name": "a"}})
    gadgets = ResourceClient(api, crds["cluster"], namespaced=False)
    with pytest.raises(ValueError, match=rf"{crds['cluster']} is cluster-scoped.*{namespace}"):
        await gadgets.create(widget(crds["cluster"], "g", namespace, kind="Gadget"))
    with pytest.raises(ValueError, match="cluster-scoped"):
        await gadgets.delete("g", namespace)
    assert await cms.namespaced() and not await ResourceClient(api, crds["cluster"]).namespaced()


# -- custom resources: both scopes, status, apply, dry run ----------------------------------------------------


@pytest.mark.parametrize("scope", ["namespaced", "cluster"])
async def test_custom_resource_verbs_in_both_scopes(api: ApiClient, namespace: str, crds, scope: str) -> None:
    gvr = crds[scope]
    kind, ns = ("Widget", namespace) if scope == "namespaced" else ("Gadget", None)
    name = f"o-{uuid.uuid4().hex[:6]}"
    client = ResourceClient(api, gvr, field_manager="tests")
    created = await client.create(widget(gvr, name, ns, size=1, kind=kind))
    assert created["metadata"].get("namespace") == ns and created["metadata"]["generation"] == 1
    listed = await client.list(ns)
    assert [o for o in listed if o["metadata"]["name"] == name][0]["kind"] == kind
    created["spec"]["size"] = 2
    updated = await client.update(created)
    assert updated["spec"]["size"] == 2
    # status subresource: writes to it leave spec alone, and spec writes leave status alone
    updated["status"] = {"phase": "Ready"}
    updated["spec"]["size"] = 99
    status_written = await client.update_status(updated)
    assert status_written["status"] == {"phase": "Ready"} and status_written["spec"]["size"] == 2
    patched = await client.patch_status(name, {"status": {"observed": 2}}, type="merge", namespace=ns)
    assert patched["status"] == {"phase": "Ready", "observed": 2}
    applied = await client.apply_status(widget(gvr, name, ns, kind=kind) | {"status": {"phase": "Applied"}},
                                        field_manager="status-applier", force=True)  # "tests" owns phase
    assert applied["status"]["phase"] == "Applied" and applied["spec"]["size"] == 2
    spec_patch = await client.patch(name, {"spec": {"size": 3}, "status": {"phase": "Ignored"}}, type="merge",
                                    namespace=ns)
    assert spec_patch["spec"]["size"] == 3 and spec_patch["status"]["phase"] == "Applied"
    json_patched = await client.patch(name, [{"op": "replace", "path": "/spec/size", "value": 4}], type="json",
                                      namespace=ns)
    assert json_patched["spec"]["size"] == 4
    with pytest.raises(UnsupportedMediaType, match=rf"{gvr} does not support strategic merge patches"):
        await client.patch(name, {"spec": {"size": 5}}, type="strategic", namespace=ns)
    # a delete held up by a finalizer returns the object, marked for deletion; otherwise there is nothing to return
    await client.patch(name, {"metadata": {"finalizers": ["tests/hold"]}}, type="merge", namespace=ns)
    held = await client.delete(name, ns, uid=created["metadata"]["uid"])
    assert held is not None and held["metadata"]["deletionTimestamp"]
    await client.patch(name, {"metadata": {"finalizers": None}}, type="merge", namespace=ns)
    with pytest.raises(NotFound):
        await client.get(name, ns)
    await client.create(widget(gvr, name, ns, kind=kind))
    assert await client.delete(name, ns) is None
    with pytest.raises(NotFound):
        await client.get(name, ns)


async def test_dry_run_writes_persist_nothing(api: ApiClient, namespace: str, crds) -> None:
    gvr = crds["namespaced"]
    client = ResourceClient(api, gvr, field_manager="tests")
    dry = await client.create(widget(gvr, "d", namespace), dry_run=True)
    assert dry["metadata"]["name"] == "d" and dry["metadata"]["uid"]
    with pytest.raises(NotFound):
        await client.get("d", namespace)
    assert (await client.apply(widget(gvr, "d", namespace), dry_run=True))["spec"]["size"] == 1
    with pytest.raises(NotFound):
        await client.get("d", namespace)
    real = await client.create(widget(gvr, "d", namespace, size=1))
    rv = real["metadata"]["resourceVersion"]
    real["spec"]["size"] = 7
    assert (await client.update(real, dry_run=True))["spec"]["size"] == 7
    assert (await client.patch("d", {"spec": {"size": 8}}, type="merge", namespace=namespace,
                               dry_run=True))["spec"]["size"] == 8
    assert (await client.apply(widget(gvr, "d", namespace, size=9), dry_run=True, force=True))["spec"]["size"] == 9
    real["status"] = {"phase": "dry"}
    assert (await client.update_status(real, dry_run=True))["status"] == {"phase": "dry"}
    assert (await client.patch_status("d", {"status": {"phase": "dry"}}, type="merge", namespace=namespace,
                                      dry_run=True))["status"] == {"phase": "dry"}
    assert (await client.apply_status(widget(gvr, "d", namespace) | {"status": {"phase": "dry"}},
                                      dry_run=True))["status"] == {"phase": "dry"}
    await client.delete("d", namespace, dry_run=True)
    after = await client.get("d", namespace)
    assert after["metadata"]["resourceVersion"] == rv and after["spec"]["size"] == 1 and "status" not in after


async def test_server_side_apply_with_two_managers(api: ApiClient, namespace: str, crds) -> None:
    gvr = crds["namespaced"]
    alice = ResourceClient(api, gvr, field_manager="alice")
    bob = ResourceClient(api, gvr, field_manager="bob")
    first = await alice.apply(widget(gvr, "shared", namespace, size=1))  # creates it
    assert first["spec"]["size"] == 1
    same = await bob.apply(widget(gvr, "shared", namespace, size=1))  # same value: co-owned, no conflict
    assert same["spec"]["size"] == 1
    await alice.apply(widget(gvr, "shared", namespace, size=1) | {"metadata": {
        "name": "shared", "namespace": namespace, "labels": {"by": "alice"}}})
    with pytest.raises(Conflict) as conflict:
        await bob.apply(widget(gvr, "shared", namespace, size=2))
    assert conflict.value.status == 409
    assert [(c["reason"], c["field"]) for c in conflict.value.causes] == [("FieldManagerConflict", ".spec.size")]
    assert "alice" in conflict.value.causes[0]["message"]
    taken = await bob.apply(widget(gvr, "shared", namespace, size=2), force=True)
    assert taken["spec"]["size"] == 2 and taken["metadata"]["labels"] == {"by": "alice"}
    owners = {m["manager"]: json.dumps(m.get("fieldsV1")) for m in taken["metadata"]["managedFields"]}
    assert '"f:size"' in owners["bob"] and '"f:size"' not in owners["alice"]
    with pytest.raises(ValueError, match="field_manager"):
        await ResourceClient(api, gvr).apply(widget(gvr, "shared", namespace))


# -- mapper ---------------------------------------------------------------------------------------------------


async def test_mapper_maps_kinds_and_refreshes_on_a_miss(api: ApiClient, admin_client, crds) -> None:
    mapper = RESTMapper(api, min_refresh_interval=0.2)
    assert await mapper.gvr_for("v1", "ConfigMap") == CONFIGMAPS
    assert await mapper.gvr_for("apps/v1", "Deployment") == GVR("apps", "v1", "deployments")
    assert await mapper.kind_for(GVR("", "v1", "namespaces")) == "Namespace"
    assert await mapper.is_namespaced(CONFIGMAPS) and not await mapper.is_namespaced(GVR("", "v1", "namespaces"))
    assert await mapper.gvr_for(crds["cluster"].group_version, "Gadget") == crds["cluster"]
    assert not await mapper.is_namespaced(crds["cluster"])
    with pytest.raises(NoMatchError, match=r"kind Sprocket in apiVersion v1"):
        await mapper.gvr_for("v1", "Sprocket")
    # a kind installed after the mapper's last pass is found by the refresh its miss triggers
    late = await asyncio.to_thread(install_crd, admin_client, "Namespaced", "Sprocket", "sprockets")
    try:
        assert await mapper.gvr_for(late.group_version, "Sprocket") == late
        assert await ResourceClient(api, late, mapper=mapper).namespaced()
    finally:
        kubernetes.client.ApiextensionsV1Api(admin_client).delete_custom_resource_definition(
            f"{late.resource}.{late.group}")


async def test_mapper_misses_share_one_discovery_pass_and_passes_are_spaced() -> None:
    class CountingDiscovery(DiscoveryClient):
        def __init__(self) -> None:
            super().__init__(None)  # type: ignore[arg-type]
            self.passes: list[float] = []

        async def discover(self) -> DiscoveryResult:
            self.passes.append(time.monotonic())
            await asyncio.sleep(0.01)
            return DiscoveryResult({CONFIGMAPS: ResourceInfo(CONFIGMAPS, "ConfigMap", True, frozenset(), True)})

    discovery = CountingDiscovery()
    mapper = RESTMapper(discovery, min_refresh_interval=0.3)
    found = await asyncio.gather(*(mapper.gvr_for("v1", "ConfigMap") for _ in range(10)))
    assert found == [CONFIGMAPS] * 10 and len(discovery.passes) == 1
    misses = await asyncio.gather(*(mapper.gvr_for("v1", "Nope") for _ in range(10)), return_exceptions=True)
    assert all(isinstance(m, NoMatchError) for m in misses) and len(discovery.passes) == 2
    assert discovery.passes[1] - discovery.passes[0] >= 0.3
