"""Status conditions: set, find and remove a condition in an object's ``status.conditions``, as apimachinery's
``meta.SetStatusCondition``/``FindStatusCondition``/``RemoveStatusCondition`` do.

``lastTransitionTime`` changes only when ``status`` does; ``observedGeneration`` defaults to the object's
generation. Differs from apimachinery: the object is passed (for its generation, and to create missing lists), the
time is a ``datetime`` written to the second, and an invalid condition raises ``ValueError`` here rather than the
server refusing the whole status write.
"""

from __future__ import annotations

import datetime
import re
from typing import Any, MutableMapping

CONDITION_STATUSES = ("True", "False", "Unknown")
_REASON = re.compile(r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$")  # metav1.Condition's reason pattern


def set_status_condition(obj: MutableMapping[str, Any], type: str, status: str, reason: str, message: str = "",
                         observed_generation: int | None = None, now: datetime.datetime | None = None) -> bool:
    """Set condition ``type`` of ``obj`` (its ``status.conditions``, created if missing) to ``status`` with
    ``reason`` and ``message``; True if anything changed. ``lastTransitionTime`` becomes ``now`` (default: the
    current time) only for a new condition or a new ``status``; ``observedGeneration`` defaults to the object's
    ``metadata.generation`` (left out if it has none). ValueError names a malformed argument."""
    if not isinstance(type, str) or not type:
        raise ValueError(f"a condition needs a non-empty type, got {type!r}")
    if status not in CONDITION_STATUSES:
        raise ValueError(f"condition {type!r}: status must be one of {', '.join(CONDITION_STATUSES)}, got {status!r}")
    if not isinstance(reason, str) or not _REASON.match(reason):
        raise ValueError(f"condition {type!r}: reason must be a CamelCase word like 'Reconciled', got {reason!r}")
    if observed_generation is None:
        observed_generation = (obj.get("metadata") or {}).get("generation")
    conditions = _conditions(obj, create=True)
    wanted: dict[str, Any] = {"type": type, "status": status, "reason": reason, "message": message}
    if observed_generation is not None:
        wanted["observedGeneration"] = observed_generation
    existing = find_status_condition(obj, type)
    if existing is None:
        conditions.append({**wanted, "lastTransitionTime": _timestamp(now)})
        return True
    changed = any(existing.get(key) != value for key, value in wanted.items())
    if existing.get("status") != status or "lastTransitionTime" not in existing:
        existing["lastTransitionTime"] = _timestamp(now)
        changed = True
    existing.update(wanted)
    return changed


def find_status_condition(obj: MutableMapping[str, Any], type: str) -> dict[str, Any] | None:
    """The condition ``type`` of ``obj`` (the dict itself, in ``status.conditions``), or None."""
    for condition in _conditions(obj, create=False):
        if isinstance(condition, dict) and condition.get("type") == type:
            return condition
    return None


def remove_status_condition(obj: MutableMapping[str, Any], type: str) -> bool:
    """Remove condition ``type`` from ``obj``; True if it was there."""
    conditions = _conditions(obj, create=False)
    kept = [c for c in conditions if not (isinstance(c, dict) and c.get("type") == type)]
    if len(kept) == len(conditions):
        return False
    conditions[:] = kept
    return True


def is_status_condition_true(obj: MutableMapping[str, Any], type: str) -> bool:
    """Whether ``obj`` has condition ``type`` with status ``True``."""
    condition = find_status_condition(obj, type)
    return condition is not None and condition.get("status") == "True"


def _conditions(obj: MutableMapping[str, Any], create: bool) -> list[Any]:
    """``obj``'s ``status.conditions`` list (created if ``create``; an empty list not in ``obj`` otherwise)."""
    status = obj.get("status")
    if not isinstance(status, dict):
        if not create:
            return []
        status = obj["status"] = {}
    conditions = status.get("conditions")
    if not isinstance(conditions, list):
        if not create:
            return []
        conditions = status["conditions"] = []
    return conditions


def _timestamp(now: datetime.datetime | None) -> str:
    """``now`` (default: the current time) as ``metav1.Time`` serialises it: RFC 3339 in UTC, to the second."""
    when = now or datetime.datetime.now(datetime.timezone.utc)
    if when.tzinfo is None:
        raise ValueError(f"now must be a timezone-aware datetime, got {when!r}")
    return when.astimezone(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
