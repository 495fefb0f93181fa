"""action_steps: how many answers a step has had

With ``attempts`` (its sends), whether a copy of the step may still be on its way to its
executor when it fails on a "not now" (app.actions.saga.record_report). 0 for every
existing row: a step that failed before this revision keeps the reading it had.

Revision ID: 9d0e1f2a3b4c
Revises: 8c9d0e1f2a3b
Create Date: 2026-12-06 22:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "9d0e1f2a3b4c"
down_revision: str | None = "8c9d0e1f2a3b"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # In place (ALTER TABLE … ADD COLUMN, SQLite too), a server default filling the rows.
    op.add_column(
        "action_steps",
        sa.Column("answers", sa.Integer(), nullable=False, server_default="0"),
    )


def downgrade() -> None:
    op.drop_column("action_steps", "answers")  # in place on SQLite 3.35+
