"""jobs: an index in GET /jobs's default order (priority descending, submit time, id)

Without it every request for the first page sorted all jobs (64,000 in issue 13's fleet:
tens of ms of PostgreSQL's time per request); with it the page is the index's first 100
entries. Built without CONCURRENTLY: migrations run before the service starts.

Revision ID: de9f0a1b2c89
Revises: cd8e9f0a1b78
Create Date: 2026-12-04 04:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "de9f0a1b2c89"
down_revision: str | None = "cd8e9f0a1b78"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_jobs_priority_submit_time_id",
        "jobs",
        [sa.text("priority DESC"), "submit_time", "id"],
    )


def downgrade() -> None:
    op.drop_index("ix_jobs_priority_submit_time_id", table_name="jobs")
