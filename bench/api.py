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

Prints p50/p95/p99 latency (ms), requests/s and the count of failed requests (a non-2xx
answer or a dropped connection) per endpoint per backend, and the load average beside
them (the generator shares the machine).

``--fleet issue`` measures what issue 13 asks, each figure beside its target: 32 clusters ×
200 nodes × 8 GPUs and 64,000 jobs (2,000 a cluster), a history of closed allocations and
``gpu_util`` samples (one a node every ``--sample-s``) behind them, 32 clients, PostgreSQL.
The history's allocations belong to the fleet's own jobs (earlier runs of jobs requeued
since): only their count and spread matter to the queries. ``GET /healthz`` (no token, no
database) is the harness's own ceiling: the generator shares the CPUs with the server.

    python -m bench.api [--nodes 200] [--jobs 2000] [--clients 8] [--seconds 5]
    python -m bench.api --fleet issue [--history-days 1] [--sample-s 300]
    python -m bench.api --fleet issue --cpu --database shaper_bench_issue [--root DIR]
    python -m bench.api --mixed [--connectors 10 25 50 100] [--push-every 5] [--delta-nodes 1000]
        [--readers 200] [--seconds 60] [--backends postgres sqlite]

``--cpu`` measures what the server itself spends per request, which does not depend on
how many cores the load generator takes: one uvicorn worker, ``--clients`` (default 4)
clients per endpoint, the CPU time of the worker process (user + system, from
``/proc``) ÷ requests. ``--database NAME`` keeps the seeded PostgreSQL database between
runs (seeded when it does not exist yet, reused as it is otherwise), and ``--root DIR``
serves the application from another checkout (the tree before a change), so two trees
can be measured back to back against the same rows.

``--mixed`` (bench/fleet_load.py) is the issue's mixed load: connectors pushing node
deltas on a cadence while dashboard clients read, every sequence number accounted for.

The 30-day utilization window reads whatever history was seeded: with the issue's 24 h it
is a lower bound of the real thing (``--history-days 30`` seeds the month: 30× the rows,
55 million samples at ``--sample-s 300``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import psycopg
from rich.console import Console
from rich.progress import Progress
from rich.table import Table
from sqlmodel import Session, select

from app.actions.models import Action, ActionKind
from app.clusters import service as cluster_service
from app.clusters.models import Cluster, ClusterCreate
from app.core import migrate
from app.core.bulk import insert_tuples
from app.core.db import make_engine
from app.gpu_models import service as gpu_model_service
from app.jobs.models import Allocation, Job
from app.nodes.models import Node
from app.plans.models import Plan, PlanState
from app.telemetry import service as telemetry_service
from app.telemetry.models import TelemetrySample
from app.tokens import service as token_service
from app.tokens.models import ApiTokenCreate
from app.utilization import fold
from bench.ingest import NOW, make_snapshot
from bench.scratch_db import DEFAULT_DSN, scratch_database

CLUSTER = "bench"
_30_DAYS = (NOW - timedelta(days=30)).isoformat().replace("+00:00", "Z")
READS = {
    "GET /healthz (no token, no database)": "/healthz",
    "GET /clusters": "/api/v1/clusters",
    "GET /jobs?limit=100": "/api/v1/jobs?limit=100",
    "GET /nodes?limit=100": "/api/v1/nodes?limit=100",
    "GET /utilization (24 h)": "/api/v1/utilization",
    "GET /utilization (30 d, 6 h buckets)": f"/api/v1/utilization?since={_30_DAYS}&bucket_s=21600",
    "GET /plans": "/api/v1/plans",
    "GET /actions": "/api/v1/actions",
}
PUSH = "POST telemetry delta (1 client)"


@dataclass(frozen=True)
class Target:
    """Issue 13's figure for an endpoint (PostgreSQL, 2 workers, 32 clients)."""

    text: str
    min_per_second: float | None = None
    max_p50_ms: float | None = None
    max_p99_ms: float | None = None

    def met(self, figures: Figures) -> bool:
        return (
            (self.min_per_second is None or figures.per_second >= self.min_per_second)
            and (self.max_p50_ms is None or figures.percentile(50) <= self.max_p50_ms)
            and (self.max_p99_ms is None or figures.percentile(99) <= self.max_p99_ms)
        )


TARGETS = {
    "GET /clusters": Target("≥ 1,000 req/s", min_per_second=1000),
    "GET /jobs?limit=100": Target("≥ 300 req/s, p99 ≤ 100 ms", 300, max_p99_ms=100),
    # "≤ 50 ms" read as the median: the issue names no percentile.
    "GET /utilization (24 h)": Target("p50 ≤ 50 ms", max_p50_ms=50),
    "GET /utilization (30 d, 6 h buckets)": Target("p50 ≤ 200 ms", max_p50_ms=200),
}


@dataclass(frozen=True)
class Fleet:
    clusters: int
    nodes: int  # per cluster
    jobs: int  # per cluster
    history_days: float
    sample_s: int  # one gpu_util sample a node every sample_s over the history; 0: none


# Issue 13's fleet: 32 × 200 nodes × 8 GPUs = 51,200 GPUs, 64,000 jobs.
ISSUE_FLEET = Fleet(clusters=32, nodes=200, jobs=2000, history_days=1, sample_s=300)


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


def cluster_name(index: int) -> str:
    return CLUSTER if index == 0 else f"{CLUSTER}-{index:02d}"


def seed_cluster(session: Session, name: str, snapshot: dict[str, Any], now: datetime) -> None:
    """Register cluster ``name`` and ingest ``snapshot`` as its connector's first push."""
    cluster_service.register_cluster(session=session, cluster_in=ClusterCreate(name=name), now=now)
    push = telemetry_service.parse_push(json.dumps(snapshot).encode())
    telemetry_service.ingest(session=session, cluster_name=name, push=push, now=now)


def seed(url: str, fleet: Fleet, n_plans: int) -> tuple[str, str]:
    """The fleet, its history and plans in ``url``; returns (viewer token, connector token)."""
    engine = make_engine(url)
    try:
        with Session(engine, expire_on_commit=False) as session:
            gpu_model_service.ensure_default_catalogue(session=session)
            for index in range(fleet.clusters):
                snapshot = make_snapshot(fleet.nodes, fleet.jobs, seed=1 + index)
                seed_cluster(session, cluster_name(index), snapshot, NOW)
            seed_history(session, fleet)
            # What the beat's folder does every 10 s in a deployment (no worker runs
            # here): left as deltas, the history's roll-up would be read from them.
            while fold.fold_deltas(session=session):
                pass
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


def seed_history(session: Session, fleet: Fleet) -> None:
    """Closed allocations back to ``history_days`` before NOW, one run after another on
    each node's two halves (4 GPUs each, 1–6 h runs), and a ``gpu_util`` sample a node
    every ``sample_s``. Written with COPY on PostgreSQL."""
    if fleet.history_days <= 0:
        return
    rng = random.Random(3)
    start = NOW - timedelta(days=fleet.history_days)
    nodes = session.execute(select(Node.id, Node.cluster_id)).all()
    jobs_by_cluster: dict[int, list[int]] = {}
    for job_id, cluster_id in session.execute(select(Job.id, Job.cluster_id)):
        jobs_by_cluster.setdefault(cluster_id, []).append(job_id)

    def allocations() -> Iterator[tuple[object, ...]]:
        for node_id, cluster_id in nodes:
            jobs = jobs_by_cluster[cluster_id]
            for half in (0, 1):
                at = start + timedelta(minutes=rng.randrange(60))
                while True:
                    end = at + timedelta(minutes=rng.randrange(60, 360))
                    if end >= NOW:
                        break
                    indices = json.dumps(list(range(4 * half, 4 * half + 4)))
                    yield (rng.choice(jobs), node_id, indices, 4, at, end)
                    at = end

    insert_tuples(
        session,
        Allocation.__table__,  # type: ignore[attr-defined]
        ["job_id", "node_id", "gpu_indices", "gpu_count", "started_at", "released_at"],
        allocations(),
    )
    if fleet.sample_s > 0:
        steps = int(fleet.history_days * 86400 // fleet.sample_s)

        def samples() -> Iterator[tuple[object, ...]]:
            for node_id, cluster_id in nodes:
                for step in range(steps):
                    at = start + timedelta(seconds=step * fleet.sample_s)
                    yield (cluster_id, at, "gpu_util", rng.random(), node_id)

        insert_tuples(
            session,
            TelemetrySample.__table__,  # type: ignore[attr-defined]
            ["cluster_id", "at", "metric", "value", "node_id"],
            samples(),
        )
    session.commit()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class Server:
    base: str
    pid: int  # with one worker, the process that serves the requests

    def cpu_s(self) -> float:
        """User + system CPU time of the server's process so far (Linux ``/proc``)."""
        stat = Path(f"/proc/{self.pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2 :].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@contextmanager
def serving(url: str, workers: int, root: Path | None = None) -> Iterator[Server]:
    """The application under uvicorn on ``url``'s database, in another process; from the
    checkout ``root`` if given (this one otherwise)."""
    port = _free_port()
    env = {**os.environ, "SHAPER_DATABASE_URL": url, "SHAPER_LOG_LEVEL": "WARNING"}
    if root is not None:
        env["PYTHONPATH"] = str(root)
    server = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "app.main:create_app", "--factory",
         "--host", "127.0.0.1", "--port", str(port), "--workers", str(workers),
         "--log-level", "warning", "--no-access-log"],
        env=env, cwd=root, start_new_session=True,
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
        yield Server(base, server.pid)
    finally:
        server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            # Still working through requests whose clients gave up (an overloaded run):
            # its workers too, all at once; what they had not committed is rolled back.
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=30)


@contextmanager
def served(url: str, workers: int, root: Path | None = None) -> Iterator[str]:
    """The base URL of :func:`serving`."""
    with serving(url, workers, root) as server:
        yield server.base


def hammer(base: str, path: str, token: str, clients: int, seconds: float) -> Figures:
    """``clients`` threads, each with its own keep-alive connection, for ``seconds``."""
    figures = Figures()
    lock = threading.Lock()
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=base, headers=headers, timeout=60) as warm:
        for _ in range(2):  # the first request pays for imports and caches (each worker)
            warm.get(path)
    deadline = time.perf_counter() + seconds

    def client() -> None:
        mine: list[float] = []
        bad = 0
        with httpx.Client(base_url=base, headers=headers, timeout=60) as http:
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                try:
                    status = http.get(path).status_code
                except httpx.TransportError:  # a dropped connection counts as a failure
                    status = 0
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


def push_deltas(
    base: str, token: str, n_nodes: int, n_jobs: int, seconds: float, last_seq: int = 1
) -> Figures:
    """Deltas of the seeded session, from ``last_seq`` + 1 (a kept database: its last)."""
    figures = Figures()
    rng = random.Random(7)
    headers = {"Authorization": f"Bearer {token}"}
    seq = last_seq
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


def cpu_per_request(
    server: Server, path: str, token: str, clients: int, seconds: float
) -> tuple[float, Figures]:
    """ms of the server process' CPU per request of ``path``, over a :func:`hammer` run."""
    with httpx.Client(base_url=server.base, timeout=60) as warm:  # imports, caches, plans
        for _ in range(20):
            warm.get(path, headers={"Authorization": f"Bearer {token}"})
    before = server.cpu_s()
    figures = hammer(server.base, path, token, clients, seconds)
    used = server.cpu_s() - before
    # hammer's own warm-up requests ran inside the measured span: counted as requests.
    requests = len(figures.latencies_s) + 2
    return used / requests * 1000, figures


@contextmanager
def kept_database(dsn: str, name: str, fleet: Fleet, n_plans: int) -> Iterator[tuple[str, str]]:
    """PostgreSQL database ``name``, seeded with ``fleet`` when it does not exist yet (and
    kept), as it is otherwise; yields its URL and a new viewer token."""
    params = dict(p.split("=", 1) for p in dsn.split())
    url = (
        f"postgresql+psycopg://{params.get('user', 'postgres')}@{params.get('host', '127.0.0.1')}"
        f":{params.get('port', '5432')}/{name}"
    )
    with psycopg.connect(dsn, autocommit=True) as admin:
        exists = admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name]).fetchone()
        if not exists:
            admin.execute(f'CREATE DATABASE "{name}"')
    if not exists:
        try:
            migrate.upgrade(url)
            viewer, _ = seed(url, fleet, n_plans)
        except BaseException:
            with psycopg.connect(dsn, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            raise
        yield url, viewer
        return
    engine = make_engine(url)
    try:
        with Session(engine) as session:
            token_in = ApiTokenCreate(name="viewer", scopes=["viewer"])
            viewer = token_service.create_token(session=session, token_in=token_in, now=NOW).token
    finally:
        engine.dispose()
    yield url, viewer


def connector_token(url: str) -> tuple[str, int]:
    """A new token of the benchmark cluster's connector in ``url``'s database, and the
    last seq its connector pushed (the deltas go on from there)."""
    engine = make_engine(url)
    try:
        with Session(engine) as session:
            token_in = ApiTokenCreate(name="connector", scopes=[f"connector:{CLUSTER}"])
            token = token_service.create_token(session=session, token_in=token_in, now=NOW).token
            cluster = session.exec(select(Cluster).where(Cluster.name == CLUSTER)).one()
            return token, cluster.last_seq or 1
    finally:
        engine.dispose()


CPU_READS = ("GET /healthz (no token, no database)", "GET /clusters", "GET /jobs?limit=100")


def main_cpu(args: argparse.Namespace, fleet: Fleet, console: Console) -> None:
    if args.database:
        database: AbstractContextManager[tuple[str, str]] = kept_database(
            args.dsn, args.database, fleet, args.plans
        )
    else:
        database = _seeded(partial(scratch_database, args.dsn, "shaper_bench_api"), fleet, args)
    labels = [label for label in READS if any(e in label for e in args.endpoints)]
    clients = args.clients or 4
    table = Table(
        title=f"Server CPU per request: one uvicorn worker, {clients} clients, "
        f"{args.seconds:g} s an endpoint, PostgreSQL; {fleet.clusters} cluster(s) × "
        f"{fleet.nodes} nodes, {fleet.clusters * fleet.jobs:,} jobs"
        + (f"; served from {args.root}" if args.root else "")
    )
    for column in ("endpoint", "CPU ms/request", "req/s", "p50 ms", "failed", "load"):
        table.add_column(column, justify="left" if column == "endpoint" else "right")
    with database as (url, viewer), serving(url, 1, args.root) as server:
        for label in labels:
            cpu_ms, f = cpu_per_request(server, READS[label], viewer, clients, args.seconds)
            table.add_row(
                label, f"{cpu_ms:.2f}", f"{f.per_second:,.0f}", f"{f.percentile(50):.1f}",
                str(f.non_2xx), f"{f.load_average:.1f}",
            )  # fmt: skip
    console.print(table)


@contextmanager
def _seeded(
    database: Callable[[], AbstractContextManager[str]], fleet: Fleet, args: argparse.Namespace
) -> Iterator[tuple[str, str]]:
    with database() as url:
        viewer, _ = seed(url, fleet, args.plans)
        yield url, viewer


@contextmanager
def sqlite_database() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="shaper-bench-") as scratch:
        url = f"sqlite:///{Path(scratch) / 'shaper.db'}"
        migrate.upgrade(url)
        yield url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--fleet",
        choices=["quick", "issue"],
        default="quick",
        help="issue: 32 clusters, 64,000 jobs, 24 h of history, 32 clients, PostgreSQL",
    )
    parser.add_argument("--clusters", type=int, help="default 1 (issue: 32)")
    parser.add_argument("--nodes", type=int, default=200, help="per cluster")
    parser.add_argument("--jobs", type=int, default=2000, help="per cluster")
    parser.add_argument("--history-days", type=float, help="default 0 (issue: 1)")
    parser.add_argument("--sample-s", type=int, help="default 0: no samples (issue: 300)")
    parser.add_argument("--plans", type=int, default=50)
    parser.add_argument("--clients", type=int, help="concurrent readers (default 8; issue: 32)")
    parser.add_argument(
        "--seconds", type=float, help="per endpoint and backend (default 5; --mixed: 60)"
    )
    parser.add_argument("--workers", type=int, default=2, help="uvicorn worker processes")
    parser.add_argument("--dsn", default=DEFAULT_DSN, help="PostgreSQL server (admin DSN)")
    parser.add_argument("--backends", nargs="+", help="default sqlite postgres (issue: postgres)")
    parser.add_argument(
        "--cpu", action="store_true", help="server CPU per request (one worker; PostgreSQL)"
    )
    parser.add_argument(
        "--endpoints", nargs="+", default=list(CPU_READS), help="--cpu: labels (or parts)"
    )
    parser.add_argument("--database", help="keep the seeded PostgreSQL database of this name")
    parser.add_argument("--root", type=Path, help="serve the application from this checkout")
    from bench import fleet_load  # imports this module: here, not at the top

    fleet_load.add_arguments(parser)
    args = parser.parse_args()
    console = Console(width=max(Console().width, 150))
    if args.mixed:
        args.seconds = args.seconds or 60.0
        fleet_load.main_mixed(args, console)
        return
    args.seconds = args.seconds or 5.0
    issue = args.fleet == "issue"
    base_fleet = ISSUE_FLEET if issue else Fleet(1, args.nodes, args.jobs, 0, 0)
    fleet = Fleet(
        clusters=args.clusters or base_fleet.clusters,
        nodes=args.nodes,
        jobs=args.jobs,
        history_days=base_fleet.history_days if args.history_days is None else args.history_days,
        sample_s=base_fleet.sample_s if args.sample_s is None else args.sample_s,
    )
    if args.cpu:
        main_cpu(args, fleet, console)
        return
    args.clients = args.clients or (32 if issue else 8)
    args.backends = args.backends or (["postgres"] if issue else ["sqlite", "postgres"])
    results: dict[str, dict[str, Figures]] = {}
    databases: dict[str, Callable[[], AbstractContextManager[str]]] = {
        "sqlite": sqlite_database,
        "postgres": partial(scratch_database, args.dsn, "shaper_bench_api"),
    }
    steps = len(args.backends) * (len(READS) + 2)
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("benchmark", total=steps)
        for backend in args.backends:
            with ExitStack() as stack:
                progress.update(task, description=f"{backend}: seeding")
                if backend == "postgres" and args.database:
                    url, viewer = stack.enter_context(
                        kept_database(args.dsn, args.database, fleet, args.plans)
                    )
                    connector, last_seq = connector_token(url)
                else:
                    url = stack.enter_context(databases[backend]())
                    viewer, connector = seed(url, fleet, args.plans)
                    last_seq = 1
                progress.advance(task)
                with served(url, args.workers, args.root) as base:
                    figures: dict[str, Figures] = {}
                    for label, path in READS.items():
                        progress.update(task, description=f"{backend}: {label}")
                        figures[label] = hammer(base, path, viewer, args.clients, args.seconds)
                        progress.advance(task)
                    progress.update(task, description=f"{backend}: {PUSH}")
                    figures[PUSH] = push_deltas(
                        base, connector, args.nodes, args.jobs, args.seconds, last_seq
                    )
                    progress.advance(task)
                results[backend] = figures

    history = (
        f"{fleet.history_days:g} d of history"
        + (f", a sample a node every {fleet.sample_s} s" if fleet.sample_s else "")
        if fleet.history_days
        else "no history"
    )
    table = Table(
        title=f"API latency: {fleet.clusters} cluster(s) × {fleet.nodes} nodes × 8 GPUs, "
        f"{fleet.clusters * fleet.jobs:,} jobs, {history}, {args.plans} plans; "
        f"{args.clients} clients, {args.workers} uvicorn workers, {args.seconds:g} s each"
    )
    # The issue's targets are for its fleet: beside other figures they would mislead.
    targets = TARGETS if issue else {}
    table.add_column("endpoint")
    if targets:
        table.add_column("target (issue 13)")
    for backend in results:
        for column in ("p50/p95/p99 ms", "req/s", "failed", "load", "met")[: 5 if targets else 4]:
            table.add_column(f"{backend}\n{column}", justify="right")
    for label in [*READS, PUSH]:
        target = targets.get(label)
        row = [label, target.text if target else ""] if targets else [label]
        for backend in results:
            f = results[backend][label]
            row += [
                f"{f.percentile(50):.0f} / {f.percentile(95):.0f} / {f.percentile(99):.0f}",
                f"{f.per_second:,.0f}",
                str(f.non_2xx),
                f"{f.load_average:.1f}",
            ]
            if targets:
                row.append("" if target is None else ("yes" if target.met(f) else "no"))
        table.add_row(*row)
    console.print(table)
    bad = sum(f.non_2xx for figures in results.values() for f in figures.values())
    console.print(
        f"failed (non-2xx answers or dropped connections): {bad} (expected 0); "
        f"CPUs: {os.cpu_count()}"
    )


if __name__ == "__main__":
    main()
