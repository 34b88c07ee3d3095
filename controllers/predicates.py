"""Predicates: which watch events reach a controller's queue, judged on what the event changed.

controller-runtime's ``predicate`` package, with these differences, and why:

- One record, ``WatchEvent`` (``type`` add/update/delete, ``old``, ``new``), where controller-runtime has four
  event types and a ``Funcs`` struct of four methods: a predicate is a plain function of the event, and
  ``and_``/``or_``/``not_`` compose functions. There are no generic events (no channel sources here).
- A delete the informer only saw through a relist (a ``DeletedFinalStateUnknown`` tombstone) arrives unwrapped:
  ``old`` is the last state the cache knew, possibly stale, and ``state_unknown`` is True.
- As controller-runtime's, the built-ins judge updates only; adds and deletes pass. ``generation_changed``
  compares ``metadata.generation``, which the server bumps on spec changes (and on deletion) but not on status
  or metadata writes. Objects without one (ConfigMaps, Secrets) have none on either side, so it drops all their
  updates: use it for resources with a spec/status split.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

from informers.field_selector import FieldSelector
from informers.resource import Object

WatchEventType = Literal["add", "update", "delete"]


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One informer event: ``old`` is None for an add, ``new`` is None for a delete."""

    type: WatchEventType
    old: Object | None
    new: Object | None
    state_unknown: bool = False

    @property
    def obj(self) -> Object:
        """The object the event is about: the new state, or the last one for a delete."""
        obj = self.new if self.new is not None else self.old
        assert obj is not None, "a WatchEvent carries at least one object"
        return obj


Predicate = Callable[[WatchEvent], bool]


def _changed(event: WatchEvent, field: str) -> bool:
    """Whether an update changed ``metadata.<field>`` (an absent or empty value counts as none); True otherwise."""
    if event.type != "update" or event.old is None or event.new is None:
        return True
    old: object = event.old["metadata"].get(field) or None
    return old != (event.new["metadata"].get(field) or None)


def generation_changed(event: WatchEvent) -> bool:
    """Updates that changed ``metadata.generation`` (a spec change, a deletion), not status or metadata writes."""
    return _changed(event, "generation")


def labels_changed(event: WatchEvent) -> bool:
    """Updates that changed the labels."""
    return _changed(event, "labels")


def annotations_changed(event: WatchEvent) -> bool:
    """Updates that changed the annotations."""
    return _changed(event, "annotations")


def resource_version_changed(event: WatchEvent) -> bool:
    """Updates that are real changes: drops the resync replays, which carry the same ``resourceVersion``."""
    return _changed(event, "resourceVersion")


def fields_match(selector: str) -> Predicate:
    """Events of objects that match the field selector ``selector`` (``status.phase=Running``), or did before an
    update (so the controller sees an object leave the selection, as a server-filtered watch would say with a
    delete). SelectorError at once for a malformed one."""
    parsed = FieldSelector.parse(selector)

    def predicate(event: WatchEvent) -> bool:
        return any(obj is not None and parsed.matches(obj) for obj in (event.new, event.old))
    return predicate


def and_(*predicates: Predicate) -> Predicate:
    """Passes the events that every one of ``predicates`` passes."""
    def all_pass(event: WatchEvent) -> bool:
        return all(p(event) for p in predicates)
    return all_pass


def or_(*predicates: Predicate) -> Predicate:
    """Passes the events that any of ``predicates`` passes."""
    def any_passes(event: WatchEvent) -> bool:
        return any(p(event) for p in predicates)
    return any_passes


def not_(predicate: Predicate) -> Predicate:
    """Passes the events that ``predicate`` drops (adds and deletes included)."""
    def negated(event: WatchEvent) -> bool:
        return not predicate(event)
    return negated
