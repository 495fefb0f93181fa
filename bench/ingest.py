"""Telemetry ingest benchmark: one snapshot of 2,000 nodes × 8 GPUs and 20,000 jobs.

Prints, in one run and one table, Shaper's ingest (JSON bytes → validated snapshot →
set-based writes: COPY on PostgreSQL) next to a naive row-by-row ORM insert of the same
snapshot (``session.add`` + ``flush`` per row), plus a steady-state re-ingest where 10 % of
the jobs changed. Runs against a scratch PostgreSQL database that it drops afterwards.

Shaper is timed twice over: through the two calls the API route makes (``parse_push`` on
the body bytes, then ``ingest``), and as a whole ``POST /api/v1/clusters/{id}/telemetry``
through the real application in-process (body-limit middleware, token check, FastAPI,
the response), which adds everything but the network and the ASGI server.

    python -m bench.ingest [--nodes 2000] [--jobs 20000] [--dsn "host=127.0.0.1 user=postgres"]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from fastapi.testclient import TestClient
from rich.console import Console
from rich.progress import track
from rich.table import Table
from sqlmodel import Session

from app.api.deps import get_clock
from app.clusters import service as cluster_service
from app.clusters.models import ClusterCreate
from app.core.clock import FrozenClock
from app.core.config import Settings
from app.core.db import get_session, make_engine
from app.core.gc_pause import paused_gc
from app.core.lookup import row_id
from app.gpu_models import service as gpu_model_service
from app.jobs.models import Allocation, Job
from app.main import create_app
from app.nodes.models import Node
from app.telemetry import service as telemetry_service
from app.tokens import service as token_service
from app.tokens.models import ApiTokenCreate
from bench.scratch_db import DEFAULT_DSN, scratch_database
from wire.telemetry import TelemetrySnapshot

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


def shaper_ingest(engine: Any, cluster: str, body: bytes) -> tuple[float, int]:
    """What the route does with a request body: ``parse_push`` (the route's request reads
    its JSON body with it), then ``ingest`` in a session of its own, under one pause of the
    garbage collector as the route holds it (``_PushRoute``)."""
    started = time.perf_counter()
    with paused_gc():
        push = telemetry_service.parse_push(body)
        with Session(engine, expire_on_commit=False) as session:
            ack = telemetry_service.ingest(
                session=session, cluster_name=cluster, push=push, now=NOW
            )
        del push
    elapsed = time.perf_counter() - started
    return elapsed, ack.nodes_written + ack.jobs_written + ack.allocations_written


def api_client(engine: Any, url: str) -> TestClient:
    """The real application on the scratch database, called in-process."""
    app = create_app(Settings(database_url=url))

    def session_override() -> Any:
        with Session(engine, expire_on_commit=False) as session:
            yield session

    app.dependency_overrides[get_session] = session_override
    app.dependency_overrides[get_clock] = lambda: FrozenClock(NOW)
    return TestClient(app)


def http_ingest(client: TestClient, cluster: str, token: str, body: bytes) -> tuple[float, int]:
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    started = time.perf_counter()
    response = client.post(f"/api/v1/clusters/{cluster}/telemetry", headers=headers, content=body)
    elapsed = time.perf_counter() - started
    assert response.status_code == 200, response.text[:500]
    ack = response.json()
    return elapsed, ack["nodes_written"] + ack["jobs_written"] + ack["allocations_written"]


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
            node_ids[report.name] = row_id(node)
            rows += 1
        for job_report in track(snapshot.jobs, description="naive: jobs", transient=True):
            job = Job(
                cluster_id=cluster_id,
                external_id=job_report.external_id,
                name=job_report.name,
                team=job_report.team,
                queue=job_report.queue,
                kind=job_report.kind,
                shape=job_report.shape,
                priority=job_report.priority,
                gpus_requested=job_report.gpus_requested,
                allowed_gpu_models=list(job_report.allowed_gpu_models),
                checkpointable=job_report.checkpointable,
                submit_time=job_report.submit_time,
                start_time=job_report.start_time,
                state=job_report.state,
                updated_at=NOW,
            )
            session.add(job)
            session.flush()
            rows += 1
            for allocation in job_report.allocations:
                session.add(
                    Allocation(
                        job_id=row_id(job),
                        node_id=node_ids[allocation.node],
                        gpu_indices=list(allocation.gpu_indices),
                        gpu_count=allocation.gpus,
                        started_at=NOW,
                    )
                )
                session.flush()
                rows += 1
        session.commit()
    return time.perf_counter() - started, rows


def _seconds(values: list[float]) -> str:
    """The median, with the range when there are several runs."""
    if len(values) == 1:
        return f"{values[0]:.3f}"
    return f"{statistics.median(values):.3f} ({min(values):.3f}–{max(values):.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=2000)
    parser.add_argument("--jobs", type=int, default=20000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="PostgreSQL server (admin DSN)")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="time Shaper this many times, each into a fresh cluster (median and range shown)",
    )
    parser.add_argument(
        "--skip-naive", action="store_true", help="leave out the naive baseline (≈ 15-30 s)"
    )
    args = parser.parse_args()
    if not 1 <= args.repeat <= 32:  # one token carries every bench cluster's scope, 32 at most
        parser.error("--repeat must be between 1 and 32")
    console = Console()

    with scratch_database(args.dsn, "shaper_bench") as url:
        engine = make_engine(url)
        with Session(engine) as session:
            gpu_model_service.ensure_default_catalogue(session=session)
            catalogue = gpu_model_service.ids_by_name(session=session)
            names = [f"bench-{how}-{i}" for i in range(args.repeat) for how in ("shaper", "http")]
            ids = {
                name: row_id(
                    cluster_service.register_cluster(
                        session=session, cluster_in=ClusterCreate(name=name), now=NOW
                    )
                )
                for name in [*names, "bench-naive"]
            }
            scopes = [f"connector:{name}" for name in names if "-http-" in name]
            token = token_service.create_token(
                session=session,
                token_in=ApiTokenCreate(name="bench", scopes=scopes),
                now=NOW,
            ).token
        # Only the raw bytes are alive while Shaper ingests, as in the API server.
        raw = json.dumps(make_snapshot(args.nodes, args.jobs, args.seed)).encode()
        changed = make_snapshot(args.nodes, args.jobs, args.seed, seq=2)
        for job in changed["jobs"][::10]:
            job["priority"] = (job["priority"] + 1) % 101
        raw_changed = json.dumps(changed).encode()
        del changed
        times: dict[str, list[float]] = {k: [] for k in ("first", "steady", "http", "http2")}
        rows: dict[str, int] = {}
        with api_client(engine, url) as client:
            for i in range(args.repeat):
                for key, body in (("first", raw), ("steady", raw_changed)):
                    elapsed, rows[key] = shaper_ingest(engine, f"bench-shaper-{i}", body)
                    times[key].append(elapsed)
                for key, body in (("http", raw), ("http2", raw_changed)):
                    elapsed, rows[key] = http_ingest(client, f"bench-http-{i}", token, body)
                    times[key].append(elapsed)
        assert (rows["http"], rows["http2"]) == (rows["first"], rows["steady"])
        snapshot = TelemetrySnapshot.model_validate_json(raw)
        allocations = sum(len(j.allocations) for j in snapshot.jobs)
        console.print(
            f"snapshot: {args.nodes} nodes × 8 GPUs, {args.jobs} jobs "
            f"({allocations} running with allocations), {len(raw) / 2**20:.1f} MiB JSON"
        )
        naive: tuple[float, int] | None = None
        if not args.skip_naive:
            naive = naive_ingest(engine, ids["bench-naive"], snapshot, catalogue)
        engine.dispose()

    runs = f", {args.repeat} runs: median (min–max)" if args.repeat > 1 else ""
    table = Table(title=f"Telemetry ingest into PostgreSQL (one transaction each{runs})")
    for column in ("method", "wall s", "rows written", "rows/s", "vs naive"):
        table.add_column(column, justify="right" if column != "method" else "left")
    labels = {
        "first": "shaper: first snapshot (parse + COPY)",
        "steady": "shaper: re-ingest, 10 % of jobs changed",
        "http": "shaper: first snapshot, whole POST in-process",
        "http2": "shaper: re-ingest, whole POST in-process",
    }
    for key, label in labels.items():
        median = statistics.median(times[key])
        versus = ""
        if naive is not None and key in ("first", "http"):
            versus = f"{naive[0] / median:.1f}× faster"
        table.add_row(
            label, _seconds(times[key]), str(rows[key]), f"{rows[key] / median:,.0f}", versus
        )
    if naive is not None:
        table.add_row(
            "naive: ORM add + flush per row",
            f"{naive[0]:.3f}",
            str(naive[1]),
            f"{naive[1] / naive[0]:,.0f}",
            "1.0×",
        )
    console.print(table)
    first = statistics.median(times["first"])
    if naive is not None:
        console.print(
            f"target: first snapshot ≤ 1 s and ≥ 10× naive → "
            f"{'met' if first <= 1 and naive[0] / first >= 10 else 'NOT met'}"
        )


if __name__ == "__main__":
    main()
