"""job reason and restart count: why the scheduler holds a job, and how often it restarted

Existing rows get "" and 0 through server defaults, so the upgrade works on a live table.

Revision ID: 630e9b2fbb64
Revises: 2efac8c2a267
Create Date: 2026-12-02 10:37:29.632776
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "630e9b2fbb64"
down_revision: str | None = "2efac8c2a267"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("reason", sa.String(length=255), nullable=False, server_default="")
        )
        batch_op.add_column(
            sa.Column("restart_count", sa.Integer(), nullable=False, server_default="0")
        )


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("restart_count")
        batch_op.drop_column("reason")
