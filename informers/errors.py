"""ApiError: a failed request to the API server, carrying the decoded ``Status``, and its typed subclasses.

Where client-go offers predicates (``errors.IsNotFound(err)``), the common cases here are subclasses of
``ApiError`` (``NotFound``, ``Conflict``, ...) so that ``except NotFound:`` reads as the intent and
``except ApiError:`` still catches them all. The class is chosen from the HTTP code, and for 409 also from the
Status reason: ``AlreadyExists`` and ``Conflict`` share the code but call for opposite reactions.
"""

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

    @staticmethod
    def from_status(status: dict[str, Any], http_status: int = 0, retry_after: float | None = None) -> "ApiError":
        """Build from a ``Status`` object (HTTP error body or watch ERROR event), as ``for_status_code`` does."""
        code = int(status.get("code") or http_status or 500)
        details = status.get("details") or {}
        if retry_after is None and details.get("retryAfterSeconds"):
            retry_after = float(details["retryAfterSeconds"])
        return ApiError.for_status_code(code, status.get("reason", ""), status.get("message", ""), status, retry_after)

    @staticmethod
    def for_status_code(
        status: int, reason: str = "", message: str = "", body: dict[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> "ApiError":
        """The error for an HTTP code and Status reason: the matching subclass (``NotFound``, ``AlreadyExists``,
        ``Conflict``, ...), or ``ApiError`` itself for a code without one."""
        cls = AlreadyExists if status == 409 and reason == "AlreadyExists" else _BY_CODE.get(status, ApiError)
        return cls(status, reason, message, body, retry_after)

    @property
    def causes(self) -> list[dict[str, Any]]:
        """The Status's ``details.causes``: one ``{"reason", "message", "field"}`` dict per cause (may be empty)."""
        return list((self.body.get("details") or {}).get("causes") or [])

    @property
    def is_gone(self) -> bool:
        """The requested resourceVersion is no longer available: relist from scratch."""
        if self.status == 410 or self.reason in ("Expired", "Gone"):
            return True
        return self.is_too_large_resource_version

    @property
    def is_too_large_resource_version(self) -> bool:
        """The server has not caught up to the requested resourceVersion (client-go also relists then)."""
        if any(c.get("reason") == "ResourceVersionTooLarge" for c in self.causes):
            return True
        return "too large resource version" in self.message.lower()


class Unauthorized(ApiError):
    """401: the server did not accept the credentials."""


class Forbidden(ApiError):
    """403: the user may not do this (RBAC), or an admission plugin refused the request."""


class NotFound(ApiError):
    """404: the object (or its namespace, or the resource itself) does not exist."""


class AlreadyExists(ApiError):
    """409 with reason ``AlreadyExists``: a create found an object of that name."""


class Conflict(ApiError):
    """409 otherwise: a stale ``resourceVersion`` or failed precondition (re-read and retry), or a server-side
    apply conflict with another field manager (``causes`` name the fields; apply with ``force`` to take them)."""


class Gone(ApiError):
    """410: the requested resourceVersion is too old (compacted); relist or re-read."""


class UnsupportedMediaType(ApiError):
    """415: the resource does not accept this content type (e.g. a strategic merge patch of a custom resource)."""


class Invalid(ApiError):
    """422: the object failed validation; ``causes`` lists each offending field."""


class TooManyRequests(ApiError):
    """429: throttled by the server (API priority and fairness); ``retry_after`` says when to try again."""


_BY_CODE: dict[int, type[ApiError]] = {
    401: Unauthorized, 403: Forbidden, 404: NotFound, 409: Conflict, 410: Gone, 415: UnsupportedMediaType,
    422: Invalid, 429: TooManyRequests,
}


class FenceError(Exception):
    """A write refused locally: the fence of the client (e.g. a leadership term) no longer holds."""


def describe_error(e: BaseException) -> str:
    """``Type: message`` (just ``Type`` when the message is empty): what a log line or condition shows of an error.
    An ``ApiError`` says ``403 Forbidden: ...`` by itself: its type would only repeat the reason."""
    if isinstance(e, ApiError):
        return str(e)
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
