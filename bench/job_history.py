"""The job page's plan history: GET /plans/decisions/history reads the latest plans of a
cluster whose every plan holds one decision per waiting job, and picks out one job's.

Times the service call (the database's JSON functions pick the job's decisions out of
each plan) on SQLite and PostgreSQL, for plans of 1,000, 10,000 and 100,000 decisions,
reading 20 plans (the job page's PLANS_READ) and 50.

    python -m bench.job_history [--decisions 1000 10000 100000] [--dsn "host=… user=…"]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path

from sqlmodel import Session

from app.clusters import service as cluster_service
from app.clusters.models import ClusterCreate
from app.core import migrate
from app.core.db import make_engine
from app.core.lookup import row_id
from app.jobs.models import Job
from app.plans import service as plan_service
from app.plans.models import Plan
from bench.scratch_db import DEFAULT_DSN, scratch_database
from wire.telemetry import SchedulerKind

NOW = datetime(2026, 11, 2, 12, tzinfo=UTC)
PLANS = 50
REPEATS = 3


@contextmanager
def _sqlite() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="shaper-bench-") as scratch:
        url = f"sqlite:///{Path(scratch) / 'shaper.db'}"
        migrate.upgrade(url)
        yield url


def _seed(session: Session, decisions: int) -> int:
    """A cluster with ``PLANS`` plans of ``decisions`` waits each; the id of the job that
    every plan decides about, last (the worst case for a scan)."""
    cluster = cluster_service.register_cluster(
        session=session,
        cluster_in=ClusterCreate(name="alpha", scheduler=SchedulerKind.sim),
        now=NOW,
    )
    job = Job(
        cluster_id=row_id(cluster),
        external_id=f"j{decisions - 1}",
        name="j",
        team="vision",
        queue="default",
        gpus_requested=8,
        updated_at=NOW,
    )
    session.add(job)
    waits = [
        {"job": f"j{i}", "action": "wait", "reason": "insufficient_capacity", "message": "full"}
        for i in range(decisions)
    ]
    for k in range(PLANS):
        session.add(
            Plan(
                cluster_id=row_id(cluster),
                created_at=NOW - timedelta(minutes=k),
                policy="shaper",
                engine="cp-sat",
                mode="advise",
                status="OPTIMAL",
                decisions=waits,
            )
        )
    session.commit()
    return row_id(job)


def _median_ms(call: Callable[[], object]) -> float:
    times = []
    for _ in range(REPEATS):
        started = time.perf_counter()
        call()
        times.append(1000 * (time.perf_counter() - started))
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--decisions", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--dsn", default=DEFAULT_DSN)
    args = parser.parse_args()
    backends: dict[str, Callable[[], AbstractContextManager[str]]] = {
        "sqlite": _sqlite,
        "postgres": partial(scratch_database, args.dsn, "shaper_bench_job_history"),
    }
    print("backend   decisions/plan  20 plans (ms)  50 plans (ms)")
    for backend, database in backends.items():
        for decisions in args.decisions:
            with database() as url:
                engine = make_engine(url)
                with Session(engine) as session:
                    job_id = _seed(session, decisions)
                    read = partial(
                        plan_service.job_decision_history, session=session, job_id=job_id
                    )
                    assert len(read(plans=PLANS)) == PLANS
                    twenty = _median_ms(partial(read, plans=20))
                    fifty = _median_ms(partial(read, plans=PLANS))
                print(f"{backend:<9} {decisions:>14,} {twenty:>14.0f} {fifty:>14.0f}")
                engine.dispose()


if __name__ == "__main__":
    main()
