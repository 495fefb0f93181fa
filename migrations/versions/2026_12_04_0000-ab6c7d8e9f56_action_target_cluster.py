"""actions.target_cluster_id: where a federated move sends its job

A ``move`` action (issue 16) takes a pending job from its cluster (``cluster_id``) to
another cluster of its federation group. NULL for every other action, and for a move
whose target cluster was deleted since (deleting a cluster clears it; no ON DELETE, which
SQLite could not reflect on a column added in place; the saga then cancels the move:
nowhere to go).

Revision ID: ab6c7d8e9f56
Revises: 9a5b6c7d8e45
Create Date: 2026-12-04 00:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "ab6c7d8e9f56"
down_revision: str | None = "9a5b6c7d8e45"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Added in place, never by recreating ``actions`` (see 9a5b6c7d8e45).
    if op.get_bind().dialect.name == "sqlite":
        op.execute(
            "ALTER TABLE actions ADD COLUMN target_cluster_id INTEGER REFERENCES clusters (id)"
        )
    else:
        op.add_column("actions", sa.Column("target_cluster_id", sa.Integer(), nullable=True))
        op.create_foreign_key(
            "fk_actions_target_cluster_id",
            "actions",
            "clusters",
            ["target_cluster_id"],
            ["id"],
        )


def downgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        op.drop_constraint("fk_actions_target_cluster_id", "actions", type_="foreignkey")
    op.drop_column("actions", "target_cluster_id")  # in place on SQLite 3.35+
