"""jobs.required_nodes: the only nodes a pending job may start on

Slurm pins a job requeued with its checkpoint to the node that holds its image
(``ReqNodeList``); connectors report it as ``JobReport.required_nodes`` and the solver
places the job only there. Existing rows get ``[]`` (any node), which is what the solver
assumed for them before.

Revision ID: 6d2e3f4a5b12
Revises: 5c1d2e3f4a01
Create Date: 2026-12-03 08:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "6d2e3f4a5b12"
down_revision: str | None = "5c1d2e3f4a01"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # An added column: SQLite adds it in place, without recreating the table.
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("required_nodes", sa.JSON(), nullable=False, server_default="[]")
        )


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("required_nodes")
