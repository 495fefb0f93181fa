"""A net under every route's path and query parameters: values no database could use.

Routes declare their parameters with the bounded types of ``app.core.types`` where they
can; this dependency, put on every API router (``app.api.router``), holds the same line
for any that do not yet. From the matched endpoint's own type hints it finds the
parameters typed ``int`` and ``str`` (also inside ``Optional``/``Annotated``), then
refuses with 422 naming the parameter:

- an ``int`` outside PostgreSQL ``integer`` (±2^31): every id column is one, and SQLite
  raises ``OverflowError`` past 2^63 where PostgreSQL would merely find nothing, so the
  one bound makes both backends answer alike;
- a ``str`` with NUL (PostgreSQL cannot take it in a query) or over 1,024 characters
  (no name, filter or sort key is that long).

A value that is not a number at all is left to FastAPI's own validation, which reports
it the usual way. It runs before the route's other dependencies; ``app.main`` still
answers an anonymous caller 401 first, as for any validation error.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError

from app.core.types import INT32_MAX

MAX_PARAMETER_LENGTH = 1024


def _base_type(annotation: Any) -> Any:
    """``int`` for ``int``, ``int | None``, ``Annotated[int, …]``; else the annotation."""
    if typing.get_origin(annotation) is typing.Annotated:
        return _base_type(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _base_type(members[0]) if len(members) == 1 else annotation
    return annotation


@lru_cache(maxsize=1024)
def _scalar_parameters(endpoint: Callable[..., Any]) -> dict[str, type]:
    try:
        hints = typing.get_type_hints(endpoint, include_extras=True)
    except (NameError, TypeError):  # a hint that cannot be resolved: nothing to check
        return {}
    names = inspect.signature(endpoint).parameters
    return {
        name: base
        for name, hint in hints.items()
        if name in names and (base := _base_type(hint)) in (int, str)
    }


def _problem(kind: type, raw: str) -> tuple[str, str] | None:
    if kind is int:
        try:
            value = int(raw)
        except ValueError:
            return None
        if not -(INT32_MAX + 1) <= value <= INT32_MAX:
            return "less_than_equal", f"Input should be between {-(INT32_MAX + 1)} and {INT32_MAX}"
        return None
    if "\x00" in raw:
        return "string_pattern_mismatch", "Input must not contain NUL (\\u0000) characters"
    if len(raw) > MAX_PARAMETER_LENGTH:
        return "string_too_long", f"String should have at most {MAX_PARAMETER_LENGTH} characters"
    return None


def refuse_unusable_parameters(request: Request) -> None:
    endpoint = request.scope.get("endpoint")
    if endpoint is None:
        return
    errors: list[dict[str, Any]] = []
    for name, kind in _scalar_parameters(endpoint).items():
        for where, values in (
            ("path", [request.path_params[name]] if name in request.path_params else []),
            ("query", request.query_params.getlist(name)),
        ):
            for raw in values:
                problem = _problem(kind, str(raw))
                if problem is not None:
                    error_type, message = problem
                    errors.append(
                        {"loc": (where, name), "msg": message, "type": error_type, "input": raw}
                    )
    if errors:
        raise RequestValidationError(errors)
