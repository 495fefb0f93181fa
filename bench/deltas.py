"""Delta ingest benchmark: one-job deltas into a cluster of 1,000 nodes × 8 GPUs and 10,000
jobs on PostgreSQL, the connector's steady state (issue 15).

After a first snapshot (``bench.ingest.make_snapshot``), it ingests ``--deltas`` deltas in
turn, each naming one job: a running job's priority changed, a running job finished, a new
pending job. Each is timed as the API route runs it (``parse_push`` on the body bytes, then
``ingest`` in a session of its own). The first deltas run on tables PostgreSQL has not
analysed yet (autovacuum does so within about a minute), so they are shown apart. A
delta's cost should follow the delta, not the cluster: compare ``--jobs 2000`` with the
default.

    python -m bench.deltas [--nodes 1000] [--jobs 10000] [--deltas 90] [--dsn ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

from rich.console import Console
from rich.table import Table
from sqlmodel import Session

from app.clusters import service as cluster_service
from app.clusters.models import ClusterCreate
from app.core.db import make_engine
from app.gpu_models import service as gpu_model_service
from bench.ingest import NOW, make_snapshot, shaper_ingest
from bench.scratch_db import DEFAULT_DSN, scratch_database

FRESH = 10  # deltas counted as "right after the snapshot"


def one_job_deltas(snapshot: dict[str, Any], count: int) -> list[tuple[str, bytes]]:
    """(kind, body) for ``count`` deltas after ``snapshot``, seq 2 onwards."""
    running = [j for j in snapshot["jobs"] if j["state"] == "running"]
    pending = [j for j in snapshot["jobs"] if j["state"] == "pending"]
    if min(len(running), len(pending)) < count:
        raise SystemExit(f"{count} deltas need as many running and pending jobs: use more jobs")
    bodies = []
    for i in range(count):
        kind = ("priority", "finished", "new")[i % 3]
        if kind == "priority":
            job = {**running[i], "priority": (running[i]["priority"] + 1) % 101}
        elif kind == "finished":
            job = {**running[i], "state": "finished", "end_time": NOW.isoformat()}
            del job["allocations"]
        else:
            job = {**pending[i], "external_id": f"new-{i}"}
        body = {
            "kind": "delta",
            "connector_session": snapshot["connector_session"],
            "seq": snapshot["seq"] + 1 + i,
            "jobs": [job],
        }
        bodies.append((kind, json.dumps(body).encode()))
    return bodies


def _ms(values: list[float]) -> tuple[str, str, str]:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return (
        f"{statistics.median(values) * 1e3:.1f}",
        f"{p99 * 1e3:.1f}",
        f"{max(values) * 1e3:.1f}",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=10000)
    parser.add_argument("--deltas", type=int, default=90)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="PostgreSQL server (admin DSN)")
    args = parser.parse_args()
    if args.deltas <= FRESH:
        parser.error(f"--deltas must be above {FRESH}")
    console = Console()
    snapshot = make_snapshot(args.nodes, args.jobs, args.seed)
    deltas = one_job_deltas(snapshot, args.deltas)
    with scratch_database(args.dsn, "shaper_bench_deltas") as url:
        engine = make_engine(url)
        with Session(engine) as session:
            gpu_model_service.ensure_default_catalogue(session=session)
            cluster_service.register_cluster(
                session=session, cluster_in=ClusterCreate(name="bench"), now=NOW
            )
        first, _ = shaper_ingest(engine, "bench", json.dumps(snapshot).encode())
        times: dict[str, list[float]] = {}
        for i, (kind, body) in enumerate(deltas):
            elapsed, _ = shaper_ingest(engine, "bench", body)
            times.setdefault(kind, []).append(elapsed)
            times.setdefault("fresh" if i < FRESH else "analysed", []).append(elapsed)
        engine.dispose()

    table = Table(
        title=f"One-job deltas into {args.nodes} nodes × 8 GPUs, {args.jobs} jobs "
        f"(first snapshot {first:.3f} s)"
    )
    for column in ("deltas", "count", "p50 ms", "p99 ms", "max ms"):
        table.add_column(column, justify="right" if column != "deltas" else "left")
    labels = {
        "fresh": f"the first {FRESH} (tables not analysed yet)",
        "analysed": "the rest",
        "priority": "a running job's priority",
        "finished": "a running job finished",
        "new": "a new pending job",
    }
    for key, label in labels.items():
        table.add_row(label, str(len(times[key])), *_ms(times[key]))
    console.print(table)


if __name__ == "__main__":
    main()
