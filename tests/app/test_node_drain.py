"""An operator drains a node and gives it back (issue 17): ``POST
/clusters/{cluster}/nodes/{node}/drain`` and ``/undrain`` make an approved action about
the node (no job), whose saga runs ``drain@connector → confirm@connector`` on a simulated
cluster whose connector answers in-process (as in ``shaper demo``), on SQLite and on
PostgreSQL. A drained node takes no new work and its running job stays; the connector's
journal answers a resent step, refuses a stale one, and a failed drain is not undone.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine
from sqlmodel import Session, select

from app.actions import local, saga, tasks
from app.actions.models import Action
from app.actions.router import get_dispatcher
from app.clusters import service as cluster_service
from app.clusters.models import ClusterCreate
from app.nodes.models import Node
from app.telemetry import service as telemetry_service
from connectors.actions import ConnectorStepExecutor
from connectors.sim import SimCluster, SimExecutors, SiteSpec
from tests.app.test_federation_moves import T0, Clock, Group
from tests.support.live_server import app_on, tokens_for
from wire.steps import Outcome, StepRequest
from wire.telemetry import JobKind, JobReport, NodeState, SchedulerKind, TelemetrySnapshot


def _sim(name: str, clock: Clock) -> SimCluster:
    return SimCluster(
        SiteSpec(
            name=name,
            nodes=((f"{name}1", "H100", 8), (f"{name}2", "H100", 8)),
            teams=("research",),
            kinds=(JobKind.training,),
            arrivals_per_hour=0,
        ),
        start=T0,
        seed=1,
        clock=clock,
    )


def _job(job_id: str, gpus: int) -> JobReport:
    return JobReport(
        external_id=job_id, team="research", gpus_requested=gpus, priority=10, submit_time=T0
    )


class Site(Group):
    """One simulated cluster ``lab`` (nodes lab1, lab2), its executors registered in-process,
    and an operator and a viewer talking to the API (the saga helpers are the federation
    tests': ``run_sagas``, ``action``, ``steps``)."""

    def __init__(self, engine: Engine, tmp_path: Path) -> None:
        self.engine = engine
        self.clock = Clock()
        self.cluster = _sim("lab", self.clock)
        self.executors = SimExecutors(self.cluster, state_dir=tmp_path / "lab")
        self.seq = 0
        with Session(engine) as session:
            cluster_service.register_cluster(
                session=session,
                now=T0,
                cluster_in=ClusterCreate(name="lab", scheduler=SchedulerKind.sim),
            )
            self.tokens = tokens_for(session, T0, ["operator", "viewer"])
        self.client = TestClient(app_on(engine))
        self.client.app.dependency_overrides[get_dispatcher] = lambda: lambda action_id: None  # type: ignore[attr-defined]
        self.push()

    def push(self) -> None:
        self.seq += 1
        with Session(self.engine) as session:
            telemetry_service.ingest(
                session=session,
                cluster_name="lab",
                push=TelemetrySnapshot.of(
                    self.cluster.read_state(), connector_session="test", seq=self.seq
                ),
                now=self.clock.now,
            )

    def post(self, path: str, scope: str = "operator", **kwargs: Any) -> Any:
        return self.client.post(
            f"/api/v1{path}", headers={"Authorization": f"Bearer {self.tokens[scope]}"}, **kwargs
        )

    def get(self, path: str) -> Any:
        return self.client.get(
            f"/api/v1{path}", headers={"Authorization": f"Bearer {self.tokens['viewer']}"}
        )

    def node_state(self, name: str) -> str:
        with Session(self.engine) as session:
            node = session.exec(select(Node).where(Node.name == name)).one()
            return str(node.state)

    def reported(self, name: str) -> NodeState:
        return {n.name: n.state for n in self.cluster.read_state().nodes}[name]

    def jobs(self) -> dict[str, tuple[str, list[str]]]:
        return {
            j.external_id: (j.state.value, sorted(a.node for a in j.allocations))
            for j in self.cluster.read_state().jobs
        }


@pytest.fixture
def site(
    committed_engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Site]:
    monkeypatch.setattr(tasks, "get_engine", lambda: committed_engine)
    monkeypatch.setattr(tasks, "_timings", lambda: {"step_timeout_s": 0.3, "start_wait_s": 5.0})
    monkeypatch.setattr(saga, "CONFIRM_POLL_S", 0.05)
    monkeypatch.setattr(saga, "RETRY_BACKOFF_S", (0.05,))
    made = Site(committed_engine, tmp_path)
    prefixes = made.executors.queues()
    for prefix in prefixes:
        local.register(prefix, made.executors.handle)
    yield made
    for prefix in prefixes:
        local.unregister(prefix)
    made.client.close()


def test_a_drained_node_takes_no_new_work_and_an_undrained_one_does(site: Site) -> None:
    site.cluster.submit(_job("stays", 4), timedelta(hours=10))
    site.cluster.submit(_job("fills", 8), timedelta(hours=10))
    assert site.jobs() == {"stays": ("running", ["lab1"]), "fills": ("running", ["lab2"])}
    site.push()

    answer = site.post("/clusters/lab/nodes/lab1/drain", json={"reason": "DIMM errors"})
    assert answer.status_code == 202, answer.text
    drain = answer.json()
    assert (drain["kind"], drain["state"], drain["job_id"], drain["job_external_id"]) == (
        "drain",
        "approved",
        None,
        None,
    )
    assert (drain["source_node"], drain["target_node"], drain["reason"]) == (
        "lab1",
        "lab1",
        "DIMM errors",
    )
    site.run_sagas()
    done = site.action(drain["id"])
    assert done.state == "succeeded", done.error
    assert site.steps(drain["id"]) == [
        ("forward", "drain", "connector.lab", "succeeded"),
        ("forward", "confirm", "connector.lab", "succeeded"),
    ]
    assert site.reported("lab1") is NodeState.draining
    assert site.node_state("lab1") == "draining"  # the confirm's reading, before telemetry
    # Listed with the others.
    listed = site.get("/actions?cluster=lab").json()["items"]
    assert [(a["id"], a["kind"], a["state"]) for a in listed] == [
        (drain["id"], "drain", "succeeded")
    ]

    # Its job runs on; a job that fits only there waits.
    site.cluster.submit(_job("waits", 4), timedelta(hours=1))
    site.clock.now += timedelta(minutes=1)
    jobs = site.jobs()
    assert jobs["stays"] == ("running", ["lab1"]) and jobs["waits"] == ("pending", [])

    # Drained already: nothing to do.
    again = site.post("/clusters/lab/nodes/lab1/drain")
    assert again.status_code == 409, again.text
    assert "draining already" in again.json()["error"]["message"]

    site.push()
    back = site.post("/clusters/lab/nodes/lab1/undrain")
    assert back.status_code == 202, back.text
    assert back.json()["reason"] == "undrain of node lab1 asked by operator"
    site.run_sagas()
    assert site.action(back.json()["id"]).state == "succeeded"
    assert [s[1] for s in site.steps(back.json()["id"])] == ["undrain", "confirm"]
    assert site.reported("lab1") is NodeState.up and site.node_state("lab1") == "up"
    assert site.jobs()["waits"] == ("running", ["lab1"])
    up = site.post("/clusters/lab/nodes/lab1/undrain")
    assert up.status_code == 409 and "up already" in up.json()["error"]["message"]


def test_bad_requests_name_what_is_wrong(site: Site) -> None:
    unknown = site.post("/clusters/nowhere/nodes/lab1/drain")
    assert unknown.status_code == 404 and unknown.json()["error"]["id"] == "nowhere"
    missing = site.post("/clusters/lab/nodes/lab9/drain")
    assert missing.status_code == 404 and missing.json()["error"]["id"] == "lab9"
    for body, field in (({"reason": ""}, "reason"), ({"why": "x"}, "why")):
        bad = site.post("/clusters/lab/nodes/lab1/drain", json=body)
        assert bad.status_code == 422, bad.text
        assert field in (bad.json()["error"]["field"] or ""), bad.json()
    assert site.post("/clusters/lab/nodes/lab1/drain", scope="viewer").status_code == 403

    first = site.post("/clusters/lab/nodes/lab1/drain")
    assert first.status_code == 202
    # Not dispatched yet: a second request for the node is refused, naming the first.
    for verb in ("drain", "undrain"):
        busy = site.post(f"/clusters/lab/nodes/lab1/{verb}")
        assert busy.status_code == 409, busy.text
        assert busy.json()["error"]["details"]["action_id"] == first.json()["id"]
    # Another node is another matter.
    assert site.post("/clusters/lab/nodes/lab2/drain").status_code == 202
    with Session(site.engine) as session:
        assert len(session.exec(select(Action)).all()) == 2


def test_a_drain_the_scheduler_refuses_fails_and_is_not_undone(site: Site) -> None:
    # The control plane knows a node the scheduler does not (a stale view).
    with Session(site.engine) as session:
        lab1 = session.exec(select(Node).where(Node.name == "lab1")).one()
        session.add(Node(cluster_id=lab1.cluster_id, name="ghost", updated_at=T0))
        session.commit()
    answer = site.post("/clusters/lab/nodes/ghost/drain")
    assert answer.status_code == 202
    site.run_sagas()
    action = site.action(answer.json()["id"])
    assert action.state == "failed"
    assert "has no such node" in (action.error or "")
    assert site.steps(action.id or 0) == [
        ("forward", "drain", "connector.lab", "failed"),
        ("forward", "confirm", "connector.lab", "skipped"),
    ]


def test_the_connector_journal_answers_resends_and_refuses_stale_node_steps(
    tmp_path: Path,
) -> None:
    """The executor alone: steps as app/actions/messages.py builds them."""
    cluster = _sim("lab", Clock())
    executor = ConnectorStepExecutor(cluster, cluster="lab", state_dir=tmp_path)

    def step(name: str, key: str, generation: int, **args: Any) -> StepRequest:
        return StepRequest(
            action_id=generation,
            key=key,
            step=name,
            workload_id="lab2",
            generation=generation,
            args=args,
        )

    drained = executor.run(step("drain", "k1", 5, reason="maintenance"))
    assert drained.ok and drained.outcome is Outcome.executed, drained.error
    assert executor.run(step("drain", "k1", 5)).outcome is Outcome.duplicate
    # A new drain of the drained node (another action, another key) succeeds untouched.
    assert executor.run(step("drain", "k2", 6)).ok
    seen = executor.run(step("confirm", "k3", 6, expect="drained"))
    assert seen.ok and seen.result["state"] == "draining", seen.error
    # Still draining: an undrain's confirm says "not yet", to be asked again.
    early = executor.run(step("confirm", "k4", 7, expect="up"))
    assert not early.ok and early.retryable and "expected up" in (early.error or "")
    assert executor.run(step("undrain", "k5", 7)).ok
    # A late drain of the older action is refused: the node stays up.
    stale = executor.run(step("drain", "k6", 6))
    assert stale.outcome is Outcome.refused and "stale generation" in (stale.error or "")
    assert {n.name: n.state for n in cluster.read_state().nodes}["lab2"] is NodeState.up
    # A job's step of the same id is fenced apart from the node's.
    other = executor.run(
        StepRequest(action_id=1, key="k7", step="cancel", workload_id="lab2", generation=1)
    )
    assert other.outcome is Outcome.executed and "no job 'lab2'" in (other.error or "")
