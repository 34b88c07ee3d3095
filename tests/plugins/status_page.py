"""Test plugin for the status page: a ConfigMap controller that reconciles (a rate, a latency and a queue to
show), one that waits for a GVR no API server serves, and one whose start fails with markup in its error (user
data the page must escape)."""

from __future__ import annotations

import asyncio
from typing import Any

from controllers import Controller, ControllerContext, ManagedController, ReconcileContext, Request
from informers import GVR

CONFIGMAPS = GVR("", "v1", "configmaps")
GADGETS = GVR("page.kube-syncer.io", "v1", "gadgets")
MARKUP = "<script>document.title='pwned'</script><img src=x onerror=\"document.title='pwned'\"> & co"


def syncer_controllers(settings: dict[str, Any]) -> dict[str, ManagedController]:
    async def reconcile(req: Request, rc: ReconcileContext) -> None:
        await asyncio.sleep(0.01)  # a latency to see

    def count(ctx: ControllerContext) -> Any:
        return Controller("configmap-count", reconcile, workers=1).for_(CONFIGMAPS).run

    def never(ctx: ControllerContext) -> Any:
        return Controller("gadget-sync", reconcile).for_(GADGETS).run

    def failing(ctx: ControllerContext) -> Any:
        raise RuntimeError(f"cannot start: {MARKUP}")

    return {"configmap-count": ManagedController([CONFIGMAPS], count),
            "gadget-sync": ManagedController([GADGETS], never),
            "markup": ManagedController([CONFIGMAPS], failing)}
