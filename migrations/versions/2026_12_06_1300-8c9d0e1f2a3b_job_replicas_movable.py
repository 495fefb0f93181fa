"""jobs: whether a service's connector can choose which of its replicas leave a node

wire: JobReport.replicas_movable. False for every existing row: nothing moved a replica
before, and the next telemetry report says otherwise where it can.

Revision ID: 8c9d0e1f2a3b
Revises: 7b8c9d0e1f2a
Create Date: 2026-12-06 13:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "8c9d0e1f2a3b"
down_revision: str | None = "7b8c9d0e1f2a"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # In place (ALTER TABLE … ADD COLUMN, SQLite too): a server default fills the rows
    # there are, and ``jobs`` is not recreated under the triggers and allocations that
    # refer to it.
    op.add_column(
        "jobs",
        sa.Column("replicas_movable", sa.Boolean(), nullable=False, server_default=sa.false()),
    )


def downgrade() -> None:
    op.drop_column("jobs", "replicas_movable")  # in place on SQLite 3.35+
