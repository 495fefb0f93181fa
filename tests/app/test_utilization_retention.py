"""Retention of node samples (``app.utilization.retention``), on both backends: samples
older than the retention age are deleted, in batches, newer ones and services' demand
samples kept, and ``GET /utilization`` answers every window the same before and after,
from the roll-up. Also the periodic task's schedule and ``shaper db prune-samples``."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from pydantic import ValidationError
from sqlmodel import Session, col, func, select

from app.clusters import service as cluster_service
from app.clusters.models import ClusterCreate
from app.core import migrate
from app.core.config import Settings
from app.core.db import make_engine
from app.gpu_models import service as gpu_model_service
from app.telemetry import service as telemetry_service
from app.telemetry.models import TelemetrySample
from app.utilization import fold, retention
from app.utilization.models import GroupBy
from app.utilization.raw import summarize_raw
from app.utilization.service import summarize
from app.worker import make_celery
from tests.app.builders import job, node, snapshot
from tests.support.clock import T0
from wire.telemetry import SchedulerKind, TelemetrySnapshot

RETENTION = timedelta(days=30)
SECOND = timedelta(seconds=1)
NODES = 3


def _history(
    session: Session, start: datetime, *, days: int, seed: int, spread_s: int = 3600
) -> None:
    """A cluster pushed to twice a day for ``days`` days from ``start``: jobs placed anew,
    GPU samples (a few sharing an instant, the others up to ``spread_s`` before the push),
    a service's demand."""
    rng = random.Random(seed)
    cluster_in = ClusterCreate(name="alpha", scheduler=SchedulerKind.sim)
    cluster_service.register_cluster(session=session, now=start, cluster_in=cluster_in)
    for seq in range(1, 2 * days + 1):
        now = start + timedelta(hours=12 * seq, microseconds=rng.randrange(10**6))
        jobs = [
            job(f"j{j}", team=("x", "y")[j % 2], state="running", start_time=now.isoformat(),
                submit_time=start.isoformat(), gpus_requested=1,
                allocations=[{"node": f"n{rng.randrange(NODES)}", "gpu_indices": [j]}])
            for j in range(4) if rng.random() < 0.7
        ]  # fmt: skip
        shared = now - timedelta(minutes=1)
        samples = [
            {"at": (shared if i < 2 else now - rng.randrange(spread_s) * SECOND).isoformat(),
             "metric": metric, "node": f"n{i % NODES}", "value": rng.random()}
            for i in range(5) for metric in ("gpu_util", "cpu_util")
        ]  # fmt: skip
        samples.append(
            {"at": now.isoformat(), "metric": "demand_replicas", "job": "svc", "value": 2}
        )
        jobs.append(job("svc", kind="realtime_inference", submit_time=start.isoformat()))
        push = snapshot(
            seq,
            nodes=[node(f"n{i}", gpu_model=("H100", "A100-80G")[i % 2]) for i in range(NODES)],
            jobs=jobs,
            samples=samples,
        )
        telemetry_service.ingest(
            session=session,
            cluster_name="alpha",
            push=TelemetrySnapshot.model_validate(push),
            now=now,
        )
        if seq % 5 == 2:  # PostgreSQL: some of the roll-up folded, some still deltas
            fold.fold_deltas(session=session)


def _windows(start: datetime, end: datetime) -> list[dict[str, Any]]:
    """Windows over the old samples, the new ones and both, at edges off any period."""
    old = start + timedelta(days=2, seconds=7.25)
    return [
        {"since": old, "until": old + timedelta(hours=13), "bucket_s": 60},
        {"since": old, "until": old + timedelta(days=3), "bucket_s": 3601},
        {"since": start, "until": end, "bucket_s": 86400},
        {"since": end - timedelta(days=3, seconds=1.5), "until": end, "bucket_s": 3600},
    ]


def _answers(session: Session, windows: list[dict[str, Any]]) -> list[Any]:
    return [
        summarize(session=session, group_by=group_by, **window)
        for window in windows
        for group_by in GroupBy
    ]


def _count(session: Session, *where: Any) -> int:
    return session.exec(select(func.count()).select_from(TelemetrySample).where(*where)).one()


def test_old_samples_go_and_the_answers_stay(session: Session) -> None:
    start = T0 - timedelta(days=40)
    _history(session, start, days=40, seed=3)
    end = start + timedelta(days=41)
    cutoff = end - RETENTION
    windows = _windows(start, end)
    before = _answers(session, windows)
    # The roll-up answered what the raw rows say, over windows with samples in them.
    assert before[0] == summarize_raw(session=session, group_by=GroupBy.cluster, **windows[0])
    assert any(p.measured_util is not None for p in before[0].series[0].points)
    old_nodes = _count(
        session, col(TelemetrySample.at) < cutoff, col(TelemetrySample.node_id).is_not(None)
    )
    new_samples = _count(session, col(TelemetrySample.at) >= cutoff)
    old_demand = _count(
        session, col(TelemetrySample.at) < cutoff, col(TelemetrySample.metric) == "demand_replicas"
    )
    assert old_nodes > 100 and new_samples > 0 and old_demand > 0  # fmt: skip

    deleted = retention.prune_samples(session=session, now=end, older_than=RETENTION, batch=7)

    assert deleted == old_nodes
    assert _count(session, col(TelemetrySample.at) < cutoff) == old_demand  # forecasts' history
    assert _count(session, col(TelemetrySample.at) >= cutoff) == new_samples
    assert _answers(session, windows) == before
    # The raw rows alone no longer say it: the answer is the roll-up's.
    raw = summarize_raw(session=session, group_by=GroupBy.cluster, **windows[0])
    assert all(p.measured_util is None for p in raw.series[0].points)
    # Nothing left to delete; a second run is harmless.
    assert retention.prune_samples(session=session, now=end, older_than=RETENTION) == 0
    assert _answers(session, windows) == before


def _exact_rows(session: Session, where: str) -> int:
    query = f"SELECT count(*) FROM utilization_rollups WHERE period_us = 1 AND {where}"
    return int(session.execute(sa.text(query)).scalar_one())


def _exact_sums(session: Session) -> dict[Any, Any]:
    """Per group, the sums of its exact instants: an edge off the 16 s grid still counts
    each event once, in one bucket."""
    query = (
        "SELECT dimension, cluster_id, gpu_model_id, team, SUM(gpus), SUM(opened),"
        " SUM(closed), SUM(samples), ROUND(CAST(SUM(sample_sum) AS NUMERIC), 9)"
        " FROM utilization_rollups WHERE period_us = 1 GROUP BY 1, 2, 3, 4"
    )
    return {
        tuple(row[:4]): tuple(float(v) for v in row[4:]) for row in session.execute(sa.text(query))
    }


def test_the_rollup_compacts_old_instants_and_whole_16s_answers_stay(session: Session) -> None:
    period = timedelta(seconds=16)
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    start = epoch + (T0 - timedelta(days=40) - epoch) // period * period  # a 16 s multiple
    _history(session, start, days=40, seed=6, spread_s=20)  # several instants a 16 s period
    end = start + timedelta(days=41)
    cutoff = end - RETENTION
    edge = epoch + (cutoff - epoch) // period * period
    old = start + timedelta(days=2)
    # Every edge a multiple of 16 s: over compacted periods, kept ones and both.
    windows = [
        {"since": old, "until": old + timedelta(hours=13), "bucket_s": 64},
        {"since": old, "until": old + timedelta(days=3), "bucket_s": 3600},
        {"since": start, "until": end, "bucket_s": 86400},
        {"since": edge - timedelta(days=1), "until": edge + timedelta(days=1), "bucket_s": 4000},
        {"since": old + timedelta(hours=11, seconds=32), "until": old + timedelta(hours=13),
         "bucket_s": 16},
    ]  # fmt: skip
    before = _answers(session, windows)
    assert any(p.measured_util is not None for p in before[0].series[0].points)
    cutoff_us = (edge - epoch) // timedelta(microseconds=1)
    old_rows = _exact_rows(session, f"period_start_us < {cutoff_us}")
    new_rows = _exact_rows(session, f"period_start_us >= {cutoff_us}")
    # At most a row per group and old 16 s period will be left, beside those at its start.
    periods = session.execute(sa.text(
        "SELECT count(*) FROM (SELECT DISTINCT dimension, cluster_id, gpu_model_id, team,"
        " period_start_us / 16000000 FROM utilization_rollups WHERE period_us = 1"
        f" AND period_start_us < {cutoff_us} AND period_start_us % 16000000 <> 0) AS p"
    )).scalar_one()  # fmt: skip
    before_cutoff = f"period_start_us < {cutoff_us}"
    at_starts = _exact_rows(session, f"{before_cutoff} AND period_start_us % 16000000 = 0")

    sums = _exact_sums(session)

    moved = retention.compact_rollups(session=session, before=cutoff, batch=7)

    assert moved > 0
    left = _exact_rows(session, f"period_start_us < {cutoff_us}")
    assert left <= periods + at_starts < old_rows
    # In each old 16 s period, at most its start and the start + 1 µs are left.
    assert _exact_rows(session, f"{before_cutoff} AND period_start_us % 16000000 > 1") == 0
    assert _exact_rows(session, f"period_start_us >= {cutoff_us}") == new_rows
    assert _exact_sums(session) == sums
    assert _answers(session, windows) == before
    # Deltas folded afterwards (PostgreSQL) land as exact instants again; compacted anew.
    fold.fold_deltas(session=session)
    assert _answers(session, windows) == before
    retention.compact_rollups(session=session, before=cutoff)
    assert _answers(session, windows) == before
    assert retention.compact_rollups(session=session, before=cutoff) == 0
    # Samples pruned too: still the same answers.
    retention.prune_samples(session=session, now=end, older_than=RETENTION)
    assert _answers(session, windows) == before


def test_every_dimension_gets_its_turn_when_one_has_far_more_rows(session: Session) -> None:
    # GPU samples land in the cluster and GPU model dimensions, not the team one: a node
    # sampled at many instants gives those two far more rows than the team's few job
    # starts. Compacted with room for a few batches, the team's rows are compacted too
    # (they waited behind the cluster's, all of whose batches came first).
    period = timedelta(seconds=16)
    epoch = datetime(1970, 1, 1, tzinfo=UTC)
    start = epoch + (T0 - timedelta(days=40) - epoch) // period * period
    cluster_in = ClusterCreate(name="alpha", scheduler=SchedulerKind.sim)
    cluster_service.register_cluster(session=session, now=start, cluster_in=cluster_in)
    for seq, team in enumerate(("x", "y", "z"), start=1):
        now = start + timedelta(hours=seq, seconds=5)  # allocations open off the grid
        samples = [
            {"at": (now - i * period + offset).isoformat(), "metric": "gpu_util",
             "node": "n0", "value": 0.5}
            for i in range(1, 60) for offset in (3 * SECOND, 9 * SECOND)
        ]  # fmt: skip
        jobs = [
            job(f"j{seq}{k}", team=team, state="running", gpus_requested=1,
                start_time=(now - k * SECOND).isoformat(), submit_time=start.isoformat(),
                allocations=[{"node": "n0", "gpu_indices": [k]}])
            for k in range(1, 3)
        ]  # fmt: skip
        push = snapshot(seq, nodes=[node("n0")], jobs=jobs, samples=samples)
        telemetry_service.ingest(
            session=session,
            cluster_name="alpha",
            push=TelemetrySnapshot.model_validate(push),
            now=now,
        )
    fold.fold_deltas(session=session)  # PostgreSQL: the deltas into the roll-up
    movable = "period_start_us % 16000000 > 1 AND dimension = "
    before = {d: _exact_rows(session, f"{movable}'{d}'") for d in retention.DIMENSIONS}
    assert before["cluster"] > 300 and before["gpu_model"] > 300
    assert 0 < before["team"] < 20

    retention.compact_rollups(
        session=session, before=start + timedelta(days=1), batch=20, max_batches=6
    )

    after = {d: _exact_rows(session, f"{movable}'{d}'") for d in retention.DIMENSIONS}
    assert after["team"] == 0, (before, after)
    # Batches of about 20 rows (whole 16 s periods), taken in turns: the team's one, then
    # the cluster's and the GPU model's alternately; six were not enough for them.
    for big in ("cluster", "gpu_model"):
        assert 40 <= before[big] - after[big] <= 80 and after[big] > 0, (before, after)
    # A dimension done gives its turns to the others: unbounded, all of them are done.
    retention.compact_rollups(
        session=session, before=start + timedelta(days=1), batch=20, max_batches=None
    )
    assert all(_exact_rows(session, f"{movable}'{d}'") == 0 for d in retention.DIMENSIONS)


def test_the_api_answers_old_periods_from_the_rollup(
    session: Session, client: TestClient, auth: dict[str, dict[str, str]]
) -> None:
    start = T0 - timedelta(days=40)
    _history(session, start, days=34, seed=4)
    since = start + timedelta(days=1)
    params = {"since": since.isoformat(), "until": (since + timedelta(days=1)).isoformat()}
    before = client.get("/api/v1/utilization", params=params, headers=auth["viewer"])
    assert before.status_code == 200
    assert any(p["measured_util"] is not None for p in before.json()["series"][0]["points"])
    pruned = retention.prune_samples(
        session=session, now=start + timedelta(days=35), older_than=RETENTION
    )
    assert pruned > 0
    after = client.get("/api/v1/utilization", params=params, headers=auth["viewer"])
    assert after.json() == before.json()


def test_the_beat_schedule_folds_and_prunes() -> None:
    app = make_celery(Settings(environment="test"))
    tasks = {entry["task"]: entry["schedule"] for entry in app.conf.beat_schedule.values()}
    assert tasks["app.utilization.tasks.fold_rollup_deltas"] <= 60
    assert tasks["app.utilization.tasks.prune_samples"] <= 86400
    assert Settings(environment="test").sample_retention_days >= 31  # the diagnosis' window
    with pytest.raises(ValidationError, match="sample_retention_days"):
        Settings(environment="test", sample_retention_days=31)  # would delete what it reads


def _gpu_util_before(at: datetime) -> tuple[Any, ...]:
    return (col(TelemetrySample.at) < at, col(TelemetrySample.metric) == "gpu_util")


def test_prune_samples_command(make_postgres_database: Any) -> None:
    url = make_postgres_database("prune_cli")
    migrate.upgrade(url)
    engine = make_engine(url)
    now = datetime.now(UTC)
    try:
        with Session(engine) as session:
            gpu_model_service.ensure_default_catalogue(session=session)
            _history(session, now - timedelta(days=12), days=10, seed=5)
            old = _count(session, *_gpu_util_before(now - timedelta(days=7)))
            assert old > 0
            unfolded = session.execute(sa.text("SELECT count(*) FROM utilization_rollup_deltas"))
            assert unfolded.scalar_one() > 0
        env = {**os.environ, "SHAPER_DATABASE_URL": url}
        command = [sys.executable, "-m", "app", "db", "prune-samples", "--older-than-days", "7"]
        # Under the diagnosis' 32 days: refused, nothing deleted, unless forced.
        refused = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=120, check=False
        )
        assert refused.returncode != 0
        assert "--force" in refused.stderr and "Nothing deleted" in refused.stderr
        with Session(engine) as session:
            assert _count(session, *_gpu_util_before(now - timedelta(days=7))) == old
        done = subprocess.run(
            [*command, "--force"], env=env, capture_output=True, text=True, timeout=120,
            check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert "deleted" in done.stderr and "compacted" in done.stderr
        with Session(engine) as session:
            left = _count(session, *_gpu_util_before(now - timedelta(days=7)))
            assert left == 0
            assert _count(session, col(TelemetrySample.at) >= now - timedelta(days=7)) > 0
            unfolded = session.execute(sa.text("SELECT count(*) FROM utilization_rollup_deltas"))
            assert unfolded.scalar_one() == 0
    finally:
        engine.dispose()
