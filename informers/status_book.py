"""StatusBook: what the last discovery pass decided per GVR, and why a GVR a consumer waits for has no informer.

Reads are pure: ``render`` derives the live state (starting, synced, stale, error) from the informers without
changing what the pass recorded.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Any, Collection, Mapping, Protocol

from .discovery import DiscoveryResult, not_served
from .discovery_triggers import CRDInfo
from .gvr import GVR
from .shared_informer import SharedIndexInformer

# ``explain``'s answer for a GVR that a CRD or an APIService is about to serve: waiting for it is normal.
NOT_SERVED_YET = "not served yet: its CRD or APIService does not serve it yet"


class GVRState(enum.StrEnum):
    """Where a GVR is: seen by discovery, left out (filter, permissions), idle (could be watched, but nobody
    requires it), or watched (and how that goes)."""

    DISCOVERED = "discovered"
    EXCLUDED = "excluded"
    FORBIDDEN = "forbidden"
    IDLE = "idle"
    STARTING = "starting"
    SYNCED = "synced"
    STALE = "stale"
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class GVRStatus:
    """One GVR's state (with ``reason`` when it is not watched or not well)."""

    gvr: GVR
    state: GVRState
    reason: str = ""
    kind: str = ""
    namespaced: bool = False
    verbs: tuple[str, ...] = ()
    source: str = "builtin"

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"gvr": str(self.gvr), "state": self.state.value, "reason": self.reason, "kind": self.kind,
                "namespaced": self.namespaced, "verbs": list(self.verbs), "source": self.source}


class Providers(Protocol):
    """What the discovery triggers know of the CRDs and APIServices that provide GVRs."""

    def crds(self) -> dict[tuple[str, str], CRDInfo] | None: ...

    def aggregated_group_versions(self) -> set[str]: ...


class StatusBook:
    """The last pass's result and per-GVR statuses (``record``), read by ``render`` and ``explain``."""

    def __init__(self, providers: Providers) -> None:
        self.providers = providers
        self.last_pass: DiscoveryResult | None = None
        self._status: dict[GVR, GVRStatus] = {}

    def record(self, result: DiscoveryResult, status: dict[GVR, GVRStatus]) -> None:
        """What a pass found and decided."""
        self.last_pass, self._status = result, status

    def any_forbidden(self) -> bool:
        """Whether the last pass found a GVR forbidden (RBAC is not watched: only a pass sees it change)."""
        return any(st.state is GVRState.FORBIDDEN for st in self._status.values())

    def removal_reason(self, gvr: GVR) -> str:
        """Why the informer of ``gvr`` is no longer wanted, as the last pass said."""
        st = self._status.get(gvr.full)
        return st.reason if st is not None and st.reason else "no longer served"

    def render(self, informers: Mapping[GVR, SharedIndexInformer], adopted: Collection[GVR]) -> list[GVRStatus]:
        """Every GVR seen by the last pass with its current state; a watched metadata-only key follows its GVR."""
        stale = self.last_pass.stale_group_versions if self.last_pass else set()
        entries = [*self._status.items(), *((g, replace(self._status[g.full], gvr=g))
                                            for g in adopted if g.metadata_only and g.full in self._status)]
        out = []
        for gvr, st in sorted(entries, key=lambda e: (e[0], e[0].metadata_only)):
            inf = informers.get(gvr)
            if inf is not None and gvr in adopted:
                if gvr.group_version in stale:
                    st = replace(st, state=GVRState.STALE, reason="its API is unavailable; serving the last known "
                                                                  "cache")
                elif inf.last_error is not None:
                    st = replace(st, state=GVRState.ERROR, reason=str(inf.last_error))
                else:
                    st = replace(st, state=GVRState.SYNCED if inf.has_synced() else GVRState.STARTING, reason="")
            out.append(st)
        return out

    def explain(self, gvr: GVR) -> str | None:
        """Why ``gvr`` (which has no informer) has none: ``excluded: ...``, ``forbidden: ...``, ``idle: ...``,
        ``NOT_SERVED_YET`` or ``not served: ...`` with the closest served names; None before the first pass or
        when the pass meant to watch it."""
        if self.last_pass is None:
            return None
        st = self._status.get(gvr.full)
        if st is None:
            crd = (self.providers.crds() or {}).get((gvr.group, gvr.resource))
            if crd is not None and (not crd.established or gvr.version in crd.served) or \
                    gvr.group_version in self.providers.aggregated_group_versions():
                return NOT_SERVED_YET
            return not_served(gvr.full, self.last_pass.resources)
        if st.state in (GVRState.EXCLUDED, GVRState.FORBIDDEN, GVRState.IDLE):
            return f"{st.state.value}: {st.reason}"
        return None
