"""clusters.seq_gaps: sequence numbers the connector sessions skipped

Counted when a live session's snapshot is accepted with ``seq`` above ``last_seq + 1``
(app/telemetry/fencing.py), exported as ``shaper_telemetry_seq_gaps_total``. Existing
clusters start at 0.

Revision ID: 8f4a5b6c7d34
Revises: 7e3f4a5b6c23
Create Date: 2026-12-03 15:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "8f4a5b6c7d34"
down_revision: str | None = "7e3f4a5b6c23"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("clusters", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column(
                "seq_gaps",
                sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
                nullable=False,
                server_default="0",
            )
        )


def downgrade() -> None:
    with op.batch_alter_table("clusters", schema=None) as batch_op:
        batch_op.drop_column("seq_gaps")
