"""Example plugin: mirror ConfigMaps carrying a label into one target namespace.

``default/app-config`` becomes ``mirror/default.app-config``; removing the label or deleting the source removes
the mirror, and a mirror deleted by hand is recreated. Settings (``[plugin_settings.configmap_mirror]``):
``label`` (a label selector, default ``kube-syncer.io/mirror=true``) and ``target_namespace`` (default ``mirror``).
"""

from __future__ import annotations

from typing import Any

from controllers import Controller, ControllerContext, ManagedController, Request
from informers import GVR, ApiError, LabelSelector

CONFIGMAPS = GVR("", "v1", "configmaps")
NAMESPACES = GVR("", "v1", "namespaces")
MIRRORED_FROM = "kube-syncer.io/mirrored-from"


def syncer_controllers(settings: dict[str, Any]) -> dict[str, ManagedController]:
    """The plugin hook: one controller, running while ConfigMaps and Namespaces are served."""
    selector = LabelSelector.parse(settings.get("label", "kube-syncer.io/mirror=true"))
    target = settings.get("target_namespace", "mirror")

    def create(ctx: ControllerContext) -> Any:
        assert ctx.client is not None
        client, cms = ctx.client, ctx.informer(CONFIGMAPS).lister

        def source_of(obj: Any) -> list[Request]:
            meta = obj["metadata"]
            if meta.get("namespace") == target:
                origin = (meta.get("annotations") or {}).get(MIRRORED_FROM, "")
                ns, _, name = origin.partition("/")
                return [Request(name, ns)] if name else []
            return [Request(meta["name"], meta.get("namespace"))]

        async def reconcile(req: Request) -> None:
            mirror = f"{req.namespace}.{req.name}"
            src = cms.get(req.name, req.namespace)
            path = CONFIGMAPS.path(target, mirror)
            if src is None or not selector.matches(src["metadata"].get("labels")):
                try:
                    await client.request("DELETE", path)
                    ctx.log.info("removed mirror {}/{}", target, mirror)
                except ApiError as e:
                    if e.status != 404:
                        raise
                return
            body = {"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": mirror, "namespace": target,
                                 "annotations": {MIRRORED_FROM: req.key}},
                    "data": src.get("data") or {}, "binaryData": src.get("binaryData") or {}}
            current = cms.get(mirror, target)
            if current is None:
                await _ensure_namespace(client, target)
                try:
                    await client.request("POST", CONFIGMAPS.path(target), body=body)
                except ApiError as e:
                    if e.status != 409:
                        raise
                ctx.log.info("mirrored {} to {}/{}", req.key, target, mirror)
            elif current.get("data") != src.get("data") or current.get("binaryData") != src.get("binaryData"):
                body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
                await client.request("PUT", path, body=body)
                ctx.log.info("updated mirror {}/{}", target, mirror)

        return Controller("configmap-mirror", reconcile, workers=ctx.workers).watch(CONFIGMAPS, source_of).run

    return {"configmap-mirror": ManagedController([CONFIGMAPS, NAMESPACES], create)}


async def _ensure_namespace(client: Any, name: str) -> None:
    try:
        await client.request("POST", NAMESPACES.path(), body={"metadata": {"name": name}})
    except ApiError as e:
        if e.status != 409:
            raise
