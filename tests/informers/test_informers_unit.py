"""Pure-logic tests of the informers package (no API server involved)."""

from __future__ import annotations

import pytest

from informers import GVR, Backoff, FieldSelector, DeletedFinalStateUnknown, LabelSelector, SelectorError, Store, object_key
from informers.errors import ApiError, describe_error


def cm(name, ns="ns", rv="1", labels=None):
    return {"metadata": {"name": name, "namespace": ns, "resourceVersion": rv, "labels": labels or {}}}


@pytest.mark.parametrize("text,gvr", [
    ("configmaps.v1", GVR("", "v1", "configmaps")),
    ("widgets.v1alpha1.example.com", GVR("example.com", "v1alpha1", "widgets")),
    ("apps/v1/deployments", GVR("apps", "v1", "deployments")),
    ("v1/pods", GVR("", "v1", "pods")),
])
def test_gvr_parse_and_format(text, gvr):
    assert GVR.parse(text) == gvr
    assert GVR.parse(str(gvr)) == gvr


@pytest.mark.parametrize("bad", ["", "configmaps", "a/b/c/d", "/v1/", "v1/", "apps//deployments"])
def test_gvr_parse_errors_name_the_text(bad):
    with pytest.raises(ValueError, match=rf"cannot parse GVR {bad!r}: .*; expected resource.version\[.group\]"):
        GVR.parse(bad)


@pytest.mark.parametrize("bad,why", [
    ("deployments.apps/v1", r"version 'deployments.apps' is not a version such as 'v1' \(did you mean "
                            r"'deployments.v1.apps'\?\)"),
    ("Deployment.v1.apps", r"resource 'Deployment' is not a lower-case resource name \(the plural"),
    ("apps/v1/Deployment", r"resource 'Deployment' is not a lower-case"),
    ("deployments.V1.apps", r"version 'V1' is not a version"),
    ("deployments.v1.Apps", r"group 'Apps' is not a lower-case DNS name"),
    ("apps_x/v1/deployments", r"group 'apps_x'"),
])
def test_gvr_parse_rejects_what_cannot_be_a_gvr(bad, why):
    with pytest.raises(ValueError, match=why):
        GVR.parse(bad)


def test_gvr_paths():
    assert GVR("", "v1", "pods").path("ns", "p") == "/api/v1/namespaces/ns/pods/p"
    assert GVR("apps", "v1", "deployments").path() == "/apis/apps/v1/deployments"


@pytest.mark.parametrize("selector,labels,expected", [
    ("a=b", {"a": "b"}, True),
    ("a==b", {"a": "c"}, False),
    ("a!=b", {}, True),
    ("a in (x, y),b", {"a": "y", "b": ""}, True),
    ("a notin (x)", {"a": "x"}, False),
    ("a notin (x)", {}, True),
    ("!a", {"a": "1"}, False),
    ("!a", {}, True),
    ("app.kubernetes.io/name=web,tier", {"app.kubernetes.io/name": "web", "tier": "1"}, True),
    ("", {"a": "1"}, True),
    ("a=", {"a": ""}, True),
])
def test_label_selector_matching(selector, labels, expected):
    assert LabelSelector.parse(selector).matches(labels) is expected


@pytest.mark.parametrize("bad", ["a=b,", "a in x", "a in (x", "=b", "a b", "a=(b)", "!", "a in (x) y"])
def test_label_selector_errors_quote_the_selector(bad):
    with pytest.raises(SelectorError, match="invalid label selector"):
        LabelSelector.parse(bad)


def test_store_upsert_delete_and_namespace_index():
    s = Store()
    assert s.upsert(cm("a")) is None
    assert s.upsert(cm("a", rv="2"))["metadata"]["resourceVersion"] == "1"
    s.upsert(cm("b", ns="other"))
    s.upsert({"metadata": {"name": "cluster-wide"}})
    assert object_key(cm("a")) == "ns/a"
    assert s.get("cluster-wide") is not None
    assert [o["metadata"]["name"] for o in s.by_index("namespace", "other")] == ["b"]
    assert s.delete("ns/a")["metadata"]["name"] == "a"
    assert s.by_index("namespace", "ns") == []
    assert s.delete("ns/a") is None


def test_store_replace_reports_upserts_and_tombstones():
    s = Store({"color": lambda o: [o["metadata"]["labels"].get("color", "")]})
    s.upsert(cm("keep", labels={"color": "red"}))
    s.upsert(cm("gone", labels={"color": "red"}))
    upserts, deletes = s.replace([cm("keep", rv="5", labels={"color": "blue"}), cm("new")])
    assert [(old and old["metadata"]["resourceVersion"], new["metadata"]["name"]) for old, new in upserts] == [
        ("1", "keep"), (None, "new")]
    assert deletes == [DeletedFinalStateUnknown("ns/gone", cm("gone", labels={"color": "red"}))]
    assert s.by_index("color", "red") == []
    assert [o["metadata"]["name"] for o in s.by_index("color", "blue")] == ["keep"]


def test_store_indexers_added_late_cover_existing_objects_and_names_are_unique():
    s = Store()
    s.upsert(cm("a", labels={"x": "1"}))
    s.add_indexers({"x": lambda o: [o["metadata"]["labels"]["x"]]})
    assert len(s.by_index("x", "1")) == 1
    with pytest.raises(ValueError, match="already exist"):
        s.add_indexers({"x": lambda o: []})
    with pytest.raises(KeyError, match="no index named 'y'"):
        s.by_index("y", "1")
    s.remove_indexers(["x", "unknown", "namespace"])  # the namespace index stays
    assert set(s.indexers) == {"namespace"} and len(s.by_index("namespace", "ns")) == 1
    s.upsert(cm("b", labels={}))  # no longer indexed by x: its missing label is not read
    s.add_indexers({"x": lambda o: [o["metadata"]["labels"].get("x", "")]})  # the name is free again


def test_backoff_doubles_caps_jitters_and_resets():
    now = [0.0]
    b = Backoff(jitter=0.0, clock=lambda: now[0])
    assert [round(b.next(), 2) for _ in range(8)] == [0.8, 1.6, 3.2, 6.4, 12.8, 25.6, 30.0, 30.0]
    now[0] = 500.0  # quiet for more than 2 minutes
    assert b.next() == 0.8
    j = Backoff(rand=lambda: 1.0)
    assert j.next() == pytest.approx(1.6)


def test_api_error_classification():
    assert ApiError(410).is_gone
    assert ApiError.from_status({"kind": "Status", "code": 410, "reason": "Expired"}).is_gone
    too_large = ApiError.from_status({"code": 504, "reason": "Timeout", "details": {
        "causes": [{"reason": "ResourceVersionTooLarge", "message": "Too large resource version"}],
        "retryAfterSeconds": 1}})
    assert too_large.is_gone and too_large.retry_after == 1
    assert not ApiError(403, "Forbidden").is_gone


def test_describe_error_says_an_api_errors_reason_once():
    forbidden = ApiError.for_status_code(403, "Forbidden", 'leases is forbidden: User "x" cannot list')
    assert describe_error(forbidden) == '403 Forbidden: leases is forbidden: User "x" cannot list'
    assert describe_error(TimeoutError()) == "TimeoutError"
    assert describe_error(ValueError("bad")) == "ValueError: bad"


def test_field_selectors_parse_and_match_as_the_server_reads_them():
    selector = FieldSelector.parse("spec.nodeName=node-a,status.phase!=Failed")
    assert selector.matches({"spec": {"nodeName": "node-a"}, "status": {"phase": "Running"}})
    assert not selector.matches({"spec": {"nodeName": "node-a"}, "status": {"phase": "Failed"}})
    assert not selector.matches({"spec": {}})  # a missing field is ""
    assert FieldSelector.parse("spec.unschedulable==true").matches({"spec": {"unschedulable": True}})
    escaped = FieldSelector.parse(r"metadata.name=a\,b\=c")
    assert escaped.matches({"metadata": {"name": "a,b=c"}}) and str(escaped) == r"metadata.name=a\,b\=c"
    assert FieldSelector.parse("").matches({}) and not FieldSelector.parse("")
    for bad, why in [("name", "is not field=value"), ("a=1,", "an empty term"), ("=v", "is not a field path"),
                     (r"a=\x", "invalid escape"), ("spec.nodeName=a=b", "unescaped '='"),
                     ("a=b!=c", "unescaped '='"), ("a=b\\", "lone backslash")]:
        with pytest.raises(SelectorError, match=why):
            FieldSelector.parse(bad)
