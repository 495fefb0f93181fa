"""How autogenerate writes our column types: as plain SQLAlchemy, so revisions never import
application code (they must stay valid while the models move on)."""

from __future__ import annotations

from typing import Any

from sqlmodel.sql.sqltypes import AutoString

from app.core.db import UtcDateTime


def render_item(type_: str, obj: Any, autogen_context: Any) -> str | bool:
    if type_ == "type" and isinstance(obj, UtcDateTime):
        return "sa.DateTime(timezone=True)"
    if type_ == "type" and isinstance(obj, AutoString):
        return f"sa.String(length={obj.length})" if obj.length else "sa.String()"
    return False
