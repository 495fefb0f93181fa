"""Concurrent writers keep the utilization roll-up exact and never deadlock, on a real
PostgreSQL: a connector's ingest per cluster, sagas moving jobs within and between the
clusters (ORM writes of allocations, the job row locked first, as ``app.actions.saga``
does), node agents' samples, jobs changing team and nodes changing GPU model, each
writer in its own thread with its own connection, round after round at the same moment.
Afterwards the roll-up equals what the raw rows sum to.

Before the roll-up took deltas (migration ``0a1b2c3d4e5f``), the triggers upserted shared
roll-up rows in the writer's transaction, and these writers deadlocked (92 and 97 of the
270 writes in two runs, each a second's wait): a saga holding a job row waited for the
ingest's lock on the cluster row (the roll-up's foreign key) while the ingest waited for
the job row; and two statements of one transaction took roll-up rows in their own
orders. Writes that take no shared lock also let a node's GPU model change race a write
on the node; the model changes here check that such a write is filed under the new model.
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError
from sqlmodel import Session, col, select

from app.clusters import service as cluster_service
from app.clusters.models import ClusterCreate
from app.core import migrate
from app.core.db import make_engine
from app.gpu_models import service as gpu_model_service
from app.jobs.models import Allocation, Job
from app.nodes.models import Node
from app.telemetry import service as telemetry_service
from app.utilization import fold
from app.utilization.models import GroupBy
from app.utilization.raw import summarize_raw
from app.utilization.service import summarize
from tests.app.builders import job, node, snapshot
from tests.support.clock import T0
from wire.telemetry import SampleReport, SchedulerKind, TelemetrySnapshot

CLUSTERS = ("alpha", "beta")
MODELS = ("H100", "A100-80G")
TEAMS = ("x", "y", "z")
NODES = 4
JOBS = 8
ROUNDS = 30
ROUND_S = 10
# The writers' history begins an hour after the jobs' submission (the builders' T0).
START = T0 + timedelta(hours=1)


@pytest.fixture
def engine(make_postgres_database: Any) -> Iterator[Engine]:
    """A database of its own: the writers commit, from many connections."""
    url = make_postgres_database("rollup_writers")
    migrate.upgrade(url)
    engine = make_engine(url, pool_size=12)
    yield engine
    engine.dispose()


class Writers:
    """Runs each writer's rounds in lock step and records what the database refused."""

    def __init__(self, count: int) -> None:
        self.barrier = threading.Barrier(count, timeout=120)
        self.refused: Counter[str] = Counter()
        self.failures: list[BaseException] = []
        self.lock = threading.Lock()

    def run(self, engine: Engine, write: Callable[[Session, int], None]) -> None:
        try:
            for round_ in range(ROUNDS):
                self.barrier.wait()
                with Session(engine) as session:
                    try:
                        write(session, round_)
                    except DBAPIError as exc:
                        session.rollback()
                        with self.lock:
                            self.refused[type(exc.orig).__name__] += 1
        except BaseException as exc:
            with self.lock:
                self.failures.append(exc)
            self.barrier.abort()


def _at(round_: int, rng: random.Random) -> datetime:
    return START + timedelta(seconds=round_ * ROUND_S, microseconds=rng.randrange(ROUND_S * 10**6))


def _push(cluster: str, rng: random.Random) -> Callable[[Session, int], None]:
    """The cluster's connector: every job placed anew each round, now and then on
    another team or a node on another GPU model, with samples."""

    def write(session: Session, round_: int) -> None:
        now = START + timedelta(seconds=round_ * ROUND_S)
        models = [MODELS[(i + (round_ // 7 if i == 0 else 0)) % 2] for i in range(NODES)]
        jobs = []
        for j in range(JOBS):
            team = TEAMS[(j + round_ // 5) % len(TEAMS)] if j < 3 else TEAMS[j % len(TEAMS)]
            if rng.random() < 0.7:  # GPU j of a node: no two jobs hold the same GPU
                start = (now - timedelta(seconds=rng.randrange(1, 60))).isoformat()
                placed = [{"node": f"n{rng.randrange(NODES)}", "gpu_indices": [j]}]
                jobs.append(
                    job(f"j{j}", team=team, state="running", start_time=start,
                        gpus_requested=1, allocations=placed)
                )  # fmt: skip
            else:
                jobs.append(job(f"j{j}", team=team))
        samples = [
            {"at": _at(round_ - 1, rng).isoformat(), "metric": "gpu_util",
             "node": f"n{rng.randrange(NODES)}", "value": rng.random()}
            for _ in range(4)
        ]  # fmt: skip
        push = snapshot(
            round_ + 2,
            nodes=[node(f"n{i}", gpu_model=models[i]) for i in range(NODES)],
            jobs=jobs,
            samples=samples,
        )
        telemetry_service.ingest(
            session=session,
            cluster_name=cluster,
            push=TelemetrySnapshot.model_validate(push),
            now=now + timedelta(seconds=ROUND_S),
        )

    return write


def _saga(home: str, target: str, rng: random.Random) -> Callable[[Session, int], None]:
    """A saga's last step: the job's row locked, its GPUs released on ``home`` and held
    on ``target`` (another node of the same cluster, or another cluster's)."""

    def write(session: Session, round_: int) -> None:
        now = _at(round_, rng)
        moved = session.exec(
            select(Job)
            .join(Node, col(Node.cluster_id) == col(Job.cluster_id))
            .where(col(Node.cluster_id).in_(_cluster_ids(session, home)))
            .where(Job.external_id == f"j{rng.randrange(JOBS)}")
            .with_for_update(of=Job)
        ).first()
        assert moved is not None
        held = session.exec(
            select(Allocation).where(
                Allocation.job_id == moved.id, col(Allocation.released_at).is_(None)
            )
        ).all()
        for allocation in held:
            allocation.released_at = now
            session.add(allocation)
        session.flush()
        nodes = session.exec(
            select(Node.id).where(col(Node.cluster_id).in_(_cluster_ids(session, target)))
        ).all()
        session.add(
            Allocation(job_id=moved.id, node_id=rng.choice(nodes), gpu_indices=[],
                       gpu_count=rng.randint(1, 4), started_at=now)
        )  # fmt: skip
        moved.updated_at = now
        session.add(moved)
        session.commit()

    return write


def _agent(cluster: str, rng: random.Random) -> Callable[[Session, int], None]:
    """Node agents: each round one node of the cluster reports a few GPU samples."""

    def write(session: Session, round_: int) -> None:
        name = f"n{rng.randrange(NODES)}"
        telemetry_service.record_node_samples(
            session=session,
            cluster_name=cluster,
            node_name=name,
            samples=[
                SampleReport(at=_at(round_, rng), metric="gpu_util", value=rng.random(),
                             node=name, gpu_index=i)
                for i in range(3)
            ],
            now=START + timedelta(seconds=(round_ + 1) * ROUND_S),
        )  # fmt: skip

    return write


def _cluster_ids(session: Session, name: str) -> list[int]:
    return [cluster_service.get_cluster(session=session, name=name).id or 0]


def _setup(engine: Engine) -> None:
    with Session(engine) as session:
        gpu_model_service.ensure_default_catalogue(session=session)
        for name in CLUSTERS:
            cluster_service.register_cluster(
                session=session,
                now=T0,
                cluster_in=ClusterCreate(name=name, scheduler=SchedulerKind.sim),
            )
    rng = random.Random(0)
    for name in CLUSTERS:
        with Session(engine) as session:
            _push(name, rng)(session, -1)


def _all_time(
    session: Session, *, deltas: bool = True
) -> dict[tuple[str, int], tuple[int, int, int, int]]:
    """Per dimension and cluster, all time: GPUs held, allocations opened and closed,
    samples, as the roll-up (and its deltas not yet folded) say."""
    unfolded = (
        " UNION ALL SELECT dimension, cluster_id, gpus, opened, closed, samples"
        " FROM utilization_rollup_deltas"
    )
    rows = session.execute(
        sa.text(
            "SELECT dimension, cluster_id, SUM(gpus), SUM(opened), SUM(closed), SUM(samples)"
            " FROM (SELECT dimension, cluster_id, gpus, opened, closed, samples"
            f" FROM utilization_rollups WHERE period_us = 0{unfolded if deltas else ''})"
            " AS u GROUP BY dimension, cluster_id"
        )
    )
    return {(d, c): (int(g), int(o), int(x), int(s)) for d, c, g, o, x, s in rows}


def _raw_all_time(session: Session) -> dict[tuple[str, int], tuple[int, int, int, int]]:
    """The same, summed from the allocations and samples themselves."""
    allocations = {
        cluster: (int(held), int(opened), int(closed))
        for cluster, held, opened, closed in session.execute(
            sa.text(
                "SELECT n.cluster_id,"
                " SUM(CASE WHEN a.released_at IS NULL THEN a.gpu_count ELSE 0 END),"
                " COUNT(*), COUNT(a.released_at)"
                " FROM allocations a JOIN nodes n ON n.id = a.node_id GROUP BY n.cluster_id"
            )
        )
    }
    samples = dict(
        session.execute(
            sa.text(
                "SELECT n.cluster_id, COUNT(*) FROM telemetry_samples s"
                " JOIN nodes n ON n.id = s.node_id WHERE s.metric = 'gpu_util'"
                " GROUP BY n.cluster_id"
            )
        )
        .tuples()
        .all()
    )
    expected = {}
    for cluster in allocations.keys() | samples.keys():
        held, opened, closed = allocations.get(cluster, (0, 0, 0))
        sampled = int(samples.get(cluster, 0))
        expected[("cluster", cluster)] = (held, opened, closed, sampled)
        expected[("gpu_model", cluster)] = (held, opened, closed, sampled)
        expected[("team", cluster)] = (held, opened, closed, 0)
    return expected


def _assert_exact(engine: Engine) -> int:
    """The roll-up's all-time sums and its summaries equal the raw rows'; returns the
    points compared."""
    compared = 0
    end = START + timedelta(seconds=(ROUNDS + 2) * ROUND_S)
    with Session(engine) as session:
        assert _all_time(session) == _raw_all_time(session)
        windows = [
            (START - timedelta(minutes=5), end, 60),
            (START + timedelta(seconds=37.5), end - timedelta(seconds=3.25), 61),
            (START - timedelta(days=1), end + timedelta(days=1), 3600),
        ]
        for since, until, bucket_s in windows:
            for group_by in GroupBy:
                for cluster in (None, *CLUSTERS):
                    arguments: dict[str, Any] = {
                        "session": session, "since": since, "until": until,
                        "bucket_s": bucket_s, "group_by": group_by, "cluster": cluster,
                    }  # fmt: skip
                    expected = summarize_raw(**arguments)
                    assert summarize(**arguments) == expected, (since, group_by, cluster)
                    compared += sum(len(s.points) for s in expected.series)
    return compared


def _writes(*, across: bool = True) -> list[Callable[[Session, int], None]]:
    """Per cluster its connector and two node agents; sagas within alpha and (``across``)
    both ways between the clusters."""
    rng = random.Random(1)
    moves = [("alpha", "alpha"), *([("alpha", "beta"), ("beta", "alpha")] if across else [])]
    return [
        *(_push(name, random.Random(rng.random())) for name in CLUSTERS),
        *(_saga(home, target, random.Random(rng.random())) for home, target in moves),
        *(_agent(name, random.Random(rng.random())) for name in CLUSTERS for _ in range(2)),
    ]


def _fold(session: Session, round_: int) -> None:
    """The periodic fold, among the writers: it must neither wait for them nor file a
    node's deltas under a model being changed."""
    fold.fold_deltas(session=session)


def test_concurrent_writers_neither_deadlock_nor_drift(engine: Engine) -> None:
    _setup(engine)
    writes = [*_writes(), _fold]
    writers = Writers(len(writes))
    threads = [
        threading.Thread(target=writers.run, args=(engine, write), name=f"writer-{i}")
        for i, write in enumerate(writes)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=600)
    assert not writers.failures, writers.failures
    assert psycopg.errors.DeadlockDetected.__name__ not in writers.refused
    assert not writers.refused, writers.refused
    with Session(engine) as session:  # the writers did write, in every cluster and group
        totals = _all_time(session)
        assert all(totals[("team", c)][1] > ROUNDS for c in _ids(session))
        assert all(totals[("cluster", c)][3] > ROUNDS for c in _ids(session))
    assert _assert_exact(engine) > 0
    with Session(engine) as session:
        assert fold.fold_deltas(session=session) > 0
        left = session.execute(sa.text("SELECT count(*) FROM utilization_rollup_deltas"))
        assert left.scalar_one() == 0
    assert _assert_exact(engine) > 0


def _ids(session: Session) -> list[int]:
    return [i for name in CLUSTERS for i in _cluster_ids(session, name)]


def test_downgrade_folds_the_deltas_into_the_rollup(engine: Engine) -> None:
    """The revision before the deltas reads the periods only: its downgrade folds them."""
    _setup(engine)
    for round_ in range(ROUNDS // 2):
        for write in _writes():
            with Session(engine) as session:
                write(session, round_)
    url = engine.url.render_as_string(hide_password=False)
    with Session(engine) as session:
        expected = _raw_all_time(session)
        assert session.execute(sa.text("SELECT count(*) FROM utilization_rollup_deltas")).scalar()
    engine.dispose()
    migrate.downgrade(url, "f0a1b2c3d4e5")
    with Session(engine) as session:
        assert _all_time(session, deltas=False) == expected
    engine.dispose()
    migrate.upgrade(url)
    assert _assert_exact(engine) > 0


def test_a_deleted_clusters_deltas_are_neither_read_nor_kept(engine: Engine) -> None:
    """The deltas have no foreign key (see ``app.utilization.models``): the reads leave out
    a deleted cluster's, and the fold drops them, as the cascade drops its periods. (No
    move between the clusters: a deleted cluster's jobs take their allocations on other
    clusters' nodes with them, which no roll-up follows.)"""
    _setup(engine)
    for round_ in range(3):
        for write in _writes(across=False):
            with Session(engine) as session:
                write(session, round_)
    with Session(engine) as session:
        beta = _cluster_ids(session, "beta")[0]
        cluster_service.delete_cluster(session=session, name="beta", now=START)
    orphans = sa.text("SELECT count(*) FROM utilization_rollup_deltas WHERE cluster_id = :c")
    with Session(engine) as session:
        assert session.execute(orphans, {"c": beta}).scalar_one() > 0
        arguments: dict[str, Any] = {
            "session": session, "since": START - timedelta(minutes=5),
            "until": START + timedelta(minutes=5), "bucket_s": 60, "group_by": GroupBy.team,
        }  # fmt: skip
        assert summarize(**arguments) == summarize_raw(**arguments)
        fold.fold_deltas(session=session)
        assert session.execute(orphans, {"c": beta}).scalar_one() == 0
