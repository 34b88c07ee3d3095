"""The discovering factory against the real control plane: CRDs and APIServices coming and going."""

from __future__ import annotations

import asyncio
import gc
import time

import psutil
import pytest
from prometheus_client import CollectorRegistry

from controllers import ControllerManager, ManagedController
from informers import GVR, ApiClient, ResourceFilter

from tests.factories import factory, only
from tests.helpers import eventually
from tests.kube import CRD_PATH, crd_gone, delete_crd, new_object, post_crd, unique_group


async def test_crd_lifecycle_creates_syncs_drops_and_replaces_informers(api) -> None:
    group = unique_group("life")
    gvr = GVR(group, "v1", "widgets")
    f = factory(api, filter=only("life"))
    await f.start()
    sub = f.subscribe("test")
    ticks = 0

    async def count() -> None:
        nonlocal ticks
        async for _ in sub:
            ticks += 1

    counter = asyncio.create_task(count())
    try:
        assert gvr not in f.informers()[0]
        await post_crd(api, group)
        await eventually(lambda: gvr in f.informers()[0], 20, "informer synced for the new CRD")
        await new_object(api, gvr, "after")
        inf = f.informers()[0][gvr]
        await eventually(lambda: inf.lister.get("after", "default") is not None, 10)
        assert ticks >= 2  # initial tick + set change/synced
        task = inf._task
        await delete_crd(api, f"widgets.{group}")
        await eventually(lambda: gvr not in f.informers()[0] and gvr not in f.informers()[1], 20, "GVR dropped")
        assert task is not None and task.done()
        assert len(inf.store) == 0 and inf.registrations == []
        # recreate with the same name: a new informer that only caches the new objects
        await eventually(lambda: crd_gone(api, f"widgets.{group}"), 30, "CRD deletion finished")
        await post_crd(api, group)
        await eventually(lambda: gvr in f.informers()[0], 20, "informer for the recreated CRD")
        inf2 = f.informers()[0][gvr]
        assert inf2 is not inf
        await new_object(api, gvr, "reborn")
        await eventually(lambda: inf2.lister.get("reborn", "default") is not None, 10)
        assert inf2.lister.get("after", "default") is None
        statuses = {s.gvr: s for s in f.status()}
        assert statuses[gvr].state == "synced" and statuses[gvr].source == "crd"
    finally:
        counter.cancel()
        await f.shutdown()
        await asyncio.gather(counter, return_exceptions=True)


async def test_a_gvrs_field_selector_is_applied_by_the_server(api, namespace) -> None:
    configmaps = GVR("", "v1", "configmaps")
    for name in ("keep", "other"):
        await api.request("POST", configmaps.path(namespace), body={"metadata": {"name": name}})
    f = factory(api, filter=ResourceFilter(include=["core/configmaps"]), namespace=namespace,
                field_selectors={configmaps: "metadata.name=keep"})
    await f.start()
    try:
        await eventually(lambda: configmaps in f.informers()[0], 10, "configmaps synced")
        inf = f.informers()[0][configmaps]
        assert inf.reflector.selectors["fieldSelector"] == "metadata.name=keep"
        assert list(inf.store.keys()) == [f"{namespace}/keep"]
        await api.request("POST", configmaps.path(namespace), body={"metadata": {"name": "later"}})
        await api.request("PATCH", f"{configmaps.path(namespace)}/keep", body={"data": {"x": "1"}})
        await eventually(lambda: (inf.store.get(f"{namespace}/keep") or {}).get("data") == {"x": "1"}, 10, "update")
        assert list(inf.store.keys()) == [f"{namespace}/keep"]
    finally:
        await f.shutdown()


async def test_served_versions_follow_the_crd(api) -> None:
    group = unique_group("versions")
    f = factory(api, filter=only("versions"))
    await f.start()
    try:
        crd = await post_crd(api, group, versions=("v1", "v2"))
        v1, v2 = GVR(group, "v1", "widgets"), GVR(group, "v2", "widgets")
        await eventually(lambda: {v1, v2} <= set(f.informers()[0]), 20, "both versions")
        name = crd["metadata"]["name"]
        current = await api.request("GET", f"{CRD_PATH}/{name}")
        current["spec"]["versions"][1]["served"] = False
        await api.request("PUT", f"{CRD_PATH}/{name}", body=current)
        await eventually(lambda: v2 not in f.informers()[0] and v1 in f.informers()[0], 20, "v2 dropped")
        current = await api.request("GET", f"{CRD_PATH}/{name}")
        current["spec"]["versions"][1]["served"] = True
        await api.request("PUT", f"{CRD_PATH}/{name}", body=current)
        await eventually(lambda: v2 in f.informers()[0], 20, "v2 back")
        # preferred-version-only keeps the server's preferred version (v2 sorts above v1)
        f2 = factory(api, filter=ResourceFilter(include=["versions-*.example.com/*"], preferred_version_only=True))
        await f2.start()
        try:
            assert {g for g in set(f2.informers()[0]) | set(f2.informers()[1]) if g.group == group} == {v2}
        finally:
            await f2.shutdown()
    finally:
        await f.shutdown()


async def test_unavailable_aggregated_api_does_not_block_discovery(control_plane_factory) -> None:
    cp = control_plane_factory()
    async with ApiClient.from_kubeconfig(str(cp.kubeconfig)) as api:
        await api.request("POST", "/apis/apiregistration.k8s.io/v1/apiservices", body={
            "apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
            "metadata": {"name": "v1beta1.broken.example.com"},
            "spec": {"group": "broken.example.com", "version": "v1beta1", "groupPriorityMinimum": 1000,
                     "versionPriority": 15, "insecureSkipTLSVerify": True,
                     "service": {"namespace": "default", "name": "does-not-exist", "port": 443}}})
        f = factory(api, filter=ResourceFilter(include=["core/*", "broken.example.com/*", "agg-*.example.com/*"]))
        started = asyncio.get_running_loop().time()
        async with asyncio.timeout(30):
            await f.start()
        try:
            assert asyncio.get_running_loop().time() - started < 15
            assert GVR("", "v1", "configmaps") in set(f.informers()[0]) | set(f.informers()[1])
            assert not any(g.group == "broken.example.com" for g in f.informers()[0])
            group = unique_group("agg")
            await post_crd(api, group)
            await eventually(lambda: GVR(group, "v1", "widgets") in f.informers()[0], 20, "CRD despite broken API")
        finally:
            await f.shutdown()


async def _may(api: ApiClient, verb: str, group: str, resource: str) -> bool:
    review = await api.request("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", body={
        "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": {"verb": verb, "group": group, "resource": resource}}})
    return bool(review["status"].get("allowed"))


async def _grant(api: ApiClient, name: str, rules: list[dict]) -> None:
    await api.request("POST", "/apis/rbac.authorization.k8s.io/v1/clusterroles",
                      body={"metadata": {"name": name}, "rules": rules})
    await api.request("POST", "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings", body={
        "metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "User", "name": "kube-syncer-restricted", "apiGroup": "rbac.authorization.k8s.io"}]})


async def test_restricted_user_gets_only_permitted_gvrs_and_periodic_rediscovery(control_plane_factory) -> None:
    cp = control_plane_factory()
    async with ApiClient.from_kubeconfig(str(cp.kubeconfig)) as admin, \
            ApiClient.from_kubeconfig(str(cp.kubeconfig), context="restricted") as restricted:
        group = "periodic.example.com"
        await _grant(admin, "restricted-reader", [
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list", "watch"]},
            {"apiGroups": [group], "resources": ["*"], "verbs": ["list", "watch"]},
        ])
        await eventually(lambda: _may(restricted, "list", "", "configmaps"), 10, "the RBAC grant in the authorizer")
        f = factory(restricted, filter=ResourceFilter(include=["core/*", f"{group}/*"]), check_permissions=True,
                    rediscovery_interval=1.0)
        await f.start()
        try:
            cms = GVR("", "v1", "configmaps")
            await eventually(lambda: cms in f.informers()[0], 20, "configmaps synced")
            assert set(f.informers()[0]) | set(f.informers()[1]) == {cms}
            states = {s.gvr: s for s in f.status()}
            assert states[GVR("", "v1", "secrets")].state == "forbidden"
            assert "may not list" in states[GVR("", "v1", "secrets")].reason
            # no permission to watch CRDs: only the periodic pass can find a new one
            assert not f.triggers.watching(CRDS_GVR)
            await post_crd(admin, group)
            await eventually(lambda: GVR(group, "v1", "widgets") in f.informers()[0], 20, "found periodically")
            passes, since = f.passes, time.monotonic()
            await eventually(lambda: f.passes >= passes + 3, 10, "three periodic passes")
            assert time.monotonic() - since > 1.5  # about one per second: no storm
            assert all(i.last_error is None for i in f.informers()[0].values())
        finally:
            await f.shutdown()


CRDS_GVR = GVR("apiextensions.k8s.io", "v1", "customresourcedefinitions")


async def test_200_crds_at_once_sync_in_a_bounded_number_of_passes(control_plane_factory) -> None:
    cp = control_plane_factory()
    async with ApiClient.from_kubeconfig(str(cp.kubeconfig)) as api:
        f = factory(api, filter=ResourceFilter(include=["bulk-*.example.com/*"]))
        await f.start()
        try:
            first = f.passes
            groups = [f"bulk-{i}.example.com" for i in range(200)]
            sem = asyncio.Semaphore(16)

            async def one(g: str) -> None:
                async with sem:
                    await post_crd(api, g)

            await asyncio.gather(*(one(g) for g in groups))
            wanted = {GVR(g, "v1", "widgets") for g in groups}
            await eventually(lambda: wanted <= set(f.informers()[0]), 180, "200 informers synced")
            passes = f.passes - first
            print(f"\n200 CRDs: {passes} discovery passes")
            assert passes < 100
        finally:
            await f.shutdown()


async def test_50_crd_cycles_leak_nothing(control_plane_factory) -> None:
    cp = control_plane_factory()
    async with ApiClient.from_kubeconfig(str(cp.kubeconfig)) as api:
        f = factory(api, filter=ResourceFilter(include=["cycle.example.com/*"]))
        await f.start()
        tasks_before = len(asyncio.all_tasks())
        proc = psutil.Process()
        gvr = GVR("cycle.example.com", "v1", "widgets")
        rss = []
        try:
            for i in range(50):
                await post_crd(api, "cycle.example.com")
                await eventually(lambda: gvr in f.informers()[0], 30, f"cycle {i}: synced")
                await delete_crd(api, "widgets.cycle.example.com")
                await eventually(lambda: gvr not in f.informers()[0] and gvr not in f.informers()[1], 30,
                                 f"cycle {i}: dropped")
                await eventually(lambda: crd_gone(api, "widgets.cycle.example.com"), 30, f"cycle {i}: CRD gone")
                if i in (9, 49):
                    gc.collect()
                    rss.append(proc.memory_info().rss)
            await eventually(lambda: len(asyncio.all_tasks()) <= tasks_before, 5, "no task left behind")
            assert f.informer_set.all() == {} and not f.informer_set.adopted()
            watches = [c for c in proc.net_connections("tcp") if c.raddr and c.raddr.port == cp.port]
            assert len(watches) <= 4  # the two trigger watches plus pooled idle connections
            assert rss[1] - rss[0] < 8 * 1024 * 1024, rss
        finally:
            await f.shutdown()


@pytest.mark.parametrize("watch", ["required", "all"])
async def test_a_metadata_only_key_is_an_informer_of_its_own_while_required(api, watch) -> None:
    """A controller requiring ``gvr.only_metadata()`` gets that informer, of PartialObjectMetadata (with
    ``watch="required"`` and not the full one): started when required, stopped when released (the full one stays
    with ``watch="all"``), and, its controller stopped first, when the CRD goes."""
    group = unique_group("meta")
    gvr = GVR(group, "v1", "widgets")
    key = gvr.only_metadata()
    await post_crd(api, group)
    f = factory(api, filter=only("meta"), watch=watch)
    await f.start()
    contexts = []

    def create(ctx):
        contexts.append(ctx)
        return lambda ctx: asyncio.Event().wait()

    def manager() -> ControllerManager:
        return ControllerManager("meta", f, {"c": ManagedController([key], create)},
                                 metrics_registry=CollectorRegistry())

    try:
        # Nothing outside the core group wanted yet: with watch="required" no trigger announces the CRD.
        await eventually(lambda: f.trigger() or gvr in {s.gvr for s in f.status()}, 20, "the CRD discovered")
        await new_object(api, gvr, "w1")
        m = manager()
        await m.start()
        await eventually(lambda: m.status()["c"].state == "running", 20, "the controller running")
        inf = contexts[-1].informers[key]
        assert inf.gvr == key and f.explain(key) is None
        await eventually(lambda: inf.lister.get("w1", "default") is not None, 10)
        assert inf.lister.get("w1", "default")["kind"] == "PartialObjectMetadata"
        assert set(f.informers()[0]) & {gvr, key} == ({key} if watch == "required" else {gvr, key})
        states = {s.gvr: s.state for s in f.status()}
        assert states[key] == "synced" and states[gvr] == ("idle" if watch == "required" else "synced")
        await m.stop()
        await eventually(lambda: key not in f.informers()[0], 20, "the released metadata informer stopped")
        assert (gvr in f.informers()[0]) is (watch == "all") and inf.registrations == []
        m = manager()
        await m.start()
        await eventually(lambda: m.status()["c"].state == "running", 20, "the controller running again")
        assert contexts[-1].informers[key] is not inf
        await delete_crd(api, f"widgets.{group}")
        await eventually(lambda: m.status()["c"].state == "waiting" and key not in f.informers()[0], 20,
                         "the controller stopped and the informer dropped with the CRD")
        await m.stop()
    finally:
        await f.shutdown()
