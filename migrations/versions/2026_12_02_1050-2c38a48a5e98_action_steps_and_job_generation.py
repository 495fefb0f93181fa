"""action steps and job generation: the saga log of every action, and the fencing token

``action_steps`` holds each step of an action's saga (forward and compensation) with its
idempotency key, the generation it carries, attempts, result and error. ``jobs.generation``
is the job's fencing token; existing rows start at 0 through a server default, so the
upgrade works on a live table.

Revision ID: 2c38a48a5e98
Revises: 630e9b2fbb64
Create Date: 2026-12-02 10:50:22.054384
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "2c38a48a5e98"
down_revision: str | None = "630e9b2fbb64"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "action_steps",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("action_id", sa.Integer(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("phase", sa.String(length=16), nullable=False),
        sa.Column("name", sa.String(length=32), nullable=False),
        sa.Column("queue", sa.String(length=320), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("generation", sa.Integer(), nullable=False),
        sa.Column("idempotency_key", sa.String(length=200), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("result", sa.JSON(), nullable=False),
        sa.Column("error", sa.String(length=4096), nullable=True),
        sa.Column("sent_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["action_id"],
            ["actions.id"],
            name=op.f("fk_action_steps_action_id_actions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_action_steps")),
        sa.UniqueConstraint("action_id", "seq", name="uq_action_steps_action_seq"),
        sa.UniqueConstraint("idempotency_key", name=op.f("uq_action_steps_idempotency_key")),
    )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("generation", sa.Integer(), nullable=False, server_default="0")
        )


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("generation")
    op.drop_table("action_steps")
