"""service_forecasts, runtime_predictions: the shaping cycle's forecasts, to be scored

What each cycle forecast (issue 19), kept to be compared with what happened: each elastic
service's demand in the next hour (one row per service and hour: mean, the SLA quantile's
value, the method, the seasonal-naive forecast; the hour's observed mean once it is
over) and each block job's run time, the first time a cycle predicted it (with the
team's median, the naive prediction). New tables only: nothing existing changes.

Revision ID: cd8e9f0a1b78
Revises: bc7d8e9f0a67
Create Date: 2026-12-04 03:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "cd8e9f0a1b78"
down_revision: str | None = "bc7d8e9f0a67"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "service_forecasts",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column(
            "cluster_id",
            sa.Integer(),
            sa.ForeignKey("clusters.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column(
            "job_id", sa.Integer(), sa.ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False
        ),
        sa.Column("target_hour", sa.DateTime(timezone=True), nullable=False),
        sa.Column("made_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("method", sa.String(length=16), nullable=False),
        sa.Column("quantile", sa.Float(), nullable=False),
        sa.Column("mean", sa.Float(), nullable=False),
        sa.Column("upper", sa.Float(), nullable=False),
        sa.Column("naive", sa.Float(), nullable=False),
        sa.Column("actual", sa.Float(), nullable=True),
        sa.Column("scored_at", sa.DateTime(timezone=True), nullable=True),
        sa.UniqueConstraint("job_id", "target_hour", name="uq_service_forecasts_job_hour"),
    )
    op.create_index(
        "ix_service_forecasts_hour_cluster", "service_forecasts", ["target_hour", "cluster_id"]
    )
    op.create_table(
        "runtime_predictions",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column(
            "cluster_id",
            sa.Integer(),
            sa.ForeignKey("clusters.id", ondelete="CASCADE"),
            nullable=False,
        ),
        sa.Column(
            "job_id",
            sa.Integer(),
            sa.ForeignKey("jobs.id", ondelete="CASCADE"),
            nullable=False,
            unique=True,
        ),
        sa.Column("predicted_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("predicted_s", sa.Float(), nullable=False),
        sa.Column("naive_s", sa.Float(), nullable=False),
    )
    op.create_index("ix_runtime_predictions_predicted_at", "runtime_predictions", ["predicted_at"])


def downgrade() -> None:
    op.drop_index("ix_runtime_predictions_predicted_at", table_name="runtime_predictions")
    op.drop_table("runtime_predictions")
    op.drop_index("ix_service_forecasts_hour_cluster", table_name="service_forecasts")
    op.drop_table("service_forecasts")
