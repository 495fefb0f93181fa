"""The Ray connector against a real Ray cluster (tests/support/ray_cluster.py: a head and
two workers with 4 GPUs each by Ray's count): telemetry of a job on a placement group,
pushed through the runner to the real API on PostgreSQL; a low-priority job stopped for
a higher one and submitted again, through the action executor with steps as the saga
sends them; a Serve deployment following a resize step; a node drained through the GCS.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from celery import Celery
from kombu import Connection
from pydantic import ValidationError
from sqlmodel import Session

from app.clusters import service as cluster_service
from app.clusters.models import ClusterCreate
from app.core import migrate
from app.core.db import make_engine
from app.gpu_models import service as gpu_model_service
from connectors import registry
from connectors.actions import ConnectorStepExecutor
from connectors.base import ConnectorError
from connectors.ray import RayConnector
from connectors.runner import RunnerConfig, TelemetryRunner
from tests.connectors.conftest import REPO
from tests.connectors.test_slurm_actions import REPLY_TASK, TOKEN, ConnectorWorker, reply_queue
from tests.support.live_server import app_on, serve, tokens_for
from tests.support.pipeline import RedisServer
from tests.support.ray_cluster import JOBS_DIR, RayCluster, ray_cluster_fixture, wait_for
from wire.steps import Outcome, StepReport, StepRequest
from wire.telemetry import (
    TERMINAL_JOB_STATES,
    ClusterState,
    JobReport,
    JobShape,
    JobState,
    NodeState,
    SchedulerKind,
)

__all__ = ["ray_cluster_fixture"]  # the fixture, found by pytest where it is imported

CLUSTER = "ray-lab"
NOW = datetime.now(UTC)
_actions = itertools.count(1)


@pytest.fixture
def ray(ray_cluster: RayCluster, tmp_path: Path) -> Iterator[RayCluster]:
    """The cluster with no job running, before and after the test."""
    ray_cluster.stop_all_jobs()
    yield ray_cluster
    ray_cluster.stop_all_jobs()


_opened: list[RayConnector] = []


def connector(cluster: RayCluster, state_dir: Path) -> RayConnector:
    """A connector on the test cluster, closed when the test ends."""
    made = registry.create(
        SchedulerKind.ray,
        cluster=CLUSTER,
        dashboard_url=cluster.dashboard_url,
        gcs_address=cluster.gcs_address,
        state_dir=str(state_dir),
    )
    assert isinstance(made, RayConnector)
    _opened.append(made)
    return made


@pytest.fixture(autouse=True)
def _close_connectors() -> Iterator[None]:
    yield
    while _opened:
        _opened.pop().close()


def train(cluster: RayCluster, name: str, *, gpus: float, bundles: int, **metadata: str) -> str:
    """Submit the placement-group job of tests/connectors/data/ray; returns its id."""
    record = cluster.directory / f"{name}.runs"
    return cluster.submit(
        f"{sys.executable} {JOBS_DIR / 'shaper_ray_train.py'} {gpus} {bundles} {record}",
        submission_id=name,
        metadata=metadata,
    )


def job(state: ClusterState, external_id: str) -> JobReport:
    found = {j.external_id: j for j in state.jobs}
    assert external_id in found, sorted(found)
    return found[external_id]


def placed(connector: RayConnector, external_id: str) -> dict[str, int]:
    """GPUs per node of a running job, once Ray has placed all it asked for; {} before."""
    report = job(connector.read_state(), external_id)
    assert report.state not in TERMINAL_JOB_STATES, f"{external_id}: {report.reason}"
    held = {a.node: a.gpus for a in report.allocations}
    if report.state is not JobState.running or sum(held.values()) < report.gpus_requested:
        return {}
    return held


def step(name: str, workload: str, *, key: str | None = None, **args: Any) -> StepRequest:
    """A step as app/actions/messages.py builds it for the connector's queue."""
    return StepRequest.model_validate(
        {
            "action_id": next(_actions),
            "key": key or f"a:{name}:{uuid.uuid4().hex[:8]}",
            "step": name,
            "phase": "forward",
            "workload_id": workload,
            "generation": 1,
            "args": {"source_node": None, "target_node": None, "replicas": 0, **args},
        }
    )


def ok(report: StepReport) -> StepReport:
    assert report.ok, report.error
    return report


# --- telemetry -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def control_plane(make_postgres_database: Any) -> Iterator[dict[str, Any]]:
    url = make_postgres_database("ray_e2e")
    migrate.upgrade(url)
    engine = make_engine(url)
    with Session(engine) as session:
        gpu_model_service.ensure_default_catalogue(session=session)
        cluster_service.register_cluster(
            session=session, now=NOW, cluster_in=ClusterCreate(name=CLUSTER, scheduler="ray")
        )
        tokens = tokens_for(session, NOW, (f"connector:{CLUSTER}", "viewer"))
    yield {"app": app_on(engine), "tokens": tokens}
    engine.dispose()


def test_telemetry_of_a_job_on_a_placement_group_reaches_the_api(
    ray: RayCluster, tmp_path: Path, control_plane: dict[str, Any]
) -> None:
    train(
        ray,
        "pg-train",
        gpus=2,
        bundles=2,
        **{"shaper.io/priority": "40", "shaper.io/kind": "training", "shaper.io/team": "vision"},
    )
    ray_connector = connector(ray, tmp_path)
    # STRICT_SPREAD over two workers: one bundle of 2 GPUs on each.
    assert wait_for("the job's placement group", lambda: placed(ray_connector, "pg-train")) == {
        "ray-w1": 2,
        "ray-w2": 2,
    }
    state = ray_connector.read_state()
    nodes = {n.name: n for n in state.nodes}
    assert set(nodes) == {"ray-head", "ray-w1", "ray-w2"}
    assert (nodes["ray-w1"].gpu_count, nodes["ray-w1"].gpu_model) == (4, "A10")
    assert nodes["ray-w1"].labels["ray.io/node-id"] == ray.node_ids()["ray-w1"]
    assert nodes["ray-head"].gpu_count == 0 and nodes["ray-head"].gpu_model is None
    assert all(n.state is NodeState.up for n in nodes.values())
    report = job(state, "pg-train")
    assert (report.priority, report.kind.value, report.team) == (40, "training", "vision")
    assert report.gpus_requested == 4 and report.restart_count == 0
    assert report.start_time is not None and report.end_time is None

    tokens = control_plane["tokens"]
    with serve(control_plane["app"]) as base:
        runner = TelemetryRunner(
            ray_connector,
            RunnerConfig(control_plane=base, cluster=CLUSTER, token=tokens[f"connector:{CLUSTER}"]),
        )
        try:
            ack = runner.run_once()
        finally:
            runner.close()
        assert ack is not None and ack.nodes_written == 3
        listed = httpx.get(
            f"{base}/api/v1/jobs",
            params={"cluster": CLUSTER},
            headers={"Authorization": f"Bearer {tokens['viewer']}"},
        ).json()["items"]
    stored = {j["external_id"]: j for j in listed}["pg-train"]
    assert stored["state"] == "running" and stored["priority"] == 40
    assert sorted((a["node"], a["gpu_count"]) for a in stored["allocations"]) == [
        ("ray-w1", 2),
        ("ray-w2", 2),
    ]


# --- stop a low-priority job for a higher one, then resubmit it ------------------------------


def test_a_low_priority_job_is_stopped_for_a_higher_one_and_resubmitted(
    ray: RayCluster, tmp_path: Path
) -> None:
    checkpoints = str(tmp_path / "low-checkpoints")
    train(ray, "low", gpus=4, bundles=2, **{"shaper.io/priority": "10",
          "shaper.io/checkpoint-dir": checkpoints})  # fmt: skip
    ray_connector = connector(ray, tmp_path / "connector")
    executor = ConnectorStepExecutor(ray_connector, cluster=CLUSTER, state_dir=tmp_path / "steps")
    wait_for("the low job on every GPU", lambda: placed(ray_connector, "low"))
    train(ray, "high", gpus=2, bundles=2, **{"shaper.io/priority": "90"})
    wait_for(
        "the high job to wait for GPUs",
        lambda: job(ray_connector.read_state(), "high").gpus_requested == 4,
    )
    assert placed(ray_connector, "high") == {}  # its placement group waits: no GPU is free

    # The saga's preemption of a job that no agent checkpoints: requeue (held) → confirm.
    requeue = step("requeue", "low", hold=True)
    report = ok(executor.run(requeue))
    assert report.outcome is Outcome.executed and report.result["held"] is True
    assert ray.job("low")["status"] == "STOPPED"
    ok(executor.run(step("confirm", "low", expect="stopped")))
    low = job(ray_connector.read_state(), "low")
    assert low.state is JobState.pending and low.reason == "held by Shaper until a plan starts it"
    assert wait_for("the high job's GPUs", lambda: placed(ray_connector, "high")) == {
        "ray-w1": 2,
        "ray-w2": 2,
    }

    # A resent requeue is answered from the journal; one reaching a connector that lost
    # its journal finds its own step key and stops nothing again.
    assert executor.run(requeue).outcome is Outcome.duplicate
    amnesiac = ConnectorStepExecutor(ray_connector, cluster=CLUSTER, state_dir=tmp_path / "new")
    ok(amnesiac.run(requeue))

    # The high job is done; the plan starts the low one again: a new submission of the same
    # Shaper job, resuming from the checkpoint directory it declared.
    ok(executor.run(step("cancel", "high")))
    ok(executor.run(step("start", "low", nodes=["ray-w1", "ray-w2"])))
    resubmitted = ray.job("low.r1")
    assert resubmitted["metadata"]["shaper.io/job"] == "low"
    assert resubmitted["metadata"]["shaper.io/step"] == requeue.key
    wait_for("the low job to run again", lambda: placed(ray_connector, "low"))
    ok(executor.run(step("confirm", "low", expect="running", nodes=["ray-w1", "ray-w2"])))
    low = job(ray_connector.read_state(), "low")
    assert low.state is JobState.running and low.restart_count == 1
    runs = wait_for(
        "the resubmitted job to record its start",
        lambda: len(lines := (ray.directory / "low.runs").read_text().splitlines()) == 2 and lines,
    )
    assert runs == ["resumed_from=", f"resumed_from={checkpoints}"]
    # Starting it again changes nothing: it runs.
    ok(executor.run(step("start", "low")))
    assert [j["submission_id"] for j in ray.get("/api/jobs/") if j["status"] == "RUNNING"] == [
        "low.r1"
    ]


def test_steps_ray_cannot_do_are_refused_with_the_reason(ray: RayCluster, tmp_path: Path) -> None:
    ray_connector = connector(ray, tmp_path)
    executor = ConnectorStepExecutor(ray_connector, cluster=CLUSTER, state_dir=tmp_path / "steps")
    pinned = executor.run(step("requeue", "anything", nodes=["ray-w1"]))
    assert (pinned.ok, pinned.retryable) == (False, False)
    assert "cannot be pinned to nodes" in (pinned.error or "")
    assert "not supported yet" in (pinned.error or "")
    suspend = executor.run(step("suspend", "anything"))
    assert suspend.outcome is Outcome.refused and "cannot suspend" in (suspend.error or "")
    resize = executor.run(step("resize", "not-a-service", replicas=2))
    assert "only Ray Serve deployments" in (resize.error or "")
    unknown = executor.run(step("requeue", "no-such-job"))
    assert (unknown.ok, unknown.retryable) == (False, False)
    assert "Ray has no such submitted job" in (unknown.error or "")
    with pytest.raises(ValidationError, match="dashboard_ur"):
        registry.create(SchedulerKind.ray, cluster=CLUSTER, dashboard_ur="http://x")
    down = registry.create(SchedulerKind.ray, cluster=CLUSTER, dashboard_url="http://127.0.0.1:9")
    assert isinstance(down, RayConnector)
    _opened.append(down)
    with pytest.raises(ConnectorError, match="unreachable") as caught:
        down.read_state()
    assert caught.value.retryable


# --- Serve ---------------------------------------------------------------------------------


def deploy_serve(ray: RayCluster, *, replicas: int, external_scaler: bool) -> None:
    config = {
        "proxy_location": "Disabled",  # no HTTP proxy: nothing listens on a fixed port
        "applications": [
            {
                "name": "echo",
                "route_prefix": "/echo",
                "import_path": "shaper_ray_serve:app",
                "external_scaler_enabled": external_scaler,
                "deployments": [{"name": "Echo", "num_replicas": replicas}],
            }
        ],
    }
    response = httpx.put(f"{ray.dashboard_url}/api/serve/applications/", json=config, timeout=60)
    response.raise_for_status()


def replicas(ray_connector: RayConnector) -> tuple[int, int]:
    """The Serve deployment's running replicas and the GPUs they hold."""
    reports = {j.external_id: j for j in ray_connector.read_state().jobs}
    report = reports.get("serve:echo/Echo")
    if report is None:
        return 0, 0  # Serve deploys the application in the background
    assert report.shape is JobShape.elastic
    return report.replicas, sum(a.gpus for a in report.allocations)


def test_a_serve_deployment_follows_a_resize_step(ray: RayCluster, tmp_path: Path) -> None:
    ray_connector = connector(ray, tmp_path)
    executor = ConnectorStepExecutor(ray_connector, cluster=CLUSTER, state_dir=tmp_path / "steps")
    try:
        deploy_serve(ray, replicas=1, external_scaler=False)
        wait_for("one replica", lambda: replicas(ray_connector) == (1, 1), 120)
        refused = executor.run(step("resize", "serve:echo/Echo", replicas=3))
        assert (refused.ok, refused.retryable) == (False, False)
        assert "external_scaler_enabled: true" in (refused.error or "")

        deploy_serve(ray, replicas=1, external_scaler=True)
        ok(executor.run(step("resize", "serve:echo/Echo", replicas=3)))
        wait_for("three replicas", lambda: replicas(ray_connector) == (3, 3), 120)
        ok(executor.run(step("resize", "serve:echo/Echo", replicas=2)))
        wait_for("two replicas", lambda: replicas(ray_connector) == (2, 2), 120)
        report = job(ray_connector.read_state(), "serve:echo/Echo")
        assert (report.min_replicas, report.max_replicas, report.gpus_requested) == (1, 8, 2)
        assert report.kind.value == "realtime_inference" and report.state is JobState.running
    finally:
        httpx.delete(f"{ray.dashboard_url}/api/serve/applications/", timeout=60)


# --- draining ------------------------------------------------------------------------------


def test_a_drained_node_is_reported_draining_and_takes_no_new_work(
    ray: RayCluster, tmp_path: Path
) -> None:
    """On a worker of its own (draining ends with the node gone), started here."""
    ray.add_worker("ray-w3", gpus=1)
    ray_connector = connector(ray, tmp_path)
    nodes = {n.name: n for n in ray_connector.read_state().nodes}
    assert nodes["ray-w3"].state is NodeState.up
    ray_connector.drain_node("ray-w3", deadline_s=600)
    states = wait_for(
        "the node to drain",
        lambda: (
            {n.name: n.state for n in ray_connector.read_state().nodes}["ray-w3"]
            is not NodeState.up
        ),
    )
    assert states
    reported = {n.name: n.state for n in ray_connector.read_state().nodes}["ray-w3"]
    # Ray lets an idle drained node go at once: draining, then down.
    assert reported in (NodeState.draining, NodeState.down)
    with pytest.raises(ConnectorError, match="no such node"):
        ray_connector.drain_node("ray-w9")


# --- the connector process: steps from the broker, as the saga sends them --------------------


class RayConnectorWorker(ConnectorWorker):
    """Test_slurm_actions' worker, sending to this cluster's queue."""

    def send(
        self, step: str, job_id: str, *, key: str | None = None, task: str = "", **args: Any
    ) -> str:
        key = key or f"test:{uuid.uuid4().hex}"
        with Connection(self.broker) as connection:
            connection.SimpleQueue(reply_queue(key)).close()  # declared before any reply
        self.client.send_task(
            f"shaper.connector.{task or step}",
            kwargs={"step": step_message(step, job_id, key, args)},
            queue=f"connector.{CLUSTER}",
        )
        return key


def step_message(step: str, job_id: str, key: str, args: dict[str, Any]) -> dict[str, Any]:
    request = StepRequest.model_validate(
        {
            "action_id": 1,
            "key": key,
            "step": step,
            "workload_id": job_id,
            "generation": 1,
            "args": {"source_node": None, "target_node": None, "replicas": 0, **args},
            "reply_task": REPLY_TASK,
            "reply_queue": reply_queue(key),
        }
    )
    return request.model_dump(mode="json")


def test_the_connector_process_runs_steps_sent_through_the_broker(
    ray: RayCluster, tmp_path: Path
) -> None:
    """``python -m connectors.runner --kind ray --broker`` on a private Redis: the step
    messages the saga sends (tests/connectors/test_slurm_actions.py builds them the same
    way) stop a job held and start it again; answers come back on the reply queue."""
    train(ray, "brokered", gpus=1, bundles=2, **{"shaper.io/priority": "5"})
    redis = RedisServer(tmp_path)
    redis.start()
    log = tmp_path / "connector.log"
    command = [
        sys.executable, "-m", "connectors.runner", "--kind=ray", f"--cluster={CLUSTER}",
        f"--token={TOKEN}", f"--broker={redis.url}", "--actions-only",
        f"--state-dir={tmp_path / 'steps'}", "--set", f"dashboard_url={ray.dashboard_url}",
        "--set", f"state_dir={tmp_path / 'held'}",
    ]  # fmt: skip
    env = {key: value for key, value in os.environ.items() if not key.startswith("SHAPER_")}
    with open(log, "wb") as stream:
        process = subprocess.Popen(
            command, cwd=REPO, env=env, stdout=stream, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    client = Celery("ray-connector-test", broker=redis.url, set_as_current=False)
    worker = RayConnectorWorker(redis.url, process, log, tmp_path / "steps", client)
    try:
        wait_for("the job to run", lambda: ray.job("brokered")["status"] == "RUNNING")
        held = worker.step("requeue", "brokered", hold=True)
        assert held["ok"] is True and held["executor"] == f"connector.{CLUSTER}", held
        assert ray.job("brokered")["status"] == "STOPPED"
        started = worker.step("start", "brokered")
        assert started["ok"] is True, started
        wait_for("the job to run again", lambda: ray.job("brokered.r1")["status"] == "RUNNING")
        assert "serving ray action steps on queue connector.ray-lab" in log.read_text()
    finally:
        client.close()
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
        redis.stop()
