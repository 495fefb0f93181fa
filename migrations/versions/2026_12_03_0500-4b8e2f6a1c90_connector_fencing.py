"""connector fencing: the live session since when, replay digests, 64-bit seq

``clusters.connector_session_since`` is when the live connector session's first snapshot
was accepted; ``recent_pushes`` keeps ``[seq, digest]`` of that session's last accepted
pushes (a replay with other content is refused); ``superseded_sessions`` lists the sessions
that lost the cluster to a newer one (their pushes are refused). ``last_seq`` becomes
``bigint`` on PostgreSQL so connectors may number pushes by epoch milliseconds; SQLite's
INTEGER is 64-bit already, and it is left alone there: changing a column type on SQLite
recreates the table, and dropping ``clusters`` with foreign keys on would cascade into
every node and job.

Existing rows get ``[]``: a session that was live before the upgrade stays live, with no
digests yet (a replay of one of its earlier pushes is answered ``out_of_order``).
Downgrading back to ``integer`` fails if a stored ``last_seq`` no longer fits in it.

Revision ID: 4b8e2f6a1c90
Revises: 7d1e5a9c3b42
Create Date: 2026-12-03 05:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "4b8e2f6a1c90"
down_revision: str | None = "7d1e5a9c3b42"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Only added columns: SQLite adds them in place, without recreating the table.
    with op.batch_alter_table("clusters", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("connector_session_since", sa.DateTime(timezone=True), nullable=True)
        )
        batch_op.add_column(
            sa.Column("recent_pushes", sa.JSON(), nullable=False, server_default="[]")
        )
        batch_op.add_column(
            sa.Column("superseded_sessions", sa.JSON(), nullable=False, server_default="[]")
        )
    if op.get_bind().dialect.name == "postgresql":
        op.alter_column("clusters", "last_seq", existing_type=sa.Integer(), type_=sa.BigInteger())


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.alter_column("clusters", "last_seq", existing_type=sa.BigInteger(), type_=sa.Integer())
    # Not in batch mode: that would recreate ``clusters`` on SQLite (see above); SQLite
    # 3.35+ drops a column in place.
    op.drop_column("clusters", "superseded_sessions")
    op.drop_column("clusters", "recent_pushes")
    op.drop_column("clusters", "connector_session_since")
