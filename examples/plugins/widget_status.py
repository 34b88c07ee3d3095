"""Example plugin: a controller for the example ``Widget`` CRD (``examples/crds/widget.json``) that writes
``status.observedGeneration`` and a ``Ready`` condition. It runs only while the CRD is installed."""

from __future__ import annotations

import datetime
from typing import Any

from controllers import Controller, ControllerContext, ManagedController, Request
from informers import GVR

WIDGETS = GVR("examples.kube-syncer.io", "v1", "widgets")


def syncer_controllers(settings: dict[str, Any]) -> dict[str, ManagedController]:
    """The plugin hook: the widget controller, started when the Widget CRD is served and synced."""

    def create(ctx: ControllerContext) -> Any:
        assert ctx.client is not None
        client, widgets = ctx.client, ctx.informer(WIDGETS).lister

        async def reconcile(req: Request) -> None:
            widget = widgets.get(req.name, req.namespace)
            if widget is None:
                return
            generation = widget["metadata"].get("generation", 1)
            if (widget.get("status") or {}).get("observedGeneration") == generation:
                return
            size = (widget.get("spec") or {}).get("size", 0)
            now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            status = {"observedGeneration": generation, "conditions": [{
                "type": "Ready", "status": "True", "reason": "Reconciled", "message": f"size is {size}",
                "observedGeneration": generation, "lastTransitionTime": now}]}
            await client.request("PATCH", WIDGETS.path(req.namespace, req.name) + "/status",
                                 body={"status": status})
            ctx.log.info("widget {} ready (generation {}, size {})", req.key, generation, size)

        return Controller("widget-status", reconcile, workers=ctx.workers).watch(WIDGETS).run

    return {"widget-status": ManagedController([WIDGETS], create)}
