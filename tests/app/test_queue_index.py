"""The dashboard's reads of ``GET /jobs`` at 100,000 jobs (issue 18), checked on the
statements the service runs, with SQLite's query plan: the queue page's waiting jobs
(``state=pending&sort=submit_time``, web/frontend/src/queue.ts) are read in order from
``ix_jobs_state_submit_time_id``, without sorting every waiting job (325 → 0.2 ms of
SQLite's time at 87,655 pending jobs); the Forecasts page's question whether any elastic
job exists (``shape=elastic&limit=1&sort=team``, forecasts.ts) picks them out of
``ix_jobs_state_demand`` instead of walking every job's row in the default order (145 →
13 ms of CPU with none elastic)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlmodel import Session

from app.core import migrate
from app.core.db import make_engine
from app.gpu_models import service as gpu_model_service
from app.jobs import service as job_service
from tests.app.builders import job, node, registered_with, running, snapshot

NOW = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)


def _page_plan(url: str, **query: Any) -> tuple[list[str], list[str], list[str]]:
    """The external ids of ``list_jobs(**query)``, SQLite's plan of its page's SELECT and
    of its count."""
    engine = make_engine(url)
    statements: list[tuple[str, Any]] = []

    def note(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        statements.append((statement, parameters))

    try:
        with Session(engine) as session:
            sa.event.listen(engine, "before_cursor_execute", note)
            try:
                page = job_service.list_jobs(session=session, **query)
            finally:
                sa.event.remove(engine, "before_cursor_execute", note)
            [page_read] = [
                s for s in statements if "ORDER BY" in s[0] and "FROM jobs JOIN clusters" in s[0]
            ]
            [count] = [s for s in statements if "count(*)" in s[0]]
            plans = [
                [
                    str(row[-1])
                    for row in session.connection().exec_driver_sql(
                        f"EXPLAIN QUERY PLAN {statement}", parameters
                    )
                ]
                for statement, parameters in (page_read, count)
            ]
    finally:
        engine.dispose()
    return [item["external_id"] for item in page["items"]], plans[0], plans[1]


def test_the_queue_s_waiting_jobs_are_read_in_order_from_the_index(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'queue.db'}"
    migrate.upgrade(url)
    waiting = [
        job(f"w{i}", submit_time=(NOW - timedelta(minutes=(i * 37) % 101)).isoformat())
        for i in range(101)
    ]
    jobs = [
        *waiting,
        running("r1", "n1", [0, 1], submit_time=(NOW - timedelta(hours=3)).isoformat()),
    ]
    engine = make_engine(url)
    with Session(engine) as session:
        gpu_model_service.ensure_default_catalogue(session=session)
        registered_with(session, "alpha", snapshot(1, nodes=[node("n1")], jobs=jobs), now=NOW)
    engine.dispose()

    ids, plan, _ = _page_plan(url, state="pending", sort="submit_time", limit=50, offset=0)
    assert any("ix_jobs_state_submit_time_id" in step for step in plan), plan
    assert not any("TEMP B-TREE" in step for step in plan), plan
    # Longest waiting first: submitted 100, 99, ... minutes before NOW.
    by_age = sorted(waiting, key=lambda j: j["submit_time"])
    assert ids == [j["external_id"] for j in by_age[:50]]

    # A later page, and one of a cluster and team, from the index too.
    ids, plan, _ = _page_plan(url, state="pending", sort="submit_time", limit=50, offset=50)
    assert ids == [j["external_id"] for j in by_age[50:100]]
    assert not any("TEMP B-TREE" in step for step in plan), plan
    ids, plan, _ = _page_plan(
        url, state="pending", sort="submit_time", limit=50, cluster="alpha", team="vision"
    )
    assert ids == [j["external_id"] for j in by_age[:50]]
    assert not any("TEMP B-TREE" in step for step in plan), plan


def test_the_forecasts_page_s_elastic_count_is_read_from_the_demand_index(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'shapes.db'}"
    migrate.upgrade(url)
    blocks = [job(f"b{i}", priority=i % 7) for i in range(30)]
    service = job("svc", shape="elastic", min_replicas=1, max_replicas=4, replicas=1)
    engine = make_engine(url)
    with Session(engine) as session:
        gpu_model_service.ensure_default_catalogue(session=session)
        registered_with(session, "alpha", snapshot(1, jobs=blocks), now=NOW)
        registered_with(session, "beta", snapshot(1, jobs=[service]), now=NOW)
    engine.dispose()

    for cluster, expected in ((None, ["svc"]), ("beta", ["svc"]), ("alpha", [])):
        where = {"cluster": cluster} if cluster else {}
        ids, plan, _ = _page_plan(url, shape="elastic", limit=1, sort="team", **where)
        assert ids == expected
        assert not any("ix_jobs_priority_submit_time_id" in step for step in plan), plan
        # Of every cluster: from the demand index (a cluster's: its jobs, from its index).
        assert cluster or any("ix_jobs_state_demand" in step for step in plan), plan
    # In the default order the page of one walks every job's row in priority order.
    _, plan, _ = _page_plan(url, shape="elastic", limit=1)
    assert any("SCAN jobs USING INDEX ix_jobs_priority_submit_time_id" in s for s in plan), plan
