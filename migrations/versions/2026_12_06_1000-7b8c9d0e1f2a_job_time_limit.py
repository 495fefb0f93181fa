"""jobs: the time limit a scheduler reports (Slurm's TimeLimit, a Job's activeDeadlineSeconds)

Nullable (no limit, or the scheduler does not say), so existing rows need no default.

Revision ID: 7b8c9d0e1f2a
Revises: 6a7b8c9d0e1f
Create Date: 2026-12-06 10:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "7b8c9d0e1f2a"
down_revision: str | None = "6a7b8c9d0e1f"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # In place (ALTER TABLE … ADD COLUMN, SQLite too): a nullable column needs no default,
    # and ``jobs`` is not recreated under the triggers and allocations that refer to it.
    op.add_column("jobs", sa.Column("time_limit_s", sa.Float(), nullable=True))


def downgrade() -> None:
    op.drop_column("jobs", "time_limit_s")  # in place on SQLite 3.35+
