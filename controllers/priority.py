"""Which informer events wait behind live changes in a work queue: controller-runtime's handler priorities.

An object of an initial list (a controller starting, a member cluster joining a fleet loop, a handler added to
an informer that has synced) and a resync (an update whose resourceVersion did not change) are ``LOW_PRIORITY``;
every other event, a change made now, is 0, so that it does not wait behind a storm of them. A relist after an
expired watch or an outage tells handlers only what changed meanwhile (the informer skips the objects whose
resourceVersion is unchanged, where client-go delivers each as an update that controller-runtime puts at low
priority): those are real changes, at 0.
"""

from __future__ import annotations

from typing import Any

LOW_PRIORITY = -100  # controller-runtime's handler.LowPriority


def add_priority(is_in_initial_list: bool) -> int:
    """The priority of an add: low for an object of an initial list."""
    return LOW_PRIORITY if is_in_initial_list else 0


def update_priority(old: Any, new: Any) -> int:
    """The priority of an update: low for a resync (the same resourceVersion on both sides)."""
    if old is new or old["metadata"].get("resourceVersion") == new["metadata"].get("resourceVersion"):
        return LOW_PRIORITY
    return 0
