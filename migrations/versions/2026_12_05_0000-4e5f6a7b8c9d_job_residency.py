"""jobs.residency: the clusters of its federation group a job may run in

A job's own data-residency or locality rule, as its connector read it (wire.residency:
``{"cluster_selector": {"region": "eu"}, "allowed_clusters": ["alpha"] | null}``): the
federation planner starts or moves it only to members whose labels and names it permits,
on top of its team's rule (issue 16). NULL for every job without one, existing ones
included.

Revision ID: 4e5f6a7b8c9d
Revises: 3d4e5f6a7b8c
Create Date: 2026-12-05 00:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "4e5f6a7b8c9d"
down_revision: str | None = "3d4e5f6a7b8c"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # In place (ALTER TABLE … ADD COLUMN, SQLite too): a nullable column needs no default,
    # and ``jobs`` is not recreated under its allocations.
    op.add_column("jobs", sa.Column("residency", sa.JSON(), nullable=True))


def downgrade() -> None:
    op.drop_column("jobs", "residency")  # in place on SQLite 3.35+
