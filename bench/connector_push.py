"""The real connector process pushing to the real API: what ``bench/connectors.py``
(Kubernetes) and ``bench/slurm_connector.py`` (Slurm) both measure.

``python -m connectors.runner`` runs as its own process against the API on uvicorn (in a
thread of the benchmark) over a scratch PostgreSQL database: the time from the process's
start to the first snapshot stored by the control plane, the latency of a change in the
scheduler until the control plane has the job, and the process's memory (RSS now and its
peak, VmHWM)."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import uvicorn
from sqlalchemy import text
from sqlmodel import Session

from app.clusters import service as cluster_service
from app.clusters.models import ClusterCreate
from app.core.config import Settings
from app.core.db import get_session, make_engine
from app.gpu_models import service as gpu_model_service
from app.main import create_app
from app.tokens import service as token_service
from app.tokens.models import ApiTokenCreate
from bench.scratch_db import scratch_database
from wire.telemetry import SchedulerKind

# The targets (issue 15).
FIRST_SNAPSHOT_TARGET_S = 10.0
CHANGE_P99_TARGET_S = 2.0
MEMORY_TARGET_MIB = 300.0


@contextmanager
def serve(app: Any) -> Iterator[str]:
    """The API on uvicorn in a thread, on a free loopback port."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise SystemExit("the API server did not start")
        time.sleep(0.05)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def memory_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of a process, MiB: now and its peak."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    return fields["VmRSS"], fields["VmHWM"]


def measure_pushed(
    *,
    kind: str,
    cluster: str,
    scheduler: SchedulerKind,
    connector_args: list[str],
    changes: int,
    change: Callable[[int], str],
    dsn: str,
) -> dict[str, Any]:
    """Start ``python -m connectors.runner --kind=KIND --cluster=CLUSTER … connector_args``
    against a fresh API and database; then ``changes`` times ``change(i)`` (which changes
    the scheduler and returns the external id of the job to expect) and wait until the
    control plane stores that job. Returns first_s, jobs (in the first snapshot),
    latencies, rss and hwm (MiB)."""
    with scratch_database(dsn, f"shaper_bench_{kind}_connector") as url:
        engine = make_engine(url)
        now = datetime.now(UTC)
        with Session(engine) as session:
            gpu_model_service.ensure_default_catalogue(session=session)
            cluster_id = cluster_service.register_cluster(
                session=session,
                cluster_in=ClusterCreate(name=cluster, scheduler=scheduler),
                now=now,
            ).id
            token = token_service.create_token(
                session=session,
                token_in=ApiTokenCreate(name="bench", scopes=[f"connector:{cluster}"]),
                now=now,
            ).token

        def scalar(query: str, **params: Any) -> Any:
            with engine.connect() as connection:
                return connection.execute(text(query), params).scalar()

        def job_known(external_id: str) -> bool:
            return bool(
                scalar(
                    "select 1 from jobs where cluster_id = :c and external_id = :e",
                    c=cluster_id,
                    e=external_id,
                )
            )

        app = create_app(Settings(database_url=url))

        def session_override() -> Iterator[Session]:
            # The app's sessions on the scratch database, as bench/ingest.py does.
            with Session(engine, expire_on_commit=False) as session:
                yield session

        app.dependency_overrides[get_session] = session_override
        with serve(app) as api_url:
            started = time.monotonic()
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "connectors.runner",
                    f"--kind={kind}",
                    f"--cluster={cluster}",
                    f"--control-plane={api_url}",
                    *connector_args,
                ],
                env={**os.environ, "SHAPER_CONNECTOR_TOKEN": token},
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            try:
                while scalar("select last_seq from clusters where id = :c", c=cluster_id) is None:
                    if process.poll() is not None:
                        stderr = process.stderr.read() if process.stderr else ""
                        raise SystemExit(f"the connector exited:\n{stderr[-3000:]}")
                    if time.monotonic() - started > 120:
                        raise SystemExit("no snapshot reached the control plane in 120 s")
                    time.sleep(0.05)
                first_s = time.monotonic() - started
                jobs = scalar("select count(*) from jobs where cluster_id = :c", c=cluster_id)
                latencies: list[float] = []
                for i in range(changes):
                    sent = time.monotonic()
                    external_id = change(i)
                    while not job_known(external_id):
                        if time.monotonic() - sent > 30:
                            raise SystemExit(
                                f"{external_id} did not reach the control plane in 30 s"
                            )
                        time.sleep(0.02)
                    latencies.append(time.monotonic() - sent)
                rss, hwm = memory_mib(process.pid)
            finally:
                process.terminate()
                try:
                    process.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    process.kill()
        engine.dispose()
    return {"first_s": first_s, "jobs": jobs, "latencies": latencies, "rss": rss, "hwm": hwm}


def p99(values: list[float]) -> float:
    return (
        statistics.quantiles(values, n=100, method="inclusive")[98]
        if len(values) > 1
        else values[0]
    )


def verdict(value: float, target: float) -> str:
    return "met" if value <= target else "NOT met"
