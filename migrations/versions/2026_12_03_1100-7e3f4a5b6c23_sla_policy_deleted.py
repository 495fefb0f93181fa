"""sla_policies.deleted: a deletion is a version of its own

``DELETE /api/v1/policies/{name}`` appends a version marked deleted (keeping the last
spec) instead of removing rows, so a policy's history stays readable after it is gone.
Existing rows are live versions: ``false``.

Revision ID: 7e3f4a5b6c23
Revises: 6d2e3f4a5b12
Create Date: 2026-12-03 11:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "7e3f4a5b6c23"
down_revision: str | None = "6d2e3f4a5b12"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("sla_policies", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("deleted", sa.Boolean(), nullable=False, server_default=sa.false())
        )


def downgrade() -> None:
    with op.batch_alter_table("sla_policies", schema=None) as batch_op:
        batch_op.drop_column("deleted")
