"""Example plugin: mirror ConfigMaps carrying a label into one target namespace.

``default/app-config`` becomes ``mirror/default.app-config``; removing the label or deleting the source removes
the mirror, and a mirror changed or deleted by hand is put back. Settings (``[plugin_settings.configmap_mirror]``):
``label`` (a label selector, default ``kube-syncer.io/mirror=true``) and ``target_namespace`` (default ``mirror``).

The mirror is written with ``create_or_update`` (read it, change what differs, update it with its
resourceVersion, or create it); a mirror cannot have its source as owner (owners live in the object's namespace),
so a second source of requests maps mirror events back to their source.
"""

from __future__ import annotations

from typing import Any

from controllers import (
    Controller, ControllerContext, ManagedController, OperationResult, ReconcileContext, Request, WatchEvent,
    create_or_update,
)
from informers import GVR, AlreadyExists, LabelSelector, NotFound
from informers.resource import Object

CONFIGMAPS = GVR("", "v1", "configmaps")
NAMESPACES = GVR("", "v1", "namespaces")
MIRRORED_FROM = "kube-syncer.io/mirrored-from"


def syncer_controllers(settings: dict[str, Any]) -> dict[str, ManagedController]:
    """The plugin hook: one controller, running while ConfigMaps and Namespaces are served."""
    selector = LabelSelector.parse(settings.get("label", "kube-syncer.io/mirror=true"))
    target = settings.get("target_namespace", "mirror")

    def labelled(event: WatchEvent) -> bool:
        """Events of sources: labelled before or after (so that removing the label is seen)."""
        return any(o is not None and selector.matches(o["metadata"].get("labels"))
                   for o in (event.old, event.new))

    def is_mirror(event: WatchEvent) -> bool:
        meta = event.obj["metadata"]
        return meta.get("namespace") == target and MIRRORED_FROM in (meta.get("annotations") or {})

    def source_of(mirror: Object) -> list[Request]:
        namespace, _, name = mirror["metadata"]["annotations"][MIRRORED_FROM].partition("/")
        return [Request(name, namespace)] if name else []

    async def reconcile(req: Request, rc: ReconcileContext) -> None:
        name = f"{req.namespace}.{req.name}"
        src = rc.lister().get(req.name, req.namespace)
        if src is None or not selector.matches(src["metadata"].get("labels")):
            if rc.lister().get(name, target) is not None:
                try:
                    await rc.client.delete(name, target)
                    rc.log.info("removed mirror {}/{}", target, name)
                except NotFound:
                    pass
            return
        if rc.lister(NAMESPACES).get(target) is None:
            try:
                await rc.clients(NAMESPACES).create({"apiVersion": "v1", "kind": "Namespace",
                                                     "metadata": {"name": target}})
            except AlreadyExists:
                pass

        def mirror_source(cm: Object) -> None:
            cm["metadata"]["annotations"] = {**(cm["metadata"].get("annotations") or {}), MIRRORED_FROM: req.key}
            for key in ("data", "binaryData"):  # absent when empty, as the server returns them
                if src.get(key):
                    cm[key] = dict(src[key])
                else:
                    cm.pop(key, None)

        _, result = await create_or_update(rc.client, {
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": target}}, mirror_source)
        if result is not OperationResult.UNCHANGED:
            rc.log.info("mirrored {} to {}/{} ({})", req.key, target, name, result)

    def create(ctx: ControllerContext) -> Any:
        return (Controller("configmap-mirror", reconcile, workers=ctx.workers)
                .for_(CONFIGMAPS, predicates=[labelled])
                .watches(CONFIGMAPS, source_of, predicates=[is_mirror])
                .run)

    return {"configmap-mirror": ManagedController([CONFIGMAPS, NAMESPACES], create)}
