"""What every domain service does with the row a lookup found: the row or ``NotFound``;
before it creates something, no row yet or ``Conflict``.

The services keep their own queries (locked or not, joined or not); these only turn the
result into the error, named as the API reports it (``resource``, ``id``, ``field``).
"""

from __future__ import annotations

from typing import Protocol, TypeVar

from app.core.errors import Conflict, NotFound

T = TypeVar("T")


class _Row(Protocol):
    @property
    def id(self) -> int | None: ...


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


def row_id(row: _Row) -> int:
    """The primary key of a row the database holds (read, or added and flushed): the
    models type ``id`` ``int | None`` only for a row not inserted yet."""
    if row.id is None:
        raise ValueError(f"{type(row).__name__} has no id: it was never flushed")
    return row.id
