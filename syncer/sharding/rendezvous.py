"""Rendezvous (highest-random-weight) hashing with bounded loads: which member should own each unit of work.

Every replica computes the same answer without talking to the others: each unit ranks members by a BLAKE2b weight
(stable across processes, unlike ``hash()``) and goes to the first with room (``floor(units / members)``, one more
for the first ``units % members``), strongest preference first. Loads stay within one of the mean, and a member
joining or leaving moves little more than its 1/N share. ``bucket_of`` hashes units into a fixed count of buckets
(as Knative's) by name and count only, so a held bucket never gains a unit another replica still runs.
"""

from __future__ import annotations

import hashlib
from typing import Iterable


def weight(member: str, unit: str) -> int:
    """The weight of ``member`` for ``unit`` (64 bits)."""
    return int.from_bytes(hashlib.blake2b(f"{member}\0{unit}".encode(), digest_size=8).digest(), "big")


def bucket_of(unit: str, count: int) -> str:
    """The bucket of ``unit`` among ``count``, ``NN-of-MM`` (numbered from 1, as Knative's), or ``unit`` itself
    when ``count`` is 0 (a bucket per unit)."""
    if not count:
        return unit
    n = int.from_bytes(hashlib.blake2b(unit.encode(), digest_size=8).digest(), "big") % count
    width = max(2, len(str(count)))
    return f"{n + 1:0{width}d}-of-{count:0{width}d}"


def assign(units: Iterable[str], members: Iterable[str]) -> dict[str, str]:
    """The owner of every unit (an empty mapping without members)."""
    members = sorted(set(members))
    units = sorted(set(units))
    if not members:
        return {}
    room, extra = divmod(len(units), len(members))  # ``extra`` members may hold one more
    load = dict.fromkeys(members, 0)
    ranking = {u: sorted(members, key=lambda m: (-weight(m, u), m)) for u in units}
    owners: dict[str, str] = {}
    for u in sorted(units, key=lambda u: (-weight(ranking[u][0], u), u)):
        for m in ranking[u]:
            if load[m] < room or (load[m] == room and extra > 0):
                extra -= load[m] == room
                load[m] += 1
                owners[u] = m
                break
    return owners
