"""HealthItem: one line of the sidecar's liveness report (``/healthz``), whoever produces it.

A typed record rather than furiko's map of name to error (``HealthStatus``), so that every producer (controllers,
clusters, shard units, stores, runnables, webhooks, background tasks) says the same three things the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class HealthItem:
    """``name`` of what is checked, whether it is ``healthy``, and why not (or what it is doing) in ``message``."""

    name: str
    healthy: bool
    message: str = ""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form, as ``/healthz`` and ``/status`` show it."""
        return {"name": self.name, "healthy": self.healthy, "message": self.message}
