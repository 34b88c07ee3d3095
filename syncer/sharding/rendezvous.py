"""Rendezvous (highest-random-weight) hashing with bounded loads: which member should own each unit of work.

Every replica computes the same answer from the same units and members, without talking to the others. Each
unit ranks the members by a weight (a BLAKE2b of member and unit name: stable across processes, unlike the
salted ``hash()``) and goes to the first one in its ranking that has room (``floor(units / members)``, and one more for the first
``units % members`` members to fill up); units are placed strongest-preference first. Plain rendezvous hashing spreads 50 units
over 3 members as 16/16/18 and over 5 as 5..13; with the bound every member is within one of the mean, and adding
or removing a member still moves little more than the 1/N of the units it must (16 of 50 for 3 -> 4 members,
where 12.5 is the ideal; assignment by modulo moves almost all). There is no shard number to hand out, so a
restarted replica cannot end up with none (Argo CD's shard -1).

Units can first be hashed into a fixed number of buckets (``bucket_of``), as Knative's leader-election buckets
are, and the buckets be what is assigned: the coordination cost then follows the buckets, not the units. A unit's
bucket depends on its name and the count only, never on which other units exist: a bucket held by one replica must
not gain a unit that another replica still runs.
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
