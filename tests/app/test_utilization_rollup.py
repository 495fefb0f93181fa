"""The summary read from the roll-up equals the one computed from the raw allocations and
samples, over random histories (written by the ingest, by an ORM writer as the action
sagas do, with jobs changing team and nodes changing GPU model, samples arriving late)
and random windows and bucket sizes, on both backends."""

from __future__ import annotations

import random
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa
from sqlmodel import Session, select

from app.clusters import service as cluster_service
from app.clusters.models import ClusterCreate
from app.core import migrate
from app.core.db import make_engine
from app.gpu_models import service as gpu_model_service
from app.jobs.models import Allocation, Job
from app.nodes.models import Node
from app.telemetry import service as telemetry_service
from app.utilization import fold, rollup
from app.utilization.models import GroupBy
from app.utilization.raw import summarize_raw
from app.utilization.service import summarize, to_us
from tests.app.builders import job, node, snapshot
from tests.support.clock import T0
from wire.telemetry import SchedulerKind, TelemetrySnapshot

CLUSTERS = ("alpha", "beta")
MODELS = ("H100", "A100-80G")
TEAMS = ("x", "y", "z")
NODES = 3
JOBS = 6


def _instant(rng: random.Random, start: datetime, span_s: float) -> datetime:
    """A time in [start, start + span_s), to the µs."""
    return start + timedelta(microseconds=rng.randrange(int(span_s * 1_000_000)))


def _push(
    session: Session, rng: random.Random, cluster: str, seq: int, now: datetime, models: list[str]
) -> None:
    nodes = [node(f"n{i}", gpu_model=models[i]) for i in range(NODES)]
    free = {f"n{i}": list(range(8)) for i in range(NODES)}
    jobs = []
    for j in range(JOBS):
        team = rng.choice(TEAMS) if rng.random() < 0.15 else TEAMS[j % len(TEAMS)]
        name = f"n{rng.randrange(NODES)}"
        gpus = rng.randint(1, 4)
        if rng.random() < 0.6 and len(free[name]) >= gpus:
            indices = [free[name].pop() for _ in range(gpus)]
            jobs.append(
                job(
                    f"j{j}",
                    team=team,
                    state="running",
                    start_time=T0.isoformat(),
                    gpus_requested=gpus,
                    allocations=[{"node": name, "gpu_indices": indices}],
                )
            )
        else:
            jobs.append(job(f"j{j}", team=team))
    samples = [
        {
            # Late and out of order: anywhere in the last two hours.
            "at": (now - timedelta(microseconds=rng.randrange(7200 * 1_000_000))).isoformat(),
            "metric": "gpu_util",
            "node": f"n{rng.randrange(NODES)}",
            "value": rng.random(),
            **({"gpu_index": rng.randrange(8)} if rng.random() < 0.5 else {}),
        }
        for _ in range(rng.randrange(6))
    ]
    push = snapshot(seq, nodes=nodes, jobs=jobs, samples=samples)
    telemetry_service.ingest(
        session=session,
        cluster_name=cluster,
        push=TelemetrySnapshot.model_validate(push),
        now=now,
    )


def _history(session: Session, rng: random.Random, *, folding: bool = True) -> datetime:
    """Random pushes to two clusters over about a day, plus allocations written through
    the ORM (as ``app.actions.saga`` does), now and then folding the roll-up's deltas
    (``folding``: the schema has them); returns the last write's time."""
    gpu_model_service.ensure_default_catalogue(session=session)
    for name in CLUSTERS:
        cluster_service.register_cluster(
            session=session,
            now=T0,
            cluster_in=ClusterCreate(name=name, scheduler=SchedulerKind.sim),
        )
    models = {name: [rng.choice(MODELS) for _ in range(NODES)] for name in CLUSTERS}
    now = T0
    placed: list[Allocation] = []
    for seq in range(1, 31):
        now += timedelta(microseconds=rng.randrange(1, 3600 * 1_000_000))
        for name in CLUSTERS:
            if rng.random() < 0.1:  # a node's GPU model changes: its history moves with it
                models[name][rng.randrange(NODES)] = rng.choice(MODELS)
            if rng.random() < 0.8:
                _push(session, rng, name, seq, now, models[name])
        if seq % 7 == 0:  # a saga's placement: opened now, released at a later push
            target = session.exec(select(Job).where(Job.external_id == "j0")).first()
            host = session.exec(select(Node)).first()
            assert target is not None and host is not None
            placed.append(
                Allocation(
                    job_id=target.id, node_id=host.id, gpu_indices=[], gpu_count=2, started_at=now
                )
            )
            session.add(placed[-1])
            session.commit()
        if seq % 7 == 3 and placed:
            placed[-1].released_at = now
            session.add(placed[-1])
            session.commit()
        if folding and seq % 4 == 0:  # PostgreSQL: answers from periods and deltas both
            fold.fold_deltas(session=session)
    return now


def _window(rng: random.Random, end: datetime) -> tuple[datetime, datetime, int]:
    bucket_s = rng.choice([60, 61, 300, 900, 3600, 3601, 7200, 21600, 86400, 7 * 86400])
    buckets = rng.randint(1, min(60, 2 * 86400 // bucket_s + 2))
    if rng.random() < 0.3:  # on whole seconds, as a dashboard might ask
        since = T0 + timedelta(seconds=rng.randrange(-3600, int((end - T0).total_seconds())))
    else:
        since = _instant(rng, T0 - timedelta(hours=1), (end - T0).total_seconds() + 7200)
    tail = rng.choice([0, rng.randrange(1, bucket_s * 1_000_000)])
    until = since + timedelta(seconds=bucket_s * buckets) - timedelta(microseconds=tail)
    return since, until, bucket_s


def _compare(session: Session, rng: random.Random, end: datetime, windows: int) -> int:
    """Asserts the two answers equal over random windows; returns the points compared."""
    compared = 0
    for _ in range(windows):
        since, until, bucket_s = _window(rng, end)
        for group_by in GroupBy:
            for cluster in (None, "alpha", "nowhere"):
                arguments: dict[str, Any] = {
                    "session": session,
                    "since": since,
                    "until": until,
                    "bucket_s": bucket_s,
                    "group_by": group_by,
                    "cluster": cluster,
                }
                expected = summarize_raw(**arguments)
                assert summarize(**arguments) == expected, (since, until, bucket_s, group_by)
                compared += sum(len(s.points) for s in expected.series)
    return compared


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_rollup_equals_the_raw_computation(session: Session, seed: int) -> None:
    rng = random.Random(seed)
    end = _history(session, rng)
    assert _compare(session, rng, end, windows=12) > 0


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
def test_migration_backfills_the_history_already_stored(
    backend: str, make_postgres_database: Any, tmp_path: Path
) -> None:
    url = (
        make_postgres_database("rollup_backfill")
        if backend == "postgres"
        else f"sqlite:///{tmp_path / 'backfill.db'}"
    )
    # History written by today's ingest (it writes today's columns and tables), then the
    # schema taken back to the revision before the roll-up, history kept, and up again:
    # the roll-up's migration meets a database that holds history and no roll-up.
    migrate.upgrade(url)
    engine = make_engine(url)
    try:
        with Session(engine, expire_on_commit=False) as session:
            rng = random.Random(7)
            end = _history(session, rng, folding=False)
        engine.dispose()
        migrate.downgrade(url, "de9f0a1b2c89")  # the revision before the roll-up
        with Session(engine) as session:
            tables = sa.inspect(session.connection()).get_table_names()
            assert "utilization_rollups" not in tables
        migrate.upgrade(url)
        with Session(engine) as session:
            stored = session.execute(sa.text("SELECT count(*) FROM utilization_rollups"))
            assert stored.scalar_one() > 0
            assert _compare(session, rng, end, windows=4) > 0
            # And the triggers keep it from there.
            _push(session, rng, "alpha", 100, end + timedelta(minutes=5), list(MODELS) + ["H100"])
            assert _compare(session, rng, end + timedelta(minutes=5), windows=4) > 0
    finally:
        engine.dispose()


def test_whole_history_window_has_data(session: Session) -> None:
    """The comparison above is not between two empty answers: over the whole history
    both see allocations and samples in every group."""
    end = _history(session, random.Random(4))
    arguments: dict[str, Any] = {
        "session": session,
        "since": T0,
        "until": end + timedelta(hours=1),
        "bucket_s": 3600,
        "group_by": GroupBy.team,
    }
    teams = summarize(**arguments)
    assert {s.key for s in teams.series} == set(TEAMS)
    assert teams == summarize_raw(**arguments)
    clusters = summarize(**{**arguments, "group_by": GroupBy.cluster})
    assert [s.key for s in clusters.series] == list(CLUSTERS)
    assert all(any(p.measured_util is not None for p in s.points) for s in clusters.series)
    assert all(any(p.allocated_gpus > 0 for p in s.points) for s in clusters.series)


def test_period_ranges_cover_an_interval_once() -> None:
    rng = random.Random(5)
    for _ in range(500):
        start = rng.randrange(10**15, 10**15 + 10**12)
        end = start + rng.choice([1, 10**6, rng.randrange(1, 10**12)])
        covered = 0
        previous_end = start
        for period, first, stop in rollup.period_ranges(start, end):
            if period == rollup.EXACT_US:
                assert first == previous_end
                covered += stop - first
            else:
                assert first % period == 0 and stop % period == 0 and first == previous_end
                covered += stop - first
            previous_end = stop
        assert previous_end == end and covered == end - start


def test_cluster_deletion_takes_its_rollup(session: Session) -> None:
    _history(session, random.Random(6))
    alpha = cluster_service.get_cluster(session=session, name="alpha")
    cluster_service.delete_cluster(session=session, name="alpha", now=T0)
    rows = session.execute(
        sa.text("SELECT count(*) FROM utilization_rollups WHERE cluster_id = :c"), {"c": alpha.id}
    ).scalar_one()
    assert rows == 0
    assert to_us(T0) % rollup.LEVELS_US[0] == 0  # T0 sits on a period boundary
