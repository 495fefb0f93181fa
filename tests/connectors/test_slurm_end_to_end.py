"""Real Slurm → Slurm connector → runner → the real API on PostgreSQL, over HTTP."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from sqlmodel import Session

from app.clusters import service as cluster_service
from app.clusters.models import ClusterCreate
from app.core import migrate
from app.core.db import make_engine
from app.gpu_models import service as gpu_model_service
from connectors.runner import RunnerConfig, TelemetryRunner
from connectors.slurm.config import SlurmMapping
from tests.connectors.conftest import SlurmCluster
from tests.support.live_server import app_on, free_port, serve, tokens_for

NOW = datetime.now(UTC)


@pytest.fixture(scope="module")
def control_plane(make_postgres_database: Any) -> Iterator[dict[str, Any]]:
    url = make_postgres_database("slurm_e2e")
    migrate.upgrade(url)
    engine = make_engine(url)
    with Session(engine) as session:
        gpu_model_service.ensure_default_catalogue(session=session)
        cluster_service.register_cluster(
            session=session, now=NOW, cluster_in=ClusterCreate(name="hpc-test", scheduler="slurm")
        )
        tokens = tokens_for(session, NOW, ("connector:hpc-test", "viewer"))

    app = app_on(engine)
    yield {"app": app, "tokens": tokens}
    engine.dispose()


def _runner(slurm: SlurmCluster, base: str, token: str) -> TelemetryRunner:
    connector = slurm.connector(mapping=SlurmMapping(gpu_model_aliases={"h100": "H100"}))
    config = RunnerConfig(
        control_plane=base,
        cluster="hpc-test",
        token=token,
        interval_s=0.5,
        backoff_initial_s=0.2,
        backoff_max_s=1.0,
    )
    return TelemetryRunner(connector, config)


def _jobs(base: str, token: str) -> dict[str, dict[str, Any]]:
    response = httpx.get(
        f"{base}/api/v1/jobs",
        params={"cluster": "hpc-test", "limit": 1000},
        headers={"Authorization": f"Bearer {token}"},
    )
    response.raise_for_status()
    return {j["external_id"]: j for j in response.json()["items"]}


def test_slurm_jobs_reach_the_api(slurm: SlurmCluster, control_plane: dict[str, Any]) -> None:
    job_id = slurm.sbatch("--gres=gpu:h100:2", "--comment=shaper:kind=training,priority=70")
    slurm.wait_state(job_id, "RUNNING")
    tokens = control_plane["tokens"]
    with serve(control_plane["app"]) as base:
        runner = _runner(slurm, base, tokens["connector:hpc-test"])
        try:
            assert runner.run_once() is not None
        finally:
            runner.close()
        job = _jobs(base, tokens["viewer"])[job_id]
        nodes = httpx.get(
            f"{base}/api/v1/nodes",
            params={"cluster": "hpc-test"},
            headers={"Authorization": f"Bearer {tokens['viewer']}"},
        ).json()
    squeue = slurm.job(job_id)
    assert job["state"] == "running" and job["kind"] == "training" and job["priority"] == 70
    assert [a["node"] for a in job["allocations"]] == [squeue["nodelist"]]  # one node
    assert sum(len(a["gpu_indices"]) for a in job["allocations"]) == 2
    assert {n["gpu_model"] for n in nodes["items"]} == {"H100"} and nodes["total"] == 3


def test_runner_waits_out_an_unreachable_control_plane(
    slurm: SlurmCluster, control_plane: dict[str, Any]
) -> None:
    """The runner starts while the API is down, backs off, and delivers once it is up."""
    tokens = control_plane["tokens"]
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    job_id = slurm.sbatch("--gres=gpu:h100:1")
    slurm.wait_state(job_id, "RUNNING")
    runner = _runner(slurm, base, tokens["connector:hpc-test"])
    thread = threading.Thread(target=runner.run, daemon=True)
    thread.start()
    try:
        time.sleep(2)  # the API is down: pushes fail and are retried
        assert runner.stats.push_failures >= 1 and runner.stats.snapshots_sent == 0
        with serve(control_plane["app"], port=port):
            deadline = time.monotonic() + 30
            while job_id not in _jobs(base, tokens["viewer"]):
                assert time.monotonic() < deadline, runner.stats
                time.sleep(0.2)
            assert _jobs(base, tokens["viewer"])[job_id]["state"] == "running"
    finally:
        runner.stop()
        thread.join(timeout=15)
        runner.close()
    assert not thread.is_alive()
