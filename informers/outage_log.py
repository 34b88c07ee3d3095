"""OutageLog: the level of a log line about a client's outage, INFO for the first of its kind, DEBUG for repeats.

When a member's API server goes down, each of its reflectors fails, retries and resumes on its own; a line per
reflector and attempt tells an operator nothing the first one did not, and each would be formatted and written
in a storm's busiest seconds. An outage of a client is counted by its ``recoveries`` (the server answering after
connection errors ends one). client-go logs every failed watch.
"""

from __future__ import annotations

import weakref
from typing import Protocol


class _Recovering(Protocol):
    @property
    def recoveries(self) -> int: ...


class OutageLog:
    """Remembers, per client, the outage in which it last said its line (weakly: a departed client is forgotten)."""

    def __init__(self) -> None:
        self._said: weakref.WeakKeyDictionary[_Recovering, int] = weakref.WeakKeyDictionary()

    def level(self, client: _Recovering) -> str:
        """``"INFO"`` the first time it is asked about ``client`` in its current outage, then ``"DEBUG"``."""
        outage = client.recoveries
        if self._said.get(client) == outage:
            return "DEBUG"
        self._said[client] = outage
        return "INFO"
