"""The shaping cycle on a real database: snapshot → solve → validate → plan and actions."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine
from sqlmodel import Session, select

from app.actions.models import Action
from app.core.clock import FrozenClock
from app.jobs.models import Job
from app.shaping.cycle import run_cycle
from app.shaping.lease import shaping_lease
from app.shaping.snapshot import _JOB_COLUMNS, take_snapshot, to_instance, within_catalogue
from solver import SolverConfig
from tests.app.builders import job, node, running, snapshot


@pytest.fixture
def fragmented(client: TestClient, auth: dict) -> None:
    _fragmented(client, auth, scheduler="slurm")


def _fragmented(client: TestClient, auth: dict, *, scheduler: str) -> None:
    """Two 8-GPU nodes, each half used by a checkpointable job; an 8-GPU job waits."""
    client.post(
        "/api/v1/clusters",
        headers=auth["admin"],
        json={"name": "alpha", "scheduler": scheduler, "mode": "advise"},
    )
    _push_fragmented(client, auth, 1)


def _push_fragmented(client: TestClient, auth: dict, seq: int, *more: dict[str, Any]) -> None:
    """The fragmented cluster's telemetry (``_fragmented``), with ``more`` jobs."""
    jobs = [
        running("j1", "n1", [0, 1, 2, 3], checkpointable=True, priority=10),
        running("j2", "n2", [0, 1, 2, 3], checkpointable=True, priority=10),
        job("big", gpus_requested=8, priority=50),
        *more,
    ]
    response = client.post(
        "/api/v1/clusters/alpha/telemetry",
        headers=auth["connector_alpha"],
        json=snapshot(seq, nodes=[node("n1"), node("n2")], jobs=jobs),
    )
    assert response.status_code == 200, response.text


def _service(name: str, indices: dict[str, list[int]], *, movable: bool) -> dict[str, Any]:
    """A running service of 1-GPU replicas on ``indices`` (node → GPU indices)."""
    return job(
        name,
        shape="elastic",
        state="running",
        gpus_requested=1,
        min_replicas=1,
        max_replicas=4,
        replicas=sum(len(i) for i in indices.values()),
        replicas_movable=movable,
        allocations=[{"node": n, "gpu_indices": i} for n, i in indices.items()],
    )


def _decisions(client: TestClient, auth: dict, plan_id: int) -> dict[str, list[dict[str, Any]]]:
    plan = client.get(f"/api/v1/plans/{plan_id}", headers=auth["viewer"]).json()
    by_job: dict[str, list[dict[str, Any]]] = {}
    for decision in plan["decisions"]:
        by_job.setdefault(decision["job"], []).append(decision)
    return by_job


@pytest.mark.usefixtures("fragmented")
def test_snapshot_maps_the_cluster_to_a_solver_instance(
    session: Session, clock: FrozenClock
) -> None:
    instance = to_instance(take_snapshot(session=session, cluster_name="alpha", now=clock.now()))
    assert [n.name for n in instance.nodes] == ["alpha/n1", "alpha/n2"]
    jobs = instance.job_by_id
    assert jobs["alpha/j1"].placement == {"alpha/n1": 4}
    assert jobs["alpha/j1"].gpu_indices == {"alpha/n1": (0, 1, 2, 3)}
    assert jobs["alpha/big"].total_gpus == 8 and not jobs["alpha/big"].is_running
    assert jobs["alpha/big"].priority > jobs["alpha/j1"].priority


@pytest.mark.usefixtures("fragmented")
def test_replicas_move_only_where_a_connector_can_choose_which_leave(
    client: TestClient, auth: dict, session: Session, clock: FrozenClock
) -> None:
    """The lever is on only for a cluster with a service whose connector says it can choose
    which replicas leave a node (JobReport.replicas_movable), only such a service may move,
    and never so far that it keeps fewer than max(1, min_replicas) replicas where they are
    while the work it made room for starts (``replica_moves_shrink_first``)."""
    taken = take_snapshot(session=session, cluster_name="alpha", now=clock.now())
    assert not to_instance(taken).config.replica_moves  # no service says it can

    _push_fragmented(
        client,
        auth,
        2,
        _service("spread", {"n1": [4], "n2": [4]}, movable=True),
        _service("solo", {"n1": [5, 6]}, movable=True),
        _service("fixed", {"n1": [7], "n2": [5]}, movable=False),
    )
    shown = client.get("/api/v1/jobs", params={"cluster": "alpha"}, headers=auth["viewer"])
    movable = {j["external_id"]: j["replicas_movable"] for j in shown.json()["items"]}
    assert movable["spread"] and movable["solo"] and not movable["fixed"]
    taken = take_snapshot(session=session, cluster_name="alpha", now=clock.now())
    instance = to_instance(taken)
    assert instance.config.replica_moves and instance.config.replica_moves_shrink_first
    assert not to_instance(taken, config=SolverConfig(replica_moves=False)).config.replica_moves
    jobs_by_id = instance.job_by_id
    assert jobs_by_id["alpha/spread"].migratable and jobs_by_id["alpha/solo"].migratable
    assert not jobs_by_id["alpha/fixed"].migratable
    assert jobs_by_id["alpha/j1"].migratable  # block jobs as their scheduler allows


@pytest.mark.parametrize(("scheduler", "gang_moves"), [("slurm", True), ("kubernetes", False)])
def test_a_job_on_several_nodes_moves_only_where_its_scheduler_restarts_it_pinned(
    client: TestClient,
    auth: dict,
    session: Session,
    clock: FrozenClock,
    scheduler: str,
    gang_moves: bool,
) -> None:
    """A gang's move is a restart pinned to its new nodes (app.actions.recipes): Slurm does
    that, Kubernetes' connector does not yet, so there it is not ``migratable``; a job on one
    node is, on both."""
    _fragmented(client, auth, scheduler=scheduler)
    gang = running("gang", "n1", [4, 5], gang_size=2, checkpointable=True)
    gang["gpus_requested"] = 4
    gang["allocations"].append({"node": "n2", "gpu_indices": [4, 5]})
    _push_fragmented(client, auth, 2, gang)
    jobs = to_instance(take_snapshot(session=session, cluster_name="alpha", now=clock.now()))
    assert jobs.job_by_id["alpha/gang"].placement == {"alpha/n1": 2, "alpha/n2": 2}
    assert jobs.job_by_id["alpha/gang"].migratable is gang_moves
    assert jobs.job_by_id["alpha/j1"].migratable


@pytest.mark.usefixtures("fragmented")
def test_a_snapshot_job_holds_its_job_columns_frozen(session: Session, clock: FrozenClock) -> None:
    """JobRow's copied fields are Job's columns by name, lists frozen to tuples."""
    row = next(
        r
        for r in take_snapshot(session=session, cluster_name="alpha", now=clock.now()).jobs
        if r.external_id == "j1"
    )
    stored = session.exec(select(Job).where(Job.id == row.id)).one()
    for name in _JOB_COLUMNS:
        value = getattr(stored, name)
        if isinstance(value, list):
            value = tuple(value)
        elif isinstance(value, dict):
            value = tuple(sorted(value.items()))
        assert getattr(row, name) == value, name
    assert row.placement == (("n1", (0, 1, 2, 3), 4),)
    assert set(_JOB_COLUMNS) <= set(Job.model_fields)


@pytest.mark.usefixtures("fragmented")
def test_fifo_leaves_the_big_job_waiting_with_a_reason(
    client: TestClient, auth: dict, session: Session, clock: FrozenClock
) -> None:
    result = run_cycle(session=session, cluster_name="alpha", now=clock.now(), policy="fifo")
    assert result.violations == 0 and result.actions == 0
    (decision,) = _decisions(client, auth, result.plan_id)["big"]
    assert decision["action"] == "wait"
    assert decision["reason"] == "fragmentation"


@pytest.mark.usefixtures("fragmented")
def test_shaper_defragments_and_proposes_in_advise_mode(
    client: TestClient, auth: dict, session: Session, clock: FrozenClock
) -> None:
    result = run_cycle(session=session, cluster_name="alpha", now=clock.now(), policy="shaper")
    assert result.violations == 0 and result.actions >= 2
    decisions = _decisions(client, auth, result.plan_id)
    assert [d["action"] for d in decisions["big"]] == ["start"]
    moved = [d for j in ("j1", "j2") for d in decisions.get(j, []) if d["action"] == "migrate"]
    assert len(moved) == 1 and moved[0]["reason"] == "defragmentation"
    actions = client.get(
        "/api/v1/actions", headers=auth["viewer"], params={"plan_id": result.plan_id}
    ).json()["items"]
    assert {a["state"] for a in actions} == {"proposed"}
    assert all(a["reason"] for a in actions)

    # Ten more cycles over the same state keep the proposal: same plan, same action ids.
    for _ in range(10):
        clock.advance(30)
        again = run_cycle(session=session, cluster_name="alpha", now=clock.now(), policy="shaper")
        assert again.kept and again.plan_id == result.plan_id
        assert again.actions == result.actions
    kept = client.get(
        "/api/v1/actions", headers=auth["viewer"], params={"plan_id": result.plan_id}
    ).json()["items"]
    assert {a["id"] for a in kept} == {a["id"] for a in actions}
    assert {a["state"] for a in kept} == {"proposed"}
    plan = client.get(f"/api/v1/plans/{result.plan_id}", headers=auth["viewer"]).json()
    assert plan["state"] == "proposed" and plan["checked_at"] is not None
    listed = client.get("/api/v1/plans", headers=auth["viewer"], params={"cluster": "alpha"})
    assert listed.json()["total"] == 1  # no plan row per cycle while the proposal stands


def test_no_migration_is_planned_where_the_scheduler_cannot_be_told_where_a_job_goes(
    client: TestClient, auth: dict, session: Session, clock: FrozenClock
) -> None:
    """Kueue admits and the scheduler places: the defragmenting move planned on Slurm
    above would be refused there after its checkpoint had stopped the job."""
    _fragmented(client, auth, scheduler="kueue")
    # A service its connector could shrink off named nodes moves no more than a job does.
    _push_fragmented(client, auth, 2, _service("svc", {"n1": [4], "n2": [4]}, movable=True))
    instance = to_instance(take_snapshot(session=session, cluster_name="alpha", now=clock.now()))
    assert not instance.config.migration and not instance.config.cp_sat_migration
    assert not instance.config.replica_moves and not instance.job_by_id["alpha/svc"].migratable
    result = run_cycle(session=session, cluster_name="alpha", now=clock.now(), policy="shaper")
    decisions = _decisions(client, auth, result.plan_id)
    assert all(d["action"] != "migrate" for ds in decisions.values() for d in ds), decisions


@pytest.mark.usefixtures("fragmented")
@pytest.mark.parametrize(("mode", "states"), [("observe", set()), ("enforce", {"approved"})])
def test_mode_decides_what_happens_to_actions(
    client: TestClient,
    auth: dict,
    session: Session,
    clock: FrozenClock,
    mode: str,
    states: set[str],
) -> None:
    client.patch("/api/v1/clusters/alpha", headers=auth["operator"], json={"mode": mode})
    result = run_cycle(session=session, cluster_name="alpha", now=clock.now(), policy="shaper")
    actions = session.exec(select(Action).where(Action.plan_id == result.plan_id)).all()
    assert {a.state for a in actions} == states
    assert all(a.decided_by == "shaper" for a in actions)
    assert len(_decisions(client, auth, result.plan_id)["big"]) == 1  # still explained


def test_only_one_leader_at_a_time(postgres_engine: Engine) -> None:
    with Session(postgres_engine) as first, Session(postgres_engine) as second:
        with shaping_lease(first) as leader:
            assert leader
            with shaping_lease(second) as other:
                assert not other
        with shaping_lease(second) as after:
            assert after


_LEADER = """
import sys, time
from sqlmodel import Session
from app.core.db import make_engine
from app.shaping.lease import shaping_lease
with Session(make_engine(sys.argv[1])) as session, shaping_lease(session) as leader:
    print("leader" if leader else "follower", flush=True)
    time.sleep(600)
"""


def test_a_crashed_leader_is_replaced_at_the_next_tick(postgres_engine: Engine) -> None:
    """The lease dies with the leader's connection: a process killed mid-cycle (SIGKILL,
    no cleanup) leaves nothing that keeps the next replica from leading."""
    url = postgres_engine.url.render_as_string(hide_password=False)
    leader = subprocess.Popen(
        [sys.executable, "-c", _LEADER, url], stdout=subprocess.PIPE, text=True
    )
    try:
        assert leader.stdout is not None and leader.stdout.readline().strip() == "leader"
        with Session(postgres_engine) as replica, shaping_lease(replica) as held:
            assert not held
        leader.send_signal(signal.SIGKILL)
        leader.wait(timeout=30)
        deadline = time.monotonic() + 10  # the server notices the closed socket at once
        while True:
            with Session(postgres_engine) as replica, shaping_lease(replica) as held:
                if held:
                    break
            assert time.monotonic() < deadline, "the dead leader's lease was never released"
            time.sleep(0.1)
    finally:
        if leader.poll() is None:
            leader.kill()
            leader.wait(timeout=30)
        assert leader.stdout is not None
        leader.stdout.close()


def test_a_job_pinned_to_its_checkpoint_node_is_placed_only_there(
    client: TestClient, auth: dict, session: Session, clock: FrozenClock
) -> None:
    """Slurm requeues a job preempted with a checkpoint pinned to the node holding its
    image. Best fit would put it on n1 (4 GPUs free, against n2's 8); the pin says n2."""
    client.post(
        "/api/v1/clusters",
        headers=auth["admin"],
        json={"name": "alpha", "scheduler": "slurm", "mode": "advise"},
    )
    jobs = [
        running("j1", "n1", [0, 1, 2, 3], priority=10),
        job("resumer", gpus_requested=4, priority=50, required_nodes=["n2"]),
    ]
    response = client.post(
        "/api/v1/clusters/alpha/telemetry",
        headers=auth["connector_alpha"],
        json=snapshot(1, nodes=[node("n1"), node("n2")], jobs=jobs),
    )
    assert response.status_code == 200, response.text
    shown = client.get("/api/v1/jobs?cluster=alpha", headers=auth["viewer"]).json()["items"]
    assert {j["external_id"]: j["required_nodes"] for j in shown} == {
        "j1": [],
        "resumer": ["n2"],
    }

    instance = to_instance(take_snapshot(session=session, cluster_name="alpha", now=clock.now()))
    pinned = instance.job_by_id["alpha/resumer"].node_selector
    assert [n.name for n in instance.nodes if pinned.items() <= n.labels.items()] == ["alpha/n2"]

    result = run_cycle(session=session, cluster_name="alpha", now=clock.now(), policy="shaper")
    assert result.violations == 0
    starts = [
        (a.kind, a.target_node)
        for a in session.exec(select(Action).where(Action.plan_id == result.plan_id))
        if a.kind == "start"
    ]
    assert starts == [("start", "n2")]


def test_elastic_training_jobs_reach_the_solver_with_their_range(
    client: TestClient, auth: dict, session: Session, clock: FrozenClock
) -> None:
    """A block job whose report gives a replica range (Slurm: nodes) is an elastic training
    job to the solver; one whose GPUs do not add up to its range is planned rigid."""
    client.post(
        "/api/v1/clusters", headers=auth["admin"], json={"name": "alpha", "scheduler": "slurm"}
    )
    spread = {"min_replicas": 1, "max_replicas": 3, "replicas": 3, "checkpointable": True}
    jobs = [
        # Running on 2 nodes of 2 GPUs (gang of 2), 1 to 3 nodes, asking for 3.
        {
            **running("e", "n1", [0, 1], gang_size=2, **spread),
            "gpus_requested": 4,
            "allocations": [
                {"node": "n1", "gpu_indices": [0, 1]},
                {"node": "n2", "gpu_indices": [0, 1]},
            ],
        },
        job("waits", gpus_requested=2, gang_size=1, **spread),  # 1 node of 2 GPUs now
        job("odd", gpus_requested=3, gang_size=2, **spread),  # 3 GPUs on 2 nodes: not replicas
        # 2 replicas of 2 GPUs, but 3 + 1 on its nodes (Slurm --gpus-per-task can do it).
        {
            **running("uneven", "n3", [0, 1, 2], gang_size=2, **spread),
            "gpus_requested": 4,
            "allocations": [
                {"node": "n3", "gpu_indices": [0, 1, 2]},
                {"node": "n2", "gpu_indices": [2]},
            ],
        },
    ]
    body = snapshot(1, nodes=[node("n1"), node("n2"), node("n3")], jobs=jobs)
    response = client.post(
        "/api/v1/clusters/alpha/telemetry", headers=auth["connector_alpha"], json=body
    )
    assert response.status_code == 200, response.text
    instance = to_instance(take_snapshot(session=session, cluster_name="alpha", now=clock.now()))
    by_id = instance.job_by_id
    e, waits, odd = by_id["alpha/e"], by_id["alpha/waits"], by_id["alpha/odd"]
    assert e.is_resizable and waits.is_resizable and not odd.is_resizable
    assert (e.gpus_per_replica, e.replicas, e.min_replicas, e.max_replicas) == (2, 3, 1, 3)
    assert e.held_gpus == 4 and e.max_nodes == 3
    assert (waits.gpus_per_replica, waits.replicas, waits.max_nodes) == (2, 3, 3)
    assert odd.total_gpus == 3 and odd.max_replicas is None
    uneven = by_id["alpha/uneven"]
    assert uneven.max_replicas is None and uneven.placement == {"alpha/n3": 3, "alpha/n2": 1}
    # Slurm runs a node's share per node: the gangs get a node per replica from the solver.
    assert instance.one_replica_per_node == {"alpha/e", "alpha/waits"}


def test_the_cycle_shrinks_a_kubernetes_elastic_training_job_with_pods_stacked_on_a_node(
    client: TestClient, auth: dict, session: Session, clock: FrozenClock
) -> None:
    """Kubernetes' elastic training job (an elastic Indexed Job: a replica is a pod, and
    pods may share a node) holds both 8-GPU nodes with four 4-GPU pods; a higher-priority
    4-GPU job waits. The cycle shrinks the elastic job by one pod instead of stopping it,
    and the plan may keep two pods on one node (Slurm's one-node-per-replica rule is
    Slurm's only)."""
    client.post(
        "/api/v1/clusters",
        headers=auth["admin"],
        json={"name": "alpha", "scheduler": "kubernetes", "mode": "advise"},
    )
    elastic = {
        **running("e", "n1", [0, 1, 2, 3, 4, 5, 6, 7], checkpointable=True, priority=10),
        "gpus_requested": 16,
        "gang_size": 4,
        "min_replicas": 1,
        "max_replicas": 4,
        "replicas": 4,
        "allocations": [
            {"node": "n1", "gpu_indices": list(range(8))},
            {"node": "n2", "gpu_indices": list(range(8))},
        ],
    }
    jobs = [elastic, job("urgent", gpus_requested=4, priority=90)]
    response = client.post(
        "/api/v1/clusters/alpha/telemetry",
        headers=auth["connector_alpha"],
        json=snapshot(1, nodes=[node("n1"), node("n2")], jobs=jobs),
    )
    assert response.status_code == 200, response.text
    instance = to_instance(take_snapshot(session=session, cluster_name="alpha", now=clock.now()))
    assert not instance.one_replica_per_node
    result = run_cycle(session=session, cluster_name="alpha", now=clock.now(), policy="shaper")
    assert result.violations == 0, result
    actions = session.exec(
        select(Action, Job)
        .join(Job, Action.job_id == Job.id)  # type: ignore[arg-type]
        .where(Action.plan_id == result.plan_id)
    ).all()
    by_job = {(j.external_id, str(a.kind)): a for a, j in actions}
    shrink, start = by_job[("e", "resize")], by_job[("urgent", "start")]
    assert shrink.target_replicas == 3 and sum(shrink.target_placement.values()) == 12
    assert 8 in shrink.target_placement.values()  # two pods kept on one node
    (freed,) = [n for n, g in shrink.target_placement.items() if g == 4]
    assert start.target_placement == {freed: 4}
    assert "preempt" not in {kind for _, kind in by_job}


def test_a_gang_across_many_long_named_nodes_is_planned_and_stored_whole(
    client: TestClient, auth: dict, session: Session, clock: FrozenClock
) -> None:
    """An action names every node of a gang (comma-separated source/target node): a 32-node
    gang on nodes named as large sites name them takes more than 255 characters."""
    names = [
        f"gpu-a100-80g-rack{i // 8:02d}-slot{i % 8:02d}.cluster.example.org" for i in range(32)
    ]
    client.post(
        "/api/v1/clusters",
        headers=auth["admin"],
        json={"name": "alpha", "scheduler": "slurm", "mode": "advise"},
    )
    big = job("big", gpus_requested=256, gang_size=32, priority=50)
    response = client.post(
        "/api/v1/clusters/alpha/telemetry",
        headers=auth["connector_alpha"],
        json=snapshot(1, nodes=[node(n) for n in names], jobs=[big]),
    )
    assert response.status_code == 200, response.text
    result = run_cycle(session=session, cluster_name="alpha", now=clock.now(), policy="shaper")
    (start,) = session.exec(
        select(Action).where(Action.plan_id == result.plan_id, Action.kind == "start")
    ).all()
    assert start.target_node is not None and start.target_node.split(",") == sorted(names)
    assert len(start.target_node) > 255


EARLIER = "2026-11-02T11:00:00+00:00"  # an hour before the clock's T0, the builders' submit
SAME_SPEED = {"H100": 1.0, "A100-80G": 1.0}


def _two_models(client: TestClient, auth: dict, *jobs: dict[str, Any]) -> None:
    """An idle H100 node and an idle A100 node (catalogue speeds 3.0 and 1.0), ``jobs``."""
    client.post(
        "/api/v1/clusters",
        headers=auth["admin"],
        json={"name": "alpha", "scheduler": "slurm", "mode": "advise"},
    )
    nodes = [node("h", gpu_model="H100"), node("a", gpu_model="A100-80G")]
    response = client.post(
        "/api/v1/clusters/alpha/telemetry",
        headers=auth["connector_alpha"],
        json=snapshot(1, nodes=nodes, jobs=list(jobs)),
    )
    assert response.status_code == 200, response.text


def _starts(session: Session, plan_id: int) -> dict[str, str | None]:
    names = {j.id: j.external_id for j in session.exec(select(Job))}
    return {
        names[a.job_id]: a.target_node
        for a in session.exec(select(Action).where(Action.plan_id == plan_id))
        if a.kind == "start" and a.job_id is not None
    }


def test_a_job_starts_on_the_model_fastest_for_it_by_its_own_speeds(
    client: TestClient, auth: dict, session: Session, clock: FrozenClock
) -> None:
    """Both nodes are free. By the catalogue the H100 is three times the A100; ``memory``
    says it runs no faster there (JobReport.speeds), so it starts on the A100 and leaves
    the H100 to ``compute``, which gains the catalogue's threefold."""
    _two_models(
        client,
        auth,
        job("memory", gpus_requested=8, priority=50, submit_time=EARLIER, speeds=SAME_SPEED),
        job("compute", gpus_requested=8, priority=50),
    )
    shown = client.get("/api/v1/jobs?cluster=alpha", headers=auth["viewer"]).json()["items"]
    assert {j["external_id"]: j["speeds"] for j in shown} == {
        "memory": {"A100-80G": 1.0, "H100": 1.0},
        "compute": {},
    }
    instance = to_instance(take_snapshot(session=session, cluster_name="alpha", now=clock.now()))
    assert instance.speeds == {"alpha/memory": {"A100-80G": 1.0, "H100": 1.0}}

    result = run_cycle(session=session, cluster_name="alpha", now=clock.now(), policy="shaper")
    assert result.violations == 0
    assert _starts(session, result.plan_id) == {"memory": "a", "compute": "h"}


def test_without_its_own_speeds_the_older_job_takes_the_fastest_model(
    client: TestClient, auth: dict, session: Session, clock: FrozenClock
) -> None:
    """The same two jobs with no speeds: the older takes the H100, as every model's speed
    says (so the test above is the speeds' doing, not the order's)."""
    _two_models(
        client,
        auth,
        job("memory", gpus_requested=8, priority=50, submit_time=EARLIER),
        job("compute", gpus_requested=8, priority=50),
    )
    result = run_cycle(session=session, cluster_name="alpha", now=clock.now(), policy="shaper")
    assert _starts(session, result.plan_id) == {"memory": "h", "compute": "a"}


def test_a_jobs_own_speeds_never_value_it_above_the_catalogue() -> None:
    """What a job's owner writes says how its speed differs between models; scaled by one
    factor so that none is above its model's catalogue speed, it never makes the job worth
    more than the catalogue says (``within_catalogue``)."""
    catalogue = {"H100": 3.0, "A100-80G": 1.0, "V100": 0.4}
    honest = {"H100": 2.5, "A100-80G": 1.0}
    assert within_catalogue(honest, catalogue) == honest  # at or below it: as written
    boasts = within_catalogue({"H100": 100.0, "A100-80G": 100.0}, catalogue)
    assert boasts == pytest.approx({"H100": 1.0, "A100-80G": 1.0})
    assert within_catalogue({"H100": 42.0}, catalogue) == pytest.approx({"H100": 3.0})
    leans = within_catalogue({"H100": 8.0, "V100": 0.1}, catalogue)
    assert leans == pytest.approx({"H100": 3.0, "V100": 0.0375})  # the ratio, 80, kept
    for own in ({"H100": 100.0, "A100-80G": 0.01}, {"V100": 0.01}, {"H100": 100.0}):
        scaled = within_catalogue(own, catalogue)
        assert all(scaled[model] <= catalogue[model] for model in own), own


def test_a_job_cannot_buy_a_gpu_from_higher_priorities_by_what_it_writes(
    client: TestClient, auth: dict, session: Session, clock: FrozenClock
) -> None:
    """A priority-10 job that says it runs at 100 on the H100 and at 0.01 on the A100
    (the review's case: taken as written, or kept at the catalogue's pace over the two, it
    took the H100 ahead of the priority-100 jobs) waits: the two priority-100 jobs get
    the two nodes."""
    _two_models(
        client,
        auth,
        job("boast", gpus_requested=8, priority=10, submit_time=EARLIER,
            speeds={"H100": 100, "A100-80G": 0.01}),
        job("first", gpus_requested=8, priority=100),
        job("second", gpus_requested=8, priority=100),
    )  # fmt: skip
    instance = to_instance(take_snapshot(session=session, cluster_name="alpha", now=clock.now()))
    assert instance.speeds["alpha/boast"] == pytest.approx({"H100": 3.0, "A100-80G": 0.0003})
    result = run_cycle(session=session, cluster_name="alpha", now=clock.now(), policy="shaper")
    assert result.violations == 0
    assert set(_starts(session, result.plan_id)) == {"first", "second"}


def _with_profiles(client: TestClient, auth: dict, profiles: list[dict[str, Any]]) -> None:
    response = client.post(
        "/api/v1/policies",
        headers=auth["operator"],
        json={"name": "alpha", "spec": {"speed_profiles": profiles}},
    )
    assert response.status_code == 201, response.text


def test_the_sla_policys_speed_profiles_give_jobs_without_their_own_their_speeds(
    client: TestClient, auth: dict, session: Session, clock: FrozenClock
) -> None:
    """A site that measured its batch inference gains nothing from an H100 says so once,
    in the cluster's SLA policy: the first profile that matches a block job without speeds
    of its own gives it its speeds, as written; a job's own speeds win; a service and a
    job no profile matches get none. The older job then starts on the A100."""
    _two_models(
        client,
        auth,
        job("memory", gpus_requested=8, priority=50, submit_time=EARLIER, kind="batch_inference"),
        job("compute", gpus_requested=8, priority=50),
        job("own", gpus_requested=1, kind="batch_inference", queue="q2", speeds={"H100": 2.0}),
        job("other-q", gpus_requested=1, kind="batch_inference", queue="q2"),
    )
    _with_profiles(
        client,
        auth,
        [
            {"kind": "batch_inference", "queue": "q2", "speeds": {"H100": 0.5}},
            {"kind": "batch_inference", "speeds": {"H100": 4.0, "A100-80G": 4.0}},
            {"kind": "batch_inference", "speeds": {"A100-80G": 9.0}},  # never reached
        ],
    )
    instance = to_instance(take_snapshot(session=session, cluster_name="alpha", now=clock.now()))
    assert instance.speeds == {
        "alpha/memory": {"H100": 4.0, "A100-80G": 4.0},  # the site's, as written
        "alpha/own": {"H100": 2.0},  # its own (at or below the catalogue's: as written)
        "alpha/other-q": {"H100": 0.5},
    }
    result = run_cycle(session=session, cluster_name="alpha", now=clock.now(), policy="shaper")
    assert result.violations == 0
    assert _starts(session, result.plan_id)["memory"] == "a"
