"""Names, labels and annotations of cached-resource replication: the one place that says what a ``CachedObject``
wrapper of a source object is called and how it is labelled (kcp's ClusterCachedResources).

Every path names a wrapper with ``wrapper_name`` and builds it with ``wrapper_for``, so create and delete agree.
Names extend kcp's ``<version>.<resource>.<group>.<name>`` with ``<namespace>.`` before the name and ``<cluster>.``
in front for other clusters; a readable name is used only if it is a valid DNS subdomain that parses back to the
same source, else ``<schema>-<32 hex>`` (a sha256 of the tuple), which never parses back. Label values that are not
valid are replaced by a stable stand-in, the originals kept in ``cache.kcp.io/original-*`` annotations. Ours:
label ``cache.kcp.io/object-cluster`` and the original UID and identity hash annotations. One ambiguity remains,
as in kcp: a schema continuing another with more dot labels (``apps``, ``apps.example.io``) can give two objects one
readable name; ``is_wrapper_of`` checks the labels.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any, Mapping

from informers import GVR, deep_copy

GROUP = "cache.kcp.io"
VERSION = "v1alpha1"
CLUSTER_CACHED_RESOURCES = GVR(GROUP, VERSION, "clustercachedresources")
CACHED_OBJECTS = GVR(GROUP, VERSION, "cachedobjects")
CACHED_OBJECT_KIND = "CachedObject"
CLUSTER_CACHED_RESOURCE_KIND = "ClusterCachedResource"

FINALIZER = "cache.kcp.io/clustercachedresource"
ANNOTATION_RESOURCE_KIND = "cache.kcp.io/resource-kind"
ANNOTATION_RESOURCE_SCOPE = "cache.kcp.io/resource-scope"

LABEL_SCHEMA = "cache.kcp.io/object-schema"
LABEL_GROUP = "cache.kcp.io/object-group"
LABEL_VERSION = "cache.kcp.io/object-version"
LABEL_RESOURCE = "cache.kcp.io/object-resource"
LABEL_ORIGINAL_NAME = "cache.kcp.io/object-original-name"
LABEL_ORIGINAL_NAMESPACE = "cache.kcp.io/object-original-namespace"
LABEL_CLUSTER = "cache.kcp.io/object-cluster"

ANNOTATION_ORIGINAL_RESOURCE_VERSION = "cache.kcp.io/original-resource-version"
ANNOTATION_ORIGINAL_UID = "cache.kcp.io/original-uid"
ANNOTATION_IDENTITY_HASH = "cache.kcp.io/identity-hash"
# Written only when the matching label had to be shortened or replaced (see label_value).
ANNOTATION_ORIGINAL_NAME = "cache.kcp.io/original-name"
ANNOTATION_ORIGINAL_NAMESPACE = "cache.kcp.io/original-namespace"
ANNOTATION_ORIGINAL_CLUSTER = "cache.kcp.io/original-cluster"

CORE_GROUP = "core"
MAX_NAME = 253
MAX_LABEL_VALUE = 63
_NAME_HASH_HEX = 32  # 128 bits of sha256: no accidental collision among any number of wrappers we will see
_LABEL_HASH_HEX = 20

_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?\Z")
_NOT_LABEL_CHAR = re.compile(r"[^-A-Za-z0-9_.]")
_NOT_NAME_CHAR = re.compile(r"[^-a-z0-9.]")


def schema(gvr: GVR) -> str:
    """``<version>.<resource>.<group>``, with ``core`` for the core group: kcp's schema label."""
    return f"{gvr.version}.{gvr.resource}.{gvr.group or CORE_GROUP}"


def is_dns_subdomain(name: str) -> bool:
    """Whether ``name`` is a valid object name for most kinds: a DNS-1123 subdomain of at most 253 characters."""
    return len(name) <= MAX_NAME and bool(_DNS_SUBDOMAIN.match(name))


def is_label_value(value: str) -> bool:
    """Whether ``value`` is a valid label value (at most 63 characters; empty is valid)."""
    return len(value) <= MAX_LABEL_VALUE and bool(_LABEL_VALUE.match(value))


def _digest(*parts: str | None) -> str:
    # JSON of the list: an unambiguous encoding of the tuple (no separator can be forged inside a part).
    return hashlib.sha256(json.dumps(list(parts)).encode()).hexdigest()


def label_value(value: str) -> str:
    """``value`` when it is a valid label value; otherwise a stable valid stand-in: its first characters (invalid
    ones replaced by ``_``) then ``-`` and 20 hex digits of its sha256. The same input always gives the same value,
    so selectors and indexes built from it agree with the labels written."""
    if is_label_value(value):
        return value
    digest = _digest(value)[:_LABEL_HASH_HEX]
    prefix = _NOT_LABEL_CHAR.sub("_", value[:MAX_LABEL_VALUE - _LABEL_HASH_HEX - 1])
    prefix = prefix.lstrip("-_.")  # a value starts with an alphanumeric
    return f"{prefix}-{digest}" if prefix else digest


def _readable_name(gvr: GVR, name: str, namespace: str | None, cluster: str) -> str:
    parts = [schema(gvr)]
    if cluster:
        parts.insert(0, cluster)
    if namespace:
        parts.append(namespace)
    parts.append(name)
    return ".".join(parts)


def _read_back(text: str, gvr: GVR, namespaced: bool) -> tuple[str, str | None, str] | None:
    """The (cluster, namespace, name) a readable wrapper name of this GVR and scope stands for, or None."""
    mid = f"{schema(gvr)}."
    if text.startswith(mid):
        cluster, rest = "", text[len(mid):]
    else:
        at = text.find(f".{mid}")
        if at <= 0:
            return None
        cluster, rest = text[:at], text[at + len(mid) + 1:]
    if not namespaced:
        return (cluster, None, rest) if rest else None
    namespace, dot, name = rest.partition(".")
    if not dot or not name or not _DNS_LABEL.match(namespace):
        return None
    return cluster, namespace, name


def wrapper_name(gvr: GVR, name: str, namespace: str | None = None, cluster: str = "") -> str:
    """The name of the CachedObject that replicates ``name`` (in ``namespace``, of ``cluster``; "" is the local
    cluster) of resource ``gvr``: the one function for create, update, delete and lookup.

    ``<[cluster.]version.resource.group[.namespace].name>`` when that is a valid name that reads back to the same
    source, else ``<schema>-<32 hex of sha256(group, version, resource, cluster, namespace, name)>``.
    """
    namespace = namespace or None  # "" and None both mean cluster-scoped
    readable = _readable_name(gvr, name, namespace, cluster)
    if is_dns_subdomain(readable) and _read_back(readable, gvr, namespace is not None) == (cluster, namespace, name):
        return readable
    digest = _digest(gvr.group, gvr.version, gvr.resource, cluster, namespace, name)[:_NAME_HASH_HEX]
    # The schema, cut to fit and cleaned to a valid prefix; being followed by "-" and not ".", it never reads back.
    prefix = _NOT_NAME_CHAR.sub("-", schema(gvr).lower())[:MAX_NAME - _NAME_HASH_HEX - 1]
    prefix = ".".join(label.strip("-") for label in prefix.split(".") if label.strip("-"))  # no empty/dashed edges
    return f"{prefix}-{digest}" if prefix else digest


def wrapper_labels(gvr: GVR, name: str, namespace: str | None = None, cluster: str = "") -> dict[str, str]:
    """The labels of a wrapper: kcp's six (schema, group, version, resource, original name and namespace,
    ``""`` for a cluster-scoped object) and ours, the source cluster (``""`` for the local one); each through
    ``label_value``."""
    return {
        LABEL_SCHEMA: label_value(schema(gvr)),
        LABEL_GROUP: label_value(gvr.group or CORE_GROUP),
        LABEL_VERSION: label_value(gvr.version),
        LABEL_RESOURCE: label_value(gvr.resource),
        LABEL_ORIGINAL_NAME: label_value(name),
        LABEL_ORIGINAL_NAMESPACE: label_value(namespace or ""),
        LABEL_CLUSTER: label_value(cluster),
    }


def wrapper_for(gvr: GVR, obj: Mapping[str, Any], cluster: str, identity_hash: str) -> dict[str, Any]:
    """The whole CachedObject replicating source object ``obj`` of ``gvr`` from ``cluster`` ("" = local).

    Name from ``wrapper_name``; labels from ``wrapper_labels``; annotations: the source's resourceVersion and UID,
    the identity hash, and the full original name/namespace/cluster when a label could not hold them;
    ``spec.raw``: a plain (unfrozen) copy of the source object without ``metadata.managedFields``.
    """
    meta = obj["metadata"]
    name: str = meta["name"]
    namespace: str | None = meta.get("namespace") or None
    annotations = {
        ANNOTATION_ORIGINAL_RESOURCE_VERSION: str(meta.get("resourceVersion") or ""),
        ANNOTATION_ORIGINAL_UID: str(meta.get("uid") or ""),
        ANNOTATION_IDENTITY_HASH: identity_hash,
    }
    for key, value in ((ANNOTATION_ORIGINAL_NAME, name), (ANNOTATION_ORIGINAL_NAMESPACE, namespace or ""),
                       (ANNOTATION_ORIGINAL_CLUSTER, cluster)):
        if label_value(value) != value:
            annotations[key] = value
    raw = deep_copy(dict(obj))
    raw_meta = raw.get("metadata")
    if isinstance(raw_meta, dict):
        raw_meta.pop("managedFields", None)
    return {
        "apiVersion": CACHED_OBJECTS.group_version,
        "kind": CACHED_OBJECT_KIND,
        "metadata": {
            "name": wrapper_name(gvr, name, namespace, cluster),
            "labels": wrapper_labels(gvr, name, namespace, cluster),
            "annotations": annotations,
        },
        "spec": {"raw": raw},
    }


def source_of(wrapper: Mapping[str, Any]) -> tuple[str, str | None, str]:
    """(cluster, namespace or None, name) of the source object a wrapper replicates, from its annotations where a
    label was shortened, else its labels: to map a wrapper's event back to the source's request. KeyError when
    the wrapper has no original-name label."""
    meta = wrapper.get("metadata") or {}
    labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    name = annotations.get(ANNOTATION_ORIGINAL_NAME) or labels[LABEL_ORIGINAL_NAME]
    namespace = annotations.get(ANNOTATION_ORIGINAL_NAMESPACE) or labels.get(LABEL_ORIGINAL_NAMESPACE) or None
    cluster = annotations.get(ANNOTATION_ORIGINAL_CLUSTER) or labels.get(LABEL_CLUSTER) or ""
    return cluster, namespace, name


def is_wrapper_of(wrapper: Mapping[str, Any], gvr: GVR, name: str, namespace: str | None = None,
                  cluster: str = "") -> bool:
    """Whether ``wrapper`` replicates that very object (its schema labels and source agree), not merely carries
    its name: the guard against the one ambiguity of readable names (see the module docstring)."""
    if not is_wrapper_of_schema(wrapper, gvr):
        return False
    try:
        return source_of(wrapper) == (cluster, namespace or None, name)
    except KeyError:
        return False


def is_wrapper_of_schema(wrapper: Mapping[str, Any], gvr: GVR) -> bool:
    """Whether ``wrapper``'s schema, group, version and resource labels are those of ``gvr``."""
    labels = (wrapper.get("metadata") or {}).get("labels") or {}
    return (labels.get(LABEL_SCHEMA) == label_value(schema(gvr))
            and labels.get(LABEL_GROUP) == label_value(gvr.group or CORE_GROUP)
            and labels.get(LABEL_VERSION) == label_value(gvr.version)
            and labels.get(LABEL_RESOURCE) == label_value(gvr.resource))


def schema_selector(gvr: GVR, cluster: str | None = None) -> str:
    """The label selector (string form) of one schema's wrappers, and of one source cluster's ("" = local) if
    ``cluster`` is given: for the cache-side informer that must see only its own schema (kcp's TODO)."""
    selector = f"{LABEL_SCHEMA}={label_value(schema(gvr))}"
    if cluster is not None:
        selector += f",{LABEL_CLUSTER}={label_value(cluster)}"
    return selector
