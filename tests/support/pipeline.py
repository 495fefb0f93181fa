"""The action pipeline's processes, for tests: a private Redis, a control-plane Celery
worker and node agents, each in its own process group so that a test can stop it.

tests/actions runs one pipeline per session (its conftest.py); the end-to-end tests
against real Slurm (tests/connectors) and Kubernetes (tests/k8s) build their own.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from celery import Celery
from sqlalchemy import Engine

from agent import procs
from agent.fencing import FenceStore
from agent.workload import WorkloadStore

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

    def start_connector(
        self, kind: str, cluster: str, control_plane: str, *settings: str, interval_s: float = 1
    ) -> Worker:
        """`shaper connector run` for ``cluster`` (its telemetry and its scheduler-level
        steps), with its token; ``settings``: ``--set`` values (``slurm_conf=…``)."""
        sets = [arg for setting in settings for arg in ("--set", setting)]
        return self._spawn(
            f"connector-{cluster}",
            [sys.executable, "-m", "connectors.runner", "--kind", kind, "--cluster", cluster,
             "--control-plane", control_plane, "--interval", str(interval_s),
             "--broker", self.broker, "--state-dir", str(self.root / f"connector-{cluster}"),
             *sets],
            {"SHAPER_CONNECTOR_TOKEN": self.tokens[f"connector:{cluster}"]},
        )  # fmt: skip

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
            _wait_stopped(worker)

    def advance(self, action_id: int) -> None:
        """What the API does on approval: ask a control worker to advance the saga."""
        send(self.broker, "app.actions.tasks.advance", "control", args=[action_id])

    def stop_all(self) -> None:
        """SIGTERM to every worker at once, then wait for each: one by one, each warm
        shutdown's second or two added up at the end of every module that runs them."""
        workers = [self.workers.pop(name) for name in list(self.workers)]
        running = [worker for worker in workers if worker.alive()]
        for worker in running:
            os.killpg(worker.process.pid, signal.SIGTERM)
        for worker in running:
            _wait_stopped(worker)

    def logs(self) -> str:
        return "\n".join(f"== {w.name}\n{w.tail()}" for w in self.workers.values())


def _wait_stopped(worker: Worker) -> None:
    """Wait for a signalled worker to exit; SIGKILL its group after 30 s."""
    try:
        worker.process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(worker.process.pid, signal.SIGKILL)
        worker.process.wait(timeout=10)


def send(broker: str, task: str, queue: str, **options: Any) -> None:
    client = Celery(broker=broker, set_as_current=False)
    try:
        client.send_task(task, queue=queue, **options)
    finally:
        client.close()
