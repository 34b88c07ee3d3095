"""Issue 14 foundations: CachedObject wrapper names, labels and bodies (syncer.builtin.cached_resources.naming),
LabelSelector.from_spec, the CachedObjectReader, and the two CRDs in deploy/crds on a real API server."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

import kubernetes
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry

from informers import GVR, AlreadyExists, ApiClient, Invalid, InformerMetrics, SharedIndexInformer
from informers.frozen import freeze
from informers.selector import LabelSelector, SelectorError
from syncer.builtin.cached_resources import naming
from syncer.builtin.cached_resources.naming import (
    ANNOTATION_IDENTITY_HASH, ANNOTATION_ORIGINAL_CLUSTER, ANNOTATION_ORIGINAL_NAME, ANNOTATION_ORIGINAL_NAMESPACE,
    ANNOTATION_ORIGINAL_RESOURCE_VERSION, ANNOTATION_ORIGINAL_UID, CACHED_OBJECTS, CLUSTER_CACHED_RESOURCES,
    LABEL_CLUSTER, LABEL_GROUP, LABEL_ORIGINAL_NAME, LABEL_ORIGINAL_NAMESPACE, LABEL_RESOURCE, LABEL_SCHEMA,
    LABEL_VERSION, is_dns_subdomain, is_label_value, is_wrapper_of, label_value, schema, schema_selector, source_of,
    wrapper_for, wrapper_name,
)
from syncer.builtin.cached_resources.reader import INDEX_SCHEMA, CachedObjectReader

from tests.helpers import eventually
from tests.kube import wait_established

CRDS = Path(__file__).resolve().parents[2] / "deploy" / "crds"
INSTANCES = GVR("machines.svm.io", "v1alpha1", "instances")
NAMESPACES = GVR("", "v1", "namespaces")
CONFIGMAPS = GVR("", "v1", "configmaps")


def source(name: str, namespace: str | None = None, *, rv: str = "7", uid: str = "u-1", **extra: object) -> dict:
    meta: dict = {"name": name, "resourceVersion": rv, "uid": uid, "labels": {"app": "web"},
                  "managedFields": [{"manager": "kubectl", "operation": "Apply"}]}
    if namespace:
        meta["namespace"] = namespace
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"k": "v"}, **extra}


# -- wrapper names ---------------------------------------------------------------------------------------------
def test_seed_form_for_cluster_scoped_objects_of_the_local_cluster():
    assert schema(INSTANCES) == "v1alpha1.instances.machines.svm.io"
    assert wrapper_name(INSTANCES, "web-server-1") == "v1alpha1.instances.machines.svm.io.web-server-1"
    assert schema(NAMESPACES) == "v1.namespaces.core"
    assert wrapper_name(NAMESPACES, "default") == "v1.namespaces.core.default"
    assert wrapper_name(NAMESPACES, "default", "") == "v1.namespaces.core.default"  # "" namespace = none
    # Dotted names stay readable too (a CRD, an APIService).
    assert wrapper_name(GVR("apiregistration.k8s.io", "v1", "apiservices"), "v1.apps") == \
        "v1.apiservices.apiregistration.k8s.io.v1.apps"


def test_namespace_and_cluster_extension():
    assert wrapper_name(CONFIGMAPS, "settings", "default") == "v1.configmaps.core.default.settings"
    assert wrapper_name(CONFIGMAPS, "kube-root-ca.crt", "kube-system") == \
        "v1.configmaps.core.kube-system.kube-root-ca.crt"
    assert wrapper_name(CONFIGMAPS, "settings", "default", "east") == "east.v1.configmaps.core.default.settings"
    assert wrapper_name(CONFIGMAPS, "settings", "default", "prod.eu") == \
        "prod.eu.v1.configmaps.core.default.settings"
    assert wrapper_name(INSTANCES, "web-server-1", cluster="east") == \
        "east.v1alpha1.instances.machines.svm.io.web-server-1"
    # Same-named objects of two clusters (and the local one) get distinct wrappers.
    names = {wrapper_name(CONFIGMAPS, "settings", "default", c) for c in ("", "east", "west")}
    assert len(names) == 3


def test_hash_fallback_for_a_long_name_is_valid_stable_and_distinct():
    long = "n" * 250
    name = wrapper_name(CONFIGMAPS, long, "default")
    assert is_dns_subdomain(name) and len(name) <= 253
    assert name.startswith("v1.configmaps.core-") and len(name) == len("v1.configmaps.core-") + 32
    assert name == wrapper_name(CONFIGMAPS, long, "default")  # stable
    others = {wrapper_name(CONFIGMAPS, long, "other"), wrapper_name(CONFIGMAPS, long, "default", "east"),
              wrapper_name(CONFIGMAPS, long[:-1] + "m", "default"), wrapper_name(GVR("", "v2", "configmaps"), long)}
    assert name not in others and len(others) == 4
    # A name that is no DNS name (ClusterRoles "system:...") and a long group also fall back to a valid name.
    for gvr, obj in ((GVR("rbac.authorization.k8s.io", "v1", "clusterroles"), "system:controller:job"),
                     (GVR("a" * 60 + "." + "b" * 60 + "." + "c" * 60 + ".io", "v1", "things"), "x" * 40)):
        hashed = wrapper_name(gvr, obj)
        assert is_dns_subdomain(hashed) and len(hashed) <= 253, hashed


def test_a_name_that_would_read_back_differently_falls_back_to_the_hash():
    # A cluster whose own name contains the schema: the readable form would read back as another source.
    odd = wrapper_name(CONFIGMAPS, "name", "ns", "a.v1.configmaps.core.b")
    assert odd.startswith("v1.configmaps.core-")
    assert odd != wrapper_name(CONFIGMAPS, "v1.configmaps.core.ns.name", "b", "a")


_piece = st.text(alphabet="ab.", min_size=1, max_size=6)
_cluster = st.one_of(st.just(""), _piece, st.sampled_from(["a.v1.configmaps.core", "v1.configmaps.core.a"]))


@settings(max_examples=400, deadline=None)
@given(a=st.tuples(_cluster, _piece, _piece), b=st.tuples(_cluster, _piece, _piece), namespaced=st.booleans())
def test_names_are_valid_and_one_to_one_within_a_resource(a, b, namespaced):
    def name_of(t):
        cluster, ns, name = t
        return wrapper_name(CONFIGMAPS, name, ns if namespaced else None, cluster)

    for t in (a, b):
        assert is_dns_subdomain(name_of(t))
    if (a if namespaced else (a[0], "", a[2])) != (b if namespaced else (b[0], "", b[2])):
        assert name_of(a) != name_of(b), (a, b)


def test_one_function_names_the_wrapper_for_create_update_delete_and_lookup():
    cases = [(CONFIGMAPS, "settings", "default", ""), (CONFIGMAPS, "settings", "default", "east"),
             (NAMESPACES, "x" * 250, None, "west"), (INSTANCES, "web-server-1", None, "")]
    for gvr, name, ns, cluster in cases:
        wrapper = wrapper_for(gvr, source(name, ns), cluster, "id")
        expected = wrapper_name(gvr, name, ns, cluster)
        assert wrapper["metadata"]["name"] == expected
        # A wrapper's event maps back to its source, whose name is the wrapper's again.
        c, n, nm = source_of(wrapper)
        assert (c, n, nm) == (cluster, ns, name) and wrapper_name(gvr, nm, n, c) == expected
        # An update (new resourceVersion) keeps the name.
        assert wrapper_for(gvr, source(name, ns, rv="8"), cluster, "id")["metadata"]["name"] == expected


# -- label values ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("value", ["", "web-server-1", "a", "v1alpha1.instances.machines.svm.io", "x" * 63])
def test_label_value_keeps_valid_values(value):
    assert label_value(value) == value


@pytest.mark.parametrize("value", ["x" * 64, "n" * 250, "system:controller:job", "-lead", "trail.", "a b",
                                   ":" * 70, "ünïcode"])
def test_label_value_substitutes_a_valid_stable_value(value):
    sub = label_value(value)
    assert is_label_value(sub) and sub != value and len(sub) <= 63
    assert label_value(value) == sub
    assert label_value(value + "z") != sub


@given(st.text(max_size=300))
def test_label_value_is_always_valid(value):
    assert is_label_value(label_value(value))


def test_truncated_labels_keep_the_full_source_in_annotations():
    long_name, cluster = "n" * 250, "c" * 40 + "." + "d" * 40
    wrapper = wrapper_for(NAMESPACES, source(long_name), cluster, "h")
    labels, annotations = wrapper["metadata"]["labels"], wrapper["metadata"]["annotations"]
    assert all(is_label_value(v) for v in labels.values())
    assert annotations[ANNOTATION_ORIGINAL_NAME] == long_name
    assert annotations[ANNOTATION_ORIGINAL_CLUSTER] == cluster
    assert ANNOTATION_ORIGINAL_NAMESPACE not in annotations  # "" fits a label
    assert source_of(wrapper) == (cluster, None, long_name)


# -- wrapper bodies --------------------------------------------------------------------------------------------
def test_wrapper_for_builds_the_whole_cached_object():
    obj = source("settings", "default")
    wrapper = wrapper_for(CONFIGMAPS, freeze(obj), "east", "abc123")  # informers hand out frozen objects
    assert wrapper["apiVersion"] == "cache.kcp.io/v1alpha1" and wrapper["kind"] == "CachedObject"
    meta = wrapper["metadata"]
    assert meta["labels"] == {
        LABEL_SCHEMA: "v1.configmaps.core", LABEL_GROUP: "core", LABEL_VERSION: "v1",
        LABEL_RESOURCE: "configmaps", LABEL_ORIGINAL_NAME: "settings", LABEL_ORIGINAL_NAMESPACE: "default",
        LABEL_CLUSTER: "east"}
    assert meta["annotations"] == {ANNOTATION_ORIGINAL_RESOURCE_VERSION: "7", ANNOTATION_ORIGINAL_UID: "u-1",
                                   ANNOTATION_IDENTITY_HASH: "abc123"}
    raw = wrapper["spec"]["raw"]
    assert "managedFields" not in raw["metadata"] and "managedFields" in obj["metadata"]  # source untouched
    expected = json.loads(json.dumps(obj))
    del expected["metadata"]["managedFields"]
    assert raw == expected
    raw["data"]["k"] = "changed"  # a plain copy, ready to send
    assert obj["data"]["k"] == "v"
    # Cluster-scoped, local: the seed's empty original-namespace, and "" for the local cluster.
    local = wrapper_for(INSTANCES, source("web-server-1"), "", "h")["metadata"]["labels"]
    assert local[LABEL_ORIGINAL_NAMESPACE] == "" and local[LABEL_CLUSTER] == "" and local[LABEL_GROUP] == \
        "machines.svm.io"


def test_schema_selector_selects_one_schema_and_optionally_one_cluster():
    east = wrapper_for(CONFIGMAPS, source("a", "ns"), "east", "h")["metadata"]["labels"]
    local = wrapper_for(CONFIGMAPS, source("a", "ns"), "", "h")["metadata"]["labels"]
    other = wrapper_for(NAMESPACES, source("a"), "east", "h")["metadata"]["labels"]
    everything = LabelSelector.parse(schema_selector(CONFIGMAPS))
    assert everything.matches(east) and everything.matches(local) and not everything.matches(other)
    only_east = LabelSelector.parse(schema_selector(CONFIGMAPS, "east"))
    assert only_east.matches(east) and not only_east.matches(local)
    only_local = LabelSelector.parse(schema_selector(CONFIGMAPS, ""))
    assert only_local.matches(local) and not only_local.matches(east)
    assert schema_selector(CONFIGMAPS, "") == "cache.kcp.io/object-schema=v1.configmaps.core,cache.kcp.io/object-cluster="


# -- LabelSelector.from_spec ------------------------------------------------------------------------------------
@pytest.mark.parametrize("spec", [None, {}, {"matchLabels": {}, "matchExpressions": []}])
def test_from_spec_empty_selects_everything(spec):
    sel = LabelSelector.from_spec(spec)
    assert not sel and str(sel) == "" and sel.matches({}) and sel.matches({"a": "b"})


@pytest.mark.parametrize("expr,yes,no", [
    ({"key": "tier", "operator": "In", "values": ["web", "db"]}, [{"tier": "db"}], [{"tier": "x"}, {}]),
    ({"key": "tier", "operator": "NotIn", "values": ["web"]}, [{"tier": "db"}, {}], [{"tier": "web"}]),
    ({"key": "tier", "operator": "Exists"}, [{"tier": ""}, {"tier": "a"}], [{}]),
    ({"key": "tier", "operator": "DoesNotExist", "values": []}, [{}, {"x": "1"}], [{"tier": "a"}]),
])
def test_from_spec_every_operator(expr, yes, no):
    sel = LabelSelector.from_spec({"matchExpressions": [expr]})
    assert all(sel.matches(lbl) for lbl in yes) and not any(sel.matches(lbl) for lbl in no)
    assert LabelSelector.parse(str(sel)).requirements == sel.requirements  # the text says the same


def test_from_spec_ands_labels_and_expressions_and_its_text_parses_back():
    sel = LabelSelector.from_spec({
        "matchLabels": {"app": "web", "example.com/team": ""},
        "matchExpressions": [{"key": "env", "operator": "NotIn", "values": ["dev"]},
                             {"key": "skip", "operator": "DoesNotExist"}]})
    assert str(sel) == "app=web,example.com/team=,env notin (dev),!skip"
    assert sel.matches({"app": "web", "example.com/team": "", "env": "prod"})
    assert not sel.matches({"app": "web", "example.com/team": "", "env": "dev"})
    assert not sel.matches({"app": "web", "example.com/team": "", "skip": "1"})
    assert not sel.matches({"app": "web"})
    assert LabelSelector.parse(str(sel)).requirements == sel.requirements


@pytest.mark.parametrize("spec,field", [
    ("app=web", "label selector: expected an object"),
    ({"matchLabels": ["app"]}, "matchLabels: expected an object"),
    ({"matchLabels": {"app": 1}}, "matchLabels['app']: a label value must be a string"),
    ({"matchLabels": {"app": "bad value"}}, "matchLabels['app']: label value 'bad value'"),
    ({"matchLabels": {"bad key": "x"}}, "matchLabels key 'bad key'"),
    ({"matchLabels": {"Bad_Prefix/x": "x"}}, "the prefix of label key"),
    ({"matchExpressions": {"key": "a"}}, "matchExpressions: expected a list"),
    ({"matchExpressions": ["a"]}, "matchExpressions[0]: expected an object"),
    ({"matchExpressions": [{"operator": "Exists"}]}, "matchExpressions[0].key: required"),
    ({"matchExpressions": [{"key": "a", "operator": "Equals", "values": ["x"]}]},
     "matchExpressions[0].operator: 'Equals' is not one of In, NotIn, Exists, DoesNotExist"),
    ({"matchExpressions": [{"key": "a", "operator": "in", "values": ["x"]}]}, "matchExpressions[0].operator"),
    ({"matchExpressions": [{"key": "a", "operator": "Exists"}, {"key": "b", "operator": "In"}]},
     "matchExpressions[1].values: must be non-empty when operator is In"),
    ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": []}]},
     "matchExpressions[0].values: must be non-empty when operator is NotIn"),
    ({"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]},
     "matchExpressions[0].values: must be empty when operator is Exists"),
    ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["x", 3]}]},
     "matchExpressions[0].values[1]: a label value must be a string"),
    ({"matchExpressions": [{"key": "a", "operator": "In", "values": "x"}]},
     "matchExpressions[0].values: expected a list of strings"),
    ({"matchExpressions": [{"key": 5, "operator": "Exists"}]}, "matchExpressions[0].key: a label key must be a string"),
])
def test_from_spec_errors_name_the_field(spec, field):
    with pytest.raises(SelectorError) as err:
        LabelSelector.from_spec(spec)
    assert field in str(err.value)


# -- the reader ------------------------------------------------------------------------------------------------
def local_informer() -> SharedIndexInformer:
    """A real CachedObjects informer fed by the test in place of a reflector (no API server)."""
    inf = SharedIndexInformer(None, CACHED_OBJECTS, metrics=InformerMetrics.for_registry(CollectorRegistry()))  # type: ignore[arg-type]
    inf.reflector.run = asyncio.Event().wait  # type: ignore[method-assign]
    return inf


def stored(wrapper: dict, rv: str = "1") -> dict:
    wrapper = json.loads(json.dumps(wrapper))
    wrapper["metadata"]["resourceVersion"] = rv
    return wrapper


async def test_reader_gets_and_lists_through_the_schema_index():
    inf = local_informer()
    reader = CachedObjectReader(inf)
    assert INDEX_SCHEMA in inf.store.indexers
    CachedObjectReader(inf)  # a second reader shares the index
    long = "n" * 250
    wrappers = [wrapper_for(CONFIGMAPS, source("a", "ns", uid="1"), "", "h"),
                wrapper_for(CONFIGMAPS, source("a", "ns", uid="2"), "east", "h"),
                wrapper_for(CONFIGMAPS, source(long, "ns", uid="3"), "east", "h"),
                wrapper_for(NAMESPACES, source("a", uid="4"), "", "h")]
    inf.start()
    try:
        inf.replace([stored(w) for w in wrappers], "10")
        assert reader.get(CONFIGMAPS, "a", "ns")["metadata"]["uid"] == "1"
        assert reader.get(CONFIGMAPS, "a", "ns", "east")["metadata"]["uid"] == "2"
        assert reader.get(CONFIGMAPS, long, "ns", "east")["metadata"]["uid"] == "3"
        assert reader.get(NAMESPACES, "a")["metadata"]["uid"] == "4"
        assert reader.get(CONFIGMAPS, "a", "ns", "west") is None and reader.get(CONFIGMAPS, "b", "ns") is None
        assert reader.get_wrapper(CONFIGMAPS, "a", "ns")["metadata"]["annotations"][ANNOTATION_IDENTITY_HASH] == "h"
        assert sorted(o["metadata"]["uid"] for o in reader.list(CONFIGMAPS)) == ["1", "2", "3"]
        assert sorted(o["metadata"]["uid"] for o in reader.list(CONFIGMAPS, "east")) == ["2", "3"]
        assert [o["metadata"]["uid"] for o in reader.list(CONFIGMAPS, "")] == ["1"]
        assert reader.count(CONFIGMAPS) == 3 and reader.count(NAMESPACES) == 1 and reader.list(INSTANCES) == []
        # A deleted wrapper leaves the index.
        inf.apply("DELETED", stored(wrappers[1], "11"))
        assert reader.get(CONFIGMAPS, "a", "ns", "east") is None and reader.count(CONFIGMAPS, "east") == 1
    finally:
        await inf.stop()


async def test_reader_never_returns_another_schemas_object_under_the_same_name():
    # The seed's own ambiguity: group "apps" + name "example.io.x" and group "apps.example.io" + name "x".
    short, dotted = GVR("apps", "v1", "deployments"), GVR("apps.example.io", "v1", "deployments")
    assert wrapper_name(short, "example.io.x") == wrapper_name(dotted, "x")
    inf = local_informer()
    reader = CachedObjectReader(inf)
    inf.start()
    try:
        inf.replace([stored(wrapper_for(dotted, source("x", uid="dotted"), "", "h"))], "1")
        assert reader.get(dotted, "x")["metadata"]["uid"] == "dotted"
        assert reader.get(short, "example.io.x") is None
        assert not is_wrapper_of(reader.get_wrapper(dotted, "x"), short, "example.io.x")
    finally:
        await inf.stop()


def test_reader_needs_a_cached_objects_informer():
    inf = SharedIndexInformer(None, CONFIGMAPS, metrics=InformerMetrics.for_registry(CollectorRegistry()))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="cachedobjects"):
        CachedObjectReader(inf)


# -- the CRDs on a real API server -----------------------------------------------------------------------------
def install(admin_client: kubernetes.client.ApiClient) -> None:
    """Create both CRDs (or bring an existing copy up to date: other tests of the session may have installed
    them) and wait until they are served."""
    api = kubernetes.client.ApiextensionsV1Api(admin_client)
    for path in sorted(CRDS.glob("*.json")):
        body = json.loads(path.read_text())
        try:
            api.create_custom_resource_definition(body)
        except kubernetes.client.ApiException as e:
            if e.status != 409:
                raise
            current = api.read_custom_resource_definition(body["metadata"]["name"])
            body["metadata"]["resourceVersion"] = current.metadata.resource_version
            api.replace_custom_resource_definition(body["metadata"]["name"], body)
        wait_established(admin_client, body["metadata"]["name"])


def test_deploy_crds_are_the_two_resources():
    names = {json.loads(p.read_text())["metadata"]["name"] for p in CRDS.glob("*.json")}
    assert names == {"clustercachedresources.cache.kcp.io", "cachedobjects.cache.kcp.io"}
    for path in CRDS.glob("*.json"):
        crd = json.loads(path.read_text())
        assert path.name == f"{crd['spec']['group']}_{crd['spec']['names']['plural']}.json"
        assert crd["spec"]["scope"] == "Cluster"
        [version] = crd["spec"]["versions"]
        assert version["name"] == naming.VERSION and version["served"] and version["storage"]


async def test_crds_apply_and_accept_resources_and_wrappers(admin_client, api: ApiClient):
    install(admin_client)
    suffix = uuid.uuid4().hex[:8]
    ccr_name = f"instances-{suffix}"
    ccr = {
        "apiVersion": "cache.kcp.io/v1alpha1", "kind": "ClusterCachedResource", "metadata": {"name": ccr_name},
        "spec": {"group": "machines.svm.io", "version": "v1alpha1", "resource": "instances",
                 "labelSelector": {"matchLabels": {"app": "web"}, "matchExpressions": [
                     {"key": "tier", "operator": "In", "values": ["a", "b"]},
                     {"key": "env", "operator": "NotIn", "values": ["dev"]},
                     {"key": "owner", "operator": "Exists"},
                     {"key": "skip", "operator": "DoesNotExist"}]},
                 "identity": {"secretRef": {"namespace": "kube-system", "name": "instances-identity"}}}}
    wrappers: list[str] = []
    try:
        created = await api.request("POST", CLUSTER_CACHED_RESOURCES.path(), body=ccr)
        assert created["spec"] == ccr["spec"]  # nothing pruned: the selector's expressions are kept
        assert str(LabelSelector.from_spec(created["spec"]["labelSelector"])) == \
            "app=web,tier in (a,b),env notin (dev),owner,!skip"
        # The status subresource takes the whole status; the main resource ignores it.
        status = {"phase": "Ready", "identityHash": "abc", "resourceCounts": {"local": 3, "cache": 2},
                  "conditions": [{"type": "ResourceValid", "status": "True", "reason": "Served", "message": "ok",
                                  "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 1}]}
        updated = await api.request("PUT", CLUSTER_CACHED_RESOURCES.path(name=ccr_name) + "/status",
                                    body={**created, "status": status})
        assert updated["status"] == status
        # The schema refuses what the controller must never write.
        for bad in ({"phase": "Running"}, {"resourceCounts": {"local": "three"}}):
            with pytest.raises(Invalid):
                await api.request("PUT", CLUSTER_CACHED_RESOURCES.path(name=ccr_name) + "/status",
                                  body={**updated, "status": bad})
        with pytest.raises(Invalid):
            bad_selector = {"matchExpressions": [{"key": "a", "operator": "Equals", "values": ["x"]}]}
            await api.request("POST", CLUSTER_CACHED_RESOURCES.path(), body={
                **ccr, "metadata": {"name": f"bad-{suffix}"}, "spec": {**ccr["spec"], "labelSelector": bad_selector}})

        # Wrappers: arbitrary spec.raw kept whole; long and non-DNS names through the hash fallback and label
        # stand-ins are accepted by the server as they are.
        arbitrary = source(f"cm-{suffix}", "default", nested={"list": [1, {"deep": None}], "x-y": True})
        cases = [(CONFIGMAPS, arbitrary, ""), (CONFIGMAPS, source("n" * 250 + suffix, "default"), f"east-{suffix}"),
                 (GVR("rbac.authorization.k8s.io", "v1", "clusterroles"), source(f"system:x:{suffix}"), "")]
        for gvr, obj, cluster in cases:
            body = wrapper_for(gvr, obj, cluster, "abc")
            got = await api.request("POST", CACHED_OBJECTS.path(), body=body)
            wrappers.append(got["metadata"]["name"])
            assert got["spec"]["raw"] == body["spec"]["raw"] and got["metadata"]["labels"] == body["metadata"]["labels"]
            assert source_of(got) == (cluster, obj["metadata"].get("namespace"), obj["metadata"]["name"])
        with pytest.raises(AlreadyExists):  # the same source again: the same name
            await api.request("POST", CACHED_OBJECTS.path(), body=wrapper_for(CONFIGMAPS, arbitrary, "", "abc"))

        # The server takes from_spec's text as a query, every form included (empty values too).
        query = LabelSelector.from_spec({"matchLabels": {"app": "", "x": "y"}, "matchExpressions": [
            {"key": "tier", "operator": "In", "values": ["", "a"]}, {"key": "env", "operator": "NotIn", "values": ["dev"]},
            {"key": "owner", "operator": "Exists"}, {"key": "skip", "operator": "DoesNotExist"}]})
        await api.request("GET", CACHED_OBJECTS.path(), params={"labelSelector": str(query)})
        # The server selects by the schema selector; a reader over a filtered informer finds them.
        listed = await api.request("GET", CACHED_OBJECTS.path(), params={
            "labelSelector": schema_selector(CONFIGMAPS, "")})
        assert wrappers[0] in {w["metadata"]["name"] for w in listed["items"]} and wrappers[1] not in \
            {w["metadata"]["name"] for w in listed["items"]}
        inf = SharedIndexInformer(api, CACHED_OBJECTS, label_selector=schema_selector(CONFIGMAPS),
                                  metrics=InformerMetrics.for_registry(CollectorRegistry()))
        reader = CachedObjectReader(inf)
        inf.start()
        try:
            assert await inf.wait_for_sync(30)
            got = reader.get(CONFIGMAPS, arbitrary["metadata"]["name"], "default")
            assert got is not None and got["nested"] == arbitrary["nested"]
            assert reader.get(CONFIGMAPS, "n" * 250 + suffix, "default", f"east-{suffix}") is not None
            assert len(reader.list(CONFIGMAPS, f"east-{suffix}")) == 1
            assert reader.list(GVR("rbac.authorization.k8s.io", "v1", "clusterroles")) == []  # filtered out
            await api.request("DELETE", CACHED_OBJECTS.path(name=wrappers[0]))
            await eventually(lambda: reader.get(CONFIGMAPS, arbitrary["metadata"]["name"], "default") is None, 15,
                             "the deleted wrapper to leave the reader")
        finally:
            await inf.stop()
    finally:
        for name in wrappers[1:]:
            await api.request("DELETE", CACHED_OBJECTS.path(name=name))
        await api.request("DELETE", CLUSTER_CACHED_RESOURCES.path(name=ccr_name))
