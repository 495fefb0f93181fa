"""The action pipeline for real: PostgreSQL, Redis, a control-plane Celery worker and node
agents as separate processes, workloads under real CRIU.

One pipeline per test session (workers take seconds to start on two cores); every test
uses its own workload ids, and every process is stopped by its process group at the end.
The broker is a Redis server of the pipeline's own (no persistence, like production's
default), so a test can restart it without touching anyone else's.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from fastapi.testclient import TestClient
from sqlalchemy import Engine
from sqlmodel import Session, select

from agent import procs
from agent.fencing import FenceStore
from agent.workload import RunningWorkload, WorkloadStore, kill_workload
from app.actions.models import Action, ActionStep
from app.actions.router import get_dispatcher
from app.core import migrate
from app.core.config import Settings
from app.core.db import get_session, make_engine
from app.gpu_models import service as gpu_model_service
from app.main import create_app
from app.tokens import service as token_service
from app.tokens.models import ApiTokenCreate
from tests.agent.helpers import processes_mentioning

CLUSTER = "lab"
WAIT_S = 60.0
READY = " ready."


@dataclass
class Worker:
    name: str
    process: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> bool:
        return self.process.poll() is None

    def tail(self) -> str:
        return procs.read_tail(self.log, lines=40)


class RedisServer:
    """A private redis-server on a free port; restart() loses every queued message."""

    def __init__(self, root: Path) -> None:
        self.root = root
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.root / "redis.log", "ab") as log:
            self.process = subprocess.Popen(
                [
                    "redis-server",
                    "--port",
                    str(self.port),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                    str(self.root),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        client = redis.Redis.from_url(self.url)

        def answers() -> bool:
            try:
                return bool(client.ping())
            except redis.ConnectionError:
                return False

        assert procs.wait_until(answers, timeout=WAIT_S, interval=0.05), "redis did not start"
        client.close()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()


@dataclass
class Pipeline:
    """The processes of one control plane and its node agents, and their state dirs."""

    root: Path
    database_url: str
    engine: Engine
    broker: str
    workers: dict[str, Worker] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    redis: RedisServer | None = None
    # Plaintext API tokens by scope, for the executors' reports.
    tokens: dict[str, str] = field(default_factory=dict)

    def state_dir(self, node: str) -> Path:
        return self.root / "nodes" / node

    def store(self, node: str) -> WorkloadStore:
        return WorkloadStore(self.state_dir(node))

    def journal(self, node: str) -> list[dict[str, Any]]:
        return FenceStore(self.state_dir(node)).read_journal()

    def _spawn(self, name: str, command: list[str], extra_env: dict[str, str]) -> Worker:
        log = self.root / "logs" / f"{name}-{time.time_ns()}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        with open(log, "wb") as stream:
            process = subprocess.Popen(
                command,
                env={**os.environ, **self.env, **extra_env},
                stdout=stream,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                cwd=self.root,
            )
        worker = Worker(name, process, log)
        self.workers[name] = worker
        ready = procs.wait_until(
            lambda: READY in log.read_text(errors="replace") or not worker.alive(),
            timeout=WAIT_S,
            interval=0.1,
        )
        assert ready and worker.alive(), f"{name} did not start:\n{worker.tail()}"
        return worker

    def start_control(self, **extra_env: str) -> Worker:
        return self._spawn(
            "control",
            [  # `shaper worker`, as docker-compose.yml runs it
                sys.executable,
                "-m",
                "app",
                "worker",
                "--queues",
                "control",
                "--pool",
                "solo",
                "--beat",
                "--schedule",
                str(self.root / f"beat-{time.time_ns()}"),
                "--loglevel",
                "INFO",
                "--without-heartbeat",
                "--without-gossip",
                "--without-mingle",
            ],
            extra_env,
        )

    def start_agent(
        self,
        node: str,
        *options: str,
        cluster: str = CLUSTER,
        wrapper: tuple[str, ...] = (),
        broker: str | None = None,
        env: dict[str, str] | None = None,
    ) -> Worker:
        """wrapper: a command the agent runs under (``ip netns exec NS``); broker: its URL
        as seen from there; env: more environment (a skewed clock)."""
        return self._spawn(
            f"agent-{node}",
            [
                *wrapper,
                sys.executable,
                "-m",
                "agent",
                "worker",
                "--cluster",
                cluster,
                "--node",
                node,
                "--broker",
                broker or self.broker,
                "--state-dir",
                str(self.state_dir(node)),
                *options,
            ],
            {"SHAPER_AGENT_TOKEN": self.tokens[f"agent:{cluster}/{node}"], **(env or {})},
        )

    def ensure(self, name: str, start: Callable[[], Worker]) -> Worker:
        worker = self.workers.get(name)
        if worker is None or not worker.alive():
            worker = start()
        return worker

    def stop(self, name: str, sig: int = signal.SIGTERM) -> None:
        worker = self.workers.pop(name, None)
        if worker is None:
            return
        if worker.alive():
            os.killpg(worker.process.pid, sig)
            try:
                worker.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(worker.process.pid, signal.SIGKILL)
                worker.process.wait(timeout=10)

    def advance(self, action_id: int) -> None:
        """What the API does on approval: ask a control worker to advance the saga."""
        send(self.broker, "app.actions.tasks.advance", "control", args=[action_id])

    def stop_all(self) -> None:
        for name in list(self.workers):
            self.stop(name)

    def logs(self) -> str:
        return "\n".join(f"== {w.name}\n{w.tail()}" for w in self.workers.values())


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


def send(broker: str, task: str, queue: str, **options: Any) -> None:
    client = Celery(broker=broker, set_as_current=False)
    try:
        client.send_task(task, queue=queue, **options)
    finally:
        client.close()


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


def action_state(engine: Engine, action_id: int) -> tuple[str, list[ActionStep]]:
    with Session(engine) as session:
        action = session.get(Action, action_id)
        assert action is not None
        steps = list(
            session.exec(
                select(ActionStep).where(ActionStep.action_id == action_id).order_by(ActionStep.seq)  # type: ignore[arg-type]
            )
        )
        return action.state, steps


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
