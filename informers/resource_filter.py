"""ResourceFilter: which discovered GVRs get informers, and why the others do not."""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Iterable

from .discovery import ResourceInfo
from .gvr import GVR


@dataclass(frozen=True)
class Rule:
    """A glob pattern over group, version and resource. Text forms: ``group/version/resource`` or
    ``group/resource`` (any version); ``core`` or an empty group means the core group; ``*`` matches anything."""

    group: str = "*"
    version: str = "*"
    resource: str = "*"

    @classmethod
    def parse(cls, text: str) -> "Rule":
        """Parse a rule; ValueError names the text and the accepted forms."""
        parts = text.strip().split("/")
        if len(parts) == 2:
            parts.insert(1, "*")
        if len(parts) != 3 or not parts[1] or not parts[2]:
            raise ValueError(f"invalid resource rule {text!r}: use group/version/resource or group/resource "
                             "(globs allowed, 'core' for the core group), e.g. 'apps/deployments' or '*.k8s.io/*'")
        group = "" if parts[0] == "core" else parts[0]
        return cls(group, parts[1], parts[2])

    def matches(self, gvr: GVR) -> bool:
        """Whether the GVR fits the pattern."""
        return (fnmatchcase(gvr.group, self.group) and fnmatchcase(gvr.version, self.version)
                and fnmatchcase(gvr.resource, self.resource))

    def __str__(self) -> str:
        return f"{self.group or 'core'}/{self.version}/{self.resource}"


@dataclass(frozen=True, init=False)
class ResourceFilter:
    """Include/exclude rules, a namespace restriction and the preferred-version switch.

    With no include rules everything is included; exclude rules win over include rules. A value: equal filters
    give equal verdicts, so a discovery pass may reuse the verdicts another member's equal filter gave.
    """

    include: tuple[Rule, ...]
    exclude: tuple[Rule, ...]
    preferred_version_only: bool
    namespaced_only: bool

    def __init__(
        self, include: Iterable[str | Rule] = (), exclude: Iterable[str | Rule] = (),
        preferred_version_only: bool = False, namespaced_only: bool = False,
    ) -> None:
        object.__setattr__(self, "include", tuple(r if isinstance(r, Rule) else Rule.parse(r) for r in include))
        object.__setattr__(self, "exclude", tuple(r if isinstance(r, Rule) else Rule.parse(r) for r in exclude))
        object.__setattr__(self, "preferred_version_only", preferred_version_only)
        object.__setattr__(self, "namespaced_only", namespaced_only)

    def restricted_to_namespaced(self) -> "ResourceFilter":
        """The same rules, leaving cluster-scoped resources out (informers restricted to a namespace)."""
        return ResourceFilter(self.include, self.exclude, self.preferred_version_only, namespaced_only=True)

    def why_excluded(self, info: ResourceInfo) -> str | None:
        """None if the GVR should get an informer, else the reason it does not."""
        gvr = info.gvr
        if not info.listable:
            return "lacks " + " and ".join(verb for verb in ("list", "watch") if verb not in info.verbs)
        if self.namespaced_only and not info.namespaced:
            return "cluster-scoped, and informers are restricted to a namespace"
        if self.preferred_version_only and not info.preferred:
            return "not the group's preferred version"
        return self.why_rules_exclude(gvr)

    def why_rules_exclude(self, gvr: GVR) -> str | None:
        """The include/exclude rules' verdict alone (no discovery needed): None if they let ``gvr`` through."""
        for rule in self.exclude:
            if rule.matches(gvr):
                return f"excluded by rule {rule}"
        if self.include and not any(rule.matches(gvr) for rule in self.include):
            return "matches no include rule"
        return None
