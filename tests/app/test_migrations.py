from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from app.core import migrate
from app.core.db import make_engine
from app.models import metadata
from migrations.render import render_item

TABLES = {
    "clusters",
    "gpu_models",
    "nodes",
    "jobs",
    "allocations",
    "telemetry_samples",
    "plans",
    "actions",
    "action_steps",
    "sla_policies",
    "api_tokens",
    "audit_log",
    "federation_groups",
    "service_forecasts",
    "runtime_predictions",
    "utilization_rollups",
    "utilization_rollup_deltas",
}


def _tables(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        return set(sa.inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def _drift(url: str) -> list[Any]:
    engine = make_engine(url)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(
                connection, opts={"compare_type": True, "render_item": render_item}
            )
            return compare_metadata(context, metadata)  # type: ignore[no-any-return]
    finally:
        engine.dispose()


def test_upgrade_downgrade_upgrade_on_postgres(make_postgres_database: Any) -> None:
    url = make_postgres_database("updown")
    migrate.upgrade(url)
    assert _tables(url) == TABLES
    migrate.downgrade(url, "base")
    assert _tables(url) == set()
    migrate.upgrade(url)
    assert _tables(url) == TABLES


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
def test_migrations_match_the_models(
    backend: str, make_postgres_database: Any, tmp_path: Any
) -> None:
    url = (
        make_postgres_database("drift")
        if backend == "postgres"
        else f"sqlite:///{tmp_path / 'drift.db'}"
    )
    migrate.upgrade(url)
    assert _drift(url) == []


def test_reason_columns_upgrade_a_table_with_rows(make_postgres_database: Any) -> None:
    """The second revision adds NOT NULL columns: rows written before it must survive."""
    url = make_postgres_database("rows")
    migrate.upgrade(url, "2efac8c2a267")
    engine = make_engine(url)
    with engine.begin() as connection:
        connection.execute(
            sa.text(
                "INSERT INTO clusters (name, scheduler, description, mode, policy,"
                " connector_status, created_at)"
                " VALUES ('a', 'slurm', '', 'observe', 'shaper', 'never_seen', now())"
            )
        )
        connection.execute(
            sa.text(
                "INSERT INTO jobs (cluster_id, external_id, name, team, queue, kind, shape,"
                " priority, sla_class, gpus_requested, allowed_gpu_models, min_gpu_memory_gib,"
                " gang_size,"
                " checkpointable, min_replicas, max_replicas, replicas, state, updated_at) VALUES"
                " (1, 'j1', '', 't', 'q', 'hpc', 'block', 0, 's', 1, '[]', 0, 1, false, 0, 0, 0,"
                " 'pending', now())"
            )
        )
    migrate.upgrade(url)
    with engine.connect() as connection:
        row = connection.execute(sa.text("SELECT reason, restart_count FROM jobs")).one()
    engine.dispose()
    assert tuple(row) == ("", 0)
