"""The wanted set of a discovery pass (served ∩ selected ∩ permitted ∩ required), without an API server."""

from __future__ import annotations

from typing import Any

from informers import GVR, GVRState, ResourceFilter, ResourceInfo
from informers.discovery_triggers import CRDInfo
from informers.wanted import NOT_REQUIRED, UNCHECKED, _status, select, wanted_set

CONFIGMAPS = GVR("", "v1", "configmaps")
SECRETS = GVR("", "v1", "secrets")
NODES = GVR("", "v1", "nodes")
WIDGETS = GVR("ex.io", "v1", "widgets")
GADGETS = GVR("ex.io", "v1", "gadgets")
METRICS = GVR("metrics.k8s.io", "v1beta1", "pods")
WATCHABLE = frozenset(("get", "list", "watch"))


def served(*gvrs: GVR, cluster_scoped: tuple[GVR, ...] = ()) -> dict[GVR, ResourceInfo]:
    return {g: ResourceInfo(g, g.resource.title(), g not in cluster_scoped, WATCHABLE, True) for g in gvrs}


class Verdicts:
    def __init__(self, denied: dict[GVR, str], undecided: set[GVR]) -> None:
        self._denied, self._undecided = denied, undecided

    def decided(self, gvr: GVR) -> bool:
        return gvr not in self._undecided

    def denied(self, gvr: GVR) -> str | None:
        return self._denied.get(gvr)


def no_crd(_: GVR) -> bool:
    return False


def test_select_applies_the_filter_and_names_each_source() -> None:
    crds = {("ex.io", "widgets"): CRDInfo("uid-w", True, frozenset({"v1"}))}
    rules = ResourceFilter(exclude=["core/configmaps"]).restricted_to_namespaced()
    s = select(served(CONFIGMAPS, NODES, WIDGETS, METRICS, cluster_scoped=(NODES,)), rules, crds,
               {"metrics.k8s.io/v1beta1"}, no_crd)
    assert s.candidates == (WIDGETS, METRICS)
    assert (s.status[CONFIGMAPS].state, s.status[CONFIGMAPS].reason) == (GVRState.EXCLUDED,
                                                                         "excluded by rule core/*/configmaps")
    assert s.status[NODES].state == GVRState.EXCLUDED and "cluster-scoped" in s.status[NODES].reason
    assert [s.status[g].source for g in (CONFIGMAPS, WIDGETS, METRICS)] == ["builtin", "crd", "aggregated"]
    assert s.uids == {WIDGETS: "uid-w", METRICS: ""}


def test_the_crd_cache_overrides_a_discovery_that_still_serves_a_deleted_crd() -> None:
    was_crd = {WIDGETS}.__contains__
    gone = select(served(WIDGETS), ResourceFilter(), {}, set(), was_crd)
    assert gone.candidates == () and gone.status[WIDGETS].reason == "its CRD was deleted"
    unknown = select(served(WIDGETS), ResourceFilter(), None, set(), was_crd)  # the CRD cache is not synced
    assert unknown.candidates == (WIDGETS,)


def test_permissions_decide_between_error_forbidden_and_permitted() -> None:
    s = select(served(CONFIGMAPS, SECRETS, WIDGETS), ResourceFilter(), None, set(), no_crd)
    w = wanted_set(s, Verdicts({SECRETS: "may not watch"}, {WIDGETS}), set(), "all")
    assert w.permitted == {CONFIGMAPS} and w.desired == {CONFIGMAPS: ""}
    assert (w.status[SECRETS].state, w.status[SECRETS].reason) == (GVRState.FORBIDDEN, "may not watch")
    assert w.status[WIDGETS].state == GVRState.ERROR
    assert all(st.state == GVRState.DISCOVERED for st in s.status.values())  # the selection is not changed


def test_required_mode_watches_only_what_is_wanted_and_says_why_the_rest_idles() -> None:
    s = select(served(CONFIGMAPS, SECRETS, WIDGETS), ResourceFilter(), None, set(), no_crd)
    w = wanted_set(s, UNCHECKED, {SECRETS, GADGETS}, "required")
    assert w.desired == {SECRETS: ""} and w.permitted == {CONFIGMAPS, SECRETS, WIDGETS}
    assert {g for g, st in w.status.items() if st.state == GVRState.IDLE} == {CONFIGMAPS, WIDGETS}
    assert w.status[CONFIGMAPS].reason == NOT_REQUIRED
    assert wanted_set(s, UNCHECKED, set(), "all").desired.keys() == {CONFIGMAPS, SECRETS, WIDGETS}


def test_a_metadata_only_key_follows_its_gvr_in_either_mode() -> None:
    crds = {("ex.io", "widgets"): CRDInfo("uid-w", True, frozenset({"v1"}))}
    s = select(served(CONFIGMAPS, WIDGETS), ResourceFilter(), crds, set(), no_crd)
    meta = {WIDGETS.only_metadata(), SECRETS.only_metadata()}
    for mode in ("all", "required"):
        w = wanted_set(s, UNCHECKED, meta, mode)  # type: ignore[arg-type]
        assert WIDGETS.only_metadata() in w.desired and w.desired[WIDGETS.only_metadata()] == "uid-w"
        assert SECRETS.only_metadata() not in w.desired  # not served
    denied = wanted_set(s, Verdicts({WIDGETS: "no"}, set()), meta, "all")
    assert WIDGETS.only_metadata() not in denied.desired


def test_a_namespace_restricts_a_copy_of_the_callers_filter() -> None:
    from kubernetes.client import Configuration

    from informers import ApiClient, DiscoveringDynamicSharedInformerFactory, DiscoveryOptions

    rules = ResourceFilter(include=["core/*"])
    f = DiscoveringDynamicSharedInformerFactory(ApiClient(Configuration()), DiscoveryOptions(filter=rules,
                                                                                             namespace="team-a"))
    assert f.filter.namespaced_only and not rules.namespaced_only


def test_members_with_equal_statuses_share_them() -> None:
    """Statuses are shared by value across members (a bounded cache), never changed in place."""
    def decide(denied: dict[GVR, str]) -> Any:
        s = select(served(CONFIGMAPS, SECRETS, WIDGETS), ResourceFilter(exclude=["core/secrets"]), None, set(),
                   no_crd)
        return wanted_set(s, Verdicts(denied, set()), {CONFIGMAPS}, "required").status

    one, two = decide({}), decide({})
    assert one == two and one is not two
    assert all(one[g] is two[g] for g in one)
    assert one[WIDGETS].state == GVRState.IDLE and one[SECRETS].state == GVRState.EXCLUDED
    other = decide({WIDGETS: "user b may not watch"})
    assert other[WIDGETS].reason == "user b may not watch" and one[WIDGETS].reason == NOT_REQUIRED
    assert other[CONFIGMAPS] is one[CONFIGMAPS]
    assert _status.cache_info().maxsize is not None  # bounded


def test_equal_filters_of_different_members_share_their_verdicts_and_a_filter_cannot_change() -> None:
    import dataclasses

    import pytest

    def rules() -> ResourceFilter:
        return ResourceFilter(exclude=["core/secrets"], preferred_version_only=True)

    first = select(served(CONFIGMAPS, SECRETS, WIDGETS), rules(), None, set(), no_crd)
    second = select(served(CONFIGMAPS, SECRETS, WIDGETS), rules(), None, set(), no_crd)
    assert second == first
    assert all(second.status[g] is first.status[g] for g in (CONFIGMAPS, SECRETS, WIDGETS))
    assert first.status[SECRETS].state is GVRState.EXCLUDED and first.candidates == (CONFIGMAPS, WIDGETS)
    other = select(served(CONFIGMAPS, SECRETS), ResourceFilter(), None, set(), no_crd)
    assert other.candidates == (CONFIGMAPS, SECRETS)  # a different filter: its own verdicts
    with pytest.raises(dataclasses.FrozenInstanceError):
        ResourceFilter().namespaced_only = True  # type: ignore[misc]
