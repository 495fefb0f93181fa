"""The action pipeline for real: PostgreSQL, Redis, a control-plane Celery worker and node
agents as separate processes, workloads under real CRIU.

One pipeline per test session (workers take seconds to start on two cores); every test
uses its own workload ids, and every process is stopped by its process group at the end.
The broker is a Redis server of the pipeline's own (no persistence, like production's
default), so a test can restart it without touching anyone else's.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session

from agent import procs
from agent.workload import RunningWorkload, WorkloadStore, kill_workload
from app.actions.router import get_dispatcher
from app.core import migrate
from app.core.clock import FrozenClock
from app.core.config import Settings
from app.core.db import get_session, make_engine
from app.gpu_models import service as gpu_model_service
from app.main import create_app
from app.tokens import service as token_service
from app.tokens.models import ApiTokenCreate
from connectors.sim import SimCluster, SimExecutors
from tests.actions.by_hand import service_site, shrink_off_a
from tests.support.pipeline import CLUSTER, Pipeline, RedisServer, Worker
from tests.support.processes import processes_mentioning


@pytest.fixture
def service_cluster(clock: FrozenClock, tmp_path: Path) -> tuple[SimCluster, SimExecutors]:
    """tests.actions.by_hand's simulated service cluster, for sagas driven by hand."""
    return service_site(clock, tmp_path)


@pytest.fixture
def service_shrink(session: Session, clock: FrozenClock) -> int:
    """An approved shrink of that cluster's service off node a (4 → 3 replicas)."""
    return shrink_off_a(session, clock)


def _token(session: Session, scope: str) -> str:
    from app.core.clock import SystemClock

    created = token_service.create_token(
        session=session,
        now=SystemClock().now(),
        token_in=ApiTokenCreate(name=scope.replace(":", "-").replace("/", "-"), scopes=[scope]),
    )
    return created.token


@pytest.fixture(scope="session")
def pipeline(
    make_postgres_database: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Pipeline]:
    root = tmp_path_factory.mktemp("pipeline")
    broker = RedisServer(root)
    broker.start()
    url = make_postgres_database("actions")
    migrate.upgrade(url)
    engine = make_engine(url)
    with Session(engine) as session:
        gpu_model_service.ensure_default_catalogue(session=session)
        session.commit()
    line = Pipeline(
        root=root,
        database_url=url,
        engine=engine,
        broker=broker.url,
        env={
            "SHAPER_DATABASE_URL": url,
            "SHAPER_BROKER_URL": broker.url,
            "PYTHONUNBUFFERED": "1",
            # No shaping cycle during the tests: it would supersede their proposals.
            "SHAPER_CYCLE_PERIOD_S": "86400",
        },
    )
    line.redis = broker
    with Session(engine) as session:
        for scope in (f"agent:{CLUSTER}/{node}" for node in "abc"):
            line.tokens[scope] = _token(session, scope)
        line.tokens[f"connector:{CLUSTER}"] = _token(session, f"connector:{CLUSTER}")
    try:
        yield line
    finally:
        line.stop_all()
        broker.stop()
        for pid in processes_mentioning(f"{root}/"):
            procs.kill_group(pid)
            procs.wait_gone(pid, timeout=10)
        engine.dispose()


@pytest.fixture
def running_pipeline(pipeline: Pipeline) -> Pipeline:
    """The control worker and the agents of nodes a and b, started if they are not."""
    pipeline.ensure("control", pipeline.start_control)
    pipeline.ensure("agent-a", lambda: pipeline.start_agent("a"))
    pipeline.ensure("agent-b", lambda: pipeline.start_agent("b"))
    return pipeline


@dataclass
class Api:
    client: TestClient
    headers: dict[str, dict[str, str]]

    def post(self, path: str, role: str, **kwargs: Any) -> Any:
        return self.client.post(f"/api/v1{path}", headers=self.headers[role], **kwargs)

    def get(self, path: str, role: str = "viewer", **kwargs: Any) -> Any:
        return self.client.get(f"/api/v1{path}", headers=self.headers[role], **kwargs)


@pytest.fixture(scope="session")
def api(pipeline: Pipeline) -> Iterator[Api]:
    """The HTTP API on the pipeline's database; approvals dispatch to its workers."""
    app = create_app(Settings(environment="test"))

    def session_dependency() -> Iterator[Session]:
        with Session(pipeline.engine, expire_on_commit=False) as session:
            yield session

    app.dependency_overrides[get_session] = session_dependency
    app.dependency_overrides[get_dispatcher] = lambda: pipeline.advance
    scopes = {
        "viewer": ["viewer"],
        "operator": ["operator"],
        "admin": ["admin"],
        "connector": [f"connector:{CLUSTER}"],
    }
    from app.core.clock import SystemClock

    with Session(pipeline.engine) as session:
        tokens = {
            role: token_service.create_token(
                session=session,
                now=SystemClock().now(),
                token_in=ApiTokenCreate(name=f"test-{role}", scopes=roles),
            ).token
            for role, roles in scopes.items()
        }
    headers = {role: {"Authorization": f"Bearer {token}"} for role, token in tokens.items()}
    with TestClient(app) as client:
        yield Api(client, headers)


class Tracked:
    """Workloads a test starts on the nodes, killed at the end wherever they run."""

    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline
        self.ids: list[str] = []

    def cleanup(self) -> None:
        for node_dir in (self.pipeline.root / "nodes").glob("*"):
            store = WorkloadStore(node_dir)
            for workload_id in self.ids:
                try:
                    workload: RunningWorkload = store.load(workload_id)
                except KeyError:
                    continue
                kill_workload(workload, timeout=10)
        for workload_id in self.ids:
            for pid in processes_mentioning(f"{workload_id}.count"):
                procs.kill_group(pid)
                procs.wait_gone(pid, timeout=10)


@pytest.fixture
def tracked(pipeline: Pipeline) -> Iterator[Tracked]:
    tracked = Tracked(pipeline)
    yield tracked
    tracked.cleanup()


def start_test_worker(
    pipeline: Pipeline, name: str, module: str, queues: list[str], env: dict[str, str]
) -> Worker:
    """A Celery worker of one of the tests' executor modules (tests/actions/*.py)."""
    return pipeline._spawn(
        name,
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            module,
            "worker",
            "-Q",
            ",".join(queues),
            "-n",
            f"{queues[0]}@%h",
            "--pool",
            "solo",
            "--without-heartbeat",
            "--without-gossip",
            "--without-mingle",
            "-l",
            "INFO",
        ],
        {**env, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )


def start_sim_connector(pipeline: Pipeline) -> Worker:
    return start_test_worker(
        pipeline,
        "connector",
        "tests.actions.sim_connector",
        [f"connector.{CLUSTER}"],
        {
            "SHAPER_SIM_CONNECTOR_LOG": str(pipeline.root / "connector-steps.jsonl"),
            "SHAPER_CONNECTOR_TOKEN": pipeline.tokens[f"connector:{CLUSTER}"],
        },
    )


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The fault-injection tallies (tests/actions/fault_model.py), when faults ran."""
    from tests.actions.fault_model import DEGRADED, TALLY

    if TALLY["faults injected"]:
        terminalreporter.write_sep("-", "fault injection (tests/actions)")
        main = ("sagas run", "faults injected", "jobs lost", "jobs run twice", "sagas unresolved")
        terminalreporter.write_line(", ".join(f"{name}: {TALLY[name]}" for name in main))
        for name in sorted(set(TALLY) - set(main)):
            terminalreporter.write_line(f"{name}: {TALLY[name]}")
        for line in sorted({line.split(": ", 2)[1] for line in DEGRADED})[:20]:
            terminalreporter.write_line(f"  not as without faults, after: {line}")
