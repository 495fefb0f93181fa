"""One error hierarchy, mapped to HTTP once (in ``app.main``), and the one error body.

Every error says what was wrong and where: ``field`` is a path into the request
(``jobs[12].external_id``), ``resource``/``resource_id`` name the object involved.
Every answer that is not a success, a 500 included, has the same body:
``{"error": {"code", "message", "field"?, "id"?, "details"?, "retryable"}}``; a retryable
one that knows when to come back says so in ``Retry-After`` (``headers()``).
``error_body`` builds it, for these errors and for the answers no class here stands for
(FastAPI's own 404 and 405, a body that is not JSON, one over the size limit).
"""

from __future__ import annotations

from typing import Any


def error_body(
    code: str,
    message: str,
    *,
    field: str | None = None,
    resource: str | None = None,
    resource_id: str | int | None = None,
    details: dict[str, Any] | None = None,
    retryable: bool = False,
) -> dict[str, Any]:
    """The body of every error answer; keys that say nothing (``None``, no details) are
    left out."""
    error: dict[str, Any] = {"code": code, "message": message}
    if field is not None:
        error["field"] = field
    if resource is not None:
        error["resource"] = resource
    if resource_id is not None:
        error["id"] = resource_id
    if details:
        error["details"] = details
    error["retryable"] = retryable
    return {"error": error}


class ShaperError(Exception):
    status_code = 500
    code = "internal"
    retryable = False

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        resource: str | None = None,
        resource_id: str | int | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.resource = resource
        self.resource_id = resource_id
        self.details = details or {}

    def body(self) -> dict[str, Any]:
        return error_body(
            self.code,
            self.message,
            field=self.field,
            resource=self.resource,
            resource_id=self.resource_id,
            details=self.details,
            retryable=self.retryable,
        )

    def headers(self) -> dict[str, str] | None:
        return None


class Invalid(ShaperError):
    status_code = 422
    code = "invalid"


class NotFound(ShaperError):
    status_code = 404
    code = "not_found"


class Conflict(ShaperError):
    status_code = 409
    code = "conflict"


class SnapshotRequired(Conflict):
    code = "snapshot_required"
    retryable = True


class Unauthorized(ShaperError):
    status_code = 401
    code = "unauthorized"

    def headers(self) -> dict[str, str] | None:
        return {"WWW-Authenticate": "Bearer"}


class PayloadTooLarge(ShaperError):
    status_code = 413
    code = "payload_too_large"


class RequestTimeout(ShaperError):
    """The client stopped sending its request's body: what came of it is dropped; send it
    again whole."""

    status_code = 408
    code = "request_timeout"
    retryable = True

    def headers(self) -> dict[str, str] | None:
        return {"Connection": "close"}  # the rest of that body may still be on its way


class Forbidden(ShaperError):
    status_code = 403
    code = "forbidden"


class Unavailable(ShaperError):
    """Something the request needs is down for now (the database read-only, full or
    unreachable): retry after ``retry_after_s``."""

    status_code = 503
    code = "unavailable"
    retryable = True

    def __init__(self, message: str, *, retry_after_s: int = 5, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.retry_after_s = retry_after_s

    def headers(self) -> dict[str, str] | None:
        return {"Retry-After": str(self.retry_after_s)}


class TooManyRequests(ShaperError):
    status_code = 429
    code = "rate_limited"
    retryable = True

    def __init__(self, message: str, *, retry_after_s: int, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.retry_after_s = retry_after_s

    def headers(self) -> dict[str, str] | None:
        return {"Retry-After": str(self.retry_after_s)}


class Internal(ShaperError):
    """An unexpected failure; its body never carries the exception's text."""

    status_code = 500
    code = "internal"
