"""Cached resource replication (issue 14) against real control planes: the session's plane is the CACHE (and the
management cluster holding the member Secrets), a plane of this module is the SOURCE, registered as a member through
a kubeconfig Secret, as in test_multicluster. Two source clusters are two Secrets pointing at that one plane.

Writes to the cache are counted with the cache apiserver's own ``apiserver_request_total``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import uuid
from pathlib import Path
from typing import Any, AsyncIterator, Iterator

import kubernetes
import pytest

from controllers.cluster_registry import ClusterRegistry
from informers import GVR, ApiClient, LabelSelector, NotFound, ResourceClient
from syncer.testing import ControlPlane
from syncer.testing.pytest_plugin import kube_client

from tests.fleet import delete_secret, kubeconfig, options, put_secret
from tests.helpers import CONFIGMAPS, create_configmaps, eventually, fresh_namespace
from tests.kube import create_crd, wait_established

from syncer.builtin.cached_resources.naming import (  # noqa: E402  (after the stand-in, while there is one)
    CACHED_OBJECTS, source_of, wrapper_name,
)
from syncer.builtin.cached_resources.replication import Replication  # noqa: E402

NAMESPACES = GVR("", "v1", "namespaces")
WIDGETS = GVR("widgets.example.com", "v1", "widgets")  # a cluster-scoped custom resource
WRITE_VERBS = ("POST", "PUT", "PATCH", "DELETE", "APPLY")
ROOT = Path(__file__).resolve().parents[2]


# -- fixtures ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def source() -> Iterator[ControlPlane]:
    cp = ControlPlane(name="cache-source")
    try:
        cp.start()
        yield cp
    finally:
        cp.stop()


def _cached_object_crd() -> dict[str, Any]:
    for where in (ROOT / "deploy" / "crds", ROOT / "syncer" / "builtin" / "cached_resources" / "crds"):
        for path in sorted(where.glob("*.json")) if where.is_dir() else []:
            body: dict[str, Any] = json.loads(path.read_text())
            if body.get("spec", {}).get("names", {}).get("plural") == CACHED_OBJECTS.resource:
                return body
    raise AssertionError("the CachedObject CRD is not shipped (deploy/crds/*.json)")


@pytest.fixture(scope="module")
def cache_crd(control_plane: ControlPlane) -> None:
    body = _cached_object_crd()
    with kube_client(control_plane) as k:
        try:
            kubernetes.client.ApiextensionsV1Api(k).create_custom_resource_definition(body)  # type: ignore[arg-type]
        except kubernetes.client.ApiException as e:
            if e.status != 409:
                raise
        wait_established(k, body["metadata"]["name"])


@pytest.fixture
async def src(source: ControlPlane) -> AsyncIterator[ApiClient]:
    async with ApiClient.from_kubeconfig(str(source.kubeconfig)) as client:
        yield client


@pytest.fixture
async def secrets_ns(api: ApiClient) -> AsyncIterator[str]:
    async with fresh_namespace(api, "cr") as name:
        yield name


@pytest.fixture
async def src_ns(src: ApiClient) -> AsyncIterator[str]:
    async with fresh_namespace(src, "src") as name:
        yield name


@contextlib.asynccontextmanager
async def fleet(api: ApiClient, secrets_ns: str, source: ControlPlane,
                names: tuple[str, ...] = ("src",)) -> AsyncIterator[ClusterRegistry]:
    registry = ClusterRegistry(api, *options(api, secrets_ns))
    await registry.start()
    try:
        for name in names:
            await put_secret(api, secrets_ns, name, kubeconfig(source))
        await eventually(lambda: registry.list_clusters() == sorted(names), 30, "the source clusters")
        yield registry
    finally:
        await registry.stop()


@contextlib.asynccontextmanager
async def replicating(registry: ClusterRegistry, api: ApiClient, gvr: GVR, selector: LabelSelector | str,
                      identity: str = "id-1", workers: int = 4, purge: bool = True,
                      join_late: bool = False) -> AsyncIterator[Replication]:
    """A Replication into the cache ``api``, registered for every cluster; stopped (and purged) afterwards.
    ``join_late``: the clusters are handed over only once it runs (its wrappers already mapped to requests)."""
    sel = selector if isinstance(selector, LabelSelector) else LabelSelector.parse(selector)
    replication = Replication(f"t-{uuid.uuid4().hex[:6]}", gvr, sel, identity, api, registry.clients,
                              workers=workers)
    task = asyncio.create_task(replication.run())
    try:
        if join_late:
            await eventually(replication.synced, 30, "the replication to run without clusters")
        await registry.register_cluster_handler(replication)
        await eventually(replication.synced, 30, "the replication to sync")
        yield replication
    finally:
        registry.unregister_cluster_handler(replication)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await replication.close()
        if purge:
            assert await replication.purge() == 0


def cached(api: ApiClient) -> ResourceClient:
    return ResourceClient(api, CACHED_OBJECTS, namespaced=False)


async def wrapper(api: ApiClient, gvr: GVR, name: str, namespace: str | None, cluster: str) -> dict[str, Any] | None:
    try:
        return await cached(api).get(wrapper_name(gvr, name, namespace, cluster))
    except NotFound:
        return None


async def writes_by_verb(api: ApiClient) -> dict[str, float]:
    """The cache apiserver's count of CachedObject write requests per verb, failed ones (a 409) included."""
    text = await api.request_text("/metrics")
    out = {verb: 0.0 for verb in WRITE_VERBS}
    for line in text.splitlines():
        if not line.startswith("apiserver_request_total{") or f'resource="{CACHED_OBJECTS.resource}"' not in line:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}", 1)[0]))
        if labels.get("verb") in out:
            out[labels["verb"]] += float(line.rsplit(" ", 1)[1])
    return out


async def writes(api: ApiClient) -> float:
    return sum((await writes_by_verb(api)).values())


async def idle(replication: Replication, reconciles: int = 0) -> None:
    """Wait until the replication has reconciled at least ``reconciles`` times and its queue has stayed empty."""
    async def quiet() -> bool:
        status = replication.status()
        if status["queue"] or status["reconciles"] < reconciles:
            return False
        await asyncio.sleep(0.5)
        now = replication.status()
        return bool(now["queue"] == 0 and now["reconciles"] == status["reconciles"])
    await eventually(quiet, 60, "the replication to go idle")


def raw(w: dict[str, Any] | None) -> dict[str, Any]:
    assert w is not None
    return w["spec"]["raw"]  # type: ignore[no-any-return]


def cm(name: str, ns: str, labels: dict[str, str], data: dict[str, str] | None = None,
       finalizers: list[str] | None = None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": ns, "labels": labels}
    if finalizers:
        meta["finalizers"] = finalizers
    return {"metadata": meta, "data": data or {"k": "v"}}


# -- tests ------------------------------------------------------------------------------------------------
async def test_propagation_and_unchanged_writes_nothing(api: ApiClient, src: ApiClient, src_ns: str,
                                                        secrets_ns: str, source: ControlPlane,
                                                        cache_crd: None) -> None:
    run = uuid.uuid4().hex[:8]
    labels = {"run": run}
    cms = ResourceClient(src, CONFIGMAPS, namespaced=True)
    for i in range(3):
        await cms.create(cm(f"c{i}", src_ns, labels))
    await cms.create(cm("other", src_ns, {"run": "someone-else"}))
    async with fleet(api, secrets_ns, source) as registry, \
            replicating(registry, api, CONFIGMAPS, f"run={run}") as r:
        async def present() -> bool:
            return all([await wrapper(api, CONFIGMAPS, f"c{i}", src_ns, "src") is not None for i in range(3)])
        await eventually(present, 30, "three wrappers")
        w = await wrapper(api, CONFIGMAPS, "c0", src_ns, "src")
        source_obj = await cms.get("c0", src_ns)
        assert raw(w)["data"] == {"k": "v"} and raw(w)["metadata"]["uid"] == source_obj["metadata"]["uid"]
        assert w is not None and source_of(w) == ("src", src_ns, "c0")
        assert await wrapper(api, CONFIGMAPS, "other", src_ns, "src") is None
        await eventually(lambda: r.counts() == {"local": 3, "cache": 3}, 10, "the counts")

        # update
        source_obj["data"] = {"k": "changed"}
        await cms.update(source_obj)

        async def updated() -> bool:
            w = await wrapper(api, CONFIGMAPS, "c0", src_ns, "src")
            return w is not None and raw(w)["data"] == {"k": "changed"}
        await eventually(updated, 30, "the update to propagate")

        # unchanged: a wrapper event that changes nothing of ours (a label of someone else's) writes nothing
        await idle(r)
        before = await writes(api)
        name = wrapper_name(CONFIGMAPS, "c1", src_ns, "src")
        await cached(api).patch(name, {"metadata": {"labels": {"someone/else": "x"}}}, type="merge")
        await asyncio.sleep(1.0)
        await idle(r)
        assert await writes(api) - before == 1  # the PATCH above, nothing of the replication's
        assert (await cached(api).get(name))["metadata"]["labels"]["someone/else"] == "x"

        # delete
        await cms.delete("c2", src_ns)
        await eventually(lambda: r.counts() == {"local": 2, "cache": 2}, 30, "the deletion to propagate")
        assert await wrapper(api, CONFIGMAPS, "c2", src_ns, "src") is None


async def test_finalizer_holds_wrapper_and_hand_edits_are_restored(api: ApiClient, src: ApiClient, src_ns: str,
                                                                   secrets_ns: str, source: ControlPlane,
                                                                   cache_crd: None) -> None:
    run = uuid.uuid4().hex[:8]
    cms = ResourceClient(src, CONFIGMAPS, namespaced=True)
    await cms.create(cm("held", src_ns, {"run": run}, finalizers=["example.com/hold"]))
    await cms.create(cm("edited", src_ns, {"run": run}))
    async with fleet(api, secrets_ns, source) as registry, replicating(registry, api, CONFIGMAPS, f"run={run}") as r:
        await eventually(lambda: r.counts()["cache"] == 2, 30, "two wrappers")

        # a finalizer keeps the wrapper (mirroring the deletion in progress) until it is removed
        await cms.delete("held", src_ns)

        async def deleting() -> bool:
            w = await wrapper(api, CONFIGMAPS, "held", src_ns, "src")
            return w is not None and "deletionTimestamp" in raw(w)["metadata"]
        await eventually(deleting, 30, "the wrapper to show the deletion")
        await asyncio.sleep(0.5)
        assert await wrapper(api, CONFIGMAPS, "held", src_ns, "src") is not None
        await cms.patch("held", {"metadata": {"finalizers": None}}, type="merge", namespace=src_ns)

        async def gone() -> bool:
            return await wrapper(api, CONFIGMAPS, "held", src_ns, "src") is None
        await eventually(gone, 30, "the wrapper to go with the last finalizer")

        # hand edits: deleted, spec edited, one of our annotations and our schema label changed
        name = wrapper_name(CONFIGMAPS, "edited", src_ns, "src")
        original = await cached(api).get(name)

        async def restored() -> bool:
            w = await wrapper(api, CONFIGMAPS, "edited", src_ns, "src")
            return w is not None and w["spec"] == original["spec"] and all(
                w["metadata"].get(f, {}).get(k) == v for f in ("labels", "annotations")
                for k, v in (original["metadata"].get(f) or {}).items())

        await cached(api).delete(name)

        async def recreated() -> bool:
            w = await wrapper(api, CONFIGMAPS, "edited", src_ns, "src")
            return w is not None and w["metadata"]["uid"] != original["metadata"]["uid"]
        await eventually(recreated, 30, "the deleted wrapper to come back")
        assert await restored()
        await cached(api).patch(name, {"spec": {"raw": {"data": {"k": "tampered"}}}}, type="merge")
        await eventually(restored, 30, "the edited spec to be restored")
        annotations = original["metadata"]["annotations"]
        await cached(api).patch(name, {"metadata": {"annotations": {k: "tampered" for k in annotations}}},
                                type="merge")
        await eventually(restored, 30, "the edited annotations to be restored")
        # Every label of ours removed: the wrapper leaves the filtered informer; the name is taken, so it is read
        # and updated, not re-created.
        await cached(api).patch(name, {"metadata": {"labels": {k: None for k in original["metadata"]["labels"]}}},
                                type="merge")
        await eventually(restored, 30, "the removed labels to be restored")
        assert r.counts() == {"local": 1, "cache": 1}


async def test_selector_change_adds_and_removes(api: ApiClient, src: ApiClient, src_ns: str, secrets_ns: str,
                                                source: ControlPlane, cache_crd: None) -> None:
    run = uuid.uuid4().hex[:8]
    cms = ResourceClient(src, CONFIGMAPS, namespaced=True)
    for name, color in (("r1", "red"), ("r2", "red"), ("b1", "blue"), ("g1", "green")):
        await cms.create(cm(name, src_ns, {"run": run, "color": color}))

    async def have() -> set[str]:
        items = await cached(api).list(label_selector=None)
        return {source_of(w)[2] for w in items if source_of(w)[1] == src_ns}

    async with fleet(api, secrets_ns, source) as registry:
        async with replicating(registry, api, CONFIGMAPS, f"run={run},color=red", purge=False):
            await eventually(lambda: _eq(have(), {"r1", "r2"}), 30, "the red ones")
        # The new spec's replication: matchExpressions are honoured (kcp ignores them); what the old selector
        # admitted and this one does not is deleted.
        selector = LabelSelector.from_spec({"matchLabels": {"run": run},
                                            "matchExpressions": [{"key": "color", "operator": "In",
                                                                  "values": ["blue", "green"]}]})
        async with replicating(registry, api, CONFIGMAPS, selector) as r:
            await eventually(lambda: _eq(have(), {"b1", "g1"}), 30, "the blue and green ones only")
            # a source relabelled in and out of the selector
            await cms.patch("r1", {"metadata": {"labels": {"color": "green"}}}, type="merge", namespace=src_ns)
            await cms.patch("g1", {"metadata": {"labels": {"color": "red"}}}, type="merge", namespace=src_ns)
            await eventually(lambda: _eq(have(), {"b1", "r1"}), 30, "the relabelled ones to follow")
            assert r.counts() == {"local": 2, "cache": 2}


async def _eq(got: Any, want: set[str]) -> bool:
    return bool(await got == want)


async def test_cluster_scoped_core_and_custom_with_long_names(api: ApiClient, src: ApiClient, secrets_ns: str,
                                                              source: ControlPlane, src_ns: str,
                                                              cache_crd: None) -> None:
    run = uuid.uuid4().hex[:8]
    with kube_client(source) as k:
        try:
            create_crd(k, WIDGETS.group, WIDGETS.resource, "Widget", scope="Cluster")
        except kubernetes.client.ApiException as e:
            if e.status != 409:
                raise
        wait_established(k, f"{WIDGETS.resource}.{WIDGETS.group}")
    widgets = ResourceClient(src, WIDGETS, namespaced=False)
    long_name = ("w" + run + "-" + "x" * 300)[:253]
    long_cm = ("c" + run + "-" + "y" * 300)[:253]
    ns_name = f"n-{run}"
    cms = ResourceClient(src, CONFIGMAPS, namespaced=True)
    await cms.create(cm(long_cm, src_ns, {"run": run}))
    await src.request("POST", "/api/v1/namespaces", body={"metadata": {"name": ns_name, "labels": {"run": run}}})
    for name in ("short", long_name):
        await widgets.create({"apiVersion": "widgets.example.com/v1", "kind": "Widget",
                              "metadata": {"name": name, "labels": {"run": run}}, "spec": {"size": 3}})
    try:
        assert len(wrapper_name(WIDGETS, long_name, None, "src")) <= 253
        async with fleet(api, secrets_ns, source) as registry, \
                replicating(registry, api, WIDGETS, f"run={run}") as wr, \
                replicating(registry, api, NAMESPACES, f"run={run}") as nr, \
                replicating(registry, api, CONFIGMAPS, f"run={run}") as cr:
            await eventually(lambda: wr.counts()["cache"] == 2 and nr.counts()["cache"] == 1 and
                             cr.counts()["cache"] == 1, 30, "widgets, the namespace and the long configmap")
            for gvr, name, namespace in ((WIDGETS, "short", None), (WIDGETS, long_name, None),
                                         (NAMESPACES, ns_name, None), (CONFIGMAPS, long_cm, src_ns)):
                w = await wrapper(api, gvr, name, namespace, "src")
                assert w is not None, (gvr, name)
                assert source_of(w) == ("src", namespace, name)
                assert raw(w)["metadata"]["name"] == name
            assert raw(await wrapper(api, WIDGETS, "short", None, "src"))["spec"] == {"size": 3}
            await widgets.delete(long_name)
            await eventually(lambda: wr.counts() == {"local": 1, "cache": 1}, 30, "the long-named one to go")
            assert await wrapper(api, WIDGETS, long_name, None, "src") is None
            # purge while the source CRD is gone: it reads and writes the cache only
            with kube_client(source) as k:
                kubernetes.client.ApiextensionsV1Api(k).delete_custom_resource_definition(
                    f"{WIDGETS.resource}.{WIDGETS.group}")
            await wr.close()
            assert await wr.purge() == 0
            assert [w for w in await cached(api).list() if source_of(w)[2] == "short"] == []
    finally:
        await src.request("DELETE", f"/api/v1/namespaces/{ns_name}")


async def test_two_source_clusters_and_purge(api: ApiClient, src: ApiClient, src_ns: str, secrets_ns: str,
                                             source: ControlPlane, cache_crd: None, tmp_path: Path) -> None:
    run = uuid.uuid4().hex[:8]
    cms = ResourceClient(src, CONFIGMAPS, namespaced=True)
    for i in range(3):
        await cms.create(cm(f"same-{i}", src_ns, {"run": run}))
    async with fleet(api, secrets_ns, source, ("east", "west")) as registry, \
            replicating(registry, api, CONFIGMAPS, f"run={run}", purge=False) as r:
        await eventually(lambda: r.counts() == {"local": 6, "cache": 6}, 30, "a wrapper per cluster and object")
        for cluster in ("east", "west"):
            w = await wrapper(api, CONFIGMAPS, "same-0", src_ns, cluster)
            assert w is not None and source_of(w) == (cluster, src_ns, "same-0")
        assert wrapper_name(CONFIGMAPS, "same-0", src_ns, "east") != wrapper_name(CONFIGMAPS, "same-0", src_ns, "west")
        # A cluster that leaves keeps its wrappers (its requests are dropped, not turned into deletions).
        await delete_secret(api, secrets_ns, "west")
        await eventually(lambda: r.counts() == {"local": 3, "cache": 6}, 30, "west to leave")
        # purge: stop replicating, then every wrapper of the schema goes, whatever its cluster
        registry.unregister_cluster_handler(r)
        await r.close()
        assert await r.purge() == 0
        assert [w for w in await cached(api).list() if source_of(w)[1] == src_ns] == []

        # An unreachable cache: purge raises, so the caller retries.
        config = tmp_path / "dead"
        config.write_bytes(kubeconfig(source, server="https://127.0.0.1:1"))
        async with ApiClient.from_kubeconfig(str(config)) as dead:
            unreachable = Replication("dead", CONFIGMAPS, LabelSelector.parse(""), "", dead, registry.clients)
            with pytest.raises(OSError):
                await unreachable.purge()


async def test_two_thousand_then_restart_writes_nothing(api: ApiClient, src: ApiClient, src_ns: str,
                                                        secrets_ns: str, source: ControlPlane,
                                                        cache_crd: None) -> None:
    run = uuid.uuid4().hex[:8]
    total = 2000
    await create_configmaps(src, src_ns, total, prefix="many", size=50, labels={"run": run})
    cms = ResourceClient(src, CONFIGMAPS, namespaced=True)
    async with fleet(api, secrets_ns, source) as registry:
        before = await writes(api)
        async with replicating(registry, api, CONFIGMAPS, f"run={run}", workers=8, purge=False) as r:
            await eventually(lambda: r.counts() == {"local": total, "cache": total}, 90, "2,000 wrappers")
            await idle(r)
        assert await writes(api) - before == total  # one create each, nothing more

        # A new replication over the same state: every source is compared with its wrapper, nothing is written.
        before = await writes(api)
        async with replicating(registry, api, CONFIGMAPS, f"run={run}", workers=8, purge=False) as r:
            await eventually(lambda: r.counts() == {"local": total, "cache": total}, 60, "the caches")
            await idle(r, reconciles=total)
        assert await writes(api) - before == 0

        # Changed while nobody replicated: exactly the deletions and updates are written.
        for i in range(10):
            await cms.delete(f"many-{i}", src_ns)
        for i in range(10, 15):
            await cms.patch(f"many-{i}", {"data": {"x": "new"}}, type="merge", namespace=src_ns)
        by_verb = await writes_by_verb(api)
        # The source cluster joins after the wrappers were mapped (and their requests dropped, no cluster being
        # there yet): the stale ones are found when it joins.
        async with replicating(registry, api, CONFIGMAPS, f"run={run}", workers=8, join_late=True) as r:
            await eventually(lambda: r.counts() == {"local": total - 10, "cache": total - 10}, 60, "the catch-up")
            await idle(r, reconciles=total - 10)
            after = await writes_by_verb(api)
            assert {v: after[v] - by_verb[v] for v in WRITE_VERBS if after[v] != by_verb[v]} == {"DELETE": 10, "PUT": 5}
            assert raw(await wrapper(api, CONFIGMAPS, "many-10", src_ns, "src"))["data"] == {"x": "new"}
