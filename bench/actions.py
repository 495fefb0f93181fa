"""Action saga benchmark: control-plane overhead per migration at 1, 10 and 100 at once.

Each migration is the real saga (``app.actions.saga``: row locks, step rows, reports)
against a scratch PostgreSQL database; node agents are in-process ``sim`` backends, and
messages go through an in-process queue instead of a broker, so what is measured is the
control plane's own work per migration — no checkpoint I/O, no broker round trips.
Several control workers (threads, each with its own sessions, as Celery workers would
have) take messages in arrival order, so N sagas are in flight at once.

    python -m bench.actions [--levels 1 10 100] [--workers 2] [--dsn "host=127.0.0.1 …"]
"""

from __future__ import annotations

import argparse
import queue
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table
from sqlalchemy import Engine
from sqlmodel import Session, select

from agent.backends.base import CheckpointImage
from agent.backends.sim import SimBackend
from agent.workload import RunningWorkload
from app.actions import saga
from app.actions.models import Action, ActionKind, ActionState
from app.clusters.models import Cluster
from app.core.db import make_engine
from app.core.security import Principal
from app.jobs.models import Job
from bench.scratch_db import DEFAULT_DSN, scratch_database
from wire.steps import StepReport
from wire.telemetry import JobState

GiB = 1 << 30
# The sim agents answer for every node (a real agent's token covers its own node only).
AGENTS = Principal(token_id=0, name="bench-agents", scopes=frozenset({"admin"}))


def now() -> datetime:
    return datetime.now(UTC)


class SimAgents:
    """Every node's agent, in-process: a sim backend per node, answering steps at once."""

    def __init__(self) -> None:
        self.nodes: dict[str, SimBackend] = {}
        self.running: dict[tuple[str, str], RunningWorkload] = {}
        self.lock = threading.Lock()

    def start(self, node: str, workload_id: str) -> None:
        backend = self.nodes.setdefault(node, SimBackend())
        self.running[(node, workload_id)] = backend.start(workload_id=workload_id, memory_bytes=GiB)

    def answer(self, node: str, step: dict[str, Any]) -> dict[str, Any]:
        workload_id, name = step["workload_id"], step["step"]
        with self.lock:
            backend = self.nodes.setdefault(node, SimBackend())
            result: dict[str, Any] = {}
            if name == "checkpoint":
                workload = self.running.pop((node, workload_id))
                image = backend.checkpoint(workload, Path(f"/sim/{node}/{workload_id}"))
                result = {"image": image.model_dump(mode="json")}
            elif name == "transfer":
                result = {"image_dir": f"/sim/{node}/{workload_id}"}
            elif name == "restore":
                image = CheckpointImage.model_validate(step["args"]["image"])
                self.running[(node, workload_id)] = backend.restore(image)
            return {
                "action_id": step["action_id"],
                "key": step["key"],
                "ok": True,
                "result": result,
            }


def prepare(engine: Engine, level: int, agents: SimAgents) -> list[int]:
    """A cluster of 2 × level nodes, level running jobs, one approved migration each."""
    with Session(engine) as session:
        cluster = Cluster(name=f"bench-{level}", created_at=now())
        session.add(cluster)
        session.flush()
        ids = []
        for index in range(level):
            job = Job(
                cluster_id=cluster.id,  # type: ignore[arg-type]
                external_id=f"job-{index}",
                checkpointable=True,
                state=JobState.running,
                updated_at=now(),
            )
            session.add(job)
            session.flush()
            action = Action(
                cluster_id=cluster.id,  # type: ignore[arg-type]
                job_id=job.id,
                kind=ActionKind.migrate,
                state=ActionState.approved,
                idempotency_key=f"bench-{level}:{index}",
                source_node=f"src-{index}",
                target_node=f"dst-{index}",
                created_at=now(),
                updated_at=now(),
                decided_by="bench",
                decided_at=now(),
            )
            session.add(action)
            session.flush()
            ids.append(action.id)
            agents.start(f"bench-{level}.src-{index}", f"job-{index}")
        session.commit()
    return ids  # type: ignore[return-value]


def run_level(engine: Engine, level: int, workers: int) -> dict[str, float]:
    agents = SimAgents()
    action_ids = prepare(engine, level, agents)
    messages: queue.Queue[tuple[str, Any]] = queue.Queue()
    control_s = [0.0] * workers
    steps = [0] * workers

    def timed(index: int, call: Any, **kwargs: Any) -> None:
        started = time.perf_counter()
        with Session(engine, expire_on_commit=False) as session:
            outgoing = call(session=session, now=now(), **kwargs)
        control_s[index] += time.perf_counter() - started
        for message in outgoing:
            messages.put(("step", message))

    def work(index: int) -> None:
        while True:
            kind, item = messages.get()
            try:
                if kind == "stop":
                    return
                if kind == "advance":
                    timed(index, saga.advance, action_id=item)
                else:
                    node = item.queue.removeprefix("agent.")
                    report = agents.answer(node, item.kwargs["step"])
                    steps[index] += 1
                    timed(
                        index,
                        saga.record_report,
                        report=StepReport.model_validate(report),
                        reporter=AGENTS,
                    )
            finally:
                messages.task_done()

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(workers)]
    for thread in threads:
        thread.start()
    started = time.perf_counter()
    for action_id in action_ids:
        messages.put(("advance", action_id))
    messages.join()
    wall = time.perf_counter() - started
    for _thread in threads:
        messages.put(("stop", None))
    for thread in threads:
        thread.join()
    with Session(engine) as session:
        states = list(
            session.exec(select(Action.state).where(Action.id.in_(action_ids)))  # type: ignore[union-attr]
        )
    assert states == ["succeeded"] * level, states
    return {
        "level": level,
        "wall_s": wall,
        "control_ms": 1000 * sum(control_s) / level,
        "wall_ms": 1000 * wall / level,
        "steps": sum(steps) / level,
        "per_s": level / wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 10, 100])
    parser.add_argument("--workers", type=int, default=2, help="control workers (threads)")
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="PostgreSQL server (admin DSN)")
    args = parser.parse_args()
    console = Console()
    with scratch_database(args.dsn, "shaper_bench_actions") as url:
        engine = make_engine(url, pool_size=args.workers + 2)
        results = [run_level(engine, level, args.workers) for level in args.levels]
        engine.dispose()

    table = Table(
        title=f"Migration sagas on PostgreSQL, sim agents, {args.workers} control workers"
    )
    for column in ("concurrent", "wall s", "control ms/mig", "wall ms/mig", "steps", "mig/s"):
        table.add_column(column, justify="right")
    for row in results:
        table.add_row(
            str(row["level"]),
            f"{row['wall_s']:.2f}",
            f"{row['control_ms']:.1f}",
            f"{row['wall_ms']:.1f}",
            f"{row['steps']:.0f}",
            f"{row['per_s']:.0f}",
        )
    console.print(table)
    console.print(
        "control ms/mig: time spent in advance/record_report (row locks, step rows, commits), "
        "summed over the workers, per migration; wall ms/mig: wall time / concurrent; "
        "steps: agent steps per migration. Checkpoint I/O excluded (sim backend)."
    )


if __name__ == "__main__":
    main()
