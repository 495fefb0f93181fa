"""What every domain service does with the row a lookup found: the row or ``NotFound``;
before it creates something, no row yet or ``Conflict``.

The services keep their own queries (locked or not, joined or not); these only turn the
result into the error, named as the API reports it (``resource``, ``id``, ``field``).
"""

from __future__ import annotations

from typing import TypeVar

from app.core.errors import Conflict, NotFound

T = TypeVar("T")


def found(row: T | None, message: str, *, resource: str, resource_id: str | int) -> T:
    """``row``, or ``NotFound`` when the lookup found nothing."""
    if row is None:
        raise NotFound(message, resource=resource, resource_id=resource_id)
    return row


def not_taken(
    row: object | None,
    message: str,
    *,
    resource: str,
    resource_id: str | int,
    field: str = "name",
) -> None:
    """``Conflict`` on ``field`` when a lookup by the new thing's name found one already."""
    if row is not None:
        raise Conflict(message, field=field, resource=resource, resource_id=resource_id)
