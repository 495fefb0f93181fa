"""service_forecasts.lead_h: every step of the solver's look-ahead is recorded

Each cycle's forecast of every hour its look-ahead sees (1 h … 5 h ahead), not only the
next one, so forecast error is tracked by lead time (issue 19). A row is now one per
service, hour and lead: the unique constraint gains ``lead_h``. The rows written before
were next-hour forecasts: ``1``.

Revision ID: f0a1b2c3d4e5
Revises: ef0a1b2c3d9a
Create Date: 2026-12-04 11:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "f0a1b2c3d4e5"
down_revision: str | None = "ef0a1b2c3d9a"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("service_forecasts", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("lead_h", sa.Integer(), nullable=False, server_default=sa.text("1"))
        )
        batch_op.drop_constraint("uq_service_forecasts_job_hour", type_="unique")
        batch_op.create_unique_constraint(
            "uq_service_forecasts_job_hour_lead", ["job_id", "target_hour", "lead_h"]
        )


def downgrade() -> None:
    # Only the next hour's forecasts fit the old constraint.
    op.execute("DELETE FROM service_forecasts WHERE lead_h <> 1")
    with op.batch_alter_table("service_forecasts", schema=None) as batch_op:
        batch_op.drop_constraint("uq_service_forecasts_job_hour_lead", type_="unique")
        batch_op.create_unique_constraint(
            "uq_service_forecasts_job_hour", ["job_id", "target_hour"]
        )
        batch_op.drop_column("lead_h")
