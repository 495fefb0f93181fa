"""The embedded default under load, on real SQLite files, a real server and threads.

Reads never take SQLite's write lock; the shaping cycle holds no transaction while it
solves (on both backends); a write waits for the lock up to ``busy_timeout``, and one that
waits longer is answered 503 retryable with ``Retry-After``, never 500.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, text
from sqlmodel import Session, select

from app.api.deps import get_clock
from app.clusters import service as cluster_service
from app.clusters.models import ClusterCreate, SchedulerKind, ShapingMode
from app.core import migrate
from app.core.clock import FrozenClock
from app.core.db import make_engine
from app.gpu_models import service as gpu_model_service
from app.plans.models import Plan
from app.shaping import cycle as cycle_module
from app.shaping.cycle import CycleResult, run_cycle
from solver import Instance
from solver import plan as sp
from tests.app.builders import job, node, running, snapshot
from tests.support.clock import T0
from tests.support.live_server import app_on, serve, tokens_for

BUSY_TIMEOUT_MS = 500
HOLD_MAX_S = 60.0
READS = 16
SCOPES = ("viewer", "admin", "connector:alpha")


@dataclass
class Site:
    engine: Engine
    base: str
    tokens: dict[str, str]

    def headers(self, scope: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[scope]}"}


def _engine(url: str) -> Iterator[Engine]:
    migrate.upgrade(url)
    engine = make_engine(url, sqlite_busy_timeout_ms=BUSY_TIMEOUT_MS)
    yield engine
    engine.dispose()


@pytest.fixture
def sqlite_file(tmp_path: Any) -> Iterator[Engine]:
    yield from _engine(f"sqlite:///{tmp_path / 'shaper.db'}")


@pytest.fixture(params=["sqlite", "postgres"])
def any_backend(request: pytest.FixtureRequest, tmp_path: Any) -> Iterator[Engine]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'shaper.db'}"
    else:
        url = request.getfixturevalue("make_postgres_database")("concurrency")
    yield from _engine(url)


@pytest.fixture
def site(sqlite_file: Engine) -> Iterator[Site]:
    yield from _serve(sqlite_file)


@pytest.fixture
def any_site(any_backend: Engine) -> Iterator[Site]:
    yield from _serve(any_backend)


def _serve(engine: Engine) -> Iterator[Site]:
    with Session(engine) as session:
        gpu_model_service.ensure_default_catalogue(session=session)
        session.commit()
        tokens = tokens_for(session, T0, SCOPES)
        cluster_service.register_cluster(
            session=session,
            now=T0,
            cluster_in=ClusterCreate(
                name="alpha", scheduler=SchedulerKind.slurm, mode=ShapingMode.advise
            ),
        )
    app = app_on(engine)
    app.dependency_overrides[get_clock] = lambda: FrozenClock(T0)
    with serve(app) as base:
        yield Site(engine=engine, base=base, tokens=tokens)


@dataclass
class SlowSolve:
    """A solve that lasts until the test has done what it checks during it."""

    solving: threading.Event
    release: threading.Event


@pytest.fixture
def slow_solve(monkeypatch: pytest.MonkeyPatch) -> Iterator[SlowSolve]:
    """Every policy the cycle asks for plans for real, then waits until the test sets
    ``release`` (at most ``HOLD_MAX_S``); ``solving`` is set when a solve starts. Held by
    the test, not for a fixed time, so that a loaded CI machine cannot end the solve before
    the requests that must overlap it were answered. (CP-SAT proves these instances
    optimal in well under a second, and the production-sized ones that take it 20 s would
    make a slow test.)"""
    slow = SlowSolve(threading.Event(), threading.Event())
    real = cycle_module.get_policy

    class Slow:
        def __init__(self, name: str) -> None:
            self.policy = real(name)

        def plan(self, instance: Instance) -> sp.Plan:
            slow.solving.set()
            plan = self.policy.plan(instance)
            slow.release.wait(HOLD_MAX_S)
            return plan

    monkeypatch.setattr(cycle_module, "get_policy", Slow)
    yield slow
    slow.release.set()  # a failed test must not leave a cycle waiting


def _busy_cluster(site: Site, nodes: int = 16) -> None:
    """``nodes`` 8-GPU nodes, each with GPUs held by checkpointable jobs of mixed sizes,
    and a queue of mixed jobs that does not fit."""
    node_rows, jobs = [], []
    for n in range(nodes):
        name = f"n{n}"
        node_rows.append(node(name))
        held = [(0, 1, 2), (4, 5)] if n % 2 else [(0,), (2, 3, 4)]
        for k, indices in enumerate(held):
            jobs.append(
                running(f"r{n}-{k}", name, list(indices), checkpointable=True, priority=n % 7)
            )
    for q in range(nodes * 3):
        jobs.append(job(f"q{q}", gpus_requested=(3, 5, 6, 7, 1)[q % 5], priority=(q * 37) % 100))
    response = httpx.post(
        f"{site.base}/api/v1/clusters/alpha/telemetry",
        headers=site.headers("connector:alpha"),
        json=snapshot(1, nodes=node_rows, jobs=jobs),
        timeout=60,
    )
    assert response.status_code == 200, response.text


def _cycle_in_thread(engine: Engine) -> tuple[threading.Thread, dict[str, Any]]:
    outcome: dict[str, Any] = {}

    def cycle() -> None:
        started = time.monotonic()
        with Session(engine) as session:
            outcome["result"] = run_cycle(
                session=session, cluster_name="alpha", now=T0, policy="shaper"
            )
        outcome["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=cycle)
    thread.start()
    return thread, outcome


def _solving(thread: threading.Thread, slow: SlowSolve) -> None:
    assert slow.solving.wait(30), "the cycle never reached its solve"
    assert thread.is_alive()


def _in_parallel(calls: list[Callable[[], httpx.Response]]) -> list[httpx.Response]:
    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        return list(pool.map(lambda call: call(), calls))


def test_reads_and_writes_go_on_while_the_cycle_solves(site: Site, slow_solve: SlowSolve) -> None:
    _busy_cluster(site)
    viewer = site.headers("viewer")
    reads = [
        "/api/v1/utilization",
        "/api/v1/nodes?cluster=alpha",
        "/api/v1/jobs?cluster=alpha",
        "/api/v1/plans",
        "/api/v1/clusters/alpha",
        "/api/v1/actions",
        "/api/v1/policies",
        "/api/v1/gpu-models",
    ]
    thread, outcome = _cycle_in_thread(site.engine)
    _solving(thread, slow_solve)
    with httpx.Client(base_url=site.base, timeout=30) as client:
        answers = _in_parallel(
            [
                (lambda path=reads[i % len(reads)]: client.get(path, headers=viewer))
                for i in range(READS - 1)
            ]
            + [lambda: client.get("/readyz")]
        )
        # A write needs the lock the cycle would hold all solve long if it held it: with
        # a busy_timeout of 0.5 s it would be answered 503 here.
        written = client.post(
            "/api/v1/tokens",
            headers=site.headers("admin"),
            json={"name": "during-the-solve", "scopes": ["viewer"]},
        )
    assert thread.is_alive(), "the requests did not overlap the solve"
    slow_solve.release.set()
    thread.join(timeout=60)
    assert [a.status_code for a in answers] == [200] * READS, [a.text for a in answers]
    assert written.status_code in (200, 201), written.text
    result: CycleResult = outcome["result"]
    with Session(site.engine) as session:
        plan = session.exec(select(Plan).where(Plan.id == result.plan_id)).one()
    assert plan.summary["jobs"] > 0 and result.actions > 0


def test_no_transaction_is_open_while_the_cycle_solves(
    any_site: Site, slow_solve: SlowSolve
) -> None:
    """On both backends: mid-solve, another connection takes the write lock at once
    (SQLite) and no connection of the database is idle in a transaction (PostgreSQL)."""
    _busy_cluster(any_site)
    engine = any_site.engine
    thread, outcome = _cycle_in_thread(engine)
    _solving(thread, slow_solve)
    if engine.dialect.name == "sqlite":
        raw = engine.raw_connection()  # BEGIN as written, no wait for the lock
        try:
            raw.execute("PRAGMA busy_timeout=0")
            raw.execute("BEGIN IMMEDIATE")  # SQLITE_BUSY if any transaction writes
            raw.execute("ROLLBACK")
            raw.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        finally:
            raw.close()
    else:
        with engine.connect() as connection:
            idle = connection.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = "
                    "current_database() AND state LIKE 'idle in transaction%'"
                )
            ).scalar_one()
        assert idle == 0
    assert thread.is_alive(), "the check did not overlap the solve"
    slow_solve.release.set()
    thread.join(timeout=60)
    assert outcome["result"].plan_id > 0


def _hold_write_lock(
    engine: Engine, taken: threading.Event, release: threading.Event, at_most: float
) -> threading.Thread:
    """Another writer: a write transaction that stays open until ``release`` is set.

    Held until the test says so (not for a fixed time) so that a slow CI machine cannot
    let the lock go before the request under test has asked for it.
    """

    def hold() -> None:
        with engine.connect() as connection, connection.begin():  # BEGIN IMMEDIATE
            connection.exec_driver_sql("UPDATE alembic_version SET version_num = version_num")
            taken.set()
            release.wait(at_most)

    thread = threading.Thread(target=hold)
    thread.start()
    assert taken.wait(5)
    return thread


def test_a_write_waits_for_the_lock_and_succeeds(site: Site) -> None:
    taken, release = threading.Event(), threading.Event()
    holder = _hold_write_lock(site.engine, taken, release, at_most=0.3)
    started = time.monotonic()
    # A generous read timeout (httpx's default is 5 s): on two cores shared with the
    # Slurm and Kubernetes tests a clean-clone run once took longer than that to answer.
    answer = httpx.post(
        f"{site.base}/api/v1/tokens",
        headers=site.headers("admin"),
        json={"name": "patient", "scopes": ["viewer"]},
        timeout=30,
    )
    waited = time.monotonic() - started
    holder.join()
    assert answer.status_code in (200, 201), answer.text
    assert waited >= 0.2  # it waited for the other writer rather than failing


def test_a_write_that_outwaits_busy_timeout_is_503_retryable(site: Site) -> None:
    taken, release = threading.Event(), threading.Event()
    holder = _hold_write_lock(site.engine, taken, release, at_most=60.0)
    try:
        with httpx.Client(base_url=site.base, timeout=30) as client:
            # Reads go on meanwhile: they never wait for the writer.
            read = client.get("/api/v1/clusters/alpha", headers=site.headers("viewer"))
            answer = client.post(
                "/api/v1/tokens",
                headers=site.headers("admin"),
                json={"name": "impatient", "scopes": ["viewer"]},
            )
    finally:
        release.set()
        holder.join()
    assert read.status_code == 200, read.text
    assert answer.status_code == 503, answer.text
    assert answer.headers["Retry-After"].isdigit()
    error = answer.json()["error"]
    assert error["retryable"] is True and error["code"] == "unavailable"
    assert error["details"]["reason"].startswith("SQLITE_BUSY")
