"""The wanted set of a discovery pass: which GVRs get informers, as pure functions of what the pass found.

``served ∩ selected`` (``select``: the filter, and the CRD cache's word over a lagging discovery), then
``∩ permitted ∩ required`` (``wanted_set``). Both build the per-GVR statuses the status book shows; neither does
I/O, so the rules are tested without an API server. The statuses are immutable and shared by value (``_status``):
a fleet's members mostly hold the same statuses, so one copy serves them all.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Literal, Mapping, Protocol

from .discovery import ResourceInfo
from .discovery_triggers import CRDInfo
from .gvr import GVR
from .resource_filter import ResourceFilter
from .status_book import GVRState, GVRStatus

WatchMode = Literal["all", "required"]
NOT_REQUIRED = "not required by any controller"


@dataclass(frozen=True, slots=True)
class Selection:
    """Every served GVR's status so far, the ones selected (whose permissions matter), their CRD uids ("" for
    a resource no CRD defines, or whose CRD is not known yet) and the status each selected one has if permitted
    but not watched (idle)."""

    status: Mapping[GVR, GVRStatus]
    candidates: tuple[GVR, ...]
    uids: Mapping[GVR, str]
    idle: Mapping[GVR, GVRStatus]


@dataclass(frozen=True, slots=True)
class WantedSet:
    """A pass's decision: the statuses, what is permitted (served, selected, permitted), and what is to be watched
    (GVR -> CRD uid, metadata-only keys included)."""

    status: dict[GVR, GVRStatus]
    permitted: frozenset[GVR]
    desired: dict[GVR, str]


class Permissions(Protocol):
    """Verdicts on watching a GVR (``AccessReviewer``)."""

    def decided(self, gvr: GVR) -> bool: ...

    def denied(self, gvr: GVR) -> str | None: ...


class Unchecked:
    """Permissions not checked: everything is permitted (the server answers 403 on watch if it is not)."""

    def decided(self, gvr: GVR) -> bool:
        """Always decided."""
        return True

    def denied(self, gvr: GVR) -> str | None:
        """Never denied."""
        return None


UNCHECKED = Unchecked()


@functools.lru_cache(maxsize=256)
def _sorted(verbs: frozenset[str]) -> tuple[str, ...]:
    """A verb set as the status shows it, one tuple per distinct set (every member's statuses share them)."""
    return tuple(sorted(verbs))


@functools.lru_cache(maxsize=4096)
def _status(gvr: GVR, state: GVRState, reason: str, kind: str, namespaced: bool, verbs: tuple[str, ...],
            source: str) -> GVRStatus:
    """One status per distinct value, shared by every member that holds it. Bounded: statuses whose reasons
    differ per member (a denial naming its user) only cycle through the cache, as a fleet of distinct clusters."""
    return GVRStatus(gvr, state, reason, kind, namespaced, verbs, source)


def _now(st: GVRStatus, state: GVRState, reason: str) -> GVRStatus:
    """``st`` in ``state`` for ``reason`` (shared, as ``_status``)."""
    return _status(st.gvr, state, reason, st.kind, st.namespaced, st.verbs, st.source)


class _Verdicts(dict[tuple[ResourceInfo, str], tuple[GVRStatus, GVRStatus | None]]):
    """One filter's verdicts per (resource, source): its discovered or excluded status, and its idle status if it
    is selected. Every member's discovery finds the same resources (interned) with equal filters, so a fleet
    decides each once, not once per member and pass; bounded, emptied when full."""

    LIMIT = 4096

    def __init__(self, filter: ResourceFilter) -> None:
        super().__init__()
        self.filter = filter

    def of(self, info: ResourceInfo, source: str) -> tuple[GVRStatus, GVRStatus | None]:
        verdict = self.get((info, source))
        if verdict is None:
            if len(self) >= self.LIMIT:
                self.clear()
            st = _status(info.gvr, GVRState.DISCOVERED, "", info.kind, info.namespaced, _sorted(info.verbs), source)
            why = self.filter.why_excluded(info)
            verdict = self[(info, source)] = (_now(st, GVRState.EXCLUDED, why), None) if why else \
                (st, _now(st, GVRState.IDLE, NOT_REQUIRED))
        return verdict


_VERDICTS: dict[ResourceFilter, _Verdicts] = {}


def select(served: Mapping[GVR, ResourceInfo], filter: ResourceFilter,
           crds: Mapping[tuple[str, str], CRDInfo] | None, aggregated: set[str],
           was_crd: Callable[[GVR], bool]) -> Selection:
    """The served GVRs the filter selects. ``crds`` is the CRD cache (None: not known), the authority over a
    discovery that still shows a deleted CRD's resources; ``aggregated`` the group-versions of APIServices."""
    verdicts = _VERDICTS.get(filter)
    if verdicts is None:
        if len(_VERDICTS) >= 64:
            _VERDICTS.clear()
        verdicts = _VERDICTS[filter] = _Verdicts(filter)
    status: dict[GVR, GVRStatus] = {}
    candidates: list[GVR] = []
    uids: dict[GVR, str] = {}
    idle: dict[GVR, GVRStatus] = {}
    for gvr, info in served.items():
        crd = crds.get((gvr.group, gvr.resource)) if crds is not None else None
        source = "crd" if crd else "aggregated" if aggregated and gvr.group_version in aggregated else "builtin"
        st, idle_st = verdicts.of(info, source)
        if crds is not None and crd is None and was_crd(gvr):
            st = _now(st, GVRState.EXCLUDED, "its CRD was deleted")
        elif idle_st is not None:
            candidates.append(gvr)
            uids[gvr] = crd.uid if crd else ""
            idle[gvr] = idle_st
        status[gvr] = st
    return Selection(status, tuple(candidates), uids, idle)


def wanted_set(selection: Selection, permissions: Permissions, wanted: set[GVR], watch: WatchMode) -> WantedSet:
    """``selection`` ∩ permitted, then ∩ ``wanted`` (the required and explicitly asked-for GVRs) with
    ``watch="required"`` (with ``"all"`` every permitted GVR); a wanted metadata-only key follows its GVR."""
    status = dict(selection.status)
    permitted: dict[GVR, str] = {}
    for gvr in selection.candidates:
        if not permissions.decided(gvr):
            status[gvr] = _now(status[gvr], GVRState.ERROR, "access review failed; asking again")
        elif denied := permissions.denied(gvr):
            status[gvr] = _now(status[gvr], GVRState.FORBIDDEN, denied)
        else:
            permitted[gvr] = selection.uids[gvr]
    desired = permitted if watch == "all" else {g: uid for g, uid in permitted.items() if g in wanted}
    for gvr in permitted.keys() - desired.keys():
        status[gvr] = selection.idle[gvr]
    desired = desired | {g: permitted[g.full] for g in wanted if g.metadata_only and g.full in permitted}
    return WantedSet(status, frozenset(permitted), desired)
