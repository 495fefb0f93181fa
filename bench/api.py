"""API latency benchmark: the main read endpoints and a telemetry push, on the embedded
default (SQLite) and on PostgreSQL, side by side in one run.

For each backend: a fresh database migrated to head and seeded with one fleet (the
snapshot ``bench.ingest`` builds: ``--nodes`` × 8 GPUs, ``--jobs`` jobs, 80 % of those that
fit running) plus ``--plans`` proposed plans of four actions each; then the real
application is served by uvicorn in a process of its own (``--workers``), and this
process, the load generator, runs ``--clients`` concurrent clients against each endpoint
for ``--seconds``. Telemetry pushes are deltas (one job's priority changed, seq + 1) from a
single client: the fencing contract allows one live connector session per cluster, whose
pushes are ordered.

Prints p50/p95/p99 latency (ms), requests/s and the count of non-2xx answers per endpoint
per backend, and the load average beside them (the generator shares the machine).

    python -m bench.api [--nodes 200] [--jobs 2000] [--clients 8] [--seconds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import httpx
from rich.console import Console
from rich.progress import Progress
from rich.table import Table
from sqlmodel import Session, select

from app.actions.models import Action, ActionKind
from app.clusters import service as cluster_service
from app.clusters.models import Cluster, ClusterCreate
from app.core import migrate
from app.core.db import make_engine
from app.gpu_models import service as gpu_model_service
from app.plans.models import Plan, PlanState
from app.telemetry import service as telemetry_service
from app.tokens import service as token_service
from app.tokens.models import ApiTokenCreate
from bench.ingest import NOW, make_snapshot
from bench.scratch_db import DEFAULT_DSN, scratch_database

CLUSTER = "bench"
READS = {
    "GET /jobs?limit=100": "/api/v1/jobs?limit=100",
    "GET /nodes?limit=100": "/api/v1/nodes?limit=100",
    "GET /utilization (24 h)": "/api/v1/utilization",
    "GET /plans": "/api/v1/plans",
    "GET /actions": "/api/v1/actions",
}
PUSH = "POST telemetry delta (1 client)"


@dataclass
class Figures:
    latencies_s: list[float] = field(default_factory=list)
    non_2xx: int = 0
    wall_s: float = 0.0
    load_average: float = 0.0

    def percentile(self, p: float) -> float:
        ordered = sorted(self.latencies_s)
        return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))] * 1000

    @property
    def per_second(self) -> float:
        return len(self.latencies_s) / self.wall_s if self.wall_s else 0.0


def seed(url: str, n_nodes: int, n_jobs: int, n_plans: int) -> tuple[str, str]:
    """The fleet and plans in ``url``; returns (viewer token, connector token)."""
    engine = make_engine(url)
    try:
        with Session(engine, expire_on_commit=False) as session:
            gpu_model_service.ensure_default_catalogue(session=session)
            cluster_service.register_cluster(
                session=session, cluster_in=ClusterCreate(name=CLUSTER), now=NOW
            )
            push = telemetry_service.parse_push(
                json.dumps(make_snapshot(n_nodes, n_jobs, seed=1)).encode()
            )
            telemetry_service.ingest(session=session, cluster_name=CLUSTER, push=push, now=NOW)
            cluster = session.exec(select(Cluster).where(Cluster.name == CLUSTER)).one()
            assert cluster.id is not None
            for p in range(n_plans):
                plan = Plan(
                    cluster_id=cluster.id,
                    created_at=NOW,
                    policy="shaper",
                    engine="cp-sat",
                    mode="advise",
                    state=PlanState.proposed,
                    status="OPTIMAL",
                    objective=1.0,
                    best_bound=1.0,
                    gap=0.0,
                    wall_time_s=0.1,
                    decisions=[],
                )
                session.add(plan)
                session.flush()
                for a in range(4):
                    session.add(
                        Action(
                            plan_id=plan.id,
                            cluster_id=cluster.id,
                            kind=ActionKind.migrate,
                            idempotency_key=f"bench-{p}-{a}",
                            reason="bench",
                            source_node="node-00000",
                            target_node="node-00001",
                            created_at=NOW,
                            updated_at=NOW,
                        )
                    )
            session.commit()
            tokens = [
                token_service.create_token(
                    session=session,
                    token_in=ApiTokenCreate(name=name, scopes=[scope]),
                    now=NOW,
                ).token
                for name, scope in (("viewer", "viewer"), ("connector", f"connector:{CLUSTER}"))
            ]
    finally:
        engine.dispose()
    return tokens[0], tokens[1]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def served(url: str, workers: int) -> Iterator[str]:
    """The application under uvicorn on ``url``'s database, in another process."""
    port = _free_port()
    env = {**os.environ, "SHAPER_DATABASE_URL": url, "SHAPER_LOG_LEVEL": "WARNING"}
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "app.main:create_app", "--factory",
         "--host", "127.0.0.1", "--port", str(port), "--workers", str(workers),
         "--log-level", "warning", "--no-access-log"],
        env=env,
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    try:
        for _ in range(200):
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.1)
        else:
            raise RuntimeError("uvicorn did not come up")
        yield base
    finally:
        server.terminate()
        server.wait(timeout=30)


def hammer(base: str, path: str, token: str, clients: int, seconds: float) -> Figures:
    """``clients`` threads, each with its own keep-alive connection, for ``seconds``."""
    figures = Figures()
    lock = threading.Lock()
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=base, headers=headers, timeout=60) as warm:
        warm.get(path)  # the first request pays for imports and caches
    deadline = time.perf_counter() + seconds

    def client() -> None:
        mine: list[float] = []
        bad = 0
        with httpx.Client(base_url=base, headers=headers, timeout=60) as http:
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                status = http.get(path).status_code
                mine.append(time.perf_counter() - started)
                bad += not 200 <= status < 300
        with lock:
            figures.latencies_s += mine
            figures.non_2xx += bad

    started = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    figures.wall_s = time.perf_counter() - started
    figures.load_average = os.getloadavg()[0]
    return figures


def push_deltas(base: str, token: str, n_nodes: int, n_jobs: int, seconds: float) -> Figures:
    figures = Figures()
    rng = random.Random(7)
    headers = {"Authorization": f"Bearer {token}"}
    seq = 1
    deadline = time.perf_counter() + seconds
    started = time.perf_counter()
    # Jobs of the seeded snapshot, replayed with a new priority: valid against physics.
    snapshot_jobs = {j["external_id"]: j for j in make_snapshot(n_nodes, n_jobs, seed=1)["jobs"]}
    ids = list(snapshot_jobs)
    with httpx.Client(base_url=base, headers=headers, timeout=60) as http:
        while time.perf_counter() < deadline:
            seq += 1
            job = dict(snapshot_jobs[ids[rng.randrange(len(ids))]])
            job["priority"] = rng.randint(0, 100)
            body = {"kind": "delta", "connector_session": "bench", "seq": seq, "jobs": [job]}
            t0 = time.perf_counter()
            status = http.post(f"/api/v1/clusters/{CLUSTER}/telemetry", json=body).status_code
            figures.latencies_s.append(time.perf_counter() - t0)
            figures.non_2xx += not 200 <= status < 300
    figures.wall_s = time.perf_counter() - started
    figures.load_average = os.getloadavg()[0]
    return figures


@contextmanager
def sqlite_database() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="shaper-bench-") as scratch:
        url = f"sqlite:///{Path(scratch) / 'shaper.db'}"
        migrate.upgrade(url)
        yield url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--jobs", type=int, default=2000)
    parser.add_argument("--plans", type=int, default=50)
    parser.add_argument("--clients", type=int, default=8, help="concurrent readers")
    parser.add_argument("--seconds", type=float, default=5.0, help="per endpoint and backend")
    parser.add_argument("--workers", type=int, default=2, help="uvicorn worker processes")
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="PostgreSQL server (admin DSN)")
    parser.add_argument("--backends", nargs="+", default=["sqlite", "postgres"])
    args = parser.parse_args()
    console = Console(width=max(Console().width, 150))
    results: dict[str, dict[str, Figures]] = {}
    databases: dict[str, Callable[[], AbstractContextManager[str]]] = {
        "sqlite": sqlite_database,
        "postgres": partial(scratch_database, args.dsn, "shaper_bench_api"),
    }
    steps = len(args.backends) * (len(READS) + 2)
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("benchmark", total=steps)
        for backend in args.backends:
            with databases[backend]() as url:
                progress.update(task, description=f"{backend}: seeding")
                viewer, connector = seed(url, args.nodes, args.jobs, args.plans)
                progress.advance(task)
                with served(url, args.workers) as base:
                    figures: dict[str, Figures] = {}
                    for label, path in READS.items():
                        progress.update(task, description=f"{backend}: {label}")
                        figures[label] = hammer(base, path, viewer, args.clients, args.seconds)
                        progress.advance(task)
                    progress.update(task, description=f"{backend}: {PUSH}")
                    figures[PUSH] = push_deltas(
                        base, connector, args.nodes, args.jobs, args.seconds
                    )
                    progress.advance(task)
                results[backend] = figures

    table = Table(
        title=f"API latency: {args.nodes} nodes × 8 GPUs, {args.jobs} jobs, {args.plans} plans; "
        f"{args.clients} clients, {args.workers} uvicorn workers, {args.seconds:g} s each"
    )
    table.add_column("endpoint")
    for backend in results:
        for column in ("p50/p95/p99 ms", "req/s", "non-2xx", "load"):
            table.add_column(f"{backend}\n{column}", justify="right")
    for label in [*READS, PUSH]:
        row = [label]
        for backend in results:
            f = results[backend][label]
            row += [
                f"{f.percentile(50):.0f} / {f.percentile(95):.0f} / {f.percentile(99):.0f}",
                f"{f.per_second:,.0f}",
                str(f.non_2xx),
                f"{f.load_average:.1f}",
            ]
        table.add_row(*row)
    console.print(table)
    bad = sum(f.non_2xx for figures in results.values() for f in figures.values())
    console.print(f"non-2xx answers: {bad} (expected 0); CPUs: {os.cpu_count()}")


if __name__ == "__main__":
    main()
