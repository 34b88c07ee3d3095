"""admission_request: the AdmissionRequest an API server would send, for unit tests of a webhook handler.

It writes the ``request`` document of an ``admission.k8s.io`` AdmissionReview as the API server fills it for the
operation (``object`` for CREATE and UPDATE, ``oldObject`` for UPDATE and DELETE, the operation's options, the
kind from the object's ``apiVersion`` and ``kind``) and reads it back with the server's own parser, so that a
handler sees in a test exactly what it sees when it is called: ``raw`` included.
"""

from __future__ import annotations

import uuid
from typing import Any, Mapping

import orjson

from informers import GVR

from ..webhook.review import REVIEW_GROUP, REVIEW_VERSIONS, AdmissionRequest, Operation, parse_review

# What the API server puts into ``options`` for each operation (CONNECT carries the subresource's own options).
_OPTIONS = {"CREATE": "CreateOptions", "UPDATE": "UpdateOptions", "DELETE": "DeleteOptions"}
_NEEDS = {"CREATE": ("object",), "UPDATE": ("object", "old_object"), "DELETE": ("old_object",), "CONNECT": ()}
DEFAULT_USER: Mapping[str, Any] = {"username": "test-user", "groups": ["system:authenticated"]}


def admission_request(operation: Operation, resource: GVR | str, object: Mapping[str, Any] | None = None,
                      old_object: Mapping[str, Any] | None = None, *, name: str | None = None,
                      namespace: str | None = None, sub_resource: str = "", kind: Mapping[str, str] | None = None,
                      user_info: Mapping[str, Any] = DEFAULT_USER, dry_run: bool = False,
                      options: Mapping[str, Any] | None = None, uid: str | None = None,
                      review_version: str = "v1") -> AdmissionRequest:
    """The request of ``operation`` on ``resource`` (a GVR, or a text ``GVR.parse`` reads: ``"v1/configmaps"``,
    ``"apps/v1/deployments"``) with the new ``object`` (CREATE, UPDATE) and the current ``old_object`` (UPDATE, DELETE).

    ``name`` and ``namespace`` default to the object's; ``kind`` to ``{"group", "version", "kind"}`` of the object's
    ``apiVersion`` and ``kind``; ``options`` to the operation's ``CreateOptions`` / ``UpdateOptions`` /
    ``DeleteOptions``; ``uid`` to a fresh one. ValueError says what is missing or wrong.
    """
    if operation not in _NEEDS:
        raise ValueError(f"operation must be one of {', '.join(_NEEDS)}, got {operation!r}")
    given = {"object": object, "old_object": old_object}
    missing = [field for field in _NEEDS[operation] if given[field] is None]
    if missing:
        raise ValueError(f"{operation} requests carry {' and '.join(_NEEDS[operation])}; "
                         f"{' and '.join(missing)} not given")
    if operation == "DELETE" and object is not None:
        raise ValueError("a DELETE request carries no object (the API server sends the deleted one as old_object)")
    if review_version not in REVIEW_VERSIONS:
        raise ValueError(f"review_version must be one of {', '.join(REVIEW_VERSIONS)}, got {review_version!r}")
    gvr = resource if isinstance(resource, GVR) else GVR.parse(resource)
    subject = object if object is not None else old_object
    metadata = (subject or {}).get("metadata") or {}
    request: dict[str, Any] = {
        "uid": uid or str(uuid.uuid4()),
        "kind": dict(kind) if kind is not None else _kind(subject, operation),
        "resource": {"group": gvr.group, "version": gvr.version, "resource": gvr.resource},
        "name": metadata.get("name", "") if name is None else name,
        "namespace": metadata.get("namespace", "") if namespace is None else namespace,
        "operation": operation, "userInfo": dict(user_info), "object": object, "oldObject": old_object,
        "dryRun": dry_run,
        "options": dict(options) if options is not None else (
            {"apiVersion": "meta.k8s.io/v1", "kind": _OPTIONS[operation]} if operation in _OPTIONS else None),
    }
    request["requestKind"], request["requestResource"] = request["kind"], request["resource"]
    if sub_resource:
        request["subResource"] = request["requestSubResource"] = sub_resource
    review = {"apiVersion": f"{REVIEW_GROUP}/{review_version}", "kind": "AdmissionReview", "request": request}
    return parse_review(orjson.dumps(review))


def _kind(subject: Mapping[str, Any] | None, operation: str) -> dict[str, str]:
    api_version, kind = (subject or {}).get("apiVersion"), (subject or {}).get("kind")
    if not isinstance(api_version, str) or not isinstance(kind, str):
        raise ValueError(f"the {operation} request's object has no apiVersion and kind (the API server always sends "
                         "them): add them to the object, or pass kind={'group': ..., 'version': ..., 'kind': ...}")
    group, _, version = api_version.rpartition("/")
    return {"group": group, "version": version, "kind": kind}
