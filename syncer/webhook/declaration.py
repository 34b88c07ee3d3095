"""What a plugin declares: a validating or mutating webhook, its handler and its configuration entry's fields.

What differs from controller-runtime (``webhook.Admission`` registered on a path, the configuration written by
hand or by kubebuilder markers) and kopf (``@kopf.on.validate``/``mutate`` with ``id`` and options), and why:

- One declaration carries both the handler and every field of its ``ValidatingWebhookConfiguration`` /
  ``MutatingWebhookConfiguration`` entry (rules, ``failurePolicy``, ``sideEffects``, ``timeoutSeconds``,
  ``matchPolicy``, selectors), so the sidecar can write the configuration and nothing can drift between the path
  served and the path configured; the path is derived from the name.
- Mistakes the API server would only report when the configuration is written (a name that is not fully
  qualified, a timeout outside 1-30 s, ``sideEffects: Some``) are ``ValueError`` at declaration, so the plugin
  fails to load with one line instead.
- ``failurePolicy`` defaults to ``Fail`` as in ``admissionregistration.k8s.io/v1``; ``sideEffects`` defaults to
  ``None``, which lets server-side dry runs call the webhook (the sidecar's readiness check relies on that).
"""

from __future__ import annotations

import inspect
import re
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, ClassVar, Literal, Mapping, Sequence

from informers import ApiClient

from .review import REVIEW_VERSIONS, AdmissionRequest, Verdict

# A handler may take the sidecar's API client too, to check the request against what the cluster holds.
Handler = Callable[[AdmissionRequest], Awaitable[Verdict]] | Callable[[AdmissionRequest, ApiClient], Awaitable[Verdict]]
FailurePolicy = Literal["Fail", "Ignore"]
SideEffects = Literal["None", "NoneOnDryRun"]
MatchPolicy = Literal["Equivalent", "Exact"]

_OPERATIONS = ("CREATE", "UPDATE", "DELETE", "CONNECT", "*")
_SCOPES = ("*", "Cluster", "Namespaced")
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# timeoutSeconds bounds of admissionregistration.k8s.io/v1.
MIN_TIMEOUT, MAX_TIMEOUT = 1, 30


@dataclass(frozen=True)
class AdmissionRule:
    """Which requests a webhook sees: ``operations`` (CREATE, UPDATE, DELETE, CONNECT or ``*``) on ``resources``
    (``widgets``, ``pods/status``, ``*``) of ``api_groups`` (``""`` is the core group) and ``api_versions``, in
    ``scope`` ``*``, ``Cluster`` or ``Namespaced``."""

    operations: Sequence[str]
    api_groups: Sequence[str]
    api_versions: Sequence[str]
    resources: Sequence[str]
    scope: str = "*"

    def __post_init__(self) -> None:
        for name in ("operations", "api_groups", "api_versions", "resources"):
            value = getattr(self, name)
            if isinstance(value, str) or not value or not all(isinstance(v, str) for v in value):
                raise ValueError(f"AdmissionRule {name} must be a non-empty list of strings, got {value!r}")
        bad = [op for op in self.operations if op not in _OPERATIONS]
        if bad:
            raise ValueError(f"AdmissionRule operations must be among {', '.join(_OPERATIONS)}, got {bad}")
        if self.scope not in _SCOPES:
            raise ValueError(f"AdmissionRule scope must be one of {', '.join(_SCOPES)}, got {self.scope!r}")

    def as_dict(self) -> dict[str, Any]:
        """The rule as the configuration object spells it."""
        return {"operations": list(self.operations), "apiGroups": list(self.api_groups),
                "apiVersions": list(self.api_versions), "resources": list(self.resources), "scope": self.scope}


@dataclass(frozen=True)
class Webhook:
    """An admission webhook: ``handler(request) -> Allow | Deny`` (or ``handler(request, client)``, given the
    sidecar's API client) for the requests ``rules`` select.

    ``name``: the entry's name in the configuration, a fully qualified DNS name (at least three labels, e.g.
    ``validate.widgets.example.com``); it is served at ``path`` (``/validating/<name>`` or ``/mutating/<name>``).
    ``timeout_seconds`` (1-30) is how long the API server waits; the handler gets a little less (``handler_timeout``)
    so that the sidecar, not the API server, says that it was too slow. ``review_versions``: the AdmissionReview
    versions accepted, ``("v1",)`` or ``("v1", "v1beta1")``.
    """

    name: str
    handler: Handler
    rules: Sequence[AdmissionRule]
    failure_policy: FailurePolicy = "Fail"
    side_effects: SideEffects = "None"
    timeout_seconds: int = 10
    match_policy: MatchPolicy = "Equivalent"
    namespace_selector: Mapping[str, Any] | None = None
    object_selector: Mapping[str, Any] | None = None
    review_versions: Sequence[str] = ("v1",)

    kind: ClassVar[Literal["validating", "mutating"]]

    def __post_init__(self) -> None:
        what = f"{type(self).__name__} {self.name!r}"
        if not is_qualified_name(self.name):
            raise ValueError(f"{what}: the name must be a fully qualified DNS name of at least three labels "
                             "(lowercase letters, digits, '-'), like 'validate.widgets.example.com'")
        if not inspect.iscoroutinefunction(self.handler):
            raise ValueError(f"{what}: the handler must be an 'async def' function taking the AdmissionRequest")
        if isinstance(self.rules, AdmissionRule) or not self.rules or \
                not all(isinstance(r, AdmissionRule) for r in self.rules):
            raise ValueError(f"{what}: rules must be a non-empty list of AdmissionRule")
        _one_of(what, "failure_policy", self.failure_policy, ("Fail", "Ignore"))
        _one_of(what, "side_effects", self.side_effects, ("None", "NoneOnDryRun"))
        _one_of(what, "match_policy", self.match_policy, ("Equivalent", "Exact"))
        if isinstance(self.timeout_seconds, bool) or not isinstance(self.timeout_seconds, int) or \
                not MIN_TIMEOUT <= self.timeout_seconds <= MAX_TIMEOUT:
            raise ValueError(f"{what}: timeout_seconds must be an integer from {MIN_TIMEOUT} to {MAX_TIMEOUT}, "
                             f"got {self.timeout_seconds!r}")
        if isinstance(self.review_versions, str) or not self.review_versions or \
                not set(self.review_versions) <= set(REVIEW_VERSIONS):
            raise ValueError(f"{what}: review_versions must be a non-empty list among {', '.join(REVIEW_VERSIONS)}, "
                             f"got {self.review_versions!r}")

    @property
    def path(self) -> str:
        """The URL path the webhook is served at."""
        return f"/{self.kind}/{self.name}"

    @property
    def handler_timeout(self) -> float:
        """Seconds the handler may take: ``timeout_seconds`` less a margin (a fifth, at most 1 s) for the answer to
        reach the API server before it gives up."""
        return handler_timeout(self.timeout_seconds)


@dataclass(frozen=True)
class ValidatingWebhook(Webhook):
    """A webhook of the ``ValidatingWebhookConfiguration``: its handler returns ``Allow()`` or ``Deny(message)``."""

    kind: ClassVar[Literal["validating", "mutating"]] = "validating"


@dataclass(frozen=True)
class MutatingWebhook(Webhook):
    """A webhook of the ``MutatingWebhookConfiguration``: ``Allow(patch=[...])`` changes the object.
    ``reinvocation_policy``: ``Never``, or ``IfNeeded`` to be called again after later webhooks changed it."""

    kind: ClassVar[Literal["validating", "mutating"]] = "mutating"
    reinvocation_policy: Literal["Never", "IfNeeded"] = "Never"

    def __post_init__(self) -> None:
        super().__post_init__()
        _one_of(f"MutatingWebhook {self.name!r}", "reinvocation_policy", self.reinvocation_policy,
                ("Never", "IfNeeded"))


def is_dns_label(value: Any) -> bool:
    """Whether ``value`` is a DNS label (RFC 1123: lowercase letters, digits, '-', at most 63), like a version name."""
    return isinstance(value, str) and len(value) <= 63 and bool(_LABEL.match(value))


def is_qualified_name(value: Any) -> bool:
    """Whether ``value`` is a DNS subdomain of at least three labels, like a webhook's or a CRD's name."""
    labels = value.split(".") if isinstance(value, str) else []
    return len(labels) >= 3 and len(value) <= 253 and all(map(is_dns_label, labels))


def handler_timeout(timeout_seconds: float) -> float:
    """The handler's share of an API server timeout of ``timeout_seconds`` (see ``Webhook.handler_timeout``)."""
    return timeout_seconds - min(1.0, timeout_seconds / 5)


def _one_of(what: str, name: str, value: Any, options: tuple[str, ...]) -> None:
    if value not in options:
        raise ValueError(f"{what}: {name} must be one of {', '.join(options)}, got {value!r}")
