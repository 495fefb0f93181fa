"""audit log: one row per change made through the API

``audit_log`` keeps who (the token's id, name and scopes; never its secret), what
(``<object type>.<verb>`` and the object's id as the API names it), when, the request's
``X-Request-ID`` and a compact record of what changed. No foreign keys: the record of a
token, cluster or plan outlives it. Indexed for the filters of ``GET /api/v1/audit``:
by object, by actor, by time.

Revision ID: 5c1d2e3f4a01
Revises: 4b8e2f6a1c90
Create Date: 2026-12-03 08:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "5c1d2e3f4a01"
down_revision: str | None = "4b8e2f6a1c90"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "audit_log",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor_token_id", sa.Integer(), nullable=True),
        sa.Column("actor_name", sa.String(length=128), nullable=False),
        sa.Column("actor_scopes", sa.JSON(), nullable=False),
        sa.Column("action", sa.String(length=64), nullable=False),
        sa.Column("object_type", sa.String(length=32), nullable=False),
        sa.Column("object_id", sa.String(length=255), nullable=False),
        sa.Column("request_id", sa.String(length=64), nullable=True),
        sa.Column("changes", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit_log")),
    )
    op.create_index(op.f("ix_audit_log_at"), "audit_log", ["at"], unique=False)
    op.create_index(
        op.f("ix_audit_log_actor_token_id"), "audit_log", ["actor_token_id"], unique=False
    )
    op.create_index(op.f("ix_audit_log_actor_name"), "audit_log", ["actor_name"], unique=False)
    op.create_index("ix_audit_log_object", "audit_log", ["object_type", "object_id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_audit_log_object", table_name="audit_log")
    op.drop_index(op.f("ix_audit_log_actor_name"), table_name="audit_log")
    op.drop_index(op.f("ix_audit_log_actor_token_id"), table_name="audit_log")
    op.drop_index(op.f("ix_audit_log_at"), table_name="audit_log")
    op.drop_table("audit_log")
