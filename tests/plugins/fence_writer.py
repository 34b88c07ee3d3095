"""Test plugin: a controller that keeps writing to ConfigMaps labelled ``fence-test=true``, stamping each write
with the writer's identity (``[plugin_settings.fence_writer] identity``), so a test can see who wrote when."""

from __future__ import annotations

import time
from typing import Any

from controllers import Controller, ControllerContext, ManagedController, Request, Result
from informers import GVR

CONFIGMAPS = GVR("", "v1", "configmaps")
WRITER = "fence-test/writer"


def syncer_controllers(settings: dict[str, Any]) -> dict[str, ManagedController]:
    identity = str(settings.get("identity", "?"))

    def create(ctx: ControllerContext) -> Any:
        assert ctx.client is not None
        client = ctx.client

        async def reconcile(req: Request) -> Result:
            await client.request("PATCH", CONFIGMAPS.path(req.namespace, req.name), body={
                "metadata": {"annotations": {WRITER: identity, "fence-test/at": repr(time.time())}}})
            return Result(requeue_after=0.1)

        def labelled_and_not_mine(obj: Any) -> bool:
            meta = obj["metadata"]
            return (meta.get("labels") or {}).get("fence-test") == "true" and (
                meta.get("annotations") or {}).get(WRITER) != identity

        # Our own writes do not enqueue: the requeue keeps the writes going at ~10 a second.
        return Controller("fence-writer", reconcile).watch(CONFIGMAPS, predicate=labelled_and_not_mine).run

    return {"fence-writer": ManagedController([CONFIGMAPS], create)}
