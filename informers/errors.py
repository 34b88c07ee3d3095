"""ApiError: a failed request to the API server, carrying the decoded ``Status``."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """An HTTP error or watch ``ERROR`` event from the API server.

    ``status`` is the HTTP code, ``reason`` the ``Status.reason`` (``Expired``, ``Forbidden``, ...),
    ``retry_after`` the server's Retry-After in seconds, if any.
    """

    def __init__(
        self, status: int, reason: str = "", message: str = "", body: dict[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(f"{status} {reason}: {message}" if reason else f"{status}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.body = body or {}
        self.retry_after = retry_after

    @classmethod
    def from_status(cls, status: dict[str, Any], http_status: int = 0, retry_after: float | None = None) -> "ApiError":
        """Build from a ``Status`` object (HTTP error body or watch ERROR event)."""
        code = int(status.get("code") or http_status or 500)
        details = status.get("details") or {}
        if retry_after is None and details.get("retryAfterSeconds"):
            retry_after = float(details["retryAfterSeconds"])
        return cls(code, status.get("reason", ""), status.get("message", ""), status, retry_after)

    @property
    def is_gone(self) -> bool:
        """The requested resourceVersion is no longer available: relist from scratch."""
        if self.status == 410 or self.reason in ("Expired", "Gone"):
            return True
        return self.is_too_large_resource_version

    @property
    def is_too_large_resource_version(self) -> bool:
        """The server has not caught up to the requested resourceVersion (client-go also relists then)."""
        causes = (self.body.get("details") or {}).get("causes") or []
        if any(c.get("reason") == "ResourceVersionTooLarge" for c in causes):
            return True
        return "too large resource version" in self.message.lower()
