"""An operator moves a queued Armada job set to another executor cluster (issue 17):
``POST /clusters/{cluster}/job-sets/{queue}/{job_set}/move`` makes an approved
``move_job_set`` action about the job set (no job), whose saga is one step on the
cluster's connector — here the real Armada connector and its step executor, answering
in-process, against the Armada test server of tests/support/armada_site.py (executors
``exec-a``: a1, a2 with 8 H100 each; ``exec-b``: b1 with 4 A100; not a real Armada, which
cannot run here) — on SQLite and on PostgreSQL. The control plane's view comes from the
connector's own telemetry. A resent step moves no job twice; a refusal is the action's
error.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine
from sqlmodel import Session, col, select

from app.actions import local, saga, tasks
from app.actions.job_sets import EXECUTOR_LABEL
from app.actions.models import Action, ActionStep
from app.actions.router import get_dispatcher
from app.clusters import service as cluster_service
from app.clusters.models import ClusterCreate
from app.gpu_models import service as gpu_model_service
from app.gpu_models.models import GpuModelCreate
from app.telemetry import service as telemetry_service
from connectors.actions import ConnectorStepExecutor
from connectors.armada import ArmadaConnector, NewJob
from connectors.armada.jobs import STOPPED_BY_STEP
from connectors.armada.reports import EXECUTOR_NODE_LABEL
from tests.support.armada_server import ArmadaTestServer
from tests.support.armada_site import (
    CLUSTER,
    connector_for,
    start_server,
)
from tests.support.armada_site import (
    EXECUTOR_LABEL as SELECTOR,
)
from tests.support.live_server import app_on, tokens_for
from wire.queues import connector_queue
from wire.telemetry import SchedulerKind, TelemetrySnapshot

QUEUE = connector_queue(CLUSTER)
WHAT_A_MOVE_SAYS = (
    "kind",
    "state",
    "job_id",
    "job_external_id",
    "job_set_queue",
    "job_set",
    "target_executor",
    "reason",
)


class Site:
    """The Armada cluster registered with the control plane, its connector's steps answered
    in-process (one answer can be lost on the way back), and an operator and a viewer
    talking to the API."""

    def __init__(self, engine: Engine, server: ArmadaTestServer, state_dir: Path) -> None:
        self.engine = engine
        self.server = server
        self.connector: ArmadaConnector = connector_for(server)
        self.executor = ConnectorStepExecutor(self.connector, cluster=CLUSTER, state_dir=state_dir)
        self.answers_to_lose = 0
        self.seq = 0
        now = datetime.now(UTC)
        with Session(engine) as session:
            for name, scheduler in ((CLUSTER, SchedulerKind.armada), ("hpc", SchedulerKind.slurm)):
                cluster_service.register_cluster(
                    session=session,
                    now=now,
                    cluster_in=ClusterCreate(name=name, scheduler=scheduler),
                )
            # exec-b's GPUs, as the site names them (the default catalogue says A100-80G).
            a100 = GpuModelCreate.model_validate(
                {"name": "A100", "memory_gib": 80, "precisions": ["fp32", "bf16", "fp16"]}
            )
            gpu_model_service.create_gpu_model(session=session, model_in=a100, now=now)
            self.tokens = tokens_for(session, now, ["operator", "viewer"])
        self.client = TestClient(app_on(engine))
        self.client.app.dependency_overrides[get_dispatcher] = lambda: lambda action_id: None  # type: ignore[attr-defined]

    def handle(self, queue: str, step: dict[str, Any]) -> dict[str, Any]:
        report = self.executor.handle(step)
        assert report is not None
        answer = report.model_dump(mode="json")
        if self.answers_to_lose:
            # Lost on its way back: the step stays sent until it times out and is resent.
            self.answers_to_lose -= 1
            return {**answer, "key": f"{step['key']}:lost"}
        return answer

    def push(self) -> None:
        self.seq += 1
        with Session(self.engine) as session:
            telemetry_service.ingest(
                session=session,
                cluster_name=CLUSTER,
                push=TelemetrySnapshot.of(
                    self.connector.read_state(), connector_session="test", seq=self.seq
                ),
                now=datetime.now(UTC),
            )

    def submit(self, job_set: str, gpus: int, **selector: str) -> str:
        return self.connector.submit_job(
            "research",
            job_set,
            NewJob(image="registry.local/train:1", gpus=gpus, node_selector=selector),
        )

    def move(self, body: Any, *, job_set: str = "sweep", scope: str = "operator") -> Any:
        return self.client.post(
            f"/api/v1/clusters/{CLUSTER}/job-sets/research/{job_set}/move",
            headers={"Authorization": f"Bearer {self.tokens[scope]}"},
            json=body,
        )

    def get(self, path: str) -> Any:
        return self.client.get(
            f"/api/v1{path}", headers={"Authorization": f"Bearer {self.tokens['viewer']}"}
        )

    def run_sagas(self) -> None:
        for _ in range(400):
            if tasks.sweep() == 0:
                return
            time.sleep(0.05)
        raise AssertionError("sagas still running")

    def action(self, action_id: int) -> Action:
        with Session(self.engine) as session:
            action = session.get(Action, action_id)
            assert action is not None
            return action

    def steps(self, action_id: int) -> list[tuple[str, str, str, str, int]]:
        with Session(self.engine) as session:
            rows = session.exec(
                select(ActionStep)
                .where(ActionStep.action_id == action_id)
                .order_by(col(ActionStep.seq))
            )
            return [(s.phase, s.name, s.queue, s.state, s.attempts) for s in rows]

    def jobs(self) -> dict[str, dict[str, Any]]:
        items = self.get(f"/jobs?cluster={CLUSTER}&limit=100").json()["items"]
        return {job["external_id"]: job for job in items}


@pytest.fixture
def site(
    committed_engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Site]:
    monkeypatch.setattr(tasks, "get_engine", lambda: committed_engine)
    monkeypatch.setattr(tasks, "_timings", lambda: {"step_timeout_s": 0.3, "start_wait_s": 5.0})
    monkeypatch.setattr(saga, "RETRY_BACKOFF_S", (0.05,))
    server = start_server()
    made = Site(committed_engine, server, tmp_path / "journal")
    local.register(QUEUE, made.handle)
    yield made
    local.unregister(QUEUE)
    made.client.close()
    made.connector.close()
    server.stop()


def test_an_operator_moves_a_queued_job_set_and_a_resent_step_moves_it_once(site: Site) -> None:
    pinned = site.submit("sweep", 2, **{"kubernetes.io/hostname": "a1"})
    free = site.submit("sweep", 2)
    other = site.submit("train", 2)  # another job set of the queue stays
    site.push()
    # The control plane knows executors from the connector's node labels.
    assert EXECUTOR_LABEL == EXECUTOR_NODE_LABEL

    answer = site.move({"executor": "exec-b", "reason": "exec-a is full this week"})
    assert answer.status_code == 202, answer.text
    move = answer.json()
    assert {field: move[field] for field in WHAT_A_MOVE_SAYS} == {
        "kind": "move_job_set",
        "state": "approved",
        "job_id": None,  # about a job set, not one job
        "job_external_id": None,
        "job_set_queue": "research",
        "job_set": "sweep",
        "target_executor": "exec-b",
        "reason": "exec-a is full this week",
    }

    site.answers_to_lose = 1  # the connector moved the job set; its answer never came back
    site.run_sagas()
    done = site.action(move["id"])
    assert done.state == "succeeded", done.error
    (step,) = site.steps(move["id"])
    assert step == ("forward", "move_job_set", QUEUE, "succeeded", 2)  # resent once
    # Armada: each job of the set cancelled and submitted again once, selecting exec-b.
    for workload in (pinned, free):
        attempts = [
            j
            for j in site.server.jobs.values()
            if j.job_id != workload and (j.spec.annotations.get("shaper.io/workload") == workload)
        ]
        assert len(attempts) == 1, attempts
        (new,) = attempts
        assert site.server.job(workload).state == "cancelled"
        assert dict(new.spec.pod_specs[0].nodeSelector) == {SELECTOR: "exec-b"}
        assert new.spec.annotations[STOPPED_BY_STEP].endswith(":forward:move_job_set")
    assert site.server.job(other).state == "queued"
    assert len(site.server.jobs) == 5

    # Armada runs them there; the control plane sees it through telemetry.
    site.server.schedule()
    site.push()
    jobs = site.jobs()
    for workload in (pinned, free):
        assert jobs[workload]["state"] == "running", jobs[workload]
        assert [a["node"] for a in jobs[workload]["allocations"]] == ["b1"]
    listed = site.get(f"/actions?cluster={CLUSTER}").json()["items"]
    assert [(a["id"], a["kind"], a["state"]) for a in listed] == [
        (move["id"], "move_job_set", "succeeded")
    ]

    # Started now: it is not a queued job set any more.
    again = site.move({"executor": "exec-a"})
    assert again.status_code == 409, again.text
    assert "is not queued" in again.json()["error"]["message"]


def test_bad_requests_name_what_is_wrong(site: Site) -> None:
    site.submit("sweep", 2)
    site.push()
    unknown = site.client.post(
        "/api/v1/clusters/nowhere/job-sets/research/sweep/move",
        headers={"Authorization": f"Bearer {site.tokens['operator']}"},
        json={"executor": "exec-b"},
    )
    assert unknown.status_code == 404 and unknown.json()["error"]["id"] == "nowhere"
    slurm = site.client.post(
        "/api/v1/clusters/hpc/job-sets/research/sweep/move",
        headers={"Authorization": f"Bearer {site.tokens['operator']}"},
        json={"executor": "exec-b"},
    )
    assert slurm.status_code == 409 and "only Armada" in slurm.json()["error"]["message"]
    for body, field in (
        ({}, "executor"),
        ({"executor": ""}, "executor"),
        ({"executor": "x" * 129}, "executor"),
        ({"executor": "exec-b", "why": "x"}, "why"),
        ({"executor": "exec-b", "reason": ""}, "reason"),
        ({"executor": "exec-z"}, "executor"),  # no node of the cluster reports it
    ):
        bad = site.move(body)
        assert bad.status_code == 422, (body, bad.text)
        assert field in (bad.json()["error"]["field"] or ""), bad.json()
    assert site.move({"executor": "exec-b"}, scope="viewer").status_code == 403
    nothing = site.move({"executor": "exec-b"}, job_set="nope")
    assert nothing.status_code == 409 and "no queued job" in nothing.json()["error"]["message"]
    there = site.move({"executor": "exec-a"})  # a 2-GPU job fits either; only a1, a2 are exec-a
    assert there.status_code == 202, there.text

    # Not dispatched yet: a second request for the job set is refused, naming the first.
    busy = site.move({"executor": "exec-b"})
    assert busy.status_code == 409, busy.text
    assert busy.json()["error"]["details"]["action_id"] == there.json()["id"]
    with Session(site.engine) as session:
        assert len(session.exec(select(Action)).all()) == 1


def test_a_move_armada_refuses_fails_with_its_reason_and_changes_nothing(site: Site) -> None:
    small = site.submit("sweep", 2)
    big = site.submit("sweep", 8)  # exec-b's one node has 4 GPUs
    site.push()
    answer = site.move({"executor": "exec-b"})
    assert answer.status_code == 202, answer.text
    site.run_sagas()
    action = site.action(answer.json()["id"])
    assert action.state == "failed"
    assert f"{big}: needs 8 GPUs" in (action.error or ""), action.error
    assert [s[:4] for s in site.steps(action.id or 0)] == [
        ("forward", "move_job_set", QUEUE, "failed")
    ]
    assert {site.server.job(j).state for j in (small, big)} == {"queued"}
    assert len(site.server.jobs) == 2

    # A job set that starts between the request and the step: Armada's view wins.
    site.submit("train", 2)
    site.push()
    raced = site.move({"executor": "exec-b"}, job_set="train")
    assert raced.status_code == 202, raced.text
    site.server.schedule()
    site.run_sagas()
    lost = site.action(raced.json()["id"])
    assert lost.state == "failed" and "only a queued job set moves" in (lost.error or "")
