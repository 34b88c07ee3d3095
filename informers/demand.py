"""Demand: who needs which GVRs watched. Owners declare theirs (``require``/``release``, the controller manager
its controllers'); ``for_resource`` callers ask for one explicitly, and that informer is never dropped by a pass."""

from __future__ import annotations

from typing import Iterable

from .gvr import GVR


class Demand:
    """The owners' declarations and the explicitly asked-for GVRs; ``wanted()`` is their union."""

    def __init__(self) -> None:
        self.explicit: set[GVR] = set()
        self._requirements: dict[str, frozenset[GVR]] = {}

    def require(self, owner: str, gvrs: Iterable[GVR]) -> set[GVR]:
        """Replace ``owner``'s declaration; the GVRs whose being required changed."""
        before = self.required()
        self._requirements[owner] = frozenset(gvrs)
        return before ^ self.required()

    def release(self, owner: str) -> set[GVR]:
        """Drop ``owner``'s declaration; the GVRs nobody requires any more."""
        before = self.required()
        self._requirements.pop(owner, None)
        return before - self.required()

    def owners(self) -> set[str]:
        """Who has declared requirements."""
        return set(self._requirements)

    def required(self) -> set[GVR]:
        """What the owners require."""
        return set().union(*self._requirements.values())

    def wanted(self) -> set[GVR]:
        """What the owners require and what was asked for explicitly."""
        return self.explicit | self.required()
