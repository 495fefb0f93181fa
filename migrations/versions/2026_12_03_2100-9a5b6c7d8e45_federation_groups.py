"""federation_groups; clusters.federation_group_id; jobs.submit_spec

A federation group is a set of clusters planned together (issue 16): a cluster belongs to
at most one (deleting a group clears its members first: they are planned alone again).
``jobs.submit_spec`` is how a pending job can be submitted in another cluster
(``wire.telemetry.SubmitSpec`` as compact JSON text); NULL for every existing row: their connectors
never said, so they stay where they are.

Revision ID: 9a5b6c7d8e45
Revises: 8f4a5b6c7d34
Create Date: 2026-12-03 21:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "9a5b6c7d8e45"
down_revision: str | None = "8f4a5b6c7d34"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "federation_groups",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(length=63), nullable=False, unique=True),
        sa.Column("description", sa.String(length=1024), nullable=False),
        sa.Column("inter_cluster_bandwidth_mib_per_s", sa.Float(), nullable=False),
        sa.Column("inter_cluster_overhead_s", sa.Float(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    # Added in place, never by recreating ``clusters``: on SQLite that would drop the table
    # with foreign keys on and cascade into every node and job (see 4b8e2f6a1c90).
    if op.get_bind().dialect.name == "sqlite":
        op.execute(
            "ALTER TABLE clusters ADD COLUMN federation_group_id INTEGER"
            " REFERENCES federation_groups (id)"
        )
    else:
        op.add_column("clusters", sa.Column("federation_group_id", sa.Integer(), nullable=True))
        op.create_foreign_key(
            "fk_clusters_federation_group_id",
            "clusters",
            "federation_groups",
            ["federation_group_id"],
            ["id"],
        )
    op.create_index("ix_clusters_federation_group_id", "clusters", ["federation_group_id"])
    with op.batch_alter_table("jobs", schema=None) as batch_op:  # an added column: in place
        batch_op.add_column(sa.Column("submit_spec", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("jobs", "submit_spec")  # in place on SQLite 3.35+, as above
    op.drop_index("ix_clusters_federation_group_id", table_name="clusters")
    if op.get_bind().dialect.name != "sqlite":
        op.drop_constraint("fk_clusters_federation_group_id", "clusters", type_="foreignkey")
    op.drop_column("clusters", "federation_group_id")  # in place on SQLite 3.35+
    op.drop_table("federation_groups")
