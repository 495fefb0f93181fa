"""The saga state machine on a real database, driven step by step as executors would."""

from __future__ import annotations

from typing import Any

import pytest
from sqlmodel import Session, col, select

from app.actions import saga
from app.actions.models import Action, ActionKind, ActionState, ActionStep
from app.clusters.models import Cluster
from app.core.clock import FrozenClock
from app.core.security import Principal
from app.jobs.models import Allocation, Job
from app.nodes.models import Node
from app.plans.models import Plan, PlanState
from tests.actions.by_hand import add_nodes
from wire.queues import executor_scope
from wire.steps import AgentStepRequest, StepReport
from wire.telemetry import JobState, SchedulerKind


@pytest.fixture
def job(session: Session, clock: FrozenClock) -> Job:
    cluster = Cluster(name="lab", created_at=clock.now())
    session.add(cluster)
    session.flush()
    row = Job(
        cluster_id=cluster.id,  # type: ignore[arg-type]
        external_id="w1",
        checkpointable=True,
        state=JobState.running,
        updated_at=clock.now(),
    )
    session.add(row)
    session.commit()
    return row


def approved(
    session: Session,
    clock: FrozenClock,
    job: Job,
    kind: ActionKind = ActionKind.migrate,
    *,
    key: str = "k",
    source: str | None = "a",
    target: str | None = "b",
    state: ActionState = ActionState.approved,
) -> int:
    action = Action(
        cluster_id=job.cluster_id,
        job_id=job.id,
        kind=kind,
        state=state,
        idempotency_key=key,
        source_node=source,
        target_node=target,
        created_at=clock.now(),
        updated_at=clock.now(),
    )
    session.add(action)
    session.commit()
    return action.id  # type: ignore[return-value]


def report(message: saga.Outgoing, ok: bool = True, **fields: Any) -> StepReport:
    step = message.kwargs["step"]
    return StepReport(action_id=step["action_id"], key=step["key"], ok=ok, **fields)


def answer(
    session: Session, clock: FrozenClock, message: saga.Outgoing, ok: bool = True, **fields: Any
) -> list[saga.Outgoing]:
    """An executor's report for the message's step."""
    return saga.record_report(
        session=session, report=report(message, ok, **fields), now=clock.now(), reporter=OPERATOR
    )


def only(outgoing: list[saga.Outgoing]) -> saga.Outgoing:
    assert len(outgoing) == 1, outgoing
    return outgoing[0]


def where(message: saga.Outgoing) -> tuple[str, str, int]:
    step = message.kwargs["step"]
    return message.queue, step["step"], step["generation"]


def state_of(session: Session, action_id: int) -> Action:
    action = session.get(Action, action_id)
    assert action is not None
    session.refresh(action)
    return action


# Admin tokens may answer any step (operators of the control plane).
OPERATOR = Principal(token_id=0, name="admin", scopes=frozenset({"admin"}))
IMAGE = {"image": {"backend": "criu", "image_dir": "/a/images/w1/g1/image"}}


def test_a_migration_runs_its_steps_in_order_and_ignores_duplicates(
    session: Session, clock: FrozenClock, job: Job
) -> None:
    action_id = approved(session, clock, job)

    first = only(saga.advance(session=session, action_id=action_id, now=clock.now()))

    assert where(first) == ("agent.lab.a", "checkpoint", 1)
    assert first.task == "shaper.agent.checkpoint"
    request = AgentStepRequest.model_validate(first.kwargs["step"])  # the agent's side agrees
    assert request.workload_id == "w1" and request.key == "k:forward:checkpoint"
    assert state_of(session, action_id).state == "running"
    assert state_of(session, action_id).fencing_token == 1
    session.refresh(job)
    assert job.generation == 1
    # A second advance while the step is out sends nothing more.
    assert saga.advance(session=session, action_id=action_id, now=clock.now()) == []

    transfer = only(answer(session, clock, first, result=IMAGE))
    assert where(transfer) == ("agent.lab.b", "transfer", 1)
    assert transfer.kwargs["step"]["args"]["image"] == IMAGE["image"]
    # The same answer again (a redelivery): nothing happens.
    assert answer(session, clock, first, result=IMAGE) == []

    restore = only(answer(session, clock, transfer, result={"image_dir": "/b/images/w1/g1/image"}))
    assert where(restore) == ("agent.lab.b", "restore", 1)
    assert restore.kwargs["step"]["args"]["image_dir"] == "/b/images/w1/g1/image"
    confirm = only(answer(session, clock, restore))
    assert where(confirm) == ("agent.lab.b", "confirm", 1)
    release = only(answer(session, clock, confirm))
    assert where(release) == ("agent.lab.a", "release", 1)
    assert release.kwargs["step"]["args"]["delete_image"] is True
    assert answer(session, clock, release) == []

    assert state_of(session, action_id).state == "succeeded"
    assert [s.state for s in saga.list_steps(session=session, action_id=action_id)] == [
        "succeeded"
    ] * 5


def test_retryable_failures_are_sent_again_with_backoff_then_compensated(
    session: Session, clock: FrozenClock, job: Job
) -> None:
    action_id = approved(session, clock, job)
    checkpoint = only(saga.advance(session=session, action_id=action_id, now=clock.now()))
    transfer = only(answer(session, clock, checkpoint, result=IMAGE))

    retries = []
    for _attempt in range(saga.MAX_ATTEMPTS - 1):
        again = only(answer(session, clock, transfer, ok=False, error="disk busy", retryable=True))
        assert again.kwargs["step"]["key"] == transfer.kwargs["step"]["key"]
        retries.append(again.countdown)
    assert retries == list(saga.RETRY_BACKOFF_S[: saga.MAX_ATTEMPTS - 1])

    fence_target = only(
        answer(session, clock, transfer, ok=False, error="disk busy", retryable=True)
    )

    # Out of attempts: compensation under a new generation, fencing the target first.
    assert where(fence_target) == ("agent.lab.b", "release", 2)
    assert state_of(session, action_id).state == "compensating"
    session.refresh(job)
    assert job.generation == 2
    home = only(answer(session, clock, fence_target))
    assert where(home) == ("agent.lab.a", "restore", 2)
    assert home.kwargs["step"]["args"] == {"image": IMAGE["image"]}
    assert answer(session, clock, home, result={"summary": "restored"}) == []
    action = state_of(session, action_id)
    assert action.state == "compensated"
    assert action.error == (
        "transfer on agent.lab.b failed: disk busy; compensated: "
        "release on lab.b (done), restore on lab.a (restored)"
    )
    assert [
        (s.phase, s.name, s.state) for s in saga.list_steps(session=session, action_id=action_id)
    ] == [
        ("forward", "checkpoint", "succeeded"),
        ("forward", "transfer", "failed"),
        ("forward", "restore", "skipped"),
        ("forward", "confirm", "skipped"),
        ("forward", "release", "skipped"),
        ("compensate", "release", "succeeded"),
        ("compensate", "restore", "succeeded"),
    ]


def test_an_unanswered_step_is_sent_again_then_given_up(
    session: Session, clock: FrozenClock, job: Job
) -> None:
    action_id = approved(session, clock, job)
    first = only(saga.advance(session=session, action_id=action_id, now=clock.now()))

    def advance_after(seconds: float) -> list[saga.Outgoing]:
        clock.advance(seconds)
        return saga.advance(
            session=session, action_id=action_id, now=clock.now(), step_timeout_s=30
        )

    assert advance_after(29) == []
    again = only(advance_after(2))
    assert again.kwargs["step"]["key"] == first.kwargs["step"]["key"]
    only(advance_after(31))
    # Three attempts unanswered: the checkpoint failed; compensation makes sure the job
    # still runs at its source (a no-op there if the checkpoint never happened).
    home = only(advance_after(31))
    assert where(home) == ("agent.lab.a", "restore", 2)
    assert "image" not in home.kwargs["step"]["args"]
    assert state_of(session, action_id).error == (
        "checkpoint on agent.lab.a failed: no answer from agent.lab.a after 3 attempts"
    )
    # A late answer of the abandoned checkpoint changes nothing.
    assert answer(session, clock, first, result=IMAGE) == []
    answer(session, clock, home, ok=False, error="not running here")
    action = state_of(session, action_id)
    assert action.state == "failed"
    assert action.error is not None and action.error.endswith(
        "compensation restore on agent.lab.a failed: not running here"
    )


def test_only_the_executor_a_step_was_sent_to_may_answer_it(
    session: Session, clock: FrozenClock, job: Job
) -> None:
    action_id = approved(session, clock, job)
    checkpoint = only(saga.advance(session=session, action_id=action_id, now=clock.now()))
    node_b = Principal(token_id=1, name="agent-b", scopes=frozenset({"agent:lab/b"}))
    forged = saga.record_report(
        session=session, report=report(checkpoint, result=IMAGE), now=clock.now(), reporter=node_b
    )
    assert forged == []
    assert saga.list_steps(session=session, action_id=action_id)[0].state == "sent"
    node_a = Principal(token_id=2, name="agent-a", scopes=frozenset({"agent:lab/a"}))
    transfer = saga.record_report(
        session=session, report=report(checkpoint, result=IMAGE), now=clock.now(), reporter=node_a
    )
    assert where(only(transfer)) == ("agent.lab.b", "transfer", 1)
    assert executor_scope("connector.lab") == "connector:lab"


def test_actions_that_cannot_run_are_cancelled_with_a_reason(
    session: Session, clock: FrozenClock, job: Job
) -> None:
    nowhere = approved(session, clock, job, key="nowhere", target=None)
    assert saga.advance(session=session, action_id=nowhere, now=clock.now()) == []
    assert state_of(session, nowhere).state == "cancelled"
    assert (
        state_of(session, nowhere).error
        == "migrate needs exactly one target node, the action names none"
    )

    first = approved(session, clock, job, key="first")
    second = approved(session, clock, job, key="second", target="c")
    only(saga.advance(session=session, action_id=first, now=clock.now()))
    assert saga.advance(session=session, action_id=second, now=clock.now()) == []
    assert state_of(session, second).state == "cancelled"
    assert state_of(session, second).error == f"action {first} is already moving job w1"
    session.refresh(job)
    assert job.generation == 1  # only the saga that runs moved the fence


def test_a_second_action_on_the_same_node_or_job_set_waits_for_none_and_is_cancelled(
    session: Session, clock: FrozenClock, job: Job
) -> None:
    def subjectless(key: str, kind: ActionKind, **fields: Any) -> int:
        action = Action(
            cluster_id=job.cluster_id,
            kind=kind,
            state=ActionState.approved,
            idempotency_key=key,
            created_at=clock.now(),
            updated_at=clock.now(),
            **fields,
        )
        session.add(action)
        session.commit()
        return action.id  # type: ignore[return-value]

    for name in ("a", "b"):
        session.add(Node(cluster_id=job.cluster_id, name=name, updated_at=clock.now()))
    session.commit()
    drain = subjectless("drain-a", ActionKind.drain, source_node="a")
    undrain = subjectless("undrain-a", ActionKind.undrain, source_node="a")
    elsewhere = subjectless("drain-b", ActionKind.drain, source_node="b")
    assert where(saga.advance(session=session, action_id=drain, now=clock.now())[0])[1] == "drain"
    assert saga.advance(session=session, action_id=undrain, now=clock.now()) == []
    assert state_of(session, undrain).state == "cancelled"
    assert (
        state_of(session, undrain).error
        == f"action {drain} is already draining or undraining node a"
    )
    # Another node's is not in its way.
    assert saga.advance(session=session, action_id=elsewhere, now=clock.now()) != []

    move = {"job_set_queue": "research", "job_set": "sweep", "target_executor": "x2"}
    first = subjectless("move-1", ActionKind.move_job_set, **move)
    second = subjectless("move-2", ActionKind.move_job_set, **move)
    other_set = subjectless("move-3", ActionKind.move_job_set, **{**move, "job_set": "other"})
    assert saga.advance(session=session, action_id=first, now=clock.now()) != []
    assert saga.advance(session=session, action_id=second, now=clock.now()) == []
    assert (
        state_of(session, second).error
        == f"action {first} is already moving job set sweep of queue research"
    )
    assert saga.advance(session=session, action_id=other_set, now=clock.now()) != []


@pytest.mark.parametrize("state", [ActionState.proposed, ActionState.rejected])
def test_undecided_and_rejected_actions_never_dispatch(
    session: Session, clock: FrozenClock, job: Job, state: ActionState
) -> None:
    action_id = approved(session, clock, job, state=state)
    assert action_id not in saga.active_action_ids(session=session)
    assert saga.advance(session=session, action_id=action_id, now=clock.now()) == []
    assert state_of(session, action_id).state == state
    assert saga.list_steps(session=session, action_id=action_id) == []
    session.refresh(job)
    assert job.generation == 0


def test_scheduler_steps_go_to_the_connector_and_a_refusal_fails_the_action(
    session: Session, clock: FrozenClock, job: Job
) -> None:
    job.checkpointable = False
    session.add(job)
    session.commit()
    action_id = approved(session, clock, job, ActionKind.preempt, target=None)

    requeue = only(saga.advance(session=session, action_id=action_id, now=clock.now()))

    assert where(requeue) == ("connector.lab", "requeue", 0)
    assert requeue.task == "shaper.connector.requeue"
    assert requeue.kwargs["step"]["args"]["source_node"] == "a"
    answer(session, clock, requeue, ok=False, error="job not found")
    action = state_of(session, action_id)
    assert action.state == "failed"
    assert action.error == "requeue on connector.lab failed: job not found"


def test_a_checkpointable_job_is_preempted_by_checkpoint_and_keeps_its_image(
    session: Session, clock: FrozenClock, job: Job
) -> None:
    action_id = approved(session, clock, job, ActionKind.preempt, target=None)

    checkpoint = only(saga.advance(session=session, action_id=action_id, now=clock.now()))
    assert where(checkpoint) == ("agent.lab.a", "checkpoint", 1)
    release = only(answer(session, clock, checkpoint, result=IMAGE))
    assert where(release) == ("agent.lab.a", "release", 1)
    assert release.kwargs["step"]["args"]["delete_image"] is False  # it resumes from it
    assert answer(session, clock, release) == []

    assert state_of(session, action_id).state == "succeeded"
    session.refresh(job)
    assert (job.state, job.generation) == ("suspended", 1)
    assert job.reason == f"preempted by action {action_id}: checkpointed"


@pytest.fixture
def slurm_job(session: Session, clock: FrozenClock, job: Job) -> Job:
    cluster = session.get(Cluster, job.cluster_id)
    assert cluster is not None
    cluster.scheduler = SchedulerKind.slurm
    session.add(cluster)
    session.commit()
    return job


STAGED_AT_B = {"image_dir": "/b/images/w1/g1/image"}


def test_on_slurm_a_migration_stages_the_image_and_requeues_the_job_pinned_to_the_target(
    session: Session, clock: FrozenClock, slurm_job: Job
) -> None:
    action_id = approved(session, clock, slurm_job)
    checkpoint = only(saga.advance(session=session, action_id=action_id, now=clock.now()))
    assert where(checkpoint) == ("agent.lab.a", "checkpoint", 1)
    transfer = only(answer(session, clock, checkpoint, result=IMAGE))
    stage = only(answer(session, clock, transfer, result=STAGED_AT_B))
    assert where(stage) == ("agent.lab.b", "stage", 1)
    assert stage.kwargs["step"]["args"]["image"] == IMAGE["image"]
    assert stage.kwargs["step"]["args"]["image_dir"] == STAGED_AT_B["image_dir"]

    requeue = only(answer(session, clock, stage, result=STAGED_AT_B))
    assert where(requeue) == ("connector.lab", "requeue", 1)
    assert requeue.task == "shaper.connector.requeue"
    assert requeue.kwargs["step"]["args"]["nodes"] == ["b"]
    # The requeue carries the image and the staged copy on b, for a scheduler that starts
    # the job's pods itself (Kubernetes: SHAPER_RESUME_FROM); Slurm's job body ignores it.
    assert requeue.kwargs["step"]["args"]["image"] == IMAGE["image"]
    assert requeue.kwargs["step"]["args"]["resume_from"] == STAGED_AT_B["image_dir"]

    confirm = only(answer(session, clock, requeue))
    assert where(confirm) == ("agent.lab.b", "confirm", 1)
    args = confirm.kwargs["step"]["args"]
    assert args["resumed_from"] == STAGED_AT_B["image_dir"]
    assert args["wait_s"] == saga.SCHEDULER_START_WAIT_S
    release = only(answer(session, clock, confirm))
    assert where(release) == ("agent.lab.a", "release", 1)
    assert answer(session, clock, release) == []
    assert state_of(session, action_id).state == "succeeded"


def test_on_slurm_a_failure_after_the_requeue_sends_the_job_home_to_resume_there(
    session: Session, clock: FrozenClock, slurm_job: Job
) -> None:
    action_id = approved(session, clock, slurm_job)
    message = only(saga.advance(session=session, action_id=action_id, now=clock.now()))
    for result in (IMAGE, STAGED_AT_B, STAGED_AT_B, {}):
        message = only(answer(session, clock, message, result=result))
    assert where(message) == ("agent.lab.b", "confirm", 1)

    release_target = only(answer(session, clock, message, ok=False, error="not restored"))

    assert where(release_target) == ("agent.lab.b", "release", 2)
    stage_home = only(answer(session, clock, release_target))
    assert where(stage_home) == ("agent.lab.a", "stage", 2)
    assert stage_home.kwargs["step"]["args"]["image"] == IMAGE["image"]
    assert "image_dir" not in stage_home.kwargs["step"]["args"]  # the source's own copy
    requeue_home = only(answer(session, clock, stage_home, result={"image_dir": "/a/img"}))
    assert where(requeue_home) == ("connector.lab", "requeue", 2)
    assert requeue_home.kwargs["step"]["args"]["nodes"] == ["a"]
    confirm_home = only(answer(session, clock, requeue_home))
    assert where(confirm_home) == ("agent.lab.a", "confirm", 2)
    assert confirm_home.kwargs["step"]["args"]["resumed_from"] == "/a/img"
    assert answer(session, clock, confirm_home) == []
    action = state_of(session, action_id)
    assert action.state == "compensated" and "not restored" in (action.error or "")


def test_on_slurm_a_failure_before_the_requeue_restores_the_job_where_it_was(
    session: Session, clock: FrozenClock, slurm_job: Job
) -> None:
    action_id = approved(session, clock, slurm_job)
    checkpoint = only(saga.advance(session=session, action_id=action_id, now=clock.now()))
    transfer = only(answer(session, clock, checkpoint, result=IMAGE))

    release_target = only(answer(session, clock, transfer, ok=False, error="disk full"))

    assert where(release_target) == ("agent.lab.b", "release", 2)
    restore = only(answer(session, clock, release_target))
    assert where(restore) == ("agent.lab.a", "restore", 2)


def test_on_slurm_a_checkpointable_job_is_preempted_into_the_queue_with_its_image_staged(
    session: Session, clock: FrozenClock, slurm_job: Job
) -> None:
    action_id = approved(session, clock, slurm_job, ActionKind.preempt, target=None)
    checkpoint = only(saga.advance(session=session, action_id=action_id, now=clock.now()))
    stage = only(answer(session, clock, checkpoint, result=IMAGE))
    assert where(stage) == ("agent.lab.a", "stage", 1)
    requeue = only(answer(session, clock, stage, result={"image_dir": "/a/img"}))
    assert where(requeue) == ("connector.lab", "requeue", 1)
    assert requeue.kwargs["step"]["args"]["nodes"] == ["a"]
    assert answer(session, clock, requeue) == []
    assert state_of(session, action_id).state == "succeeded"


def test_only_a_confirm_after_a_stage_waits_for_the_scheduler() -> None:
    def step(name: str, phase: str = "forward") -> ActionStep:
        return ActionStep(
            action_id=1, seq=0, phase=phase, name=name, queue="q", idempotency_key=name + phase
        )

    moved = [step("checkpoint"), step("restore"), step("confirm")]
    requeued = [step("checkpoint"), step("stage"), step("confirm")]
    # Kubernetes/Ray: the agent's confirm does not wait, the default timeout applies.
    assert saga._timeout(moved[2], moved, None, 300.0) == saga.DEFAULT_STEP_TIMEOUT_S
    # Slurm: confirm waits up to the start wait for the scheduler to run the job.
    assert saga._timeout(requeued[2], requeued, None, 300.0) == 360.0
    # A stage in the other phase does not count; an explicit override always wins.
    other = [step("stage", "compensate"), step("confirm")]
    assert saga._timeout(other[1], other, None, 300.0) == saga.DEFAULT_STEP_TIMEOUT_S
    assert saga._timeout(requeued[2], requeued, 5.0, 300.0) == 5.0


def test_a_plans_actions_wait_until_all_of_its_reservations_have_ended(
    session: Session, clock: FrozenClock, job: Job
) -> None:
    """Two independent groups of one plan. The first group's start has its own reservation
    but waits for the second group's too: run first, it could set the native queue moving
    onto GPUs that reservation is to hold. Ordering only: that reservation failing does not
    take the first group down, and its end lets the start go."""
    plan = Plan(
        cluster_id=job.cluster_id,
        created_at=clock.now(),
        policy="shaper",
        engine="greedy",
        mode="enforce",
        status="optimal",
        state=PlanState.approved,
    )
    session.add(plan)
    pending = Job(
        cluster_id=job.cluster_id,
        external_id="p1",
        state=JobState.pending,
        updated_at=clock.now(),
    )
    session.add(pending)
    session.commit()

    def action(kind: ActionKind, on: Job, key: str, depends_on: list[int]) -> int:
        row = Action(
            plan_id=plan.id,
            cluster_id=on.cluster_id,
            job_id=on.id,
            kind=kind,
            state=ActionState.approved,
            idempotency_key=key,
            target_node="a",
            target_placement={"a": 1},
            depends_on=depends_on,
            created_at=clock.now(),
            updated_at=clock.now(),
        )
        session.add(row)
        session.commit()
        return row.id  # type: ignore[return-value]

    hold = action(ActionKind.reserve, pending, "hold", [])
    start = action(ActionKind.start, pending, "start", [hold])
    other_hold = action(ActionKind.reserve, job, "other-hold", [])

    answer(session, clock, only(saga.advance(session=session, action_id=hold, now=clock.now())))
    assert state_of(session, hold).state == "succeeded"
    assert saga.advance(session=session, action_id=start, now=clock.now()) == []
    assert state_of(session, start).state == "approved"  # the other reservation first

    refused = only(saga.advance(session=session, action_id=other_hold, now=clock.now()))
    kicks = answer(session, clock, refused, ok=False, error="cannot hold 1 GPUs on a")
    assert state_of(session, other_hold).state == "failed"
    assert saga.kick(start) in kicks  # the plan's last reservation has ended
    sent = only(saga.advance(session=session, action_id=start, now=clock.now()))
    assert where(sent)[1] == "start"
    assert state_of(session, start).state == "running"


def _gang_on(session: Session, clock: FrozenClock, scheduler: SchedulerKind) -> Job:
    """Job g1 (checkpointable) runs on nodes a and b of a cluster of four 2-GPU nodes."""
    cluster = Cluster(name="lab", scheduler=scheduler, created_at=clock.now())
    session.add(cluster)
    session.flush()
    assert cluster.id is not None
    nodes = add_nodes(session, clock, cluster.id, "abcd", 2)
    gang = Job(
        cluster_id=cluster.id,
        external_id="g1",
        checkpointable=True,
        gpus_requested=4,
        gang_size=2,
        state=JobState.running,
        updated_at=clock.now(),
    )
    session.add(gang)
    session.flush()
    for name in "ab":
        session.add(
            Allocation(
                job_id=gang.id,  # type: ignore[arg-type]
                node_id=nodes[name],
                gpu_indices=[0, 1],
                gpu_count=2,
                started_at=clock.now(),
            )
        )
    session.commit()
    return gang


def _gang_move(session: Session, clock: FrozenClock, gang: Job) -> int:
    action_id = approved(session, clock, gang, key="gang", source="a,b", target="c,d")
    action = state_of(session, action_id)
    action.source_placement = {"a": 2, "b": 2}
    action.target_placement = {"c": 2, "d": 2}
    session.add(action)
    session.commit()
    return action_id


def test_a_gang_moves_by_a_restart_its_scheduler_pins_to_the_new_nodes(
    session: Session, clock: FrozenClock
) -> None:
    """No node's process image moves (recipes): the scheduler requeues it held and pinned,
    starts it there, and its confirm reads it running there and nowhere else."""
    gang = _gang_on(session, clock, SchedulerKind.slurm)
    action_id = _gang_move(session, clock, gang)

    requeue = only(saga.advance(session=session, action_id=action_id, now=clock.now()))
    assert where(requeue) == ("connector.lab", "requeue", 1)
    args = requeue.kwargs["step"]["args"]
    assert args["nodes"] == ["c", "d"] and args["hold"] is True
    start = only(answer(session, clock, requeue))
    assert where(start) == ("connector.lab", "start", 1)
    assert start.kwargs["step"]["args"]["nodes"] == ["c", "d"]
    confirm = only(answer(session, clock, start))
    assert where(confirm) == ("connector.lab", "confirm", 1)
    args = confirm.kwargs["step"]["args"]
    assert (args["expect"], args["nodes"], args["exactly"]) == ("running", ["c", "d"], True)
    assert answer(session, clock, confirm) == []
    assert state_of(session, action_id).state == "succeeded"
    # The control plane's own view until the next telemetry: on c and d, off a and b.
    held = session.exec(
        select(Node.name, Allocation.gpu_count)
        .join(Node, col(Node.id) == Allocation.node_id)
        .where(Allocation.job_id == gang.id, col(Allocation.released_at).is_(None))
    ).all()
    assert sorted(held) == [("c", 2), ("d", 2)]


def test_a_gang_move_its_scheduler_cannot_restart_pinned_is_cancelled_with_why(
    session: Session, clock: FrozenClock
) -> None:
    gang = _gang_on(session, clock, SchedulerKind.kubernetes)
    action_id = _gang_move(session, clock, gang)
    assert saga.advance(session=session, action_id=action_id, now=clock.now()) == []
    action = state_of(session, action_id)
    assert action.state == "cancelled"
    assert action.error == (
        "migrate of job g1 from a,b to c,d: a job on several nodes moves by a restart pinned "
        "to its new nodes, which Shaper does through Slurm and the simulated clusters only; "
        "lab runs kubernetes"
    )
    session.refresh(gang)
    assert gang.generation == 0  # nothing was sent


def test_a_gang_that_cannot_checkpoint_is_not_moved(session: Session, clock: FrozenClock) -> None:
    gang = _gang_on(session, clock, SchedulerKind.slurm)
    gang.checkpointable = False
    session.add(gang)
    session.commit()
    action_id = _gang_move(session, clock, gang)
    assert saga.advance(session=session, action_id=action_id, now=clock.now()) == []
    assert state_of(session, action_id).error == (
        "job g1 runs on a,b and cannot checkpoint: a restart on other nodes would start it over"
    )


def test_a_gang_move_that_fails_after_its_requeue_starts_the_job_where_it_was(
    session: Session, clock: FrozenClock
) -> None:
    """Its scheduler stopped the job: compensation starts it again on the nodes it left,
    under a new generation (a late copy of the move's steps is stale), and the job is
    marked displaced, so that the next plan places it first if it cannot start there."""
    gang = _gang_on(session, clock, SchedulerKind.slurm)
    action_id = _gang_move(session, clock, gang)
    requeue = only(saga.advance(session=session, action_id=action_id, now=clock.now()))
    start = only(answer(session, clock, requeue))
    back = only(answer(session, clock, start, ok=False, error="node c drained"))
    assert where(back) == ("connector.lab", "start", 2)
    assert back.kwargs["step"]["phase"] == "compensate"
    assert back.kwargs["step"]["args"]["nodes"] == ["a", "b"]
    session.refresh(gang)
    assert gang.generation == 2 and gang.displaced_at is not None
    assert "was stopped by it (start on connector.lab failed: node c drained)" in (
        gang.displaced_reason or ""
    )
    assert answer(session, clock, back) == []
    assert state_of(session, action_id).state == "compensated"


def test_a_gang_move_refused_before_its_requeue_ran_leaves_the_job_alone(
    session: Session, clock: FrozenClock
) -> None:
    gang = _gang_on(session, clock, SchedulerKind.slurm)
    action_id = _gang_move(session, clock, gang)
    requeue = only(saga.advance(session=session, action_id=action_id, now=clock.now()))
    assert answer(session, clock, requeue, ok=False, error="job 7 is not running") == []
    assert state_of(session, action_id).state == "failed"
    session.refresh(gang)
    assert gang.displaced_at is None
