"""jobs.speeds: a block job's own speed on GPU models

wire: JobReport.speeds (model name -> speed on the catalogue's scale). Empty for every
existing row: no connector said it before, and the next telemetry report says it where the
job's owner wrote it.

Revision ID: 1f2a3b4c5d6e
Revises: 0e1f2a3b4c5d
Create Date: 2026-12-07 22:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "1f2a3b4c5d6e"
down_revision: str | None = "0e1f2a3b4c5d"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # In place (ALTER TABLE … ADD COLUMN, SQLite too): the server default fills the rows
    # there are, and ``jobs`` is not recreated under the triggers and allocations that
    # refer to it.
    op.add_column("jobs", sa.Column("speeds", sa.JSON(), nullable=False, server_default="{}"))


def downgrade() -> None:
    op.drop_column("jobs", "speeds")  # in place on SQLite 3.35+
