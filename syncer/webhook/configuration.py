"""Managed configurations: the sidecar writes its ``ValidatingWebhookConfiguration`` and
``MutatingWebhookConfiguration`` from the plugins' declarations, and proves that the API server calls it.

controller-runtime never writes configurations; kopf takes any object of the name as its own. Here only objects
labelled ``app.kubernetes.io/managed-by=kube-syncer`` are touched, and one is deleted at shutdown only if this
process wrote it last. Each carries a probe webhook for dry-run ConfigMaps with a nonce label changed on every
write: a dry run our probe answers proves the API server uses the object as last written (its ``caBundle`` too).
Configurations use ``clientConfig.url``; a deployment behind a Service declares them in its manifests instead.
"""

from __future__ import annotations

import base64
import secrets
from typing import Any, Callable, Sequence

from controllers import retry_on_conflict
from informers import GVR, ApiClient, ApiError, Conflict, NotFound, ResourceClient

from .declaration import AdmissionRule, Handler, MutatingWebhook, ValidatingWebhook, Webhook
from .review import AdmissionRequest, Allow, Verdict

MANAGED_BY_LABEL, MANAGED_BY = "app.kubernetes.io/managed-by", "kube-syncer"
WRITER_ANNOTATION = "kube-syncer.io/written-by"
PROBE_LABEL = "kube-syncer.io/webhook-probe"
PROBE_NONCE_LABEL = "kube-syncer.io/webhook-probe-{kind}"  # the nonce of the kind's object as last written
PROBE_NAME = "probe.webhooks.kube-syncer.io"
CONFIGMAPS = GVR("", "v1", "configmaps")
_KINDS = {"validating": ("ValidatingWebhookConfiguration",
                         GVR("admissionregistration.k8s.io", "v1", "validatingwebhookconfigurations")),
          "mutating": ("MutatingWebhookConfiguration",
                       GVR("admissionregistration.k8s.io", "v1", "mutatingwebhookconfigurations"))}
_PROBE_TIMEOUT = 5


class ConfigurationError(Exception):
    """A configuration object cannot be managed; the message names the setting to change."""


class ManagedConfigurations:
    """The two configuration objects named ``name``, pointing at ``base_url`` + each webhook's path.

    ``probes`` are the probe webhooks to serve next to the plugins' ones; ``apply(ca_bundle)`` writes the
    objects, ``probe()`` sends one dry run and says whether both probes have answered it, each with its object as
    last written; ``remove()`` deletes what this process wrote.
    """

    def __init__(self, client: ApiClient, name: str, identity: str, base_url: str, webhooks: Sequence[Webhook],
                 probe_namespace: str) -> None:
        self.client = client
        self.name = name
        self.identity = identity
        self.base_url = base_url.rstrip("/")
        self.probe_namespace = probe_namespace
        self._nonces: dict[str, str] = {}  # kind -> the nonce of its object as last written
        self._seen: set[str] = set()  # the kinds whose probe answered with that nonce
        self._applied = False  # whether apply() ran: before that, nothing of ours can exist to remove
        probe: dict[str, Any] = {
            "name": PROBE_NAME, "failure_policy": "Ignore", "timeout_seconds": _PROBE_TIMEOUT,
            "object_selector": {"matchLabels": {PROBE_LABEL: name}},
            "namespace_selector": {"matchLabels": {"kubernetes.io/metadata.name": probe_namespace}},
            "rules": [AdmissionRule(["CREATE"], [""], ["v1"], ["configmaps"])]}
        # Only the kinds the plugins declare get an object (and a probe): a configuration of nothing but our probe
        # would be one more object for the API server to call, and for an operator to wonder about.
        self._kinds = [kind for kind in _KINDS if any(w.kind == kind for w in webhooks)] or list(_KINDS)
        self.probes: list[Webhook] = [
            (ValidatingWebhook if kind == "validating" else MutatingWebhook)(handler=self._probe_handler(kind), **probe)
            for kind in self._kinds]
        self.webhooks = [*webhooks, *self.probes]

    def url(self, webhook: Webhook) -> str:
        """Where the API server calls ``webhook``."""
        return self.base_url + webhook.path

    async def apply(self, ca_bundle: bytes) -> list[str]:
        """Create or update both objects; returns what was written (e.g. ``created ValidatingWebhookConfiguration
        kube-syncer``), nothing when they are as declared. A write needs a new answer of that kind's probe."""
        written = []
        self._applied = True
        for kind, (kind_name, gvr) in _KINDS.items():
            if kind in self._kinds:
                action = await retry_on_conflict(lambda: self._write(kind, kind_name, gvr, ca_bundle))
            else:  # left by a version of the plugins that declared webhooks of this kind
                action = "deleted" if await self._delete(gvr, lambda meta: True) else ""
            if action:
                written.append(f"{action} {kind_name} {self.name}")
        return written

    async def probe(self) -> bool:
        """Send one server-side dry run that the probes see; True once both have seen one since the last write."""
        if self.called:
            return True
        try:
            await ResourceClient(self.client, CONFIGMAPS, namespaced=True).create({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"generateName": "kube-syncer-webhook-probe-", "namespace": self.probe_namespace,
                             "labels": {PROBE_LABEL: self.name, **{PROBE_NONCE_LABEL.format(kind=kind): nonce
                                                                   for kind, nonce in self._nonces.items()}}},
            }, dry_run=True)
        except ApiError:
            if not self.called:
                raise
            # Rejected after our probes answered (another webhook, a quota): the API server did call us.
        return self.called

    @property
    def called(self) -> bool:
        """Whether the API server called both probes with the configurations last written."""
        return self._seen == set(self._kinds)

    async def remove(self) -> list[str]:
        """Delete the objects this process wrote last; returns what was deleted."""
        if not self._applied:
            return []

        def written_here(meta: dict[str, Any]) -> bool:
            return (meta.get("annotations") or {}).get(WRITER_ANNOTATION) == self.identity

        return [f"{kind_name} {self.name}" for kind_name, gvr in _KINDS.values()
                if await self._delete(gvr, written_here)]

    async def _delete(self, gvr: GVR, which: Callable[[dict[str, Any]], bool]) -> bool:
        """Delete our object of ``gvr`` if ``which(metadata)`` says so; whether it was deleted."""
        client = ResourceClient(self.client, gvr, namespaced=False)
        try:
            meta = (await client.get(self.name))["metadata"]
            if _ours(meta) and which(meta):
                await client.delete(self.name, resource_version=meta["resourceVersion"])
                return True
        except (NotFound, Conflict):
            pass  # gone already, or rewritten by another replica since: theirs now
        return False

    # -- helpers -----------------------------------------------------------------------------------------
    def _probe_handler(self, kind: str) -> Handler:
        async def handler(request: AdmissionRequest) -> Verdict:
            labels = ((request.object or {}).get("metadata") or {}).get("labels") or {}
            nonce = self._nonces.get(kind)
            if nonce and labels.get(PROBE_NONCE_LABEL.format(kind=kind)) == nonce:
                self._seen.add(kind)
            return Allow()
        return handler

    async def _write(self, kind: str, kind_name: str, gvr: GVR, ca_bundle: bytes) -> str:
        client = ResourceClient(self.client, gvr, namespaced=False)
        try:
            current: dict[str, Any] | None = await client.get(self.name)
        except NotFound:
            current = None
        if current is not None:
            meta = current["metadata"]
            if not _ours(meta):
                raise ConfigurationError(
                    f"{kind_name} {self.name!r} exists and was not created by kube-syncer (it has no label "
                    f"{MANAGED_BY_LABEL}={MANAGED_BY}), so it is left alone; set 'webhooks.configuration_name' to "
                    "another name")
            existing = current.get("webhooks") or []
            entries = self._entries(kind, ca_bundle, self._nonces.get(kind, ""))
            # Compared on the fields we write: the API server adds defaults of its own (e.g. matchConditions). The
            # writer is claimed too, so that the process running now is the one that deletes them when it stops.
            if len(existing) == len(entries) and all({k: e.get(k) for k in want} == want
                                                     for e, want in zip(existing, entries)) and \
                    (meta.get("annotations") or {}).get(WRITER_ANNOTATION) == self.identity:
                return ""
        nonce = secrets.token_hex(8)
        entries = self._entries(kind, ca_bundle, nonce)
        if current is None:
            await client.create({
                "apiVersion": gvr.group_version, "kind": kind_name,
                "metadata": {"name": self.name, "labels": {MANAGED_BY_LABEL: MANAGED_BY},
                             "annotations": {WRITER_ANNOTATION: self.identity}},
                "webhooks": entries})
        else:
            current["webhooks"] = entries
            current["metadata"].setdefault("annotations", {})[WRITER_ANNOTATION] = self.identity
            await client.update(current)
        self._nonces[kind] = nonce
        self._seen.discard(kind)
        return "created" if current is None else "updated"

    def _entries(self, kind: str, ca_bundle: bytes, nonce: str) -> list[dict[str, Any]]:
        """The object's webhooks, its probe wanting ``nonce``."""
        entries = [self._entry(w, ca_bundle) for w in self.webhooks if w.kind == kind]
        probe = entries[-1]  # the probes come last
        probe["objectSelector"] = {"matchLabels": {**probe["objectSelector"]["matchLabels"],
                                                   PROBE_NONCE_LABEL.format(kind=kind): nonce}}
        return entries

    def _entry(self, webhook: Webhook, ca_bundle: bytes) -> dict[str, Any]:
        entry = {
            "name": webhook.name,
            "clientConfig": {"url": self.url(webhook), "caBundle": base64.b64encode(ca_bundle).decode()},
            "rules": [r.as_dict() for r in webhook.rules],
            "failurePolicy": webhook.failure_policy,
            "sideEffects": webhook.side_effects,
            "timeoutSeconds": webhook.timeout_seconds,
            "matchPolicy": webhook.match_policy,
            # Written as the API server defaults them, so that an unchanged declaration compares equal.
            "namespaceSelector": dict(webhook.namespace_selector or {}),
            "objectSelector": dict(webhook.object_selector or {}),
            "admissionReviewVersions": list(webhook.review_versions),
        }
        if isinstance(webhook, MutatingWebhook):
            entry["reinvocationPolicy"] = webhook.reinvocation_policy
        return entry


def _ours(meta: dict[str, Any]) -> bool:
    return (meta.get("labels") or {}).get(MANAGED_BY_LABEL) == MANAGED_BY
