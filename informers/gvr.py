"""GVR: the (group, version, resource) triple that names a Kubernetes collection."""

from __future__ import annotations

import re
from typing import NamedTuple

_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_FORMS = ("resource.version[.group] (configmaps.v1, deployments.v1.apps) or [group/]version/resource "
          "(apps/v1/deployments, v1/pods)")


class GVR(NamedTuple):
    """A group/version/resource; the core group is ``""``.

    ``str(gvr)`` is kubectl's ``resource.version.group`` form (``widgets.v1.example.com``, ``configmaps.v1``),
    which ``GVR.parse`` reads back; ``parse`` also accepts ``group/version/resource`` and ``version/resource``,
    and rejects what cannot name a collection (upper case, a Kind, a version with dots) instead of guessing.
    ``gvr.only_metadata()`` names the metadata-only cache of the collection (``MetadataGVR``).
    """

    group: str
    version: str
    resource: str

    @classmethod
    def parse(cls, text: str) -> "GVR":
        """Parse ``resource.version[.group]`` or ``[group/]version/resource``; ValueError names the text, what
        is wrong with it and the accepted forms."""
        if "/" in text:
            parts = text.split("/")
            if len(parts) == 2:
                parts.insert(0, "")
            if len(parts) != 3:
                raise ValueError(f"cannot parse GVR {text!r}: more than two '/'; expected {_FORMS}")
            gvr = cls(*parts)
        else:
            resource, sep, rest = text.partition(".")
            version, _, group = rest.partition(".")
            if not sep:
                raise ValueError(f"cannot parse GVR {text!r}: no version; expected {_FORMS}")
            gvr = cls(group, version, resource)
        gvr._check(text)
        return gvr

    def _check(self, text: str) -> None:
        group, version, resource = self
        problem = ""
        if not _LABEL.fullmatch(resource):
            problem = (f"resource {resource!r} is not a lower-case resource name (the plural, e.g. 'deployments', "
                       "not the Kind)" if resource else "no resource")
        elif not _LABEL.fullmatch(version):
            problem = f"version {version!r} is not a version such as 'v1'" if version else "no version"
            res_group, dot, bad_group = version.partition(".")
            if "/" in text and dot and not group and _LABEL.fullmatch(res_group) and _LABEL.fullmatch(resource):
                problem += f" (did you mean '{res_group}.{resource}.{bad_group}'?)"
        elif group and not _SUBDOMAIN.fullmatch(group):
            problem = f"group {group!r} is not a lower-case DNS name"
        if problem:
            raise ValueError(f"cannot parse GVR {text!r}: {problem}; expected {_FORMS}")

    def __str__(self) -> str:
        return f"{self.resource}.{self.version}.{self.group}" if self.group else f"{self.resource}.{self.version}"

    @property
    def metadata_only(self) -> bool:
        """Whether this names the metadata-only cache of the collection (``only_metadata()``)."""
        return False

    @property
    def full(self) -> "GVR":
        """The collection with whole objects: the GVR that discovery, clients and RESTMappers know."""
        return self

    def only_metadata(self) -> "MetadataGVR":
        """The key of this collection's metadata-only cache (controller-runtime's ``OnlyMetadata``)."""
        return MetadataGVR(*self)

    @property
    def group_version(self) -> str:
        """``group/version``, or just ``version`` for the core group."""
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        """The REST path of the collection (optionally within a namespace, optionally one object)."""
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if namespace:
            base += f"/namespaces/{namespace}"
        base += f"/{self.resource}"
        return f"{base}/{name}" if name else base


class MetadataGVR(GVR):
    """A GVR whose informer caches only ``PartialObjectMetadata`` (apiVersion ``meta.k8s.io/v1``, kind and
    ``metadata``), listed and watched with the apiserver's ``as=PartialObjectMetadata`` content negotiation.

    It is a different key from its GVR (unequal, hashed apart): a factory or a controller manager may hold the
    full and the metadata-only cache of one collection side by side, and requiring one never satisfies the other.
    Everything else (fields, ``path``, ``group_version``) is the GVR's; ``str`` adds `` (metadata)``.
    """

    __slots__ = ()

    @property
    def metadata_only(self) -> bool:
        return True

    @property
    def full(self) -> GVR:
        return GVR(*self)

    def only_metadata(self) -> "MetadataGVR":
        return self

    def __eq__(self, other: object) -> bool:
        return type(other) is MetadataGVR and tuple.__eq__(self, other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return hash((MetadataGVR, *self))

    def __str__(self) -> str:
        return f"{GVR.__str__(self)} (metadata)"
