"""Admission for ClusterCachedResources: at most one per GVR (kcp's admission plugin for them does the same).

A second resource for a GVR already replicated is denied, naming the one that has it; re-applying the same object
(same name) is allowed, whatever else changed. The check lists the ClusterCachedResources through the sidecar's
client on every admission: they are few, and a webhook answers on every replica, standbys included, where no
informer of them runs.

Only what sets the GVR is judged: a create, and an update that changes the spec's GVR. Any other update of an
existing object (its finalizers, labels, the rest of its spec) is admitted: admission cannot be atomic, so two
created at the same moment may both be admitted, and if their updates were judged too, each one's finalizer
would be refused because of the other and neither could ever be reconciled or deleted. The root controller
settles such a tie (the oldest replicates, the others show phase ``Conflict``).
"""

from __future__ import annotations

from informers import ApiClient
from syncer.webhook import AdmissionRequest, AdmissionRule, Allow, Deny, ValidatingWebhook

from .naming import CLUSTER_CACHED_RESOURCES, GROUP, VERSION

WEBHOOK_NAME = "validate.clustercachedresources.cache.kcp.io"


def _gvr_of(obj: dict[str, object]) -> tuple[str, str, str]:
    spec = obj.get("spec")
    spec = spec if isinstance(spec, dict) else {}
    group = str(spec.get("group") or "")
    return ("" if group == "core" else group, str(spec.get("version") or ""), str(spec.get("resource") or ""))


async def one_per_gvr(request: AdmissionRequest, client: ApiClient) -> Allow | Deny:
    """Deny a ClusterCachedResource whose GVR another one (by another name) already replicates, when it is
    created or its GVR changes."""
    if request.object is None:
        return Allow()
    wanted = _gvr_of(request.object)
    if request.old_object is not None and _gvr_of(request.old_object) == wanted:
        return Allow()  # not a change of the GVR: metadata, status, the selector
    existing = await client.request("GET", CLUSTER_CACHED_RESOURCES.path())
    for other in existing.get("items") or ():
        name = other["metadata"]["name"]
        if name != request.name and _gvr_of(other) == wanted:
            group, version, resource = wanted
            return Deny(f"ClusterCachedResource {name!r} already replicates {resource}.{version}.{group or 'core'}; "
                        "at most one ClusterCachedResource per resource", code=409)
    return Allow()


def webhook() -> ValidatingWebhook:
    """The declaration of the one-per-GVR check."""
    return ValidatingWebhook(WEBHOOK_NAME, one_per_gvr, [AdmissionRule(
        ["CREATE", "UPDATE"], [GROUP], [VERSION], [CLUSTER_CACHED_RESOURCES.resource], scope="Cluster")])
