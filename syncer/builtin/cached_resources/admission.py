"""Admission for ClusterCachedResources: at most one per GVR (kcp's admission plugin for them does the same).

A second resource for a GVR already replicated is denied, naming the one that has it; re-applying the same object
(same name) is allowed, whatever else changed. The check lists the ClusterCachedResources through the sidecar's
client on every admission: they are few, and a webhook answers on every replica, standbys included, where no
informer of them runs.
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
    """Deny a ClusterCachedResource whose GVR another one (by another name) already replicates."""
    if request.object is None:
        return Allow()
    wanted = _gvr_of(request.object)
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
