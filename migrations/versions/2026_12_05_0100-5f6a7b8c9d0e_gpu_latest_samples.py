"""gpu_latest_samples: each GPU's newest utilization and memory sample, kept by the
writers of samples, backfilled from the recent samples

The cluster map showed each GPU's latest ``gpu_util`` and ``gpu_mem_used_gib`` of the last
10 minutes by reading every sample of those minutes: with agents reporting every 15 s,
40 rows per GPU and metric (issue 18). This table holds one row per GPU (``gpu_index``
-1: the node as a whole) and metric, the newest by ``at``; the ingest and the node
agents' samples upsert it in their transaction (``app.telemetry.latest``).

Backfill: per GPU and metric, the newest sample taken since twice the map's window
before now (20 minutes), and none older. The map runs after the migration and shows
only samples of its last 10 minutes: any older sample would never be shown, so this is
exactly the table the writers would have kept, for every read the map makes, with 10
minutes to spare for clocks of the host that migrates and the hosts that serve.
Reading every sample ever kept (35 days of them by default) would cost a sort of the
whole table for nothing the map shows.

Revision ID: 5f6a7b8c9d0e
Revises: 4e5f6a7b8c9d
Create Date: 2026-12-05 01:00:00.000000
"""

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

import sqlalchemy as sa
from alembic import op

revision: str = "5f6a7b8c9d0e"
down_revision: str | None = "4e5f6a7b8c9d"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Twice app.nodes.cluster_map.MEASURED_WINDOW (10 minutes).
BACKFILL_WINDOW = timedelta(minutes=20)
KEPT_METRICS = ("gpu_util", "gpu_mem_used_gib")  # app.telemetry.latest.KEPT_METRICS
NODE_WIDE = -1  # app.telemetry.models.NODE_WIDE

_BACKFILL = sa.text(
    "INSERT INTO gpu_latest_samples (cluster_id, node_id, metric, gpu_index, at, value)"
    " SELECT cluster_id, node_id, metric, gpu_index, at, value FROM ("
    f"  SELECT cluster_id, node_id, metric, COALESCE(gpu_index, {NODE_WIDE}) AS gpu_index,"
    "   at, value, row_number() OVER ("
    f"    PARTITION BY cluster_id, node_id, metric, COALESCE(gpu_index, {NODE_WIDE})"
    "    ORDER BY at DESC, id DESC) AS newest"
    "  FROM telemetry_samples"
    "  WHERE node_id IS NOT NULL AND metric IN :metrics AND at >= :since"
    " ) AS ranked WHERE newest = 1"
).bindparams(
    sa.bindparam("metrics", expanding=True),
    sa.bindparam("since", type_=sa.DateTime(timezone=True)),
)


def upgrade() -> None:
    op.create_table(
        "gpu_latest_samples",
        sa.Column("cluster_id", sa.Integer(), nullable=False),
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("metric", sa.String(length=32), nullable=False),
        sa.Column("gpu_index", sa.Integer(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["cluster_id"],
            ["clusters.id"],
            name=op.f("fk_gpu_latest_samples_cluster_id_clusters"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["node_id"],
            ["nodes.id"],
            name=op.f("fk_gpu_latest_samples_node_id_nodes"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "cluster_id", "node_id", "metric", "gpu_index", name=op.f("pk_gpu_latest_samples")
        ),
        # SQLite: the rows in primary-key order, so a cluster's are one range.
        sqlite_with_rowid=False,
    )
    since = datetime.now(UTC) - BACKFILL_WINDOW
    connection = op.get_bind()
    if connection.dialect.name == "sqlite":
        since = since.replace(tzinfo=None)  # stored as naive UTC there (UtcDateTime)
    connection.execute(_BACKFILL, {"metrics": list(KEPT_METRICS), "since": since})


def downgrade() -> None:
    op.drop_table("gpu_latest_samples")
