from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlmodel import Session, select

from app.core import migrate
from app.core.db import make_engine
from app.gpu_models import service as gpu_model_service
from app.models import metadata
from app.telemetry.models import NODE_WIDE, GpuLatestSample
from migrations.render import render_item
from tests.app.builders import registered_with, snapshot

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
    "gpu_latest_samples",
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


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
def test_latest_samples_are_backfilled_from_the_recent_samples(
    backend: str, make_postgres_database: Any, tmp_path: Any
) -> None:
    """Migration ``5f6a7b8c9d0e`` fills ``gpu_latest_samples`` with the newest sample of
    each GPU and metric of the last 20 minutes (the map shows 10), as the ingest keeps it;
    older samples are left out. The migration reads the wall clock, so the samples are
    dated from it."""
    url = (
        make_postgres_database("latest")
        if backend == "postgres"
        else f"sqlite:///{tmp_path / 'latest.db'}"
    )
    migrate.upgrade(url)
    now = datetime.now(UTC)

    def sample(ago_s: float, value: float, **fields: Any) -> dict[str, Any]:
        at = (now - timedelta(seconds=ago_s)).isoformat()
        return {"at": at, "metric": "gpu_util", "node": "n1", "value": value, **fields}

    samples = [
        sample(60, 0.6, gpu_index=0),
        sample(120, 0.5, gpu_index=0),  # late: older than the one before
        sample(30, 0.7, gpu_index=1),
        sample(30, 0.8, gpu_index=1),  # the same instant: the later written
        sample(45, 12.5, metric="gpu_mem_used_gib"),  # node-wide
        sample(25 * 60, 0.4, node="n2", gpu_index=1),  # older than the backfill's window
        sample(10, 0.3, metric="cpu_util"),  # not a GPU figure: not kept
    ]
    engine = make_engine(url)
    try:
        with Session(engine) as session:
            gpu_model_service.ensure_default_catalogue(session=session)
            registered_with(session, "alpha", snapshot(1, samples=samples), now=now)

        def kept() -> dict[tuple[int, str, int], tuple[datetime, float]]:
            with Session(engine) as session:
                rows = session.exec(select(GpuLatestSample)).all()
                return {(r.node_id, r.metric, r.gpu_index): (r.at, r.value) for r in rows}

        by_ingest = kept()
        migrate.downgrade(url, "4e5f6a7b8c9d")
        migrate.upgrade(url)
        backfilled = kept()
    finally:
        engine.dispose()
    old = {key for key, (at, _) in by_ingest.items() if at < now - timedelta(minutes=20)}
    assert len(old) == 1 and len(by_ingest) == 4
    assert backfilled == {key: row for key, row in by_ingest.items() if key not in old}
    assert sorted(
        (metric, index, value) for (_, metric, index), (_, value) in backfilled.items()
    ) == [
        ("gpu_mem_used_gib", NODE_WIDE, 12.5),
        ("gpu_util", 0, 0.6),
        ("gpu_util", 1, 0.8),
    ]
