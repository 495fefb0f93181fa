"""actions: source_node and target_node as TEXT on PostgreSQL

An action names every node of a gang it moves or starts, comma-separated; on a large site's
node names that passed VARCHAR(255), and PostgreSQL refused the plan's insert, failing the
whole shaping cycle of the cluster (a 32-node gang of 40-character names: 1,311
characters). SQLite never enforced the length, and changing the column's type there would
recreate ``actions`` (whose steps' foreign keys cascade): it is left as it is.

Revision ID: 0e1f2a3b4c5d
Revises: 9d0e1f2a3b4c
Create Date: 2026-12-07 05:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0e1f2a3b4c5d"
down_revision: str | None = "9d0e1f2a3b4c"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = ("source_node", "target_node")


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for column in COLUMNS:
        op.alter_column("actions", column, existing_type=sa.String(255), type_=sa.Text())


def downgrade() -> None:
    """Fails if a stored node list no longer fits in 255 characters."""
    if op.get_bind().dialect.name != "postgresql":
        return
    for column in COLUMNS:
        op.alter_column("actions", column, existing_type=sa.Text(), type_=sa.String(255))
