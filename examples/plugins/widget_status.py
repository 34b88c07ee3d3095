"""Example plugin: the controller of the example ``Widget`` CRD (``examples/crds/widget.json``), using what a real
controller uses:

- ``for_(WIDGETS, predicates=[generation_changed])``: spec changes reconcile a Widget, status writes (its own
  included) do not;
- an owned child: a ConfigMap per Widget, named after it, holding its size, with a controller owner reference;
  ``owns(CONFIGMAPS)`` reconciles the Widget when its ConfigMap is changed or deleted, which puts it back;
- the status (``observedGeneration`` and a ``Ready`` condition, set with ``set_status_condition``, whose
  ``lastTransitionTime`` moves only when the status changes) written with server-side apply, as field manager
  ``widget-status``;
- a finalizer, ``examples.kube-syncer.io/cleanup``: deleting a Widget runs ``finalize``, which deletes its
  ConfigMap at once rather than leaving it to the garbage collector, before the Widget goes;
- Events on the Widget (``kubectl describe widget``).

The controller runs only while the CRD is installed. Uninstall in order: Widgets first, then the CRD, while the
controller runs, or the finalizer holds the Widgets (and the CRD) until it runs again.
"""

from __future__ import annotations

import copy
from typing import Any

from controllers import (
    Controller, ControllerContext, ManagedController, ReconcileContext, Request, generation_changed,
    set_controller_reference, set_status_condition,
)
from informers import GVR, NotFound
from informers.resource import Object

WIDGETS = GVR("examples.kube-syncer.io", "v1", "widgets")
CONFIGMAPS = GVR("", "v1", "configmaps")
FIELD_MANAGER = "widget-status"
FINALIZER = "examples.kube-syncer.io/cleanup"


async def reconcile(req: Request, rc: ReconcileContext) -> None:
    """Make the Widget's ConfigMap hold its size, then report the generation seen in its status."""
    widget = rc.lister().get(req.name, req.namespace)
    if widget is None:
        return  # deleted: finalize has run
    size = (widget.get("spec") or {}).get("size", 0)
    child = rc.lister(CONFIGMAPS).get(req.name, req.namespace)
    if child is None or (child.get("data") or {}).get("size") != str(size):
        desired: Object = {"apiVersion": "v1", "kind": "ConfigMap",
                           "metadata": {"name": req.name, "namespace": req.namespace}, "data": {"size": str(size)}}
        set_controller_reference(widget, desired)
        await rc.clients(CONFIGMAPS).apply(desired, field_manager=FIELD_MANAGER, force=True)
        rc.events.event(widget, "Normal", "ConfigMapSynced", "Apply", f"configmap {req.name}: size {size}")
    generation = widget["metadata"]["generation"]
    if (widget.get("status") or {}).get("observedGeneration") == generation:
        return
    # The conditions as they are, so that lastTransitionTime moves only when Ready's status changes.
    status = {"observedGeneration": generation,
              "conditions": copy.deepcopy((widget.get("status") or {}).get("conditions") or [])}
    set_status_condition({"metadata": widget["metadata"], "status": status}, "Ready", "True", "Reconciled",
                         f"size is {size}")
    await rc.client.apply_status({
        "apiVersion": widget["apiVersion"], "kind": widget["kind"],
        "metadata": {"name": req.name, "namespace": req.namespace}, "status": status,
    }, field_manager=FIELD_MANAGER, force=True)
    rc.events.event(widget, "Normal", "Ready", "Reconcile", f"generation {generation}, size {size}")
    rc.log.info("widget {} ready (generation {}, size {})", req.key, generation, size)


async def finalize(req: Request, rc: ReconcileContext, widget: Object) -> None:
    """The Widget is being deleted: delete its ConfigMap now."""
    try:
        await rc.clients(CONFIGMAPS).delete(req.name, req.namespace)
    except NotFound:
        pass  # already gone: finalize may run again after a failure, and must not fail then
    rc.events.event(widget, "Normal", "CleanedUp", "Delete", f"deleted configmap {req.name}")
    rc.log.info("widget {} cleaned up", req.key)


def syncer_controllers(settings: dict[str, Any]) -> dict[str, ManagedController]:
    """The plugin hook: the widget controller, started when Widgets and ConfigMaps are served and synced."""

    def create(ctx: ControllerContext) -> Any:
        return (Controller("widget-status", reconcile, workers=ctx.workers, finalizer=FINALIZER, finalize=finalize)
                .for_(WIDGETS, predicates=[generation_changed])
                .owns(CONFIGMAPS)
                .run)

    return {"widget-status": ManagedController([WIDGETS, CONFIGMAPS], create, provided_by={
        WIDGETS: "the CRD in examples/crds/widget.json (kubectl apply -f examples/crds/widget.json)"})}
