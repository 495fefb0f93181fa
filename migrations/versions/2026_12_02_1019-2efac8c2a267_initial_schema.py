"""initial schema: clusters, GPU models, nodes, jobs, allocations, telemetry samples,
plans, actions, SLA policies, API tokens

Revision ID: 2efac8c2a267
Revises:
Create Date: 2026-12-02 10:19:01.766731
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "2efac8c2a267"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("key_id", sa.String(length=12), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=False),
        sa.Column("secret_digest", sa.String(length=64), nullable=False),
        sa.Column("scopes", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_tokens")),
        sa.UniqueConstraint("key_id", name=op.f("uq_api_tokens_key_id")),
    )
    op.create_table(
        "clusters",
        sa.Column("scheduler", sa.String(length=16), nullable=False),
        sa.Column("description", sa.String(length=1024), nullable=False),
        sa.Column("mode", sa.String(length=16), nullable=False),
        sa.Column("policy", sa.String(length=32), nullable=False),
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=63), nullable=False),
        sa.Column("connector_status", sa.String(length=16), nullable=False),
        sa.Column("connector_session", sa.String(length=64), nullable=True),
        sa.Column("last_seq", sa.Integer(), nullable=True),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_clusters")),
        sa.UniqueConstraint("name", name=op.f("uq_clusters_name")),
    )
    op.create_table(
        "gpu_models",
        sa.Column("vendor", sa.String(length=32), nullable=False),
        sa.Column("memory_gib", sa.Float(), nullable=False),
        sa.Column("relative_speed", sa.Float(), nullable=False),
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("precisions", sa.JSON(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_gpu_models")),
        sa.UniqueConstraint("name", name=op.f("uq_gpu_models_name")),
    )
    op.create_table(
        "sla_policies",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("comment", sa.String(length=1024), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_by", sa.String(length=128), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sla_policies")),
        sa.UniqueConstraint("name", "version", name="uq_sla_policies_name_version"),
    )
    with op.batch_alter_table("sla_policies", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_sla_policies_name"), ["name"], unique=False)

    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("cluster_id", sa.Integer(), nullable=False),
        sa.Column("external_id", sa.String(length=255), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("team", sa.String(length=128), nullable=False),
        sa.Column("queue", sa.String(length=128), nullable=False),
        sa.Column("kind", sa.String(length=32), nullable=False),
        sa.Column("shape", sa.String(length=16), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("sla_class", sa.String(length=64), nullable=False),
        sa.Column("gpus_requested", sa.Integer(), nullable=False),
        sa.Column("allowed_gpu_models", sa.JSON(), nullable=False),
        sa.Column("min_gpu_memory_gib", sa.Float(), nullable=False),
        sa.Column("required_precision", sa.String(length=16), nullable=True),
        sa.Column("gang_size", sa.Integer(), nullable=False),
        sa.Column("checkpointable", sa.Boolean(), nullable=False),
        sa.Column("min_replicas", sa.Integer(), nullable=False),
        sa.Column("max_replicas", sa.Integer(), nullable=False),
        sa.Column("replicas", sa.Integer(), nullable=False),
        sa.Column("submit_time", sa.DateTime(timezone=True), nullable=True),
        sa.Column("start_time", sa.DateTime(timezone=True), nullable=True),
        sa.Column("end_time", sa.DateTime(timezone=True), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["cluster_id"],
            ["clusters.id"],
            name=op.f("fk_jobs_cluster_id_clusters"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
        sa.UniqueConstraint("cluster_id", "external_id", name="uq_jobs_cluster_external_id"),
    )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_index("ix_jobs_cluster_state", ["cluster_id", "state"], unique=False)

    op.create_table(
        "nodes",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("cluster_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("gpu_model_id", sa.Integer(), nullable=True),
        sa.Column("gpu_count", sa.Integer(), nullable=False),
        sa.Column("cpu_cores", sa.Integer(), nullable=False),
        sa.Column("memory_mib", sa.BigInteger(), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["cluster_id"],
            ["clusters.id"],
            name=op.f("fk_nodes_cluster_id_clusters"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["gpu_model_id"], ["gpu_models.id"], name=op.f("fk_nodes_gpu_model_id_gpu_models")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_nodes")),
        sa.UniqueConstraint("cluster_id", "name", name="uq_nodes_cluster_name"),
    )
    op.create_table(
        "plans",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("cluster_id", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("policy", sa.String(length=32), nullable=False),
        sa.Column("engine", sa.String(length=32), nullable=False),
        sa.Column("mode", sa.String(length=16), nullable=False),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("objective", sa.Float(), nullable=True),
        sa.Column("best_bound", sa.Float(), nullable=True),
        sa.Column("gap", sa.Float(), nullable=True),
        sa.Column("wall_time_s", sa.Float(), nullable=False),
        sa.Column("decisions", sa.JSON(), nullable=False),
        sa.Column("summary", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["cluster_id"],
            ["clusters.id"],
            name=op.f("fk_plans_cluster_id_clusters"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_plans")),
    )
    with op.batch_alter_table("plans", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_plans_cluster_id"), ["cluster_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_plans_created_at"), ["created_at"], unique=False)

    op.create_table(
        "actions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("plan_id", sa.Integer(), nullable=True),
        sa.Column("cluster_id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=True),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("idempotency_key", sa.String(length=128), nullable=False),
        sa.Column("reason", sa.String(length=2048), nullable=False),
        sa.Column("source_node", sa.String(length=255), nullable=True),
        sa.Column("target_node", sa.String(length=255), nullable=True),
        sa.Column("target_replicas", sa.Integer(), nullable=True),
        sa.Column("fencing_token", sa.Integer(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("error", sa.String(length=4096), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("decided_by", sa.String(length=128), nullable=True),
        sa.Column("decided_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["cluster_id"],
            ["clusters.id"],
            name=op.f("fk_actions_cluster_id_clusters"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_actions_job_id_jobs"), ondelete="SET NULL"
        ),
        sa.ForeignKeyConstraint(
            ["plan_id"], ["plans.id"], name=op.f("fk_actions_plan_id_plans"), ondelete="SET NULL"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_actions")),
        sa.UniqueConstraint("idempotency_key", name=op.f("uq_actions_idempotency_key")),
    )
    with op.batch_alter_table("actions", schema=None) as batch_op:
        batch_op.create_index("ix_actions_cluster_state", ["cluster_id", "state"], unique=False)

    op.create_table(
        "allocations",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=False),
        sa.Column("node_id", sa.Integer(), nullable=False),
        sa.Column("gpu_indices", sa.JSON(), nullable=False),
        sa.Column("gpu_count", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("released_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_allocations_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["node_id"], ["nodes.id"], name=op.f("fk_allocations_node_id_nodes"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_allocations")),
    )
    with op.batch_alter_table("allocations", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_allocations_job_id"), ["job_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_allocations_node_id"), ["node_id"], unique=False)
        batch_op.create_index("ix_allocations_open", ["released_at", "started_at"], unique=False)

    op.create_table(
        "telemetry_samples",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("cluster_id", sa.Integer(), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("metric", sa.String(length=32), nullable=False),
        sa.Column("value", sa.Float(), nullable=False),
        sa.Column("node_id", sa.Integer(), nullable=True),
        sa.Column("gpu_index", sa.Integer(), nullable=True),
        sa.Column("job_id", sa.Integer(), nullable=True),
        sa.ForeignKeyConstraint(
            ["cluster_id"],
            ["clusters.id"],
            name=op.f("fk_telemetry_samples_cluster_id_clusters"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["job_id"],
            ["jobs.id"],
            name=op.f("fk_telemetry_samples_job_id_jobs"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["node_id"],
            ["nodes.id"],
            name=op.f("fk_telemetry_samples_node_id_nodes"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_telemetry_samples")),
    )
    with op.batch_alter_table("telemetry_samples", schema=None) as batch_op:
        batch_op.create_index("ix_telemetry_samples_cluster_at", ["cluster_id", "at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("telemetry_samples", schema=None) as batch_op:
        batch_op.drop_index("ix_telemetry_samples_cluster_at")

    op.drop_table("telemetry_samples")
    with op.batch_alter_table("allocations", schema=None) as batch_op:
        batch_op.drop_index("ix_allocations_open")
        batch_op.drop_index(batch_op.f("ix_allocations_node_id"))
        batch_op.drop_index(batch_op.f("ix_allocations_job_id"))

    op.drop_table("allocations")
    with op.batch_alter_table("actions", schema=None) as batch_op:
        batch_op.drop_index("ix_actions_cluster_state")

    op.drop_table("actions")
    with op.batch_alter_table("plans", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_plans_created_at"))
        batch_op.drop_index(batch_op.f("ix_plans_cluster_id"))

    op.drop_table("plans")
    op.drop_table("nodes")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_cluster_state")

    op.drop_table("jobs")
    with op.batch_alter_table("sla_policies", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_sla_policies_name"))

    op.drop_table("sla_policies")
    op.drop_table("gpu_models")
    op.drop_table("clusters")
    op.drop_table("api_tokens")
