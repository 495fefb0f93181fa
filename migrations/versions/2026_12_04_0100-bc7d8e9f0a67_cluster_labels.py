"""clusters.labels: where a cluster is, for a team's data-residency rule

A cluster's labels (``{"region": "eu-west"}``, Kubernetes label syntax) are matched by the
``cluster_selector`` of a team in an SLA policy: the federation planner moves the team's
pending jobs only to clusters of the group whose labels include the selector (issue 16).
Every existing cluster gets an empty map (the server default).

Revision ID: bc7d8e9f0a67
Revises: ab6c7d8e9f56
Create Date: 2026-12-04 01:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "bc7d8e9f0a67"
down_revision: str | None = "ab6c7d8e9f56"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Added in place, never by recreating ``clusters`` (see 9a5b6c7d8e45): outside batch
    # mode op.add_column is ALTER TABLE … ADD COLUMN on SQLite too, which takes NOT NULL
    # with a constant default.
    op.add_column("clusters", sa.Column("labels", sa.JSON(), nullable=False, server_default="{}"))


def downgrade() -> None:
    op.drop_column("clusters", "labels")  # in place on SQLite 3.35+
