"""JSON columns read with orjson (``app.core.db.load_json``, issue 13) read every value as
``json.loads`` does, including what orjson refuses: NaN and infinities (SQLite stores what
Python's json writes), integers past 64 bits, lone surrogates."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import sqlalchemy as sa

from app.core.db import load_json, make_engine

ODD = [
    '{"gap": NaN, "bound": Infinity, "low": -Infinity}',
    "[123456789012345678901234567890, -98765432109876543210987654321]",
    '["\\ud800 lone", "\\udfff"]',
    '{"a": 1, "a": 2}',
    "[1.0000000000000002, 5e-324, 1.7976931348623157e308, 0.1]",
    '{"s": "\\u00e9\\n\\"", "n": null, "t": true, "l": [], "o": {}}',
]


def _same(a: object, b: object) -> bool:
    """Equal, NaN equal to NaN, and of the same types all the way down."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


@pytest.mark.parametrize("text", ODD)
def test_load_json_reads_what_json_reads(text: str) -> None:
    assert _same(load_json(text), json.loads(text))
    assert _same(load_json(text.encode()), json.loads(text.encode()))


def test_sqlite_json_column_reads_odd_values(tmp_path: Path) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'json.db'}")
    table = sa.Table(
        "t", sa.MetaData(), sa.Column("id", sa.Integer, primary_key=True), sa.Column("v", sa.JSON)
    )
    try:
        with engine.begin() as connection:
            table.create(connection)
            for i, text in enumerate(ODD):
                connection.execute(
                    sa.text("INSERT INTO t (id, v) VALUES (:i, :v)"), {"i": i, "v": text}
                )
        with engine.connect() as connection:
            read = dict(connection.execute(sa.select(table.c.id, table.c.v)).tuples().all())
        assert all(_same(read[i], json.loads(text)) for i, text in enumerate(ODD))
    finally:
        engine.dispose()
