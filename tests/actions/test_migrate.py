"""Approved migrate actions move real counters between two node agents, exactly once."""

from __future__ import annotations

from pathlib import Path

from agent import procs
from agent.workload import WorkloadState
from app.actions.models import ActionKind, StepState
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
from tests.support.pipeline import Pipeline, send
from tests.support.plans import action_state

MIGRATE_STEPS = [
    ("forward", "checkpoint", "agent.lab.a", "succeeded"),
    ("forward", "transfer", "agent.lab.b", "succeeded"),
    ("forward", "restore", "agent.lab.b", "succeeded"),
    ("forward", "confirm", "agent.lab.b", "succeeded"),
    ("forward", "release", "agent.lab.a", "succeeded"),
]
MiB = 1 << 20


def migrate(pipeline: Pipeline, api: Api, workload_id: str, *, backend: str, state_mb: float):
    """Start a counter on a, approve its migration to b, wait for the saga to finish."""
    job_id = add_job(pipeline.engine, workload_id, node="a")
    action_id = propose(
        pipeline.engine,
        job_id,
        ActionKind.migrate,
        source="a",
        target="b",
        key=f"test:{workload_id}:migrate",
    )
    approved = api.post(f"/actions/{action_id}/approve", "operator")
    assert approved.status_code == 200, approved.text
    assert approved.json()["decided_by"] == "test-operator"
    return job_id, action_id, wait_for_action(pipeline, action_id)


def test_criu_migration_of_100_mb_continues_the_count(
    running_pipeline: Pipeline, api: Api, tracked: Tracked
) -> None:
    pipeline, workload_id = running_pipeline, "ctr-criu"
    counts = start_counter(pipeline, tracked, workload_id, node="a", backend="criu", state_mb=100)
    source_pid = pipeline.store("a").load(workload_id).pid
    first = progress_of(counts)

    job_id, action_id, final = migrate(pipeline, api, workload_id, backend="criu", state_mb=100)

    assert final == "succeeded", pipeline.logs()
    assert steps_of(api, action_id) == MIGRATE_STEPS
    image = action_state(pipeline.engine, action_id)[1][0].result["image"]
    assert image["backend"] == "criu" and image["size_bytes"] >= 100 * MiB
    moved = pipeline.store("b").load(workload_id)
    assert moved.is_running() and moved.pid != source_pid
    assert not procs.is_running(source_pid)
    assert pipeline.store("a").load(workload_id).state is WorkloadState.released
    # The same process memory, moved: it started when the original did and counts on.
    at_success = count_of(counts)
    assert progress_of(counts)["started_at"] == first["started_at"]
    assert at_success > first["count"]
    assert next_count(counts, at_success) > at_success
    assert running_copies(workload_id) == [moved.pid]
    assert job_generation(pipeline.engine, job_id) == 1
    assert placed_on(pipeline.engine, job_id) == ["b"]
    assert {s.generation for s in action_state(pipeline.engine, action_id)[1]} == {1}
    assert not (pipeline.state_dir("a") / "images" / workload_id).exists()
    finish_jobs(pipeline.engine, workload_id)


def test_signal_migration_of_100_mb_resumes_from_the_saved_count(
    running_pipeline: Pipeline, api: Api, tracked: Tracked
) -> None:
    pipeline, workload_id = running_pipeline, "ctr-signal"
    counts = start_counter(pipeline, tracked, workload_id, node="a", backend="signal", state_mb=100)
    before = count_of(counts)

    _job_id, action_id, final = migrate(pipeline, api, workload_id, backend="signal", state_mb=100)

    assert final == "succeeded", pipeline.logs()
    assert steps_of(api, action_id) == MIGRATE_STEPS
    moved = pipeline.store("b").load(workload_id)
    progress = progress_of(counts)
    # A new process on b that read the checkpoint taken on a: not a start from zero.
    assert str(progress["resumed_from"]).startswith(str(pipeline.state_dir("b") / "images"))
    assert progress["state_bytes"] == 100 * MiB
    log = Path(moved.spec.log_path).read_text()
    resumed_at = int(log.rsplit("resumed from", 1)[1].split("at count", 1)[1].split()[0])
    assert resumed_at > before
    assert next_count(counts, count_of(counts)) > resumed_at
    assert running_copies(workload_id) == [moved.pid]
    finish_jobs(pipeline.engine, workload_id)


def test_duplicate_and_stale_steps_are_refused_and_the_job_runs_once(
    running_pipeline: Pipeline, api: Api, tracked: Tracked
) -> None:
    pipeline, workload_id = running_pipeline, "ctr-fence"
    counts = start_counter(pipeline, tracked, workload_id, node="a", backend="criu", state_mb=5)
    _job_id, action_id, final = migrate(pipeline, api, workload_id, backend="criu", state_mb=5)
    assert final == "succeeded", pipeline.logs()
    steps = {s.name: s for s in action_state(pipeline.engine, action_id)[1]}
    running_pid = pipeline.store("b").load(workload_id).pid
    image = steps["checkpoint"].result["image"]
    base = {"action_id": action_id, "workload_id": workload_id}
    messages = [
        # The restore on b delivered again (a broker redelivery, a resend): answered from
        # the journal, not run a second time.
        (
            "agent.lab.b",
            "restore",
            {
                **base,
                "key": steps["restore"].idempotency_key,
                "generation": 1,
                "args": {"image": image, "image_dir": steps["transfer"].result["image_dir"]},
            },
        ),
        # A late restore on a from before the migration (generation 0): the job left a.
        (
            "agent.lab.a",
            "restore",
            {**base, "key": "late:restore", "generation": 0, "args": {"image": image}},
        ),
        # The same saga's generation cannot bring it back to a either.
        (
            "agent.lab.a",
            "restore",
            {**base, "key": "late:restore-again", "generation": 1, "args": {"image": image}},
        ),
        # A late release on b from an older saga would kill the running job: refused.
        ("agent.lab.b", "release", {**base, "key": "late:release", "generation": 0}),
    ]
    for queue, step, message in messages:
        send(
            pipeline.broker,
            f"shaper.agent.{step}",
            queue,
            kwargs={"step": {"step": step, **message}},
        )

    def outcomes(node: str) -> dict[str, str]:
        journal = pipeline.journal(node)
        return {e["key"]: e["outcome"] for e in journal if e["workload"] == workload_id}

    restore_key = steps["restore"].idempotency_key

    def answered() -> bool:
        on_a, on_b = outcomes("a"), outcomes("b")
        duplicates = [e["outcome"] for e in pipeline.journal("b") if e["key"] == restore_key]
        return (
            {"late:restore", "late:restore-again"} <= set(on_a)
            and "late:release" in on_b
            and duplicates.count("duplicate") == 1
        )

    assert procs.wait_until(answered, timeout=60, interval=0.2), pipeline.logs()
    assert outcomes("a")["late:restore"] == "refused"
    assert outcomes("a")["late:restore-again"] == "refused"
    assert outcomes("b")["late:release"] == "refused"
    refusal = next(e for e in pipeline.journal("a") if e["key"] == "late:restore")
    assert "stale fencing token" in refusal["error"]
    # Exactly once: the one process on b, the same as before, still counting.
    assert running_copies(workload_id) == [running_pid]
    assert next_count(counts, count_of(counts)) > 0
    # The control plane ignores the answers: nothing in the action changed.
    assert action_state(pipeline.engine, action_id)[0] == "succeeded"
    assert all(s.state == StepState.succeeded for s in action_state(pipeline.engine, action_id)[1])
    finish_jobs(pipeline.engine, workload_id)
