"""The error answers each operation can give, declared in its OpenAPI entry; and
:class:`JsonAnswer`, the hot reads' own serialisation of their success.

Derived from what the operation is rather than listed by hand on each route, so a new
route is documented correctly without anyone remembering to: every ``/api/v1`` operation
needs a token (401; 429 once an address has failed too often; 403 unless any token will
do), needs the database (503) and can fail (500); one with parameters or a body can be
refused as invalid (422, replacing FastAPI's own schema, which is not our body), one with
a body as malformed JSON (400) or too large (413), and one with path parameters can name
something missing (404). 409 stays where a route declares it (only some can conflict).
Every one of them has the body ``ErrorBody`` describes.
"""

from __future__ import annotations

import json
from typing import Any, Generic, TypeVar

from fastapi import Response
from pydantic import BaseModel, Field, TypeAdapter

T = TypeVar("T")


class ErrorDetail(BaseModel):
    code: str = Field(description="machine-readable: invalid, not_found, unavailable, …")
    message: str
    field: str | None = Field(default=None, description="path into the request at fault")
    id: str | int | None = Field(default=None, description="id of the resource involved")
    details: dict[str, Any] | None = None
    retryable: bool


class ErrorBody(BaseModel):
    error: ErrorDetail


_REF = {"$ref": "#/components/schemas/ErrorBody"}
_DESCRIPTIONS = {
    "400": "The body is not valid JSON",
    "401": "Missing, invalid, expired or revoked token",
    "403": "The token lacks the scope this operation needs",
    "404": "Nothing with that id or name",
    "408": "The request's body stopped coming; send it again",
    "409": "Conflicts with the current state",
    "413": "Body over SHAPER_MAX_BODY_BYTES",
    "422": "A value is invalid; `field` names it",
    "429": "Too many failed authentications from this address; see Retry-After",
    "500": "Unexpected failure (the server log has the details)",
    "503": "The database cannot serve this now (read-only, full, unreachable); see Retry-After",
}


def _error_response(status: str) -> dict[str, Any]:
    response: dict[str, Any] = {
        "description": _DESCRIPTIONS[status],
        "content": {"application/json": {"schema": _REF}},
    }
    if status in ("429", "503"):
        response["headers"] = {
            "Retry-After": {"description": "seconds to wait", "schema": {"type": "integer"}}
        }
    return response


def declare_error_responses(schema: dict[str, Any]) -> dict[str, Any]:
    """Adds the error answers to every ``/api/`` operation of ``schema``, and to every other
    operation that needs a token (``/metrics``), in place."""
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    definitions = ErrorBody.model_json_schema(ref_template="#/components/schemas/{model}")
    components.update(definitions.pop("$defs", {}))
    components["ErrorBody"] = definitions
    for path, item in schema.get("paths", {}).items():
        for operation in item.values():
            if not path.startswith("/api/") and "x-required-scope" not in operation:
                continue
            responses = operation.setdefault("responses", {})
            parameters = operation.get("parameters", [])
            statuses = ["401", "429", "500", "503"]
            if operation.get("x-required-scope") != "authenticated":
                statuses.append("403")
            if parameters or "requestBody" in operation:
                statuses.append("422")
            if "requestBody" in operation:
                statuses += ["400", "413"]
            if any(p.get("in") == "path" for p in parameters):
                statuses.append("404")
            # Only the routes that can answer them declare these.
            statuses += [status for status in ("408", "409") if status in responses]
            for status in statuses:
                declared = _error_response(status)
                # The route's own description where it has one: what it conflicts with,
                # which of its limits a 413 or 429 is about.
                if status in responses and responses[status].get("description"):
                    declared["description"] = responses[status]["description"]
                responses[status] = declared
    # FastAPI's validation error schemas, unused once every 422 above is ours.
    for unused in ("HTTPValidationError", "ValidationError"):
        if f"#/components/schemas/{unused}" not in json.dumps(schema["paths"]):
            components.pop(unused, None)
    return schema


class JsonAnswer(Generic[T]):
    """A success answer as FastAPI gives it for a route's ``response_model`` T, made by the
    route itself: validated as T (the same checks and conversions, on plain rows where the
    route has them) and written as JSON bytes (by alias, as FastAPI does). Declare T as the
    route's ``response_model``: the OpenAPI document is the same.

    Why (issue 13): a sync route's return value is validated again in a trip through the
    thread pool, and rows made into SQLModel objects first go through SQLModel's own
    (slower) validation. An ``async`` route that does its database work in one trip and
    answers this takes neither; the answer is byte for byte the one FastAPI wrote."""

    def __init__(self, model: Any) -> None:
        self._adapter: TypeAdapter[T] = TypeAdapter(model)

    def validate(self, value: Any) -> T:
        return self._adapter.validate_python(value)

    def response(self, value: Any) -> Response:
        body = self._adapter.dump_json(self.validate(value), by_alias=True)
        return Response(content=body, media_type="application/json")
