"""CachedResources: the root controller of ClusterCachedResources (kcp's clustercachedresources controller): one
``Replication`` per ClusterCachedResource, its identity, its status and its deletion.

It validates the GVR, resolves the identity Secret and runs the replication as a cluster handler, so it follows
the GVR into and out of each source cluster. ``Ready`` means replicating. Of two for one GVR (admission cannot be
atomic) the oldest replicates; the others are ``Conflict`` and purge nothing. Differs from kcp: one replication over
every source cluster, not one per shard; the delete flow retries when the CRD or cache is gone; a changed spec
replaces the replication; status is written only on change, counts refreshed every few seconds.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loguru import logger

from controllers import Controller, ControllerContext, ReconcileContext, Request, Result
from controllers.fleet import FleetScope
from informers import (
    GVR, AlreadyExists, ApiClient, ApiError, ClusterSource, NotFound, SharedIndexInformer, drop_managed_fields,
)
from informers.selector import LabelSelector, SelectorError

from .naming import ANNOTATION_RESOURCE_KIND, ANNOTATION_RESOURCE_SCOPE, CLUSTER_CACHED_RESOURCES, FINALIZER
from .replication import Replication
from .sources import SourceClusters, summary

SECRETS = GVR("", "v1", "secrets")
CRDS_GVR = GVR("apiextensions.k8s.io", "v1", "customresourcedefinitions")
CRDS = Path(__file__).parent / "crds"  # shipped with the package; deploy/crds links here
IDENTITY_KEY = "key"
REFRESH = 5.0  # seconds between status refreshes of a running replication (its counts)


@dataclass(frozen=True)
class Options:
    """The plugin's settings (``[plugin_settings.cached_resources]``)."""

    identity_namespace: str = "default"
    sources: tuple[str, ...] = ()
    workers: int = 2
    install_crds: bool = True


@dataclass
class _Child:
    replication: Replication
    task: asyncio.Task[None]
    signature: tuple[str, str, str]  # (gvr, selector, identity hash): a change replaces the replication


class _Sources:
    """A cluster handler that passes only the configured source clusters on to a replication."""

    def __init__(self, replication: Replication, sources: tuple[str, ...]) -> None:
        self.replication, self.sources = replication, sources

    def add_cluster(self, ctx: Any, name: str, cluster: Any) -> None:
        if not self.sources or name in self.sources:
            self.replication.add_cluster(ctx, name, cluster)


class CachedResources:
    """The fleet component: runs the root controller for one leadership term (see the module docstring)."""

    name = "cached-resources"

    def __init__(self, options: Options) -> None:
        self.options = options
        self._children: dict[str, _Child] = {}
        self._handlers: dict[str, _Sources] = {}
        self._scope: FleetScope | None = None
        self._log = logger.bind(component=self.name)

    def status(self) -> dict[str, Any]:
        """Each ClusterCachedResource's replication: its GVR and counts."""
        return {"replications": {name: {"gvr": child.signature[0], **child.replication.counts()}
                                 for name, child in sorted(self._children.items())}}

    async def run(self, scope: FleetScope) -> None:
        """Reconcile ClusterCachedResources until cancelled; every replication is stopped on the way out."""
        self._scope = scope
        if self.options.install_crds:
            await install_crds(scope.management)
        informer = SharedIndexInformer(scope.management, CLUSTER_CACHED_RESOURCES, transform=drop_managed_fields)
        controller = (Controller(self.name, self._reconcile, workers=1, finalizer=FINALIZER, finalize=self._finalize)
                      .for_(informer)
                      .watches(informer, lambda ccr: _rivals(informer.lister.list(), ccr)))
        ctx = ControllerContext(self.name, {CLUSTER_CACHED_RESOURCES: informer}, client=scope.management,
                                fence=scope.fence)
        informer.start()
        try:
            await controller.run(ctx)
        finally:
            await asyncio.shield(self._stop_all())
            await informer.stop()

    # -- reconcile ---------------------------------------------------------------------------------------
    async def _reconcile(self, req: Request, rc: ReconcileContext) -> Result | None:
        ccr = rc.lister().get(req.name)
        if ccr is None:
            await self._stop_child(req.name)
            return None
        conditions: dict[str, tuple[bool, str, str]] = {}
        gvr, selector, problem = _parse_spec(ccr.get("spec") or {})
        if gvr is None or selector is None:
            conditions["ResourceValid"] = (False, "InvalidSpec", problem)
            await self._stop_child(req.name)
            await self._write_status(rc, ccr, "Initializing", conditions, "", None)
            return None
        winner = _winner(rc.lister().list(), gvr)
        if winner is not None and winner["metadata"]["name"] != req.name:
            await self._stop_child(req.name)
            other = winner["metadata"]["name"]
            leaving = " (being deleted; this one takes over once it is gone)" if _deleting(winner) else ""
            message = (f"ClusterCachedResource {other!r} is older and replicates {gvr}{leaving}; at most one "
                       "ClusterCachedResource per resource, so this one replicates nothing")
            conditions["ResourceValid"] = (False, "Conflict", message)
            conditions["ReplicationStarted"] = (False, "Conflict", f"{other!r} replicates {gvr}")
            await self._write_status(rc, ccr, "Conflict", conditions, "", None)
            return Result(requeue_after=REFRESH)
        served = self._served(gvr)
        conditions["ResourceValid"] = ((True, "Served", f"{served[0]}, {'Namespaced' if served[1] else 'Cluster'}")
                                       if served else (False, "NotServed", f"{gvr} is not served by any source "
                                                       "cluster yet; replication starts where it appears"))
        if served:
            await self._annotate(rc, ccr, *served)
        try:
            identity = await self._identity(rc, ccr)
        except (ApiError, KeyError, ValueError) as e:
            conditions["IdentityValid"] = (False, "IdentityUnavailable", str(e))
            await self._write_status(rc, ccr, "Initializing", conditions, "", None)
            return Result(requeue_after=REFRESH)
        conditions["IdentityValid"] = (True, "IdentityResolved", "")
        child = await self._ensure_child(req.name, gvr, selector, identity)
        synced = child.replication.synced()
        conditions["ReplicationStarted"] = ((True, "Replicating", "") if synced else
                                            (False, "Starting", "waiting for the source and cache caches to sync"))
        conditions["SourcesReachable"] = summary(gvr, child.replication.standings())
        phase = "Ready" if synced and served else "Initializing"
        await self._write_status(rc, ccr, phase, conditions, identity, child.replication.counts())
        return Result(requeue_after=REFRESH)

    async def _finalize(self, req: Request, rc: ReconcileContext, ccr: dict[str, Any]) -> None:
        """The delete flow: Deleting, stop replicating, purge the wrappers, Deleted (the Controller then removes
        the finalizer). A failing purge raises, so the Controller retries it with backoff."""
        await self._write_status(rc, ccr, "Deleting", {"ReplicationStarted": (False, "Deleting", "purging")},
                                 _status(ccr).get("identityHash", ""), None)
        child = self._children.get(req.name)
        gvr, selector, _ = _parse_spec(ccr.get("spec") or {})
        await self._stop_child(req.name)
        winner = _winner(rc.lister().list(), gvr) if gvr is not None else None
        if gvr is not None and (winner is None or winner["metadata"]["name"] == req.name):  # a loser's are not its own
            purger = child.replication if child is not None else self._replication(
                req.name, gvr, selector or LabelSelector.parse(""), "")
            try:
                remaining = await purger.purge()
            except Exception as e:
                await self._write_status(rc, ccr, "Deleting", {"ReplicationStarted": (
                    False, "PurgeFailed", f"cannot purge the cache yet ({type(e).__name__}: {e}); retrying")},
                    _status(ccr).get("identityHash", ""), None)
                raise
            if remaining:
                raise RuntimeError(f"{remaining} cached objects of {gvr} remain; purging again")
        await self._write_status(rc, ccr, "Deleted", {"ReplicationStarted": (False, "Deleted", "purged")},
                                 _status(ccr).get("identityHash", ""), {"local": 0, "cache": 0})

    # -- replications ------------------------------------------------------------------------------------
    def _replication(self, name: str, gvr: GVR, selector: LabelSelector, identity: str) -> Replication:
        scope = self._require_scope()
        return Replication(name, gvr, selector, identity, scope.management, scope.registry.clients,
                           fence=scope.fence, workers=self.options.workers,
                           sources=SourceClusters(scope.registry, self.options.sources))

    async def _ensure_child(self, name: str, gvr: GVR, selector: LabelSelector, identity: str) -> _Child:
        signature = (str(gvr), str(selector), identity)
        child = self._children.get(name)
        if child is not None and child.signature == signature and not child.task.done():
            return child
        await self._stop_child(name)
        replication = self._replication(name, gvr, selector, identity)
        handler = self._handlers[name] = _Sources(replication, self.options.sources)
        task = asyncio.create_task(replication.run(), name=f"{self.name} replication {name}")
        child = self._children[name] = _Child(replication, task, signature)
        await self._require_scope().registry.register_cluster_handler(handler)
        self._log.info("replicating {} for ClusterCachedResource {}", gvr, name)
        return child

    async def _stop_child(self, name: str) -> None:
        child = self._children.pop(name, None)
        handler = self._handlers.pop(name, None)
        if handler is not None and self._scope is not None:
            self._scope.registry.unregister_cluster_handler(handler)
        if child is None:
            return
        child.task.cancel()
        await asyncio.gather(child.task, return_exceptions=True)
        await child.replication.close()
        self._log.info("stopped replicating for ClusterCachedResource {}", name)

    async def _stop_all(self) -> None:
        for name in list(self._children):
            await self._stop_child(name)

    # -- helpers -----------------------------------------------------------------------------------------
    def _require_scope(self) -> FleetScope:
        if self._scope is None:
            raise RuntimeError("cached-resources is not running")
        return self._scope

    def _served(self, gvr: GVR) -> tuple[str, bool] | None:
        """(kind, namespaced) of ``gvr`` from the discovery of the management cluster or any source cluster."""
        scope = self._require_scope()
        factories: list[ClusterSource] = [scope.management_factory]
        for name in scope.registry.list_clusters():
            if not self.options.sources or name in self.options.sources:
                try:
                    factories.append(scope.registry.cluster(name).factory)
                except LookupError:
                    continue
        for factory in factories:
            last = factory.last_pass
            info = last.resources.get(gvr) if last is not None else None
            if info is not None:
                return info.kind, info.namespaced
        return None

    async def _annotate(self, rc: ReconcileContext, ccr: dict[str, Any], kind: str, namespaced: bool) -> None:
        want = {ANNOTATION_RESOURCE_KIND: kind, ANNOTATION_RESOURCE_SCOPE: "Namespaced" if namespaced else "Cluster"}
        have = ccr["metadata"].get("annotations") or {}
        if any(have.get(k) != v for k, v in want.items()):
            await rc.client.patch(ccr["metadata"]["name"], {"metadata": {"annotations": want}}, type="merge")

    async def _identity(self, rc: ReconcileContext, ccr: dict[str, Any]) -> str:
        """The identity hash: of the referenced Secret's ``key``, or of a Secret generated for this resource."""
        ref = ((ccr.get("spec") or {}).get("identity") or {}).get("secretRef")
        secrets_client = rc.clients(SECRETS)
        if ref:
            secret = await secrets_client.get(ref["name"], ref.get("namespace") or self.options.identity_namespace)
            data = (secret.get("data") or {}).get(IDENTITY_KEY)
            if not data:
                raise ValueError(f"Secret {ref.get('namespace')}/{ref['name']} has no data key {IDENTITY_KEY!r}")
            return hashlib.sha256(base64.b64decode(data)).hexdigest()
        name = f"{ccr['metadata']['name']}-identity"
        namespace = self.options.identity_namespace
        try:
            secret = await secrets_client.get(name, namespace)
        except NotFound:
            key = base64.b64encode(secrets.token_bytes(32)).decode()
            secret = await secrets_client.create({"metadata": {"name": name, "namespace": namespace},
                                                  "data": {IDENTITY_KEY: key}})
        return hashlib.sha256(base64.b64decode(secret["data"][IDENTITY_KEY])).hexdigest()

    async def _write_status(self, rc: ReconcileContext, ccr: dict[str, Any], phase: str,
                            conditions: dict[str, tuple[bool, str, str]], identity: str,
                            counts: dict[str, int] | None) -> None:
        old = _status(ccr)
        status: dict[str, Any] = {"phase": phase, "identityHash": identity or old.get("identityHash", "")}
        if counts is not None:
            status["resourceCounts"] = counts
        previous = {c.get("type"): c for c in old.get("conditions") or ()}
        merged = dict(previous)
        for type_, (ok, reason, message) in conditions.items():
            was = previous.get(type_) or {}
            value = "True" if ok else "False"
            merged[type_] = {"type": type_, "status": value, "reason": reason, "message": message,
                             "observedGeneration": ccr["metadata"].get("generation", 0),
                             "lastTransitionTime": was.get("lastTransitionTime") if was.get("status") == value
                             else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        status["conditions"] = [merged[k] for k in sorted(merged)]
        if all(old.get(k) == v for k, v in status.items()):
            return  # unchanged: no write, so no event, so no loop
        try:
            await rc.client.patch_status(ccr["metadata"]["name"], {"status": status}, type="merge")
        except NotFound:
            pass  # deleted meanwhile


async def install_crds(client: ApiClient) -> None:
    """Create the ClusterCachedResource and CachedObject CRDs, or bring existing ones up to date."""
    for path in sorted(CRDS.glob("*.json")):
        crd = json.loads(await asyncio.to_thread(path.read_text))
        try:
            await client.request("POST", CRDS_GVR.path(), body=crd)
        except AlreadyExists:
            current = await client.request("GET", CRDS_GVR.path(name=crd["metadata"]["name"]))
            crd["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            await client.request("PUT", CRDS_GVR.path(name=crd["metadata"]["name"]), body=crd)


def _status(ccr: dict[str, Any]) -> dict[str, Any]:
    return dict(ccr.get("status") or {})


def _deleting(ccr: Any) -> bool:
    return bool(ccr["metadata"].get("deletionTimestamp"))


def _winner(ccrs: list[Any], gvr: GVR) -> Any | None:
    """The ClusterCachedResource that replicates ``gvr``: the oldest of those naming it (by creationTimestamp,
    then name), being deleted or not (a winner being deleted still purges; the next one waits for it)."""
    rivals = [c for c in ccrs if _parse_spec(c.get("spec") or {})[0] == gvr]
    return min(rivals, key=lambda c: (c["metadata"].get("creationTimestamp") or "", c["metadata"]["name"]),
               default=None)


def _rivals(ccrs: list[Any], ccr: Any) -> list[Request]:
    """``ccr`` and every other ClusterCachedResource for its GVR: a change of one may change the winner."""
    gvr = _parse_spec(ccr.get("spec") or {})[0]
    names = {ccr["metadata"]["name"]}
    if gvr is not None:
        names |= {c["metadata"]["name"] for c in ccrs if _parse_spec(c.get("spec") or {})[0] == gvr}
    return [Request(name) for name in sorted(names)]


def _parse_spec(spec: dict[str, Any]) -> tuple[GVR | None, LabelSelector | None, str]:
    """The spec's GVR and selector, or None and what is wrong."""
    version, resource = spec.get("version"), spec.get("resource")
    if not isinstance(version, str) or not version or not isinstance(resource, str) or not resource:
        return None, None, "spec.version and spec.resource are required"
    group = spec.get("group") or ""
    if group == "core":
        group = ""
    try:
        selector = LabelSelector.from_spec(spec.get("labelSelector"))
    except SelectorError as e:
        return None, None, f"spec.labelSelector: {e}"
    return GVR(group, version, resource), selector, ""

