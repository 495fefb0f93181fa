"""federation_groups.inter_cluster_egress_gpu_s_per_gib: what data leaving a site costs

A GiB crossing between a group's clusters priced in GPU-seconds of work (a cloud
provider's egress price over the GPU-hour price × 3600), added to what a start away from
home and a running job's move cost in the group plan (issue 16). Existing groups: 0, free.

Revision ID: 2c3d4e5f6a7b
Revises: 0a1b2c3d4e5f
Create Date: 2026-12-04 18:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "2c3d4e5f6a7b"
down_revision: str | None = "0a1b2c3d4e5f"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("federation_groups", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column(
                "inter_cluster_egress_gpu_s_per_gib",
                sa.Float(),
                nullable=False,
                server_default=sa.text("0"),
            )
        )


def downgrade() -> None:
    with op.batch_alter_table("federation_groups", schema=None) as batch_op:
        batch_op.drop_column("inter_cluster_egress_gpu_s_per_gib")
