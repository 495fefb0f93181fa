"""A service's shrink off named nodes (a replica move's first half), step by step and
without a database: its steps (app.actions.recipes) and what each message carries
(app.actions.messages), on a first delivery and on a resend after the job's row changed."""

from __future__ import annotations

from datetime import UTC, datetime

from app.actions.messages import step_message
from app.actions.models import Action, ActionKind
from app.actions.recipes import forward_steps
from app.clusters.models import Cluster
from app.jobs.models import Job
from wire.telemetry import JobShape, JobState, SchedulerKind

NOW = datetime(2026, 12, 6, tzinfo=UTC)
CLUSTER = Cluster(id=1, name="lab", scheduler=SchedulerKind.kubernetes, created_at=NOW)


def _service(*, movable: bool = True, gpus: int = 2) -> Job:
    return Job(
        id=7,
        cluster_id=1,
        external_id="ns/deployment/llm",
        shape=JobShape.elastic,
        state=JobState.running,
        gpus_requested=gpus,
        replicas_movable=movable,
        updated_at=NOW,
    )


def _shrink() -> Action:
    """Two 2-GPU replicas on a and one on b, shrunk to the one on b and one on a."""
    return Action(
        id=5,
        cluster_id=1,
        job_id=7,
        kind=ActionKind.resize,
        idempotency_key="shrink",
        source_placement={"a": 4, "b": 2},
        target_placement={"a": 2, "b": 2},
        target_replicas=2,
        created_at=NOW,
        updated_at=NOW,
    )


def _args(action: Action, job: Job) -> list[tuple[str, dict[str, object]]]:
    steps = forward_steps(action, _service(), CLUSTER, 1)  # chosen at dispatch
    return [
        (s.name, step_message(action, job, s, steps, start_wait_s=30.0).kwargs["step"]["args"])
        for s in steps
    ]


def test_a_shrink_off_named_nodes_names_them_and_confirms_the_gpus_left() -> None:
    (resize, resize_args), (confirm, confirm_args) = _args(_shrink(), _service())
    assert (resize, confirm) == ("resize", "confirm")
    assert resize_args["leave"] == {"a": 1} and resize_args["replicas"] == 2
    assert confirm_args["expect"] == "running" and confirm_args["gpus_at_most"] == {"a": 2}


def test_a_resend_says_what_the_first_delivery_said_whatever_the_job_row_says_now() -> None:
    """Between dispatch and a resend the job's row changed: its connector restarted
    without pod_placement (not movable any more) and reports another size. The resend
    still names the replica leaving a, from the action: a plain scale instead would let
    the ReplicaSet remove a replica of its own choosing, and the confirm would then fail."""
    (_, resize_args), _ = _args(_shrink(), _service(movable=False, gpus=1))
    assert resize_args["leave"] == {"a": 1}


def test_a_service_its_connector_cannot_move_is_resized_plainly() -> None:
    steps = forward_steps(_shrink(), _service(movable=False), CLUSTER, 1)
    assert [s.name for s in steps] == ["resize"]
    args = step_message(_shrink(), _service(movable=False), steps[0], steps, 30.0)
    assert "leave" not in args.kwargs["step"]["args"]
