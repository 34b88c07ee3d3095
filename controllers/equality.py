"""Semantic equality of objects: what the server would store the same, compared as equal.

apimachinery's ``equality.Semantic.DeepEqual`` on dicts: a key whose value is an empty map, an empty list or
null equals a missing key, at any depth (so a map of nothing but such values is empty too), because the server
drops such fields (``omitempty``) and returns the object without them. So a ``mutate`` that sets
``labels = {}`` compares equal to the stored object instead of sending a no-op write on every reconcile. Unlike
Go, where typed fields say which zero values are omitted, an empty string, 0 or false is a value here: without
the schema they cannot be told from data.
"""

from __future__ import annotations

from typing import Any

def semantic_equal(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` are the same object as the server stores it (empty maps, lists and nulls are
    missing keys)."""
    if a is None:
        a = {} if isinstance(b, dict) else [] if isinstance(b, list) else None
    if b is None:
        b = {} if isinstance(a, dict) else [] if isinstance(a, list) else None
    if isinstance(a, dict) and isinstance(b, dict):
        return all(semantic_equal(a.get(key), b.get(key)) for key in a.keys() | b.keys())
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(semantic_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, (dict, list)) and isinstance(b, (dict, list)):
        return not a and not b  # {} and [] are both "nothing" to the server
    # JSON has one number type, so 1 equals 1.0; but true is not 1, as Python would have it.
    return bool(a == b) and isinstance(a, bool) == isinstance(b, bool)
