"""Managed conversion configuration: with ``webhooks.manage_configurations``, the sidecar points each converted
CRD's ``spec.conversion`` at its ``/convert/<crd>`` path, keeps the ``caBundle`` current, and takes it back when
it stops.

controller-runtime leaves this to kubebuilder and cert-manager; here the sidecar writes its own CA as it does for
admission (``configuration.py``). Only ``spec.conversion`` is written, and only when ``None`` or ours (annotation
``kube-syncer.io/conversion-written-by``); at shutdown it goes back to ``None`` if this process wrote it last, since a
CRD pointing at a gone server fails every conversion. A CRD not installed yet is written once it exists.
"""

from __future__ import annotations

import base64
from typing import Any, Sequence

from controllers import retry_on_conflict
from informers import GVR, ApiClient, Conflict, NotFound, ResourceClient

from .configuration import ConfigurationError
from .conversion import Conversion

CRDS = GVR("apiextensions.k8s.io", "v1", "customresourcedefinitions")
CONVERSION_WRITER_ANNOTATION = "kube-syncer.io/conversion-written-by"
REVIEW_VERSIONS = ["v1"]


class ManagedConversions:
    """The ``spec.conversion`` of each CRD of ``conversions``, pointing at ``base_url`` + its path."""

    def __init__(self, client: ApiClient, identity: str, base_url: str, conversions: Sequence[Conversion]) -> None:
        self.identity = identity
        self.base_url = base_url.rstrip("/")
        self.conversions = list(conversions)
        self.missing: set[str] = set()  # the CRDs not installed at the last apply()
        self._crds = ResourceClient(client, CRDS, namespaced=False)
        self._applied = False

    def url(self, conversion: Conversion) -> str:
        """Where the API server calls ``conversion``."""
        return self.base_url + conversion.path

    async def apply(self, ca_bundle: bytes) -> list[str]:
        """Point every installed CRD's conversion at us with ``ca_bundle``; what was written (e.g. ``configured the
        conversion webhook of CRD backups.example.com``), nothing for CRDs as declared already or not installed.
        ConfigurationError names a CRD whose conversion someone else configured."""
        self._applied = True
        written = []
        for conversion in self.conversions:
            if await retry_on_conflict(lambda: self._write(conversion, ca_bundle)):
                written.append(f"configured the conversion webhook of CRD {conversion.crd}")
        return written

    async def remove(self) -> list[str]:
        """Set back to ``strategy: None`` the CRDs this process configured last; what was changed."""
        if not self._applied:
            return []
        removed = []
        for conversion in self.conversions:
            try:
                crd = await self._crds.get(conversion.crd)
                if _writer(crd) != self.identity:
                    continue
                crd["spec"]["conversion"] = {"strategy": "None"}
                del crd["metadata"]["annotations"][CONVERSION_WRITER_ANNOTATION]
                await self._crds.update(crd)  # its resourceVersion is the precondition
                removed.append(f"the conversion webhook of CRD {conversion.crd}")
            except (NotFound, Conflict):
                pass  # gone, or rewritten by another replica since: theirs now
        return removed

    def status(self, conversion: Conversion) -> str:
        """How the CRD of ``conversion`` is configured, as last seen."""
        return "CRD not installed" if conversion.crd in self.missing else "managed"

    async def _write(self, conversion: Conversion, ca_bundle: bytes) -> bool:
        try:
            crd: dict[str, Any] = await self._crds.get(conversion.crd)
        except NotFound:
            self.missing.add(conversion.crd)
            return False
        self.missing.discard(conversion.crd)
        current = crd["spec"].get("conversion") or {"strategy": "None"}
        if current.get("strategy") != "None" and _writer(crd) is None:
            raise ConfigurationError(
                f"CRD {conversion.crd}: its spec.conversion ({current.get('strategy')}) was not configured by "
                "kube-syncer, so it is left alone; remove it from the CRD, or set "
                "'webhooks.manage_configurations = false' and point it at the sidecar's "
                f"{conversion.path} yourself")
        wanted = {"strategy": "Webhook", "webhook": {
            "clientConfig": {"url": self.url(conversion), "caBundle": base64.b64encode(ca_bundle).decode()},
            "conversionReviewVersions": REVIEW_VERSIONS}}
        if current == wanted and _writer(crd) == self.identity:
            return False
        _check_versions(conversion, crd)
        crd["spec"]["conversion"] = wanted
        crd["metadata"].setdefault("annotations", {})[CONVERSION_WRITER_ANNOTATION] = self.identity
        await self._crds.update(crd)
        return True


def _writer(crd: dict[str, Any]) -> str | None:
    return (crd["metadata"].get("annotations") or {}).get(CONVERSION_WRITER_ANNOTATION)


def _check_versions(conversion: Conversion, crd: dict[str, Any]) -> None:
    """ConfigurationError if the CRD serves a version the declaration cannot convert: every read of it would fail."""
    served = sorted(v["name"] for v in crd["spec"].get("versions") or [] if v.get("served"))
    unknown = [v for v in served if v not in conversion.versions]
    if unknown:
        raise ConfigurationError(f"CRD {conversion.crd} serves version(s) {', '.join(unknown)}, which its "
                                 f"conversion ({conversion.strategy}: {', '.join(conversion.versions)}) does not "
                                 "convert; declare them or stop serving them")
