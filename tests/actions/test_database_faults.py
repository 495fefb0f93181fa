"""PostgreSQL restarted mid-saga and mid-ingest: a real server of the tests' own, restarted
(``pg_ctl restart -m fast``: every session is terminated) while a transaction is open.

* **Mid-saga**: the real saga (tests/actions/fault_model.py says what else is real) with the
  server restarted inside the transaction of each control task of a migration in turn, its
  writes already sent. The task fails with ``OperationalError`` and Celery runs it again
  (``autoretry_for``); the saga must end as if nothing happened, the job on its target,
  once.
* **Mid-ingest**: a connector's telemetry push (the real ``TelemetryRunner`` against the real
  API) with the server restarted inside the ingest transaction. The push must be refused as
  retryable (503, nothing written), and the runner's retry of the same sequence number must
  land it whole, once.

The shared server of the test session is not restarted: other tests use it.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from glob import glob
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, func, select
from sqlmodel import Session

from app.actions.models import TERMINAL_ACTION_STATES, ActionKind, ActionState
from app.api.deps import get_clock
from app.clusters.models import Cluster
from app.core import migrate
from app.core.clock import SystemClock
from app.core.config import Settings
from app.core.db import get_session, make_engine
from app.gpu_models import service as gpu_model_service
from app.jobs.models import Job
from app.main import create_app
from app.tokens import service as token_service
from app.tokens.models import ApiTokenCreate
from connectors.runner import RunnerConfig, TelemetryRunner
from tests.actions import fault_model
from tests.actions.fault_model import PROCESSES, TALLY, Fault, Scenario, World
from tests.support.clock import T0
from wire.telemetry import (
    AllocationReport,
    ClusterState,
    JobReport,
    JobState,
    NodeReport,
    SchedulerKind,
)


class PrivatePostgres:
    """A PostgreSQL server in a temporary directory, on a free port, owned by this test."""

    def __init__(self) -> None:
        binaries = sorted(glob("/usr/lib/postgresql/*/bin/pg_ctl"))
        assert binaries, "PostgreSQL's server binaries (pg_ctl, initdb) are not installed"
        self.bin = Path(binaries[-1]).parent
        # The server refuses to run as root: it runs as the postgres user, which must
        # reach its directory.
        self.root = Path(tempfile.mkdtemp(prefix="shaper-pg-", dir="/tmp"))
        self.root.chmod(0o755)
        self.data = self.root / "data"
        self.data.mkdir()
        if os.geteuid() == 0:
            owner = pwd.getpwnam("postgres")
            os.chown(self.data, owner.pw_uid, owner.pw_gid)
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self._run("initdb", "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")
        self.start()

    def _run(self, tool: str, *args: str) -> None:
        command = [str(self.bin / tool), *args]
        if os.geteuid() == 0:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, f"{tool} {args}: {done.stdout}{done.stderr}"

    def _ctl(self, *args: str) -> None:
        options = f"-p {self.port} -k {self.data} -c listen_addresses=127.0.0.1 -c fsync=off"
        log = str(self.data / "server.log")
        self._run("pg_ctl", "-D", str(self.data), "-w", "-o", options, "-l", log, *args)

    def start(self) -> None:
        self._ctl("start")

    def restart(self) -> None:
        """Down and up again: every open session is terminated, its transaction lost."""
        self._ctl("-m", "fast", "restart")
        TALLY["faults to real processes"] += 1

    def stop(self) -> None:
        self._ctl("-m", "immediate", "stop")
        shutil.rmtree(self.root, ignore_errors=True)

    def database(self, name: str) -> str:
        self._run("createdb", "-h", "127.0.0.1", "-p", str(self.port), "-U", "postgres", name)
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{name}"


@pytest.fixture(scope="module")
def server() -> Iterator[PrivatePostgres]:
    postgres = PrivatePostgres()
    try:
        yield postgres
    finally:
        postgres.stop()


@pytest.fixture(scope="module")
def engine(server: PrivatePostgres) -> Iterator[Engine]:
    url = server.database("shaper")
    migrate.upgrade(url)
    engine = make_engine(url)
    with Session(engine) as session:
        gpu_model_service.ensure_default_catalogue(session=session)
        session.commit()
    yield engine
    engine.dispose()


@pytest.fixture
def world_root(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    fault_model.patch_processes(monkeypatch)
    root = Path(tempfile.mkdtemp(prefix="shaper-pg-faults-"))
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize(
    "scenario",
    [
        Scenario("pg-migrate-sim", ActionKind.migrate),
        Scenario("pg-migrate-slurm", ActionKind.migrate, SchedulerKind.slurm),
    ],
    ids=lambda s: s.name,
)
def test_postgres_restarted_inside_each_control_transaction_of_a_saga(
    scenario: Scenario, server: PrivatePostgres, engine: Engine, world_root: Path
) -> None:
    baseline = World(engine, world_root, scenario, {}, now=T0)
    baseline.run()
    control = [i for i, label in enumerate(baseline.trace) if not label.startswith("forward:")]
    assert len(control) >= 6, baseline.trace
    problems = []
    for index in control:
        world = World(
            engine,
            world_root,
            scenario,
            {index: Fault("database_restarted")},
            now=T0,
            restart_database=server.restart,
        )
        world.run()
        TALLY["faults injected"] += world.injected
        TALLY["sagas run"] += 1
        where = f"restart in delivery {index} ({baseline.trace[index]})"
        if world.injected != 1:
            problems.append(f"{where}: the restart did not hit the transaction")
        state = world.state()
        if state is not ActionState.succeeded:
            problems.append(f"{where}: {state.value}: {world.action().error}")
            if state not in TERMINAL_ACTION_STATES:
                TALLY["sagas unresolved"] += 1
        live = PROCESSES.nodes_of(world.job_id)
        if world.job_id in PROCESSES.twice or len(live) > 1:
            TALLY["jobs run twice"] += 1
            problems.append(f"{where}: the job ran twice")
        if not live:
            TALLY["jobs lost"] += 1
        if live != ["b"] or world.db_nodes() != ["b"]:
            problems.append(f"{where}: runs on {live}, recorded on {world.db_nodes()}")
    assert not problems, "\n".join(problems)


class _Site:
    """A connector whose scheduler has two nodes and three jobs."""

    kind = SchedulerKind.slurm
    cluster = "pg-ingest"

    def read_state(self) -> ClusterState:
        now = datetime.now(UTC)
        return ClusterState(
            observed_at=now,
            nodes=[
                NodeReport(name=n, gpu_model="H100", gpu_count=8, cpu_cores=64, memory_mib=1 << 19)
                for n in ("n1", "n2")
            ],
            jobs=[
                JobReport(
                    external_id=f"job-{i}",
                    gpus_requested=2,
                    state=JobState.running,
                    submit_time=now,
                    start_time=now,
                    allocations=[AllocationReport(node="n1", gpu_indices=[2 * i, 2 * i + 1])],
                )
                for i in range(3)
            ],
        )


class _RestartOnce(Session):
    """The ingest's session: the first commit of the test finds the server restarting."""

    armed: list[PrivatePostgres] = []

    def commit(self) -> None:
        if self.armed:
            self.flush()  # the push's rows are on the server, uncommitted
            self.armed.pop().restart()
        super().commit()


def test_postgres_restarted_mid_ingest_refuses_retryably_and_the_retry_lands_once(
    server: PrivatePostgres, engine: Engine
) -> None:
    with Session(engine) as session:
        now = SystemClock().now()
        session.add(Cluster(name=_Site.cluster, scheduler=SchedulerKind.slurm, created_at=now))
        session.commit()
        token = token_service.create_token(
            session=session,
            now=now,
            token_in=ApiTokenCreate(name="pg-ingest", scopes=[f"connector:{_Site.cluster}"]),
        ).token

    def sessions() -> Iterator[Session]:
        with _RestartOnce(engine, expire_on_commit=False) as session:
            yield session

    def jobs_stored() -> int:
        with Session(engine) as session:
            return int(
                session.execute(
                    select(func.count())
                    .select_from(Job)
                    .join(Cluster, Cluster.id == Job.cluster_id)  # type: ignore[arg-type]
                    .where(Cluster.name == _Site.cluster)  # type: ignore[arg-type]
                ).scalar_one()
            )

    answers: list[Any] = []  # the test client's responses
    between_attempts: list[int] = []
    app = create_app(Settings(environment="test"))
    app.dependency_overrides[get_session] = sessions
    app.dependency_overrides[get_clock] = SystemClock
    with TestClient(app) as client:

        def handle(request: httpx.Request) -> httpx.Response:
            response = client.request(
                request.method, str(request.url), content=request.content, headers=request.headers
            )
            answers.append(response)
            return httpx.Response(response.status_code, content=response.content)

        runner = TelemetryRunner(
            _Site(),
            RunnerConfig(control_plane="http://testserver", cluster=_Site.cluster, token=token),
            transport=httpx.MockTransport(handle),
            sleep=lambda _s: between_attempts.append(jobs_stored()),
        )
        _RestartOnce.armed = [server]
        try:
            ack = runner.run_once()
        finally:
            _RestartOnce.armed = []
            runner.close()
    TALLY["faults injected"] += 1

    assert [a.status_code for a in answers] == [503, 200], [a.text for a in answers]
    refused = answers[0].json()["error"]
    assert refused["code"] == "unavailable" and refused["retryable"] is True
    assert answers[0].headers.get("Retry-After")
    assert between_attempts == [0]  # refused whole: nothing of it was written
    assert ack is not None and ack.seq == 0 and not ack.duplicate
    assert ack.jobs_written == 3 and jobs_stored() == 3
    assert runner.stats.push_failures == 1
