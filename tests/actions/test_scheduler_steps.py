"""Scheduler-level actions go to the cluster's connector queue, once each."""

from __future__ import annotations

import json

from app.actions.models import ActionKind
from tests.actions.conftest import Api, start_sim_connector
from tests.actions.helpers import add_job, finish_jobs, job_generation, propose, steps_of
from tests.actions.helpers import wait_for_action as wait
from tests.support.pipeline import Pipeline


def test_requeue_and_start_go_to_the_connector_and_a_preempt_without_checkpoint_requeues(
    running_pipeline: Pipeline, api: Api
) -> None:
    pipeline = running_pipeline
    pipeline.ensure("connector", lambda: start_sim_connector(pipeline))
    batch = add_job(pipeline.engine, "sched-batch", node="a", checkpointable=False)
    waiting = add_job(pipeline.engine, "sched-wait", node=None)
    actions = {
        "preempt": propose(
            pipeline.engine, batch, ActionKind.preempt, source="a", key="test:sched:preempt"
        ),
        "start": propose(
            pipeline.engine, waiting, ActionKind.start, target="b", key="test:sched:start"
        ),
    }
    for action_id in actions.values():
        assert api.post(f"/actions/{action_id}/approve", "operator").status_code == 200

    assert {kind: wait(pipeline, a) for kind, a in actions.items()} == {
        "preempt": "succeeded",
        "start": "succeeded",
    }, pipeline.logs()
    # Each is confirmed by reading the scheduler back ("succeeded" means seen).
    assert steps_of(api, actions["preempt"]) == [
        ("forward", "requeue", "connector.lab", "succeeded"),
        ("forward", "confirm", "connector.lab", "succeeded"),
    ]
    assert steps_of(api, actions["start"]) == [
        ("forward", "start", "connector.lab", "succeeded"),
        ("forward", "confirm", "connector.lab", "succeeded"),
    ]
    recorded = [
        step
        for line in (pipeline.root / "connector-steps.jsonl").read_text().splitlines()
        if (step := json.loads(line))["workload_id"] in ("sched-batch", "sched-wait")
    ]
    assert sorted((r["step"], r["workload_id"]) for r in recorded) == [
        ("confirm", "sched-batch"),
        ("confirm", "sched-wait"),
        ("requeue", "sched-batch"),
        ("start", "sched-wait"),
    ]
    confirms = {r["workload_id"]: r["args"] for r in recorded if r["step"] == "confirm"}
    assert confirms["sched-batch"]["expect"] == "stopped"
    assert confirms["sched-wait"]["expect"] == "running"
    assert confirms["sched-wait"]["nodes"] == ["b"]
    # The stopped job waits, held, until a plan starts it again.
    assert next(r for r in recorded if r["step"] == "requeue")["args"]["hold"] is True
    assert next(r for r in recorded if r["step"] == "start")["args"]["target_node"] == "b"
    # Nothing was moved by a process-level saga: no new generation.
    assert job_generation(pipeline.engine, batch) == 0
    pipeline.stop("connector")
    finish_jobs(pipeline.engine, "sched-batch", "sched-wait")
