"""plans as units: plan state, action dependencies and placements, displaced jobs

``plans.state`` says where a plan stands as a whole (observed, proposed, approved,
finished, rejected, expired, superseded) with ``state_reason``, ``checked_at`` (the last
cycle that found it still applies) and who decided it. ``actions.depends_on`` lists the
actions of the same plan that must succeed first; ``source_placement`` and
``target_placement`` keep the GPU counts per node behind ``source_node``/``target_node``;
``counts_on`` names, for a reservation, the jobs whose GPUs the plan frees for it;
``finished_at`` is when it ended. ``jobs.displaced_at``/``displaced_reason`` mark a job
that a failed move left without GPUs (back in its queue with its checkpoint).

Existing rows get server defaults, so the upgrade works on live tables; plans made before
it become ``observed``, and their undecided proposals are withdrawn (``cancelled``, with
the reason): every later cycle used to cancel them anyway. ``actions.plan_id`` and
``actions.job_id`` get indexes.

Revision ID: 7d1e5a9c3b42
Revises: 2c38a48a5e98
Create Date: 2026-12-02 22:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "7d1e5a9c3b42"
down_revision: str | None = "2c38a48a5e98"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("plans", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("state", sa.String(length=16), nullable=False, server_default="observed")
        )
        batch_op.add_column(sa.Column("state_reason", sa.String(length=1024), nullable=True))
        batch_op.add_column(sa.Column("checked_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("decided_by", sa.String(length=128), nullable=True))
        batch_op.add_column(sa.Column("decided_at", sa.DateTime(timezone=True), nullable=True))
    with op.batch_alter_table("actions", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("source_placement", sa.JSON(), nullable=False, server_default="{}")
        )
        batch_op.add_column(
            sa.Column("target_placement", sa.JSON(), nullable=False, server_default="{}")
        )
        batch_op.add_column(sa.Column("depends_on", sa.JSON(), nullable=False, server_default="[]"))
        batch_op.add_column(sa.Column("counts_on", sa.JSON(), nullable=False, server_default="[]"))
        batch_op.add_column(sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True))
        # Every event now looks up a plan's actions and a job's actions.
        batch_op.create_index(batch_op.f("ix_actions_plan_id"), ["plan_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_actions_job_id"), ["job_id"], unique=False)
    # Proposals made before plans were units would be neither reviewed nor superseded any
    # more (every cycle used to cancel them): withdraw them, saying why.
    op.execute(
        "UPDATE actions SET state = 'cancelled', "
        "error = 'withdrawn by the upgrade to plans as units: the next cycle proposes afresh' "
        "WHERE state = 'proposed'"
    )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("displaced_at", sa.DateTime(timezone=True), nullable=True))
        batch_op.add_column(sa.Column("displaced_reason", sa.String(length=1024), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("displaced_reason")
        batch_op.drop_column("displaced_at")
    with op.batch_alter_table("actions", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_actions_job_id"))
        batch_op.drop_index(batch_op.f("ix_actions_plan_id"))
        batch_op.drop_column("finished_at")
        batch_op.drop_column("counts_on")
        batch_op.drop_column("depends_on")
        batch_op.drop_column("target_placement")
        batch_op.drop_column("source_placement")
    with op.batch_alter_table("plans", schema=None) as batch_op:
        batch_op.drop_column("decided_at")
        batch_op.drop_column("decided_by")
        batch_op.drop_column("checked_at")
        batch_op.drop_column("state_reason")
        batch_op.drop_column("state")
