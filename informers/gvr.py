"""GVR: the (group, version, resource) triple that names a Kubernetes collection."""

from __future__ import annotations

from typing import NamedTuple


class GVR(NamedTuple):
    """A group/version/resource; the core group is ``""``.

    ``str(gvr)`` is kubectl's ``resource.version.group`` form (``widgets.v1.example.com``, ``configmaps.v1``),
    which ``GVR.parse`` reads back; ``parse`` also accepts ``group/version/resource`` and ``version/resource``.
    """

    group: str
    version: str
    resource: str

    @classmethod
    def parse(cls, text: str) -> "GVR":
        """Parse ``resource.version[.group]`` or ``[group/]version/resource``; ValueError names the text."""
        if "/" in text:
            parts = text.split("/")
            if len(parts) == 2:
                parts.insert(0, "")
            if len(parts) != 3 or not all(parts[1:]):
                raise ValueError(f"cannot parse GVR {text!r}: expected group/version/resource")
            return cls(*parts)
        resource, sep, rest = text.partition(".")
        version, _, group = rest.partition(".")
        if not resource or not sep or not version:
            raise ValueError(f"cannot parse GVR {text!r}: expected resource.version[.group], e.g. configmaps.v1")
        return cls(group, version, resource)

    def __str__(self) -> str:
        return f"{self.resource}.{self.version}.{self.group}" if self.group else f"{self.resource}.{self.version}"

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
