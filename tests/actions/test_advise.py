"""Advise mode with the real shaping cycle: nothing moves until an operator approves."""

from __future__ import annotations

from sqlmodel import Session, select

from agent import procs
from app.actions import saga
from app.actions.models import Action, ActionKind, ActionStep
from app.shaping.cycle import run_cycle
from tests.actions.conftest import Api, Tracked, start_sim_connector
from tests.actions.helpers import (
    add_job,
    finish_jobs,
    job_generation,
    now,
    placed_on,
    running_copies,
    start_counter,
    wait_for_action,
)
from tests.support.counter import count_of, next_count
from tests.support.pipeline import Pipeline

JOBS = ("adv-1", "adv-2")


def plan(pipeline: Pipeline) -> dict[str, Action]:
    """One shaping cycle of the cluster; its actions by kind."""
    with Session(pipeline.engine, expire_on_commit=False) as session:
        result = run_cycle(session=session, cluster_name="lab", now=now(), policy="shaper")
        actions = session.exec(select(Action).where(Action.plan_id == result.plan_id)).all()
    # Reservations hold the GPUs each move and start will take (the cluster is a sim one).
    actions = [a for a in actions if a.kind != ActionKind.reserve]
    by_kind = {action.kind: action for action in actions}
    assert len(by_kind) == len(actions) and set(by_kind) == {"migrate", "start"}, actions
    return by_kind


def snapshot(pipeline: Pipeline, job_ids: dict[str, int]) -> dict[str, object]:
    """Where each job's workload runs, under which PID, with which generation."""
    where = {}
    for workload_id in JOBS:
        for node in ("a", "b"):
            try:
                workload = pipeline.store(node).load(workload_id)
            except KeyError:
                continue
            if workload.is_running():
                where[workload_id] = (node, workload.pid)
    with Session(pipeline.engine) as session:
        steps = session.exec(select(ActionStep.id)).all()
    return {
        "running": where,
        "copies": {w: running_copies(w) for w in JOBS},
        "generations": {w: job_generation(pipeline.engine, i) for w, i in job_ids.items()},
        "steps": len(steps),
        "journal": [e for n in ("a", "b") for e in pipeline.journal(n) if e["workload"] in JOBS],
    }


def test_nothing_moves_until_approval_and_reject_leaves_all_as_it_was(
    running_pipeline: Pipeline, api: Api, tracked: Tracked
) -> None:
    pipeline = running_pipeline
    # The cluster's scheduler: it takes the plan's reservations and scheduler-level steps.
    pipeline.ensure("connector", lambda: start_sim_connector(pipeline))
    # Two half-full 8-GPU nodes and an 8-GPU job waiting: the plan moves one of the two.
    job_ids = {
        "adv-1": add_job(pipeline.engine, "adv-1", node="a", gpus=4),
        "adv-2": add_job(pipeline.engine, "adv-2", node="b", gpus=4),
    }
    add_job(pipeline.engine, "adv-big", node=None, gpus=8, priority=50)
    counts = {
        "adv-1": start_counter(pipeline, tracked, "adv-1", node="a", backend="criu", state_mb=5),
        "adv-2": start_counter(pipeline, tracked, "adv-2", node="b", backend="criu", state_mb=5),
    }
    before = snapshot(pipeline, job_ids)
    assert before["running"] == {
        "adv-1": ("a", before["running"]["adv-1"][1]),  # type: ignore[index]
        "adv-2": ("b", before["running"]["adv-2"][1]),  # type: ignore[index]
    }

    proposed = plan(pipeline)

    assert {a.state for a in proposed.values()} == {"proposed"}
    # Whatever runs the sagas (the sweep, a stray advance) leaves proposals alone.
    with Session(pipeline.engine, expire_on_commit=False) as session:
        assert not {a.id for a in proposed.values()} & set(saga.active_action_ids(session=session))
        for action in proposed.values():
            assert saga.advance(session=session, action_id=action.id, now=now()) == []
    listed = api.get("/actions", params={"state": "proposed", "cluster": "lab"}).json()
    listed_ids = {a["id"] for a in listed["items"] if a["kind"] != ActionKind.reserve}
    assert listed_ids == {a.id for a in proposed.values()}
    assert snapshot(pipeline, job_ids) == before

    migrate = proposed[ActionKind.migrate]
    rejected = api.post(f"/actions/{migrate.id}/reject", "operator")
    assert rejected.status_code == 200 and rejected.json()["state"] == "rejected"
    pipeline.advance(migrate.id)  # even if a worker is told to, a rejected action does nothing
    assert api.post(f"/actions/{migrate.id}/approve", "operator").status_code == 409
    assert api.get(f"/actions/{migrate.id}/steps").json() == []
    assert snapshot(pipeline, job_ids) == before
    for workload_id, path in counts.items():
        assert next_count(path, count_of(path)) > 0, workload_id

    # The next cycle proposes it again; approved, it moves, and only then.
    again = plan(pipeline)[ActionKind.migrate]
    assert api.post(f"/actions/{again.id}/approve", "operator").status_code == 200
    assert wait_for_action(pipeline, again.id) == "succeeded", pipeline.logs()
    moved = again.job_id
    (workload_id,) = [w for w, i in job_ids.items() if i == moved]
    target = again.target_node
    assert target is not None
    after = snapshot(pipeline, job_ids)
    assert after["running"][workload_id][0] == target  # type: ignore[index]
    assert after["copies"][workload_id] == [after["running"][workload_id][1]]  # type: ignore[index]
    assert after["generations"][workload_id] == 1  # type: ignore[index]
    assert placed_on(pipeline.engine, job_ids[workload_id]) == [target]
    (other,) = set(JOBS) - {workload_id}
    assert after["running"][other] == before["running"][other]  # type: ignore[index]
    assert after["generations"][other] == 0  # type: ignore[index]
    assert procs.wait_until(lambda: count_of(counts[workload_id]) > 0, timeout=5)
    finish_jobs(pipeline.engine, *JOBS, "adv-big")
