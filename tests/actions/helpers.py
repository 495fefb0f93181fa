"""Builders for the pipeline tests: a cluster with nodes, jobs run by real counters, actions."""

from __future__ import annotations

import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Engine
from sqlmodel import Session, select

from agent import procs
from app.actions.models import Action, ActionKind, ActionState
from app.clusters.models import Cluster, ShapingMode
from app.gpu_models.models import GpuModel
from app.jobs.models import Allocation, Job
from app.nodes.models import Node
from tests.actions.conftest import Tracked
from tests.support.counter import COUNTER, count_of
from tests.support.pipeline import CLUSTER, WAIT_S, Pipeline
from tests.support.plans import TERMINAL, action_state
from tests.support.processes import processes_mentioning
from wire.telemetry import JobState, SchedulerKind


def now() -> datetime:
    return datetime.now(UTC)


def ensure_cluster(engine: Engine, *, nodes: tuple[str, ...] = ("a", "b", "c")) -> int:
    with Session(engine) as session:
        cluster = session.exec(select(Cluster).where(Cluster.name == CLUSTER)).first()
        if cluster is None:
            cluster = Cluster(
                name=CLUSTER,
                scheduler=SchedulerKind.sim,
                mode=ShapingMode.advise,
                created_at=now(),
            )
            session.add(cluster)
            session.flush()
        gpu = session.exec(select(GpuModel).where(GpuModel.name == "H100")).one()
        known = set(session.exec(select(Node.name).where(Node.cluster_id == cluster.id)))
        for name in nodes:
            if name not in known:
                session.add(
                    Node(
                        cluster_id=cluster.id,  # type: ignore[arg-type]
                        name=name,
                        gpu_model_id=gpu.id,
                        # c is a spare node for fault tests: no GPUs, so no plan uses it.
                        gpu_count=0 if name == "c" else 8,
                        cpu_cores=64,
                        memory_mib=512_000,
                        updated_at=now(),
                    )
                )
        session.commit()
        return cluster.id  # type: ignore[return-value]


def add_job(
    engine: Engine,
    external_id: str,
    *,
    node: str | None,
    gpus: int = 0,
    checkpointable: bool = True,
    priority: int = 10,
    gpu_offset: int = 0,
) -> int:
    cluster_id = ensure_cluster(engine)
    with Session(engine) as session:
        job = Job(
            cluster_id=cluster_id,
            external_id=external_id,
            name=external_id,
            team="vision",
            gpus_requested=gpus,
            checkpointable=checkpointable,
            priority=priority,
            state=JobState.running if node else JobState.pending,
            submit_time=now(),
            start_time=now() if node else None,
            updated_at=now(),
        )
        session.add(job)
        session.flush()
        if node is not None:
            node_id = session.exec(
                select(Node.id).where(Node.cluster_id == cluster_id, Node.name == node)
            ).one()
            session.add(
                Allocation(
                    job_id=job.id,  # type: ignore[arg-type]
                    node_id=node_id,
                    gpu_indices=list(range(gpu_offset, gpu_offset + gpus)),
                    gpu_count=gpus,
                    started_at=now(),
                )
            )
        session.commit()
        return job.id  # type: ignore[return-value]


def finish_jobs(engine: Engine, *external_ids: str) -> None:
    """Take a test's jobs out of later shaping cycles."""
    with Session(engine) as session:
        for job in session.exec(select(Job).where(Job.external_id.in_(external_ids))):  # type: ignore[attr-defined]
            job.state = JobState.finished
            session.add(job)
            for allocation in session.exec(select(Allocation).where(Allocation.job_id == job.id)):
                allocation.released_at = now()
                session.add(allocation)
        session.commit()


def propose(
    engine: Engine,
    job_id: int,
    kind: ActionKind,
    *,
    source: str | None = None,
    target: str | None = None,
    key: str,
) -> int:
    cluster_id = ensure_cluster(engine)
    with Session(engine) as session:
        action = Action(
            cluster_id=cluster_id,
            job_id=job_id,
            kind=kind,
            state=ActionState.proposed,
            idempotency_key=key,
            reason="test",
            source_node=source,
            target_node=target,
            created_at=now(),
            updated_at=now(),
        )
        session.add(action)
        session.commit()
        return action.id  # type: ignore[return-value]


def job_generation(engine: Engine, job_id: int) -> int:
    with Session(engine) as session:
        job = session.get(Job, job_id)
        assert job is not None
        return job.generation


def count_file(pipeline: Pipeline, workload_id: str) -> Path:
    return pipeline.root / f"{workload_id}.count"


def start_counter(
    pipeline: Pipeline,
    tracked: Tracked,
    workload_id: str,
    *,
    node: str,
    backend: str,
    state_mb: float,
) -> Path:
    """`shaper agent exec` a counter on a node, as an operator would; wait until it counts."""
    tracked.ids.append(workload_id)
    counts = count_file(pipeline, workload_id)
    started = subprocess.run(
        [
            sys.executable,
            "-m",
            "agent",
            "exec",
            "--state-dir",
            str(pipeline.state_dir(node)),
            "--backend",
            backend,
            "--id",
            workload_id,
            "--",
            sys.executable,
            str(COUNTER),
            "--count-file",
            str(counts),
            "--state-mb",
            str(state_mb),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert started.returncode == 0, started.stderr
    assert procs.wait_until(lambda: count_of(counts) >= 10, timeout=WAIT_S), (
        f"{workload_id} did not start counting"
    )
    return counts


def wait_for_action(pipeline: Pipeline, action_id: int, states: set[str] = TERMINAL) -> str:
    def settled() -> bool:
        return action_state(pipeline.engine, action_id)[0] in states

    assert procs.wait_until(settled, timeout=120, interval=0.2), (
        f"action {action_id} stuck at {action_state(pipeline.engine, action_id)}\n{pipeline.logs()}"
    )
    return action_state(pipeline.engine, action_id)[0]


def running_copies(workload_id: str) -> list[int]:
    """Processes of the workload (its command line names its count file), wherever they run."""
    return processes_mentioning(f"/{workload_id}.count")


def steps_of(api: Any, action_id: int) -> list[tuple[str, str, str, str]]:
    response = api.get(f"/actions/{action_id}/steps")
    assert response.status_code == 200, response.text
    return [(s["phase"], s["name"], s["queue"], s["state"]) for s in response.json()]


def placed_on(engine: Engine, job_id: int) -> list[str]:
    """Nodes where the control plane sees the job hold GPUs (open allocations)."""
    with Session(engine) as session:
        return sorted(
            session.exec(
                select(Node.name)
                .join(Allocation, Allocation.node_id == Node.id)  # type: ignore[arg-type]
                .where(Allocation.job_id == job_id, Allocation.released_at.is_(None))  # type: ignore[union-attr]
            )
        )
