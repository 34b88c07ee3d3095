"""Admission and CRD conversion webhooks served by the sidecar: what a plugin declares and returns.

A plugin's hook ``syncer_webhooks(settings) -> list[Webhook]`` declares ``ValidatingWebhook`` and
``MutatingWebhook`` objects; each handler is ``async def handler(request: AdmissionRequest) -> Allow | Deny``.
``syncer_conversions(settings) -> list[Conversion]`` declares CRD conversion webhooks (``conversion``).
The modules: ``review`` (the AdmissionReview wire format), ``declaration`` (the declarations), ``certificates``
(TLS), ``server`` (serving), ``configuration`` (managed configuration objects), ``conversion_configuration``
(the converted CRDs' ``spec.conversion``), ``service`` (all of it, with readiness, as the sidecar runs it).
"""

from .conversion import Conversion, Converter
from .declaration import AdmissionRule, Handler, MutatingWebhook, ValidatingWebhook, Webhook
from .review import AdmissionRequest, Allow, Deny, Verdict

__all__ = ["AdmissionRequest", "AdmissionRule", "Allow", "Conversion", "Converter", "Deny", "Handler",
           "MutatingWebhook", "ValidatingWebhook", "Verdict", "Webhook"]
