"""A saga that fails half way compensates: the job runs again where it was, exactly once."""

from __future__ import annotations

from agent import procs
from app.actions.models import ActionKind
from tests.actions.conftest import Api, Tracked
from tests.actions.helpers import (
    add_job,
    finish_jobs,
    job_generation,
    placed_on,
    propose,
    running_copies,
    start_counter,
    steps_of,
    wait_for_action,
)
from tests.support.counter import count_of, next_count, progress_of
from tests.support.pipeline import Pipeline
from tests.support.plans import action_state


def test_restore_failure_on_the_target_brings_the_job_back_to_its_source(
    running_pipeline: Pipeline, api: Api, tracked: Tracked
) -> None:
    pipeline, workload_id = running_pipeline, "ctr-comp"
    # Node c's agent has no usable CRIU: it can receive an image but not restore it.
    pipeline.ensure("agent-c", lambda: pipeline.start_agent("c", "--criu", "/nonexistent/criu"))
    counts = start_counter(pipeline, tracked, workload_id, node="a", backend="criu", state_mb=5)
    started_at = progress_of(counts)["started_at"]
    source_pid = pipeline.store("a").load(workload_id).pid
    job_id = add_job(pipeline.engine, workload_id, node="a")
    action_id = propose(
        pipeline.engine, job_id, ActionKind.migrate, source="a", target="c", key="test:comp"
    )

    assert api.post(f"/actions/{action_id}/approve", "operator").status_code == 200
    final = wait_for_action(pipeline, action_id)

    assert final == "compensated", pipeline.logs()
    assert steps_of(api, action_id) == [
        ("forward", "checkpoint", "agent.lab.a", "succeeded"),
        ("forward", "transfer", "agent.lab.c", "succeeded"),
        ("forward", "restore", "agent.lab.c", "failed"),
        ("forward", "confirm", "agent.lab.c", "skipped"),
        ("forward", "release", "agent.lab.a", "skipped"),
        ("compensate", "release", "agent.lab.c", "succeeded"),
        ("compensate", "restore", "agent.lab.a", "succeeded"),
    ]
    error = api.get(f"/actions/{action_id}").json()["error"]
    assert error.startswith("restore on agent.lab.c failed:")
    assert "CRIU >= 4.1 is needed" in error
    assert "compensated: release on lab.c" in error and "restore on lab.a" in error
    # Compensation ran under a new generation; the forward steps are stale from now on.
    assert job_generation(pipeline.engine, job_id) == 2
    assert placed_on(pipeline.engine, job_id) == ["a"]
    assert [s.generation for s in action_state(pipeline.engine, action_id)[1]] == [1] * 5 + [2] * 2
    # Back on a from its checkpoint: the same process state, counting on, once.
    back = pipeline.store("a").load(workload_id)
    assert back.is_running() and back.pid != source_pid
    assert progress_of(counts)["started_at"] == started_at
    assert next_count(counts, count_of(counts)) > 0
    assert running_copies(workload_id) == [back.pid]
    assert procs.wait_until(lambda: running_copies(workload_id) == [back.pid], timeout=2)
    pipeline.stop("agent-c")
    finish_jobs(pipeline.engine, workload_id)
