"""A real Celery worker process, a real Redis broker and a real PostgreSQL database."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import redis
from celery import Celery
from sqlmodel import Session, select

from app.clusters.models import Cluster, ConnectorStatus
from app.core import migrate
from app.core.config import Settings
from app.core.db import make_engine
from app.worker import InProcessBeat, make_celery

BROKER = os.environ.get("SHAPER_TEST_REDIS_URL", "redis://127.0.0.1:6379/15")


def test_periodic_task_runs_on_a_real_worker(make_postgres_database: Any, tmp_path: Path) -> None:
    redis.Redis.from_url(BROKER).flushdb()
    url = make_postgres_database("celery")
    migrate.upgrade(url)
    engine = make_engine(url)
    now = datetime.now(UTC)
    with Session(engine) as session:
        for name, seen in (("quiet", now - timedelta(minutes=10)), ("live", now)):
            session.add(
                Cluster(
                    name=name,
                    connector_status=ConnectorStatus.connected,
                    last_seen_at=seen,
                    created_at=now,
                )
            )
        session.commit()

    env = {**os.environ, "SHAPER_DATABASE_URL": url, "SHAPER_BROKER_URL": BROKER}
    log = (tmp_path / "worker.log").open("w")
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "app.worker",
            "worker",
            "-Q",
            "control",
            "--pool",
            "solo",
            "--without-heartbeat",
            "--without-gossip",
            "--without-mingle",
        ],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        client = Celery(broker=BROKER)
        client.send_task("app.telemetry.tasks.mark_stale_connectors", queue="control")
        deadline = time.monotonic() + 60
        statuses: dict[str, str] = {}
        while time.monotonic() < deadline:
            with Session(engine) as session:
                statuses = {c.name: c.connector_status for c in session.exec(select(Cluster))}
            if statuses["quiet"] == ConnectorStatus.stale:
                break
            assert worker.poll() is None, (tmp_path / "worker.log").read_text()
            time.sleep(0.3)
        assert statuses == {"quiet": "stale", "live": "connected"}, (
            tmp_path / "worker.log"
        ).read_text()
    finally:
        worker.terminate()
        worker.wait(timeout=30)
        log.close()
        engine.dispose()


def test_embedded_default_runs_tasks_in_process() -> None:
    assert make_celery(Settings(environment="test")).conf.task_always_eager is True
    assert make_celery(Settings(broker_url=BROKER)).conf.task_always_eager is False


def test_in_process_beat_fires_the_schedule() -> None:
    app = make_celery(Settings(environment="test"))
    fired = threading.Event()

    @app.task(name="test.tick")
    def tick() -> None:
        fired.set()

    app.conf.beat_schedule = {"tick": {"task": "test.tick", "schedule": 0.05}}
    beat = InProcessBeat(app)
    beat.start()
    try:
        assert fired.wait(timeout=10)
    finally:
        beat.stop()
        beat.join(timeout=5)
    assert not beat.is_alive()


def test_the_action_sweep_runs_as_often_as_set() -> None:
    """SHAPER_ACTION_SWEEP_PERIOD_S: every 5 s unless told (impatient tests ask for 1 s)."""
    schedule = make_celery(Settings(environment="test")).conf.beat_schedule
    assert schedule["action-sweep"] == {"task": "app.actions.tasks.sweep", "schedule": 5.0}
    faster = make_celery(Settings(environment="test", action_sweep_period_s=1))
    assert faster.conf.beat_schedule["action-sweep"]["schedule"] == 1.0
