"""Test plugin: a controller that swallows cancellation and never stops."""

from __future__ import annotations

import asyncio
from typing import Any

from controllers import ControllerContext, ManagedController
from informers import GVR


def syncer_controllers(settings: dict[str, Any]) -> dict[str, ManagedController]:
    def create(ctx: ControllerContext) -> Any:
        async def start(ctx: ControllerContext) -> None:
            while True:
                try:
                    await asyncio.sleep(3600)
                except asyncio.CancelledError:
                    ctx.log.info("ignoring cancellation")

        return start

    return {"stubborn": ManagedController([GVR("", "v1", "configmaps")], create)}
