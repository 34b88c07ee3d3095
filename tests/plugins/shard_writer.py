"""Test plugin: a controller that, while its unit runs, keeps recording writes stamped with the unit's tenure
(unit, holder identity, the unit Lease's ``leaseTransitions``), so a test can check that no two holders ever
wrote under one tenure and that a unit's tenures only go forward.

It reconciles the ConfigMap ``tick`` of the watched namespace and, every ``interval`` seconds, creates one
ConfigMap in ``record_namespace`` (``[plugin_settings.shard_writer]``), through the controller's fenced client.
"""

from __future__ import annotations

import time
from typing import Any

from controllers import Controller, ControllerContext, ManagedController, Request, Result
from informers import GVR

CONFIGMAPS = GVR("", "v1", "configmaps")
UNIT_LABEL = "shard-test/unit"


def syncer_controllers(settings: dict[str, Any]) -> dict[str, ManagedController]:
    record_namespace = str(settings.get("record_namespace", "default"))
    interval = float(settings.get("interval", 2.0))

    def create(ctx: ControllerContext) -> Any:
        assert ctx.client is not None
        client, fence = ctx.client, ctx.fence
        unit = str(getattr(fence, "unit", ctx.cluster or ""))

        async def reconcile(req: Request) -> Result:
            started = time.time()
            await client.request("POST", CONFIGMAPS.path(record_namespace), body={
                "metadata": {"generateName": "w-", "labels": {UNIT_LABEL: _label(unit)}},
                "data": {"unit": unit, "cluster": ctx.cluster or "", "holder": str(getattr(fence, "holder", "")),
                         "transitions": str(getattr(fence, "transitions", -1)), "started": repr(started)}})
            return Result(requeue_after=interval)

        return Controller("shard-writer", reconcile).watch(
            CONFIGMAPS, predicate=lambda obj: obj["metadata"]["name"] == "tick").run

    return {"shard-writer": ManagedController([CONFIGMAPS], create)}


def _label(unit: str) -> str:
    return (unit or "local")[:63].strip("-.") or "local"
