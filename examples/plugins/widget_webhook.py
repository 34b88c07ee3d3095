"""Example plugin: admission webhooks for the example ``Widget`` CRD (``examples/crds/widget.json``).

- a mutating webhook, ``default.widgets.examples.kube-syncer.io``, gives a Widget without ``spec.size`` the
  default size (a JSON-patch operation);
- a validating webhook, ``validate.widgets.examples.kube-syncer.io``, denies a Widget whose size is above the
  maximum, with HTTP 422 and a message naming the field; a size of 0 is admitted with a warning.

Settings, ``[plugin_settings.widget_webhook]``: ``max_size`` (default 10), ``default_size`` (default 1).

Run it with ``syncer run --local`` and ``plugins = ["examples.plugins.widget_webhook"]``: against a local control
plane the sidecar writes the two configurations itself; ``kubectl apply`` a Widget with ``size: 50`` is then
refused with ``admission webhook "validate.widgets.examples.kube-syncer.io" denied the request: spec.size 50 is
above the maximum of 10``.
"""

from __future__ import annotations

from typing import Any

from syncer.webhook import AdmissionRequest, AdmissionRule, Allow, Deny, MutatingWebhook, ValidatingWebhook, Verdict

WIDGETS = AdmissionRule(operations=["CREATE", "UPDATE"], api_groups=["examples.kube-syncer.io"],
                        api_versions=["v1"], resources=["widgets"], scope="Namespaced")


def syncer_webhooks(settings: dict[str, Any]) -> list[MutatingWebhook | ValidatingWebhook]:
    """The plugin hook: the defaulting and the validating webhook of Widgets."""
    max_size, default_size = settings.get("max_size", 10), settings.get("default_size", 1)
    for name, value in (("max_size", max_size), ("default_size", default_size)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"[plugin_settings.widget_webhook] {name} must be an integer >= 0, got {value!r}")

    async def default(request: AdmissionRequest) -> Verdict:
        widget = request.object or {}
        if "size" in (widget.get("spec") or {}):
            return Allow()
        # JSON patch "add" needs the parent to exist: add the whole spec when there is none.
        if "spec" not in widget:
            return Allow(patch=[{"op": "add", "path": "/spec", "value": {"size": default_size}}])
        return Allow(patch=[{"op": "add", "path": "/spec/size", "value": default_size}])

    async def validate(request: AdmissionRequest) -> Verdict:
        size = ((request.object or {}).get("spec") or {}).get("size")
        if isinstance(size, int) and size > max_size:
            return Deny(f"spec.size {size} is above the maximum of {max_size}", code=422)
        return Allow(warnings=["spec.size is 0: this widget does nothing"] if size == 0 else [])

    return [MutatingWebhook("default.widgets.examples.kube-syncer.io", default, [WIDGETS]),
            ValidatingWebhook("validate.widgets.examples.kube-syncer.io", validate, [WIDGETS])]
