"""The discovering factory's informer lifecycle against the real control plane: removal hooks before a stop, a
CRD recreated within one pass, trigger informers shared with the factory's, preferred versions."""

from __future__ import annotations

import asyncio
import time

from informers import GVR, ApiClient, ApiError, ResourceFilter
from informers.discovery_triggers import APISERVICES, CRDS

from tests.factories import factory, only, passes_health
from tests.fakes import FaultyClient
from tests.helpers import apiserver_requests, eventually
from tests.kube import CRD_PATH, crd_gone, delete_crd, new_object, post_crd, unique_group


async def serve_version(api: ApiClient, name: str, version: str, served: bool) -> None:
    crd = await api.request("GET", f"{CRD_PATH}/{name}")
    for v in crd["spec"]["versions"]:
        if v["name"] == version:
            v["served"] = served
    await api.request("PUT", f"{CRD_PATH}/{name}", body=crd)


def names(inf) -> set[str]:
    return {o["metadata"]["name"] for o in inf.store}


async def test_removal_hooks_run_before_the_informer_is_stopped(api) -> None:
    group = unique_group("hook")
    v1, v2 = GVR(group, "v1", "widgets"), GVR(group, "v2", "widgets")
    f = factory(api, filter=only("hook"), removal_timeout=2)
    await f.start()
    seen: list[tuple[GVR, set[str], bool, bool]] = []
    release = asyncio.Event()

    async def hook(gvr: GVR) -> None:
        inf = f.informer_set.all()[gvr]
        synced, not_synced = f.informers()
        seen.append((gvr, names(inf), inf.has_synced(), gvr in synced or gvr in not_synced))
        await release.wait()

    async def failing(gvr: GVR) -> None:
        raise RuntimeError("a broken hook must not keep the informer alive")

    unregister = f.add_removal_hook(hook)
    f.add_removal_hook(failing)
    try:
        await post_crd(api, group, versions=("v1", "v2"))
        await eventually(lambda: {v1, v2} <= set(f.informers()[0]), 30, "both versions synced")
        for name in ("a", "b"):
            await new_object(api, v1, name)
        inf2 = f.informers()[0][v2]
        await eventually(lambda: names(inf2) == {"a", "b"}, 10, "objects cached in v2")
        release.set()
        await serve_version(api, f"widgets.{group}", "v2", False)
        await eventually(lambda: v2 not in f.informer_set.all(), 30, "v2 informer stopped")
        # the hook saw the cache whole, and the GVR already hidden from informers()
        assert seen == [(v2, {"a", "b"}, True, False)]
        assert len(inf2.store) == 0 and inf2.registrations == []
        # a hook that does not finish in time delays the stop by removal_timeout only
        release.clear()
        await serve_version(api, f"widgets.{group}", "v2", True)
        await eventually(lambda: v2 in f.informers()[0], 30, "v2 back")
        await serve_version(api, f"widgets.{group}", "v2", False)
        await eventually(lambda: len(seen) == 2, 30, "hook called again")
        began = time.monotonic()
        await eventually(lambda: v2 not in f.informer_set.all(), 10, "v2 stopped despite a hanging hook")
        assert time.monotonic() - began < 5
        unregister()
        await serve_version(api, f"widgets.{group}", "v2", True)
        await eventually(lambda: v2 in f.informers()[0], 30, "v2 back again")
        await serve_version(api, f"widgets.{group}", "v2", False)
        await eventually(lambda: v2 not in f.informer_set.all(), 30, "v2 stopped without the hook")
        assert len(seen) == 2
    finally:
        release.set()
        await f.shutdown()


async def test_crd_recreated_within_one_pass_gets_a_new_informer(control_plane) -> None:
    async with FaultyClient.from_kubeconfig(str(control_plane.kubeconfig)) as api:
        group = unique_group("reborn")
        gvr, name = GVR(group, "v1", "widgets"), f"widgets.{group}"
        f = factory(api, filter=only("reborn"))
        await f.start()
        removed: list[GVR] = []

        async def hook(g: GVR) -> None:
            removed.append(g)

        f.add_removal_hook(hook)
        try:
            old_uid = (await post_crd(api, group))["metadata"]["uid"]
            await eventually(lambda: gvr in f.informers()[0], 30, "informer synced")
            old = f.informers()[0][gvr]
            await new_object(api, gvr, "old")
            await eventually(lambda: names(old) == {"old"}, 10, "old object cached")
            # Hold the next pass right before it reads discovery: everything below happens within that pass.
            gate = api.hold(lambda method, path: path == "/apis")
            f.trigger()
            await eventually(lambda: passes_health(f).busy_for is not None, 10, "a pass held")
            await delete_crd(api, name)
            await eventually(lambda: crd_gone(api, name), 30, "CRD deleted")
            new_uid = (await post_crd(api, group))["metadata"]["uid"]
            assert new_uid != old_uid

            def new_crd_cached() -> bool:
                crds = f.triggers.crds() or {}
                info = crds.get((group, "widgets"))
                return info is not None and info.uid == new_uid and info.established

            await eventually(new_crd_cached, 30, "the recreated CRD in the trigger's cache")
            await eventually(lambda: _served(api, gvr), 30, "the recreated CRD served")
            await new_object(api, gvr, "new")
            assert f.informers()[0].get(gvr) is old  # no pass has run since
            gate.set()
            await eventually(lambda: gvr in f.informers()[0] and f.informers()[0][gvr] is not old, 30,
                             "a new informer")
            new = f.informers()[0][gvr]
            await eventually(lambda: names(new) == {"new"}, 10, "only the new object cached")
            assert removed == [gvr] and old._task is None and len(old.store) == 0
            assert f.informer_set.identity(gvr) == new_uid
            assert f.supervisor.problems() == []
        finally:
            await f.shutdown()


async def _served(api: ApiClient, gvr: GVR) -> bool:
    try:
        await api.request("GET", gvr.path("default"))
    except ApiError:
        return False
    return True


async def open_watches(api: ApiClient, resource: str) -> float:
    """Watches of ``resource`` open on the apiserver now (its apiserver_longrunning_requests gauge)."""
    text = await api.request_text("/metrics")
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("apiserver_longrunning_requests{") and 'verb="WATCH"' in line
               and f'resource="{resource}"' in line)


async def test_trigger_informers_are_shared_when_the_filter_watches_crds_and_apiservices(api) -> None:
    before = {r: await open_watches(api, r) for r in ("customresourcedefinitions", "apiservices")}
    lists_before = await apiserver_requests(api, "LIST", "customresourcedefinitions")
    f = factory(api, filter=ResourceFilter(include=["apiextensions.k8s.io/*", "apiregistration.k8s.io/*",
                                                    "share-*.example.com/*"]))
    await f.start()
    try:
        synced = f.informers()[0]
        assert {CRDS, APISERVICES} <= set(synced)
        assert f._meta.informers() == {}  # no private copies
        await eventually(lambda: _watches_opened(api, before, 1), 20, "one watch each")
        assert await apiserver_requests(api, "LIST", "customresourcedefinitions") - lists_before <= 1
        group = unique_group("share")
        await post_crd(api, group)
        await eventually(lambda: GVR(group, "v1", "widgets") in f.informers()[0], 30, "CRD picked up")
        statuses = {s.gvr: s for s in f.status()}
        assert statuses[CRDS].state == "synced" and statuses[GVR(group, "v1", "widgets")].source == "crd"
    finally:
        await f.shutdown()
    # with a transform of the user's, the triggers keep their own informers
    f = factory(api, filter=ResourceFilter(include=["apiextensions.k8s.io/*"]), transform=lambda o: o)
    await f.start()
    try:
        assert set(f._meta.informers()) == {CRDS, APISERVICES}
        await eventually(lambda: CRDS in f.informers()[0], 20, "the factory's own CRD informer synced")
        assert f.informers()[0][CRDS] is not f._meta.informers()[CRDS]
    finally:
        await f.shutdown()


async def _watches_opened(api: ApiClient, before: dict[str, float], each: int) -> bool:
    return [await open_watches(api, r) - n for r, n in before.items()] == [each] * len(before)


async def test_preferred_version_only_follows_the_served_versions(api) -> None:
    group = unique_group("pref")
    v1, v2 = GVR(group, "v1", "widgets"), GVR(group, "v2", "widgets")
    f = factory(api, filter=ResourceFilter(include=["pref-*.example.com/*"], preferred_version_only=True))
    rules = factory(api, filter=ResourceFilter(include=["pref-*.example.com/*"], exclude=[f"{group}/v2/*"]))
    await f.start()
    await rules.start()

    def watched(factory_) -> set[GVR]:
        synced, pending = factory_.informers()
        return {g for g in (*synced, *pending) if g.group == group}

    try:
        await post_crd(api, group, versions=("v1", "v2"))
        await eventually(lambda: v2 in f.informers()[0], 30, "the preferred version v2 synced")
        await eventually(lambda: v1 in rules.informers()[0], 30, "v1 synced (v2 excluded by rule)")
        assert watched(f) == {v2} and watched(rules) == {v1}
        states = {s.gvr: s for s in f.status()}
        assert states[v1].state == "excluded" and states[v1].reason == "not the group's preferred version"
        assert {s.gvr: s for s in rules.status()}[v2].reason == f"excluded by rule {group}/v2/*"
        await serve_version(api, f"widgets.{group}", "v2", False)
        await eventually(lambda: watched(f) == {v1} and v1 in f.informers()[0], 30, "v1 now preferred")
        await serve_version(api, f"widgets.{group}", "v2", True)
        await eventually(lambda: watched(f) == {v2} and v2 in f.informers()[0], 30, "v2 preferred again")
    finally:
        await asyncio.gather(f.shutdown(), rules.shutdown())
