"""The cluster map's measurements at 10,000 GPUs: read from every sample of its 10-minute
window, or from ``gpu_latest_samples`` (one row per GPU and metric, kept by the ingest),
and what keeping that table costs a push of samples (issue 18).

The database is ``bench.dashboard``'s (``big``: ``--nodes`` × 8 GPUs, 1,250: 10,000 GPUs;
``small``, a tenth; ``--jobs`` jobs in all, every GPU held and measured a minute before
now), then ``big``'s agents reporting every 15 s over the window: ``--pushes`` deltas of a
utilization and a memory sample per GPU (20,000 samples each; 39: the window's 40 rows
per GPU and metric with the snapshot's), each ingested as the route does it.

Prints, per push: the CPU time of the ingest in this thread (``time.thread_time``;
SQLite runs in it, so its work is counted, and other processes' load is not) and of its
upsert of ``gpu_latest_samples`` alone (``app.telemetry.latest.keep_latest``, timed
inside the ingest), medians over the pushes. Per cluster: the map's read
(``app.nodes.cluster_map.cluster_map``, the route's work without HTTP, the collector
paused as the route does) both ways, CPU and wall time, medians of ``--repeats``, before
the pushes (one sample per GPU and metric in the window) and after them (40); each time
the two replies are checked to be the same bytes. On PostgreSQL (``--backend
postgres``) the CPU time is this process's only, the server's is not in it: read the
wall times there. Figures only: nothing here asserts a time.

    python -m bench.latest_samples [--nodes 1250] [--jobs 100000] [--pushes 39] [--repeats 9]
                                   [--backend sqlite|postgres]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

from rich.console import Console
from rich.table import Table
from sqlalchemy import Engine
from sqlmodel import Session

from app.core.db import make_engine
from app.core.gc_pause import paused_gc
from app.nodes import cluster_map
from app.telemetry import latest
from app.telemetry import service as telemetry_service
from bench.dashboard import GPUS_PER_NODE, _sqlite, seed
from bench.scratch_db import DEFAULT_DSN, scratch_database

console = Console()
PUSH_EVERY = timedelta(seconds=15)


def sample_pushes(n_nodes: int, count: int, now: datetime) -> Iterator[tuple[datetime, bytes]]:
    """(its time, body) of ``count`` deltas of ``big``, seq 2 onwards, 15 s apart and
    ending 15 s before ``now``: a utilization and a memory sample of every GPU each."""
    rng = random.Random(11)
    for k in range(count):
        at = now - PUSH_EVERY * (count - k)
        stamp = at.isoformat()
        samples = [
            {"at": stamp, "metric": metric, "node": f"node-{i:05d}", "gpu_index": gpu,
             "value": round(rng.random(), 3) if metric == "gpu_util" else 30.0}
            for i in range(n_nodes)
            for gpu in range(GPUS_PER_NODE)
            for metric in ("gpu_util", "gpu_mem_used_gib")
        ]  # fmt: skip
        body = {"kind": "delta", "connector_session": "bench", "seq": 2 + k, "samples": samples}
        yield at, json.dumps(body).encode()


class UpsertTimer:
    """``latest.keep_latest`` wrapped: the CPU time of each call in this thread."""

    def __init__(self) -> None:
        self.wrapped: Callable[..., int] = latest.keep_latest
        self.last = 0.0

    def __call__(self, *args: Any, **kwargs: Any) -> int:
        started = time.thread_time()
        try:
            return self.wrapped(*args, **kwargs)
        finally:
            self.last = time.thread_time() - started


def ingest_pushes(engine: Engine, n_nodes: int, count: int, now: datetime) -> dict[str, float]:
    timer = UpsertTimer()
    latest.keep_latest = timer
    pushes: list[float] = []
    upserts: list[float] = []
    walls: list[float] = []
    try:
        for at, body in sample_pushes(n_nodes, count, now):
            started, wall = time.thread_time(), time.perf_counter()
            with paused_gc():
                push = telemetry_service.parse_push(body)
                with Session(engine) as session:
                    telemetry_service.ingest(session=session, cluster_name="big", push=push, now=at)
            pushes.append(time.thread_time() - started)
            walls.append(time.perf_counter() - wall)
            upserts.append(timer.last)
    finally:
        latest.keep_latest = timer.wrapped
    return {
        "push": statistics.median(pushes),
        "upsert": statistics.median(upserts),
        "wall": statistics.median(walls),
    }


def map_reads(
    engine: Engine, cluster: str, now: datetime, repeats: int
) -> dict[bool, tuple[float, float]]:
    """CPU time and wall time of the map's read, from the window and from the table
    (medians of ``repeats`` each, interleaved); the two replies compared byte for byte."""
    times: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    replies: dict[bool, str] = {}
    with Session(engine) as session:
        for _ in range(repeats):
            for from_latest in (False, True):
                session.rollback()  # a fresh read transaction each time, as a request has
                started, wall = time.thread_time(), time.perf_counter()
                with paused_gc():
                    drawn = cluster_map.cluster_map(
                        session=session, cluster=cluster, now=now, from_latest=from_latest
                    )
                times[from_latest].append(
                    (time.thread_time() - started, time.perf_counter() - wall)
                )
                replies[from_latest] = drawn.model_dump_json()
    if replies[False] != replies[True]:
        raise SystemExit(f"{cluster}: the two reads of the map differ")
    return {
        mode: (statistics.median(c for c, _ in values), statistics.median(w for _, w in values))
        for mode, values in times.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1250, help="nodes of the big cluster")
    parser.add_argument("--jobs", type=int, default=100_000, help="jobs in all")
    parser.add_argument("--pushes", type=int, default=39, help="sample pushes of big, 15 s apart")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--backend", choices=["sqlite", "postgres"], default="sqlite")
    parser.add_argument("--dsn", default=DEFAULT_DSN)
    args = parser.parse_args()
    clusters = {
        "big": (args.nodes, args.jobs * 10 // 11),
        "small": (max(1, args.nodes // 10), args.jobs - args.jobs * 10 // 11),
    }
    now = datetime.now(UTC)
    reads: dict[str, dict[bool, tuple[float, float]]] = {}
    database: Callable[[], AbstractContextManager[str]] = (
        _sqlite
        if args.backend == "sqlite"
        else partial(scratch_database, args.dsn, "shaper_bench_latest_samples")
    )
    with database() as url:
        seed(url, clusters, now)
        engine = make_engine(url)
        try:
            for cluster in clusters:
                reads[f"{cluster}, 1 sample"] = map_reads(engine, cluster, now, args.repeats)
            console.print(f"ingesting {args.pushes} pushes of big's samples …")
            ingest = ingest_pushes(engine, args.nodes, args.pushes, now)
            rows = args.pushes + 1
            reads[f"big, {rows} samples"] = map_reads(engine, "big", now, args.repeats)
        finally:
            engine.dispose()

    where = (
        "this thread's CPU, SQLite's included"
        if args.backend == "sqlite"
        else ("this process's CPU only: PostgreSQL's is in its server")
    )
    table = Table(
        title=f"GET /nodes/map's work ({args.backend}, ms, medians of {args.repeats})",
        caption=f"CPU: {where}",
    )
    table.add_column("cluster, samples per GPU and metric in the window")
    for column in ("window CPU", "latest CPU", "window wall", "latest wall"):
        table.add_column(column, justify="right")
    for label, by_mode in reads.items():
        table.add_row(
            label,
            *(f"{by_mode[mode][kind] * 1000:.1f}" for kind in (0, 1) for mode in (False, True)),
        )
    console.print(table)
    samples = args.nodes * GPUS_PER_NODE * 2
    console.print(
        f"a push of {samples:,} samples (medians of {args.pushes}): ingest "
        f"{ingest['push'] * 1000:.0f} ms CPU ({ingest['wall'] * 1000:.0f} ms wall), of which "
        f"the upsert of gpu_latest_samples {ingest['upsert'] * 1000:.0f} ms CPU"
    )


if __name__ == "__main__":
    main()
