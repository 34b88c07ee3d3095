"""Acceptance of cached resource replication (issue 14) through the real sidecar: ``Syncer`` in-process with the
built-in plugin ``syncer.builtin.cached_resources`` loaded, ``[clusters] enabled`` (member kubeconfig Secrets in a
fresh namespace of the management plane), the plugin's validating webhook called by the API server (configurations
managed by the sidecar, "auto" on a loopback apiserver).

Every test runs on private planes from ``control_plane_factory()``: the management plane is the cache (where the
ClusterCachedResources, the webhook configuration and the CachedObjects live) and workload planes are the sources.
Nothing touches the session's shared plane, so no finalizer, wrapper or webhook configuration can leak into other
tests.

- A second ClusterCachedResource for a GVR is denied by the webhook, through the API server; re-applying the first
  is allowed.
- Two source clusters with same-named objects: distinct wrappers, right ``cache.kcp.io/object-cluster`` labels and
  contents, and matching ``resourceCounts``.
- The cache apiserver down for 30 s while sources are created, updated, relabelled and deleted: afterwards the cache
  holds exactly the right wrappers, with the sources' contents, written once each.
- 5,000 source objects replicated, then the sidecar restarted: no write to CachedObjects after the restart.
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid
from dataclasses import replace
from typing import Any, Awaitable, Callable

from informers import ApiClient, ApiError, NotFound
from syncer.builtin.cached_resources.naming import (
    ANNOTATION_ORIGINAL_RESOURCE_VERSION, ANNOTATION_ORIGINAL_UID, CACHED_OBJECTS, CLUSTER_CACHED_RESOURCES,
    LABEL_CLUSTER, LABEL_GROUP, LABEL_ORIGINAL_NAME, LABEL_ORIGINAL_NAMESPACE, LABEL_RESOURCE, LABEL_SCHEMA,
    LABEL_VERSION, schema_selector, source_of, wrapper_name,
)
from syncer.builtin.cached_resources.root import install_crds
from syncer.plugins import load_plugins
from syncer.runtime import Syncer
from syncer.settings import Clusters, Settings, Webhooks
from syncer.testing import ControlPlane

from tests.cached_resources import get_ccr
from tests.fleet import kubeconfig, put_secret
from tests.helpers import CONFIGMAPS, create_configmaps, eventually, free_port

PLUGIN = "syncer.builtin.cached_resources"
CRD_NAMES = ("clustercachedresources.cache.kcp.io", "cachedobjects.cache.kcp.io")
WRITE_VERBS = ("POST", "PUT", "PATCH", "DELETE", "DELETECOLLECTION", "APPLY")


# -- the sidecar ---------------------------------------------------------------------------------------------
class Sidecar:
    """The real ``Syncer`` with the plugin, in-process, against ``management`` (the cache), members from Secrets in
    ``namespace``; ``async with`` starts it and waits until it is ready (discovery done, webhooks called by the API
    server) and the plugin has installed its CRDs; leaving stops it."""

    def __init__(self, management: ControlPlane, namespace: str, **plugin_settings: Any) -> None:
        self.management = management
        self.namespace = namespace
        self.plugins = load_plugins([PLUGIN], {"cached_resources": {"identity_namespace": namespace,
                                                                    **plugin_settings}}, entry_points=False)
        self.settings = replace(
            Settings(), kubeconfig=str(management.kubeconfig), http_bind=f"127.0.0.1:{free_port()}",
            shutdown_timeout=15.0, webhooks=Webhooks(bind=f"127.0.0.1:{free_port()}"),
            clusters=Clusters(enabled=True, namespaces=(namespace,), sync_timeout=20.0))
        self.syncer = Syncer(self.settings, ApiClient.from_kubeconfig(str(management.kubeconfig)), self.plugins,
                             identity=f"cache-{uuid.uuid4().hex[:6]}")
        self.stop = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> "Sidecar":
        self.task = asyncio.create_task(self.syncer.run(self.stop))
        webhooks = self.syncer.webhooks
        assert webhooks is not None, "the plugin declares a webhook"
        await self.wait(lambda: self.syncer.ready and webhooks.ready, 60,
                        "the sidecar to be ready (discovery done, webhooks called by the API server)")
        async with ApiClient.from_kubeconfig(str(self.management.kubeconfig)) as api:
            await self.wait(lambda: _established(api), 60, "the plugin to install its CRDs")
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.task is not None
        self.stop.set()
        await asyncio.wait_for(self.task, 30)

    async def wait(self, check: Callable[[], Awaitable[bool] | bool], timeout: float, what: str) -> None:
        """``eventually``, failing at once (with the reason) if the sidecar has exited."""
        async def guarded() -> bool:
            if self.task is not None and self.task.done():
                raise AssertionError(f"the sidecar exited while waiting for {what}: {self.task!r}")
            result = check()
            return result if isinstance(result, bool) else await result
        await eventually(guarded, timeout, what)

    def members_ready(self, *names: str) -> bool:
        rows = {r["name"]: r for r in self.syncer.status()["clusters"]["clusters"]}
        return all(rows.get(n, {}).get("ready") for n in names)

    def replications(self) -> dict[str, Any]:
        """The plugin's fleet component status (from ``/status``): each replication's GVR and counts."""
        components = {c["name"]: c for c in self.syncer.status()["clusters"]["fleet_components"]}
        return dict(components.get("cached-resources", {}).get("replications") or {})


async def _established(api: ApiClient) -> bool:
    for name in CRD_NAMES:
        try:
            crd = await api.request("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
        except NotFound:
            return False
        if not any(c["type"] == "Established" and c["status"] == "True"
                   for c in (crd.get("status") or {}).get("conditions") or ()):
            return False
    return True


async def fresh_namespace(api: ApiClient) -> str:
    name = f"members-{uuid.uuid4().hex[:8]}"
    await api.request("POST", "/api/v1/namespaces", body={"metadata": {"name": name}})
    return name


async def start_planes(factory: Callable[..., ControlPlane], n: int) -> list[ControlPlane]:
    """``n`` private planes, started concurrently (each takes a few seconds)."""
    return list(await asyncio.gather(*(asyncio.to_thread(factory) for _ in range(n))))


# -- ClusterCachedResources and CachedObjects ----------------------------------------------------------------
def ccr_body(name: str, group: str = "", selector: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"apiVersion": "cache.kcp.io/v1alpha1", "kind": "ClusterCachedResource", "metadata": {"name": name},
            "spec": {"group": group, "version": "v1", "resource": "configmaps",
                     **({"labelSelector": selector} if selector is not None else {})}}


async def ccr_ready(api: ApiClient, name: str, local: int, cache: int) -> bool:
    status = ((await get_ccr(api, name)) or {}).get("status") or {}
    return status.get("phase") == "Ready" and status.get("resourceCounts") == {"local": local, "cache": cache}


async def configmap_wrappers(api: ApiClient) -> list[dict[str, Any]]:
    out = await api.request("GET", CACHED_OBJECTS.path(), {"labelSelector": schema_selector(CONFIGMAPS)})
    return list(out["items"])


async def all_cached_objects(api: ApiClient) -> list[dict[str, Any]]:
    return list((await api.request("GET", CACHED_OBJECTS.path()))["items"])


async def sources(api: ApiClient, selector: str) -> dict[str, dict[str, Any]]:
    """name -> ConfigMap in ``default`` of a source plane, selected by label."""
    out = await api.request("GET", CONFIGMAPS.path("default"), {"labelSelector": selector})
    return {i["metadata"]["name"]: i for i in out["items"]}


def mismatches(wrappers: list[dict[str, Any]], expected: dict[tuple[str, str], dict[str, Any]]) -> list[str]:
    """What differs between the wrappers and the expected sources, by (cluster, name) in ``default``: missing,
    extra or duplicated wrappers, wrong names, and contents (data, labels, resourceVersion, UID) that differ."""
    problems: list[str] = []
    seen: dict[tuple[str, str], str] = {}
    for w in wrappers:
        cluster, namespace, name = source_of(w)
        key = (cluster, name)
        wname = w["metadata"]["name"]
        if namespace != "default":
            problems.append(f"{wname}: namespace {namespace!r}")
        if key in seen:
            problems.append(f"duplicate wrappers {seen[key]} and {wname} of {key}")
        seen[key] = wname
        if wname != wrapper_name(CONFIGMAPS, name, "default", cluster):
            problems.append(f"{wname}: not the name wrapper_name gives for {key}")
        source = expected.get(key)
        if source is None:
            problems.append(f"{wname}: extra wrapper of {key}")
            continue
        raw = w["spec"]["raw"]
        annotations = w["metadata"].get("annotations") or {}
        for what, have, want in (
                ("data", raw.get("data"), source.get("data")),
                ("labels", raw["metadata"].get("labels"), source["metadata"].get("labels")),
                ("raw resourceVersion", raw["metadata"].get("resourceVersion"), source["metadata"]["resourceVersion"]),
                ("original-resource-version", annotations.get(ANNOTATION_ORIGINAL_RESOURCE_VERSION),
                 source["metadata"]["resourceVersion"]),
                ("original-uid", annotations.get(ANNOTATION_ORIGINAL_UID), source["metadata"]["uid"])):
            if have != want:
                problems.append(f"{wname}: {what} is {have!r}, the source says {want!r}")
    problems += [f"missing wrapper of {key}" for key in sorted(set(expected) - set(seen))]
    return problems


# -- the cache apiserver's write counts --------------------------------------------------------------------------
async def cache_writes(api: ApiClient, code: str | None = None) -> dict[str, float]:
    """The cache apiserver's own count of write requests to cachedobjects, by verb (all codes, or only ``code``)."""
    text = await api.request_text("/metrics")
    totals = dict.fromkeys(WRITE_VERBS, 0.0)
    for line in text.splitlines():
        if not line.startswith("apiserver_request_total{") or not re.search(r'[{,]resource="cachedobjects"', line):
            continue
        if code is not None and f'code="{code}"' not in line:
            continue
        verb = re.search(r'[{,]verb="([A-Z]+)"', line)
        if verb and verb.group(1) in totals:
            totals[verb.group(1)] += float(line.rsplit(" ", 1)[1])
    return totals


def delta(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {verb: after[verb] - before[verb] for verb in WRITE_VERBS if after[verb] != before[verb]}


# -- 1. admission through the API server ----------------------------------------------------------------------------
async def test_a_second_cluster_cached_resource_for_a_gvr_is_denied_by_the_webhook(
        control_plane_factory: Callable[..., ControlPlane]) -> None:
    management, workload = await start_planes(control_plane_factory, 2)
    async with ApiClient.from_kubeconfig(str(management.kubeconfig)) as api:
        ns = await fresh_namespace(api)
        await put_secret(api, ns, "src", kubeconfig(workload))
        async with Sidecar(management, ns) as sidecar:
            await sidecar.wait(lambda: sidecar.members_ready("src"), 40, "member src ready")
            await api.request("POST", CLUSTER_CACHED_RESOURCES.path(),
                              body=ccr_body("configmaps", selector={"matchLabels": {"cache": "yes"}}))
            await sidecar.wait(lambda: ccr_ready(api, "configmaps", 0, 0), 60, "the first one to be Ready")

            # The same GVR under another name: denied, whether the core group is written "" or "core".
            for group in ("", "core"):
                try:
                    await api.request("POST", CLUSTER_CACHED_RESOURCES.path(), body=ccr_body("configmaps-too", group))
                except ApiError as e:
                    denied = e
                else:
                    raise AssertionError(f"a second ClusterCachedResource for configmaps (group {group!r}) was "
                                         "admitted")
                assert denied.status == 409, (denied.status, denied.message)
                assert denied.message.startswith(
                    'admission webhook "validate.clustercachedresources.cache.kcp.io" denied the request: '), \
                    denied.message
                assert "'configmaps'" in denied.message, denied.message  # names the existing one
                assert "at most one ClusterCachedResource per resource" in denied.message, denied.message
                assert await get_ccr(api, "configmaps-too") is None

            # Re-applying the first (an update, here with another selector) is allowed, and so is a merge patch.
            current = await get_ccr(api, "configmaps")
            assert current is not None
            current["spec"]["labelSelector"] = {"matchLabels": {"cache": "please"}}
            await api.request("PUT", CLUSTER_CACHED_RESOURCES.path(name="configmaps"), body=current)
            await api.request("PATCH", CLUSTER_CACHED_RESOURCES.path(name="configmaps"),
                              body={"metadata": {"labels": {"team": "a"}}},
                              headers={"Content-Type": "application/merge-patch+json"})
            updated = await get_ccr(api, "configmaps")
            assert updated is not None and updated["spec"]["labelSelector"] == {"matchLabels": {"cache": "please"}}
            # Another GVR is admitted next to it.
            await api.request("POST", CLUSTER_CACHED_RESOURCES.path(), body={
                **ccr_body("secrets"), "spec": {"group": "", "version": "v1", "resource": "secrets"}})
            assert sidecar.syncer.status()["webhooks"]["ready"]


async def test_duplicates_admitted_together_do_not_deadlock_the_oldest_replicates(
        control_plane_factory: Callable[..., ControlPlane]) -> None:
    """Issue 21, item 3: two ClusterCachedResources for one GVR, both there before the webhook answers (as two
    creates at the same moment leave them). Their finalizer updates are admitted; the oldest replicates, the other
    shows Conflict naming it; deleting the winner promotes the other. Then three creates at once for another GVR:
    whatever the webhook admits ends with exactly one replicating."""
    management, workload = await start_planes(control_plane_factory, 2)
    async with ApiClient.from_kubeconfig(str(management.kubeconfig)) as api, \
            ApiClient.from_kubeconfig(str(workload.kubeconfig)) as src:
        await create_configmaps(src, "default", 3, labels={"cache": "yes"})
        await install_crds(api)
        await eventually(lambda: _established(api), 30, "the CRDs established")
        for name in ("configmaps-b", "configmaps-a"):
            await api.request("POST", CLUSTER_CACHED_RESOURCES.path(),
                              body=ccr_body(name, selector={"matchLabels": {"cache": "yes"}}))
        stamps = {n: ((await get_ccr(api, n)) or {})["metadata"]["creationTimestamp"]
                  for n in ("configmaps-a", "configmaps-b")}
        winner, loser = sorted(stamps, key=lambda n: (stamps[n], n))
        ns = await fresh_namespace(api)
        await put_secret(api, ns, "src", kubeconfig(workload))
        async with Sidecar(management, ns) as sidecar:
            async def phase(name: str) -> str:
                obj = await get_ccr(api, name) or {}
                return str((obj.get("status") or {}).get("phase") or "")

            async def settled() -> bool:
                return await ccr_ready(api, winner, 3, 3) and await phase(loser) == "Conflict"

            await sidecar.wait(settled, 60, f"{winner} Ready with 3 objects, {loser} in Conflict")
            lo = await get_ccr(api, loser)
            assert lo is not None and "cache.kcp.io/clustercachedresource" in lo["metadata"]["finalizers"]
            assert any(c["type"] == "ResourceValid" and repr(winner) in c["message"]
                       for c in lo["status"]["conditions"]), lo["status"]
            await api.request("DELETE", CLUSTER_CACHED_RESOURCES.path(name=winner))
            await sidecar.wait(lambda: ccr_ready(api, loser, 3, 3), 60, f"{loser} to take over")

            # Three at once through the webhook: some may be admitted together; one replicates, none hangs.
            names = [f"secrets-{i}" for i in range(3)]
            body = {"group": "", "version": "v1", "resource": "secrets"}

            async def create(name: str) -> bool:
                try:
                    await api.request("POST", CLUSTER_CACHED_RESOURCES.path(), body={
                        **ccr_body(name), "spec": body})
                    return True
                except ApiError as e:
                    assert e.status == 409, (e.status, e.message)
                    return False

            admitted = [n for n, ok in zip(names, await asyncio.gather(*(create(n) for n in names))) if ok]
            assert admitted

            async def one_replicates() -> bool:
                phases = sorted([await phase(n) for n in admitted])
                return phases == sorted(["Ready"] + ["Conflict"] * (len(admitted) - 1))

            await sidecar.wait(one_replicates, 60, f"one of {admitted} Ready, the others Conflict")


# -- 2. two source clusters, same-named objects ------------------------------------------------------------------
async def test_two_source_clusters_with_same_named_objects_get_distinct_wrappers(
        control_plane_factory: Callable[..., ControlPlane]) -> None:
    management, east, west = await start_planes(control_plane_factory, 3)
    labels = {"cache": "yes"}
    async with ApiClient.from_kubeconfig(str(management.kubeconfig)) as api, \
            ApiClient.from_kubeconfig(str(east.kubeconfig)) as east_api, \
            ApiClient.from_kubeconfig(str(west.kubeconfig)) as west_api:
        for source, cluster in ((east_api, "east"), (west_api, "west")):
            for name in ("settings", "shared"):  # the same names in both clusters, different contents
                await source.request("POST", CONFIGMAPS.path("default"), body={
                    "metadata": {"name": name, "labels": labels}, "data": {"from": cluster, "name": name}})
        await east_api.request("POST", CONFIGMAPS.path("default"), body={
            "metadata": {"name": "east-only", "labels": labels}, "data": {"from": "east"}})
        await west_api.request("POST", CONFIGMAPS.path("default"), body={  # not selected
            "metadata": {"name": "unselected"}, "data": {"from": "west"}})
        ns = await fresh_namespace(api)
        await put_secret(api, ns, "east", kubeconfig(east))
        await put_secret(api, ns, "west", kubeconfig(west))
        async with Sidecar(management, ns) as sidecar:
            await sidecar.wait(lambda: sidecar.members_ready("east", "west"), 40, "members east and west ready")
            await api.request("POST", CLUSTER_CACHED_RESOURCES.path(),
                              body=ccr_body("configmaps", selector={"matchLabels": labels}))

            async def expected() -> dict[tuple[str, str], dict[str, Any]]:
                out: dict[tuple[str, str], dict[str, Any]] = {}
                for source, cluster in ((east_api, "east"), (west_api, "west")):
                    out.update({(cluster, n): o for n, o in (await sources(source, "cache=yes")).items()})
                return out

            want = await expected()
            assert len(want) == 5
            await sidecar.wait(lambda: ccr_ready(api, "configmaps", 5, 5), 60,
                               "Ready with resourceCounts {local: 5, cache: 5}")
            wrappers = await configmap_wrappers(api)
            assert not mismatches(wrappers, want), mismatches(wrappers, want)
            names = {w["metadata"]["name"]: w for w in wrappers}
            assert sorted(names) == ["east.v1.configmaps.core.default.east-only",
                                     "east.v1.configmaps.core.default.settings",
                                     "east.v1.configmaps.core.default.shared",
                                     "west.v1.configmaps.core.default.settings",
                                     "west.v1.configmaps.core.default.shared"]
            for cluster in ("east", "west"):
                wrapper = names[f"{cluster}.v1.configmaps.core.default.settings"]
                assert wrapper["metadata"]["labels"] == {
                    LABEL_SCHEMA: "v1.configmaps.core", LABEL_GROUP: "core", LABEL_VERSION: "v1",
                    LABEL_RESOURCE: "configmaps", LABEL_ORIGINAL_NAME: "settings",
                    LABEL_ORIGINAL_NAMESPACE: "default", LABEL_CLUSTER: cluster}
                assert wrapper["spec"]["raw"]["data"] == {"from": cluster, "name": "settings"}
            by_cluster = await api.request("GET", CACHED_OBJECTS.path(),
                                           {"labelSelector": schema_selector(CONFIGMAPS, "west")})
            assert sorted(w["metadata"]["name"] for w in by_cluster["items"]) == [
                "west.v1.configmaps.core.default.settings", "west.v1.configmaps.core.default.shared"]
            assert sidecar.replications()["configmaps"]["local"] == 5
            assert sidecar.replications()["configmaps"]["cache"] == 5

            # A change in one cluster reaches only its own wrapper; the counts follow a delete.
            await west_api.request("PATCH", CONFIGMAPS.path("default", "shared"), body={"data": {"from": "west2"}},
                                   headers={"Content-Type": "application/merge-patch+json"})
            await east_api.request("DELETE", CONFIGMAPS.path("default", "east-only"))

            async def converged() -> bool:
                return not mismatches(await configmap_wrappers(api), await expected())

            await sidecar.wait(converged, 30, "the west update and the east delete to be replicated")
            await sidecar.wait(lambda: ccr_ready(api, "configmaps", 4, 4), 30, "resourceCounts {local: 4, cache: 4}")
            east_shared = await api.request("GET", CACHED_OBJECTS.path(name="east.v1.configmaps.core.default.shared"))
            assert east_shared["spec"]["raw"]["data"] == {"from": "east", "name": "shared"}


# -- 3. the cache cluster down for 30 s --------------------------------------------------------------------------
OUTAGE = 30.0


async def test_cache_cluster_down_30s_catches_up_without_loss_or_duplicates(
        control_plane_factory: Callable[..., ControlPlane]) -> None:
    cache, workload = await start_planes(control_plane_factory, 2)
    yes = {"rep": "yes"}
    async with ApiClient.from_kubeconfig(str(cache.kubeconfig)) as api, \
            ApiClient.from_kubeconfig(str(workload.kubeconfig)) as src:
        for i in range(10):
            await src.request("POST", CONFIGMAPS.path("default"), body={
                "metadata": {"name": f"a-{i}", "labels": yes}, "data": {"v": "1"}})
        await src.request("POST", CONFIGMAPS.path("default"), body={"metadata": {"name": "x-0"}, "data": {"v": "1"}})
        ns = await fresh_namespace(api)
        await put_secret(api, ns, "src", kubeconfig(workload))

        async def expected() -> dict[tuple[str, str], dict[str, Any]]:
            return {("src", n): o for n, o in (await sources(src, "rep=yes")).items()}

        async with Sidecar(cache, ns) as sidecar:
            await sidecar.wait(lambda: sidecar.members_ready("src"), 40, "member src ready")
            await api.request("POST", CLUSTER_CACHED_RESOURCES.path(),
                              body=ccr_body("configmaps", selector={"matchLabels": yes}))
            await sidecar.wait(lambda: ccr_ready(api, "configmaps", 10, 10), 60, "the first 10 replicated")
            assert not mismatches(await configmap_wrappers(api), await expected())

            await asyncio.to_thread(cache.stop_apiserver)
            down = time.monotonic()
            # While the cache is down: creates, updates (one object twice), deletes, a source leaving the
            # selector and one entering it.
            for i in range(5):
                await src.request("POST", CONFIGMAPS.path("default"), body={
                    "metadata": {"name": f"b-{i}", "labels": yes}, "data": {"v": "new"}})
            merge = {"Content-Type": "application/merge-patch+json"}
            for i in range(3):
                await src.request("PATCH", CONFIGMAPS.path("default", f"a-{i}"), body={"data": {"v": "2"}},
                                  headers=merge)
            for i in range(3, 6):
                await src.request("DELETE", CONFIGMAPS.path("default", f"a-{i}"))
            await src.request("PATCH", CONFIGMAPS.path("default", "a-6"),
                              body={"metadata": {"labels": {"rep": "no"}}}, headers=merge)
            await src.request("PATCH", CONFIGMAPS.path("default", "x-0"), body={"metadata": {"labels": yes}},
                              headers=merge)
            await src.request("PATCH", CONFIGMAPS.path("default", "a-7"), body={"data": {"v": "2"}}, headers=merge)
            await asyncio.sleep(OUTAGE / 2)
            await src.request("PATCH", CONFIGMAPS.path("default", "a-7"), body={"data": {"v": "3"}}, headers=merge)
            await asyncio.sleep(max(0.0, OUTAGE - (time.monotonic() - down)))
            await asyncio.to_thread(cache.start_apiserver)
            up = time.monotonic()

            want = await expected()
            assert sorted(n for _, n in want) == sorted(
                [f"a-{i}" for i in (0, 1, 2, 7, 8, 9)] + [f"b-{i}" for i in range(5)] + ["x-0"])

            # (seconds after the restart, problems left, the first of them) as they change: for the report
            progress: list[tuple[float, int, str]] = []

            async def caught_up() -> bool:
                try:
                    left = mismatches(await configmap_wrappers(api), want)
                except (ApiError, OSError):
                    return False
                if not progress or progress[-1][1] != len(left):
                    progress.append((round(time.monotonic() - up, 1), len(left), left[0] if left else ""))
                return not left

            try:
                await sidecar.wait(caught_up, 120, "the cache to catch up after the outage")
            except AssertionError as e:
                raise AssertionError(f"{e}: not caught up {time.monotonic() - up:.0f}s after the cache came back: "
                                     f"{mismatches(await configmap_wrappers(api), want)}") from None
            catch_up = time.monotonic() - up
            await sidecar.wait(lambda: ccr_ready(api, "configmaps", 12, 12), 30, "resourceCounts {12, 12}")
            # Nothing else in the cache, and it stays so.
            await asyncio.sleep(2)
            assert not mismatches(await all_cached_objects(api), want), mismatches(await all_cached_objects(api), want)
            # The new apiserver counts from its start: each change was written once (a create per new wrapper,
            # an update per changed one, a delete per gone one).
            written = await cache_writes(api, code=None)
            succeeded = {verb: (await cache_writes(api, code))[verb]
                         for verb, code in (("POST", "201"), ("PUT", "200"), ("DELETE", "200"), ("PATCH", "200"))}
            assert succeeded == {"POST": 6, "PUT": 4, "DELETE": 4, "PATCH": 0}, (succeeded, written)
            print(f"\ncache outage {up - down:.1f}s; caught up {catch_up:.1f}s after the restart "
                  f"(problems left by seconds after it: {progress}); writes {written}")


# -- 4. 5,000 objects, replication restarted: no writes ----------------------------------------------------------
BULK = 5000


async def test_restarted_replication_of_5000_objects_writes_nothing(
        control_plane_factory: Callable[..., ControlPlane]) -> None:
    cache, workload = await start_planes(control_plane_factory, 2)
    bulk = {"bulk": "yes"}
    async with ApiClient.from_kubeconfig(str(cache.kubeconfig)) as api, \
            ApiClient.from_kubeconfig(str(workload.kubeconfig)) as src:
        started = time.monotonic()
        await create_configmaps(src, "default", BULK, prefix="bulk", size=64, labels=bulk)
        created = time.monotonic() - started
        ns = await fresh_namespace(api)
        await put_secret(api, ns, "src", kubeconfig(workload))
        before_first = await cache_writes(api)
        async with Sidecar(cache, ns) as sidecar:
            await sidecar.wait(lambda: sidecar.members_ready("src"), 40, "member src ready")
            started = time.monotonic()
            await api.request("POST", CLUSTER_CACHED_RESOURCES.path(),
                              body=ccr_body("configmaps", selector={"matchLabels": bulk}))
            await sidecar.wait(lambda: ccr_ready(api, "configmaps", BULK, BULK), 120,
                               f"Ready with {BULK} objects replicated")
            replicated = time.monotonic() - started
        initial = delta(await cache_writes(api, "201"), dict.fromkeys(WRITE_VERBS, 0.0))
        assert initial.get("POST") == BULK, f"the initial replication created {initial} (not {BULK} wrappers once)"
        wrappers = await configmap_wrappers(api)
        assert len(wrappers) == BULK and len({w["metadata"]["name"] for w in wrappers}) == BULK
        first = delta(await cache_writes(api), before_first)

        # Restart: a new sidecar over the replicated state.
        before = await cache_writes(api)
        async with Sidecar(cache, ns) as sidecar:
            await sidecar.wait(lambda: sidecar.members_ready("src"), 40, "member src ready after the restart")
            await sidecar.wait(lambda: sidecar.replications().get("configmaps", {}).get("local") == BULK and
                               sidecar.replications()["configmaps"].get("cache") == BULK, 60,
                               "the restarted replication to hold every source and wrapper")
            await sidecar.wait(lambda: ccr_ready(api, "configmaps", BULK, BULK), 60, "Ready after the restart")
            await asyncio.sleep(5)  # every source has been compared with its wrapper by now
            assert delta(await cache_writes(api), before) == {}, "the restarted replication wrote to CachedObjects"
            # It does replicate: one new source object is one create, and still nothing else.
            await src.request("POST", CONFIGMAPS.path("default"), body={
                "metadata": {"name": "after-restart", "labels": bulk}, "data": {"x": "y"}})

            async def probe_replicated() -> bool:
                try:
                    await api.request("GET", CACHED_OBJECTS.path(
                        name=wrapper_name(CONFIGMAPS, "after-restart", "default", "src")))
                    return True
                except NotFound:
                    return False

            await sidecar.wait(probe_replicated, 30, "the probe object to be replicated after the restart")
            await asyncio.sleep(2)
            assert delta(await cache_writes(api), before) == {"POST": 1}
        print(f"\n{BULK} ConfigMaps created in {created:.1f}s; replicated in {replicated:.1f}s "
              f"(cache writes {first}); after the restart: 0 writes, then 1 for one new object")
