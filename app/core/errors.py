"""One error hierarchy, mapped to HTTP once (in ``app.main``).

Every error says what was wrong and where: ``field`` is a path into the request
(``jobs[12].external_id``), ``resource``/``resource_id`` name the object involved.
Every answer that is not a success, a 500 included, has the same body:
``{"error": {"code", "message", "field"?, "id"?, "details"?, "retryable"}}``; a retryable
one that knows when to come back says so in ``Retry-After`` (``headers()``).
"""

from __future__ import annotations

from typing import Any


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
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.field is not None:
            error["field"] = self.field
        if self.resource is not None:
            error["resource"] = self.resource
        if self.resource_id is not None:
            error["id"] = self.resource_id
        if self.details:
            error["details"] = self.details
        error["retryable"] = self.retryable
        return {"error": error}

    def headers(self) -> dict[str, str] | None:
        return None


class Invalid(ShaperError):
    status_code = 422
    code = "invalid"


class BadRequest(ShaperError):
    status_code = 400
    code = "bad_request"


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


class Forbidden(ShaperError):
    status_code = 403
    code = "forbidden"


class PayloadTooLarge(ShaperError):
    status_code = 413
    code = "payload_too_large"


class Infeasible(ShaperError):
    status_code = 422
    code = "infeasible"


class ConnectorUnavailable(ShaperError):
    status_code = 503
    code = "connector_unavailable"

    def __init__(self, message: str, *, retryable: bool = True, **kwargs: Any) -> None:
        super().__init__(message, **kwargs)
        self.retryable = retryable


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
