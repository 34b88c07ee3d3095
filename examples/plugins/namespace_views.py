"""Example plugin: a union of informers kept in step with records, with a ``UnionController`` (seed 000).

The records are NamespaceViews (``examples/crds/namespaceview.json``); each names a namespace, of this cluster or of
the cluster whose kubeconfig is in a Secret of the view's namespace (key ``kubeconfig``)::

    spec: {namespace: team-a}                           # team-a of this cluster
    spec: {namespace: default, kubeconfigSecret: east}  # default of the cluster of Secret "east"

The factory builds an informer of that namespace's ConfigMaps (None while the Secret is missing: retried with
backoff); the union holds one per view, under the view's key (``namespace/name``), and follows the views as they
come, change and go. The view's status says how many ConfigMaps it sees: ``{ready: true, configMaps: 3}``
(``ready: false`` until its informer has synced), written by a second controller over the views that reads the
union's lister and is woken by the union's events. A view gets a new informer when its spec changes (not when its
Secret does: edit the view, or name another Secret).

Hosting: a union controller is a ManagedController of the records' GVR, like any controller of the local cluster:
its ``create`` builds a fresh UnionController over ``ctx.informer(VIEWS)`` for each leadership term, and the
manager stops it (every informer it made with it) when the term ends or the CRD goes.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

from controllers import Controller, ControllerContext, ManagedController, Request, Result, UnionController
from informers import GVR, ApiClient, FuncHandler, InformerMetrics, NotFound, SharedIndexInformer, object_key
from informers.untrusted_kubeconfig import client_from_untrusted_kubeconfig

VIEWS = GVR("examples.kube-syncer.io", "v1", "namespaceviews")
CONFIGMAPS = GVR("", "v1", "configmaps")
SECRETS = GVR("", "v1", "secrets")


class NamespaceInformer(SharedIndexInformer):
    """The ConfigMaps of one namespace; one of another cluster closes that cluster's client when it stops."""

    def __init__(self, client: ApiClient, namespace: str, view: str, own_client: bool) -> None:
        super().__init__(client, CONFIGMAPS, namespace=namespace,
                         metrics=InformerMetrics.for_registry().for_cluster(f"view {view}"))
        self._own = client if own_client else None

    async def stop(self) -> None:
        try:
            await super().stop()
        finally:
            if self._own is not None:
                await self._own.close()


def syncer_controllers(settings: dict[str, Any]) -> dict[str, ManagedController]:
    """The plugin hook: the union controller and its reader, while NamespaceViews are served."""

    def create(ctx: ControllerContext) -> Any:
        client = ctx.require_client()

        async def factory(view: dict[str, Any]) -> NamespaceInformer | None:
            spec, home = view["spec"], view["metadata"]["namespace"]
            secret = spec.get("kubeconfigSecret")
            if not secret:
                return NamespaceInformer(client, spec["namespace"], object_key(view), own_client=False)
            try:
                kubeconfig = (await ctx.resource_client(SECRETS).get(secret, home))["data"]["kubeconfig"]
            except NotFound:
                return None  # not yet: asked again with backoff
            other = client_from_untrusted_kubeconfig(base64.b64decode(kubeconfig), source=f"secret {home}/{secret}")
            return NamespaceInformer(other, spec["namespace"], object_key(view), own_client=True)

        views = UnionController(ctx.informer(VIEWS), object_key, factory, name="namespace-views",
                                stats=ctx.reconcile_stats)
        union = views.union()

        async def write_status(req: Request) -> Result | None:
            view = ctx.informer(VIEWS).lister.get(req.name, req.namespace)
            if view is None:
                return None
            ready = union.cluster_ready(req.key)
            seen = {"ready": True, "configMaps": len(union.lister.list_for_cluster(req.key))} if ready else \
                {"ready": False}
            if view.get("status") != seen:
                await ctx.resource_client(VIEWS).apply_status({
                    "apiVersion": view["apiVersion"], "kind": view["kind"],
                    "metadata": {"name": req.name, "namespace": req.namespace}, "status": seen}, force=True)
            return None if ready else Result(requeue_after=1.0)

        status = Controller("namespace-views-status", write_status).for_(VIEWS)

        def wake(cluster: str) -> None:  # a ConfigMap seen by view ``cluster`` (its key) changed
            namespace, _, name = cluster.partition("/")
            if status.queue is not None:
                status.queue.add(Request(name, namespace))

        union.add_event_handler(FuncHandler(lambda obj, initial, cluster: wake(cluster),
                                            lambda old, new, cluster: wake(cluster),
                                            lambda obj, cluster: wake(cluster)), name="namespace-views-status")

        async def start(ctx: ControllerContext) -> None:
            async with asyncio.TaskGroup() as tasks:
                tasks.create_task(views.run(workers=2))
                tasks.create_task(status.run(ctx))

        return start

    return {"namespace-views": ManagedController([VIEWS], create, provided_by={
        VIEWS: "the CRD in examples/crds/namespaceview.json (kubectl apply -f examples/crds/namespaceview.json)"})}
