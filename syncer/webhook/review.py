"""AdmissionReview on the wire: the request a handler sees, the verdicts it returns, and the response document.

What differs from controller-runtime's ``admission.Request``/``Response`` and kopf's handler arguments, and why:

- A verdict is one of two values, ``Allow`` (optionally with JSON-patch operations) or ``Deny`` (a message and
  an HTTP code): controller-runtime's single Response type lets a handler build "denied, with a patch", which
  the API server rejects. Here such a thing cannot be written, and a validating webhook's ``Allow`` carrying a
  patch is refused as the handler's mistake (see ``server.py``).
- Mutations are JSON-patch operations given by the handler, not a diff of a modified object computed by us
  (controller-runtime's ``PatchResponseFromRaw``, kopf's ``patch`` dict): objects are plain dicts here, and a diff
  of dicts cannot tell "remove" from "not mentioned"; operations say exactly what the API server will apply.
- Both ``admission.k8s.io/v1`` and ``v1beta1`` reviews are read and answered in the version received; the two
  versions carry the same fields, so one request type serves both.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Sequence

import orjson

from informers import GVR

REVIEW_GROUP = "admission.k8s.io"
REVIEW_VERSIONS = ("v1", "v1beta1")
_PATCH_OPS = frozenset({"add", "remove", "replace", "move", "copy", "test"})

Operation = Literal["CREATE", "UPDATE", "DELETE", "CONNECT"]


class ReviewError(ValueError):
    """A body that is no AdmissionReview request; the message says what is wrong with it."""


@dataclass(frozen=True)
class AdmissionRequest:
    """What the API server asks: ``operation`` on ``resource`` (``sub_resource``), object ``namespace``/``name``.

    ``object`` is the new object (None for DELETE), ``old_object`` the current one (UPDATE, DELETE); for
    ``dry_run`` requests nothing is persisted, so a handler with side effects must skip them. ``user_info`` is the
    requesting user (``username``, ``groups``, ...), ``kind`` the object's kind (``{"group", "version", "kind"}``),
    ``options`` the operation's options (``CreateOptions``, ...), ``raw`` the whole ``request`` document.
    """

    uid: str
    review_version: str
    operation: Operation
    resource: GVR
    kind: Mapping[str, str]
    name: str
    namespace: str
    sub_resource: str
    object: dict[str, Any] | None
    old_object: dict[str, Any] | None
    user_info: Mapping[str, Any]
    dry_run: bool
    options: Mapping[str, Any] | None
    raw: Mapping[str, Any] = field(repr=False)


@dataclass(frozen=True)
class Allow:
    """Admit the request; ``patch`` (mutating webhooks only): JSON-patch operations (RFC 6902) applied to the
    object, e.g. ``[{"op": "add", "path": "/spec/size", "value": 1}]``; ``warnings`` are shown to the client."""

    patch: Sequence[Mapping[str, Any]] = ()
    warnings: Sequence[str] = ()


@dataclass(frozen=True)
class Deny:
    """Reject the request: the client sees ``admission webhook "<name>" denied the request: <message>`` with HTTP
    ``code`` (400-599; 403 Forbidden by default, 422 Invalid for a bad field); ``warnings`` are shown too."""

    message: str
    code: int = 403
    warnings: Sequence[str] = ()

    def __post_init__(self) -> None:
        # The API server turns a code below 400 into a confusing "denied ... with code 200": refuse it early.
        if isinstance(self.code, bool) or not isinstance(self.code, int) or not 400 <= self.code <= 599:
            raise ValueError(f"Deny code must be an HTTP error code from 400 to 599, got {self.code!r}")


Verdict = Allow | Deny


def parse_review(body: bytes) -> AdmissionRequest:
    """The request of an AdmissionReview body; ReviewError says what is missing or malformed."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as e:
        raise ReviewError(f"the body is not JSON ({e})") from None
    if not isinstance(doc, dict):
        raise ReviewError(f"the body is a JSON {type(doc).__name__}, not an AdmissionReview object")
    group, _, version = str(doc.get("apiVersion", "")).partition("/")
    if doc.get("kind") != "AdmissionReview" or group != REVIEW_GROUP or version not in REVIEW_VERSIONS:
        versions = " or ".join(f"{REVIEW_GROUP}/{v}" for v in REVIEW_VERSIONS)
        raise ReviewError(f"expected kind AdmissionReview of {versions}, got kind {doc.get('kind')!r} of apiVersion "
                          f"{doc.get('apiVersion')!r}")
    req = doc.get("request")
    if not isinstance(req, dict) or not isinstance(req.get("uid"), str) or not req["uid"]:
        raise ReviewError("the AdmissionReview has no request with a uid")
    resource = req.get("resource") or {}
    try:
        return AdmissionRequest(
            uid=req["uid"], review_version=version, operation=req.get("operation", ""),
            resource=GVR(resource.get("group", ""), resource.get("version", ""), resource.get("resource", "")),
            kind=dict(req.get("kind") or {}), name=req.get("name") or "", namespace=req.get("namespace") or "",
            sub_resource=req.get("subResource") or "", object=req.get("object"), old_object=req.get("oldObject"),
            user_info=dict(req.get("userInfo") or {}), dry_run=bool(req.get("dryRun")), options=req.get("options"),
            raw=req)
    except (AttributeError, TypeError) as e:  # a field of the wrong JSON type, e.g. "resource": "x"
        raise ReviewError(f"the AdmissionReview request is malformed ({e})") from None


def check_patch(patch: Sequence[Mapping[str, Any]]) -> str:
    """What is wrong with JSON-patch operations ``patch`` ("" if nothing): caught here, a mistake is the handler's
    clear error instead of the API server's "unable to apply patch"."""
    if isinstance(patch, (str, bytes, Mapping)):
        return f"the patch must be a list of JSON-patch operations, got a {type(patch).__name__}"
    for i, op in enumerate(patch):
        if not isinstance(op, Mapping) or op.get("op") not in _PATCH_OPS or not isinstance(op.get("path"), str):
            return (f"patch operation {i} ({op!r}) is not a JSON-patch operation: it needs 'op' (one of "
                    f"{', '.join(sorted(_PATCH_OPS))}) and a 'path' string")
        if op["op"] in ("add", "replace", "test") and "value" not in op:
            return f"patch operation {i} ({op!r}) needs a 'value'"
    return ""


def review_response(request: AdmissionRequest, verdict: Verdict) -> bytes:
    """The AdmissionReview answering ``request`` with ``verdict``, in the review version it came in."""
    response: dict[str, Any] = {"uid": request.uid, "allowed": isinstance(verdict, Allow)}
    if isinstance(verdict, Deny):
        response["status"] = {"code": verdict.code, "message": verdict.message}
    elif verdict.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(orjson.dumps(list(verdict.patch))).decode()
    if verdict.warnings:
        response["warnings"] = list(verdict.warnings)
    return orjson.dumps({"apiVersion": f"{REVIEW_GROUP}/{request.review_version}", "kind": "AdmissionReview",
                         "response": response})
