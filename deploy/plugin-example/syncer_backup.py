"""A kube-syncer plugin: keep a copy "<name>-backup" of every ConfigMap labelled example.com/backup=true."""

from __future__ import annotations

from typing import Any

from controllers import (
    Controller, ControllerContext, ManagedController, OperationResult, ReconcileContext, Request, WatchEvent,
    create_or_update, set_controller_reference,
)
from informers import GVR

CONFIGMAPS = GVR("", "v1", "configmaps")
LABEL = "example.com/backup"


def syncer_controllers(settings: dict[str, Any]) -> dict[str, ManagedController]:
    """The hook: ``settings`` is the table [plugin_settings.backup] of the settings file."""
    suffix = settings.get("suffix", "-backup")

    def labelled(event: WatchEvent) -> bool:
        return (event.obj["metadata"].get("labels") or {}).get(LABEL) == "true"

    async def reconcile(req: Request, rc: ReconcileContext) -> None:
        source = rc.lister().get(req.name, req.namespace)  # from the cache; None once deleted
        if source is None:
            return  # its copy is owned by it: the garbage collector deletes the copy

        def copy_source(backup: dict[str, Any]) -> None:
            backup["data"] = dict(source.get("data") or {})
            set_controller_reference(source, backup)  # owns() maps the copy's events back to the source

        name = req.name + suffix
        _, result = await create_or_update(rc.client, {
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": req.namespace}},
            copy_source)
        if result is not OperationResult.UNCHANGED:
            rc.events.event(source, "Normal", "BackedUp", "Backup", f"{result} {name}")
            rc.log.info("{} {}", result, name)

    def create(ctx: ControllerContext) -> Any:  # called on every (re)start of the controller
        return (Controller("backup", reconcile, workers=ctx.workers)
                .for_(CONFIGMAPS, predicates=[labelled])
                .owns(CONFIGMAPS)
                .run)

    return {"backup": ManagedController([CONFIGMAPS], create)}
