"""Telemetry ingest benchmark: one snapshot of 2,000 nodes × 8 GPUs and 20,000 jobs.

Prints, in one run and one table, Shaper's ingest (JSON bytes → validated snapshot →
set-based writes: COPY on PostgreSQL) next to a naive row-by-row ORM insert of the same
snapshot (``session.add`` + ``flush`` per row), plus a steady-state re-ingest where 10 % of
the jobs changed. Runs against a scratch PostgreSQL database that it drops afterwards.

    python -m bench.ingest [--nodes 2000] [--jobs 20000] [--dsn "host=127.0.0.1 user=postgres"]
"""

from __future__ import annotations

import argparse
import json
import random
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import TypeAdapter
from rich.console import Console
from rich.progress import track
from rich.table import Table
from sqlmodel import Session

from app.clusters import service as cluster_service
from app.clusters.models import ClusterCreate
from app.core.db import make_engine
from app.gpu_models import service as gpu_model_service
from app.jobs.models import Allocation, Job
from app.nodes.models import Node
from app.telemetry import service as telemetry_service
from bench.scratch_db import DEFAULT_DSN, scratch_database
from connectors.base import TelemetryPush, TelemetrySnapshot

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
MODELS = ["H100", "A100-80G", "L40S", "H200"]


def make_snapshot(n_nodes: int, n_jobs: int, seed: int, seq: int = 1) -> dict[str, Any]:
    rng = random.Random(seed)
    nodes = [
        {
            "name": f"node-{i:05d}",
            "gpu_model": MODELS[i % 4],
            "gpu_count": 8,
            "cpu_cores": 128,
            "memory_mib": 1_048_576,
            "labels": {"rack": f"r{i // 32}"},
        }
        for i in range(n_nodes)
    ]
    free = {n["name"]: list(range(8)) for n in nodes}
    names = list(free)
    jobs = []
    for j in range(n_jobs):
        gpus = rng.choice([1, 1, 2, 4, 8])
        job: dict[str, Any] = {
            "external_id": f"job-{j}",
            "name": f"train-{j}",
            "team": f"team-{j % 17}",
            "kind": rng.choice(["training", "batch_inference", "hpc"]),
            "priority": rng.randint(0, 100),
            "gpus_requested": gpus,
            "submit_time": (NOW - timedelta(minutes=j % 900)).isoformat(),
            "checkpointable": j % 3 == 0,
            "state": "pending",
        }
        node = names[rng.randrange(len(names))]
        if len(free[node]) >= gpus and rng.random() < 0.8:
            indices, free[node] = free[node][:gpus], free[node][gpus:]
            job.update(
                state="running",
                start_time=NOW.isoformat(),
                allocations=[{"node": node, "gpu_indices": indices}],
            )
        jobs.append(job)
    return {
        "kind": "snapshot",
        "connector_session": "bench",
        "seq": seq,
        "nodes": nodes,
        "jobs": jobs,
    }


# Built once, as the API builds its validators once at start-up.
PUSH_ADAPTER: TypeAdapter[Any] = TypeAdapter(TelemetryPush)


def shaper_ingest(engine: Any, cluster: str, body: bytes) -> tuple[float, int]:
    adapter = PUSH_ADAPTER
    started = time.perf_counter()
    push = adapter.validate_json(body)
    with Session(engine) as session:
        ack = telemetry_service.ingest(session=session, cluster_name=cluster, push=push, now=NOW)
    elapsed = time.perf_counter() - started
    return elapsed, ack.nodes_written + ack.jobs_written + ack.allocations_written


def naive_ingest(
    engine: Any, cluster_id: int, snapshot: TelemetrySnapshot, catalogue: dict[str, int]
) -> tuple[float, int]:
    started = time.perf_counter()
    rows = 0
    with Session(engine) as session:
        node_ids: dict[str, int] = {}
        for report in track(snapshot.nodes, description="naive: nodes", transient=True):
            node = Node(
                cluster_id=cluster_id,
                name=report.name,
                gpu_model_id=catalogue[report.gpu_model or ""],
                gpu_count=report.gpu_count,
                cpu_cores=report.cpu_cores,
                memory_mib=report.memory_mib,
                labels=dict(report.labels),
                state=report.state,
                updated_at=NOW,
            )
            session.add(node)
            session.flush()
            node_ids[report.name] = node.id  # type: ignore[assignment]
            rows += 1
        for report in track(snapshot.jobs, description="naive: jobs", transient=True):
            job = Job(
                cluster_id=cluster_id,
                external_id=report.external_id,
                name=report.name,
                team=report.team,
                queue=report.queue,
                kind=report.kind,
                shape=report.shape,
                priority=report.priority,
                gpus_requested=report.gpus_requested,
                allowed_gpu_models=list(report.allowed_gpu_models),
                checkpointable=report.checkpointable,
                submit_time=report.submit_time,
                start_time=report.start_time,
                state=report.state,
                updated_at=NOW,
            )
            session.add(job)
            session.flush()
            rows += 1
            for allocation in report.allocations:
                session.add(
                    Allocation(
                        job_id=job.id,
                        node_id=node_ids[allocation.node],  # type: ignore[arg-type]
                        gpu_indices=list(allocation.gpu_indices),
                        gpu_count=allocation.gpus,
                        started_at=NOW,
                    )
                )
                session.flush()
                rows += 1
        session.commit()
    return time.perf_counter() - started, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="PostgreSQL server (admin DSN)")
    args = parser.parse_args()
    console = Console()

    with scratch_database(args.dsn, "shaper_bench") as url:
        engine = make_engine(url)
        with Session(engine) as session:
            gpu_model_service.ensure_default_catalogue(session=session)
            catalogue = gpu_model_service.ids_by_name(session=session)
            ids = {}
            for name in ("bench-shaper", "bench-naive"):
                ids[name] = cluster_service.register_cluster(
                    session=session, cluster_in=ClusterCreate(name=name), now=NOW
                ).id
        # Only the raw bytes are alive while Shaper ingests, as in the API server.
        raw = json.dumps(make_snapshot(args.nodes, args.jobs, args.seed)).encode()
        changed = make_snapshot(args.nodes, args.jobs, args.seed, seq=2)
        for job in changed["jobs"][::10]:
            job["priority"] = (job["priority"] + 1) % 101
        raw_changed = json.dumps(changed).encode()
        del changed
        first_s, first_rows = shaper_ingest(engine, "bench-shaper", raw)
        steady_s, steady_rows = shaper_ingest(engine, "bench-shaper", raw_changed)
        snapshot = TelemetrySnapshot.model_validate_json(raw)
        allocations = sum(len(j.allocations) for j in snapshot.jobs)
        console.print(
            f"snapshot: {args.nodes} nodes × 8 GPUs, {args.jobs} jobs "
            f"({allocations} running with allocations), {len(raw) / 2**20:.1f} MiB JSON"
        )
        naive_s, naive_rows = naive_ingest(engine, ids["bench-naive"], snapshot, catalogue)
        engine.dispose()

    table = Table(title="Telemetry ingest into PostgreSQL (one transaction each)")
    for column in ("method", "wall s", "rows written", "rows/s", "vs naive"):
        table.add_column(column, justify="right" if column != "method" else "left")
    table.add_row(
        "shaper: first snapshot (parse + COPY)",
        f"{first_s:.3f}",
        str(first_rows),
        f"{first_rows / first_s:,.0f}",
        f"{naive_s / first_s:.1f}× faster",
    )
    table.add_row(
        "shaper: re-ingest, 10 % of jobs changed",
        f"{steady_s:.3f}",
        str(steady_rows),
        f"{steady_rows / steady_s:,.0f}",
        "",
    )
    table.add_row(
        "naive: ORM add + flush per row",
        f"{naive_s:.3f}",
        str(naive_rows),
        f"{naive_rows / naive_s:,.0f}",
        "1.0×",
    )
    console.print(table)
    console.print(
        f"target: first snapshot ≤ 1 s and ≥ 10× naive → "
        f"{'met' if first_s <= 1 and naive_s / first_s >= 10 else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
