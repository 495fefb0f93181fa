"""actions.job_set_queue, job_set, target_executor: an operator's move of an Armada job set

``POST /clusters/{cluster}/job-sets/{queue}/{job_set}/move`` makes a ``move_job_set`` action
about a job set, not one job (issue 17): these name the job set and the executor cluster
its queued jobs go to. NULL for every other action, existing ones included.

Revision ID: 3d4e5f6a7b8c
Revises: 1b2c3d4e5f6a
Create Date: 2026-12-04 21:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "3d4e5f6a7b8c"
down_revision: str | None = "1b2c3d4e5f6a"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("actions", schema=None) as batch_op:
        batch_op.add_column(sa.Column("job_set_queue", sa.String(length=128), nullable=True))
        batch_op.add_column(sa.Column("job_set", sa.String(length=255), nullable=True))
        batch_op.add_column(sa.Column("target_executor", sa.String(length=128), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("actions", schema=None) as batch_op:
        batch_op.drop_column("target_executor")
        batch_op.drop_column("job_set")
        batch_op.drop_column("job_set_queue")
