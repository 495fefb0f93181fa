"""The recipe of a federated move (app.actions.recipes, app.actions.messages), step by step
and at each point it can fail, without a database or executors: which steps run where,
which job each names, and what compensation undoes."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from app.actions.messages import move_name, step_message
from app.actions.models import Action, ActionKind, ActionStep, StepState
from app.actions.recipes import (
    NO_ANSWER,
    Unplannable,
    answered_or_given_up,
    compensation_steps,
    forward_steps,
)
from app.clusters.models import Cluster
from app.jobs.models import Job
from wire.steps import StepPhase
from wire.telemetry import JobState, SchedulerKind

NOW = datetime(2026, 12, 4, tzinfo=UTC)
SPEC = json.dumps({"scheduler": "slurm", "native": {"script": "#!/bin/sh\nrun\n"}})
PORTABLE = json.dumps(
    {"scheduler": "slurm", "native": {}, "portable": {"image": "t:1", "command": ["t"], "gpus": 1}}
)


def _cluster(id_: int, name: str, scheduler: SchedulerKind = SchedulerKind.slurm) -> Cluster:
    return Cluster(id=id_, name=name, scheduler=scheduler, created_at=NOW)


A, B = _cluster(1, "a"), _cluster(2, "b")


def _job(state: JobState, *, checkpointable: bool = True, spec: str | None = SPEC) -> Job:
    return Job(
        id=7,
        cluster_id=1,
        external_id="41",
        name="train",
        team="vision",
        state=state,
        checkpointable=checkpointable,
        submit_spec=spec,
        updated_at=NOW,
    )


def _move(**nodes: str) -> Action:
    return Action(
        id=5,
        cluster_id=1,
        target_cluster_id=2,
        job_id=7,
        kind=ActionKind.move,
        idempotency_key="move:a:7:0:b",
        source_node=nodes.get("source"),
        target_node=nodes.get("target"),
        created_at=NOW,
        updated_at=NOW,
    )


def _plan(steps: list[ActionStep]) -> list[tuple[str, str]]:
    return [(s.name, s.queue) for s in steps]


def _ran(steps: list[ActionStep], upto: int, failed: str | None = "boom") -> None:
    """Steps before ``upto`` succeeded, step ``upto`` failed with ``failed``, later ones
    never ran."""
    for step in steps:
        if step.seq < upto:
            step.state = StepState.succeeded
        elif step.seq == upto:
            step.state, step.error = StepState.failed, failed
        else:
            step.state = StepState.skipped


def _message(action: Action, job: Job, step: ActionStep, steps: list[ActionStep]) -> dict:
    return step_message(action, job, step, steps, start_wait_s=30.0).kwargs["step"]  # type: ignore[no-any-return]


def test_a_pending_job_is_held_submitted_and_cancelled_once_accepted() -> None:
    action, job = _move(), _job(JobState.pending)
    steps = forward_steps(action, job, A, 1, B)
    assert _plan(steps) == [
        ("hold", "connector.a"),
        ("submit", "connector.b"),
        ("confirm", "connector.b"),
        ("cancel", "connector.a"),
    ]
    steps[1].state, steps[1].result = StepState.succeeded, {"external_id": "9001"}
    hold, submit, confirm, cancel = (_message(action, job, s, steps) for s in steps)
    assert hold["args"]["pending"] is True and hold["workload_id"] == "41"
    assert submit["args"]["name"] == move_name(5, "41") == "shaper-5-41"
    assert submit["args"]["source_cluster"] == "a"
    assert submit["args"]["spec"] == json.loads(SPEC)
    assert "hold" not in submit["args"]  # a pending job is submitted to wait in B's queue
    # B's copy, named by the id B answered the submit with, must be one B's scheduler runs.
    assert confirm["workload_id"] == "9001" and confirm["args"]["expect"] == "accepted"
    assert cancel["workload_id"] == "41"
    # The cancel at the source is never given up for want of an answer; the others are (the
    # confirm's giving up undoes the move: the copy at B is withdrawn).
    assert [answered_or_given_up(action, s) for s in steps] == [True, True, True, False]


@pytest.mark.parametrize(
    ("failed_at", "error", "compensation"),
    [
        # The hold refused (the job runs): its release asks only if the job is still held.
        (0, "job 41 is running", [("release", "connector.a")]),
        (0, f"{NO_ANSWER} from connector.a", [("release", "connector.a")]),
        (1, "b cannot run it", [("withdraw", "connector.b"), ("release", "connector.a")]),
        # B took the copy, then rejected it (or never said it would run it).
        (2, "job 9001 is failed", [("withdraw", "connector.b"), ("release", "connector.a")]),
        (3, "slurmctld down", [("withdraw", "connector.b"), ("release", "connector.a")]),
    ],
)
def test_a_pending_jobs_move_undoes_what_may_have_happened(
    failed_at: int, error: str, compensation: list[tuple[str, str]]
) -> None:
    action, job = _move(), _job(JobState.pending)
    steps = forward_steps(action, job, A, 1, B)
    _ran(steps, failed_at, error)
    undo = compensation_steps(action, steps, "a", 2)
    assert _plan(undo) == compensation
    assert all(s.phase == StepPhase.compensate and s.generation == 2 for s in undo)
    release = next(s for s in undo if s.name == "release")
    assert _message(action, job, release, [*steps, *undo])["args"]["if_held"] is True


K8S = _cluster(2, "b", SchedulerKind.kubernetes)  # starts a job pinned; holds no GPUs


def test_a_running_job_is_checkpointed_staged_at_the_target_and_released_there() -> None:
    # B runs Kubernetes: nothing reserves GPUs there, the job is checkpointed first.
    action, job = _move(source="node1", target="bnode2"), _job(JobState.running, spec=PORTABLE)
    steps = forward_steps(action, job, A, 1, K8S)
    assert _plan(steps) == [
        ("checkpoint", "agent.a.node1"),
        ("submit", "connector.b"),
        ("transfer", "agent.b.bnode2"),
        ("stage", "agent.b.bnode2"),
        ("release", "connector.b"),
        ("confirm", "agent.b.bnode2"),
        ("cancel", "connector.a"),
        ("release", "agent.a.node1"),
    ]
    assert len({s.idempotency_key for s in steps}) == len(steps)  # two releases, two keys
    steps[0].result = {"image": {"image_dir": "/img/41/g1/image", "backend": "criu"}}
    steps[1].result = {"external_id": "9"}
    steps[2].result = {"image_dir": "/b/img/9/g1/image"}
    steps[3].result = {"image_dir": "/b/img/9/g1/image"}
    sent = {(s.name, s.queue): _message(action, job, s, steps) for s in steps}
    submit = sent["submit", "connector.b"]
    assert submit["workload_id"] == "41" and submit["args"]["hold"] is True
    assert submit["args"]["nodes"] == ["bnode2"]
    # At the target after the submit, the job is the one B accepted.
    for name, queue in [
        ("transfer", "agent.b.bnode2"),
        ("stage", "agent.b.bnode2"),
        ("release", "connector.b"),
        ("confirm", "agent.b.bnode2"),
    ]:
        assert sent[name, queue]["workload_id"] == "9", (name, queue)
    assert sent["stage", "agent.b.bnode2"]["args"]["image_dir"] == "/b/img/9/g1/image"
    assert sent["confirm", "agent.b.bnode2"]["args"]["resumed_from"] == "/b/img/9/g1/image"
    # Where B's scheduler resumes it from (Kubernetes writes it on the Job it releases).
    assert sent["release", "connector.b"]["args"]["resume_from"] == "/b/img/9/g1/image"
    assert sent["cancel", "connector.a"]["workload_id"] == "41"
    assert sent["release", "agent.a.node1"]["workload_id"] == "41"
    assert sent["release", "agent.a.node1"]["args"]["delete_image"] is True
    assert [answered_or_given_up(action, s) for s in steps] == [True] * 6 + [False, False]


def test_on_a_reserving_target_the_node_is_held_before_the_job_stops_at_home() -> None:
    # B runs Slurm: the held copy is submitted and the target node reserved for it before
    # the checkpoint, and the reservation is given back once A's copy is gone.
    action = _move(source="node1", target="bnode2")
    job = _job(JobState.running).model_copy(update={"gpus_requested": 2})
    steps = forward_steps(action, job, A, 1, B)
    assert _plan(steps) == [
        ("submit", "connector.b"),
        ("reserve", "connector.b"),
        ("checkpoint", "agent.a.node1"),
        ("transfer", "agent.b.bnode2"),
        ("stage", "agent.b.bnode2"),
        ("release", "connector.b"),
        ("confirm", "agent.b.bnode2"),
        ("cancel", "connector.a"),
        ("release", "agent.a.node1"),
        ("unreserve", "connector.b"),
    ]
    steps[0].result = {"external_id": "9"}
    sent = {(s.name, s.queue): _message(action, job, s, steps) for s in steps}
    assert sent["submit", "connector.b"]["workload_id"] == "41"
    assert sent["submit", "connector.b"]["args"]["hold"] is True
    reserve = sent["reserve", "connector.b"]
    # B's job, its GPUs on the one target node, whatever B runs there now.
    assert reserve["workload_id"] == "9"
    assert reserve["args"]["gpus"] == {"bnode2": 2}
    assert reserve["args"]["counts_on"] == []
    assert reserve["args"]["ttl_s"] > 0
    assert sent["unreserve", "connector.b"]["workload_id"] == "9"
    assert sent["checkpoint", "agent.a.node1"]["workload_id"] == "41"
    # The last steps (A's cancel, A's image, B's reservation) are sent until answered.
    assert [answered_or_given_up(action, s) for s in steps] == [True] * 7 + [False] * 3


@pytest.mark.parametrize(
    ("failed_at", "compensation"),
    [
        # B's queue took the node since the plan: nothing stopped at home, nothing to bring back.
        (1, [("withdraw", "connector.b"), ("unreserve", "connector.b")]),
        (
            2,
            [
                ("withdraw", "connector.b"),
                ("unreserve", "connector.b"),
                ("restore", "agent.a.node1"),  # a no-op when it still runs there
            ],
        ),
        (
            6,
            [
                ("withdraw", "connector.b"),
                ("unreserve", "connector.b"),
                ("release", "agent.b.bnode2"),
                ("restore", "agent.a.node1"),
            ],
        ),
        (9, []),  # A's copy is cancelled: the job is B's; the upkeep ends the reservation
    ],
)
def test_a_reserving_targets_move_gives_the_reservation_back_when_undone(
    failed_at: int, compensation: list[tuple[str, str]]
) -> None:
    action, job = _move(source="node1", target="bnode2"), _job(JobState.running)
    steps = forward_steps(action, job, A, 1, B)
    _ran(steps, failed_at)
    steps[0].result = {"external_id": "9"}
    undo = compensation_steps(action, steps, "a", 2)
    assert _plan(undo) == compensation
    for step in undo:
        if step.name != "withdraw" and step.queue in ("connector.b", "agent.b.bnode2"):
            assert _message(action, job, step, [*steps, *undo])["workload_id"] == "9", step.name


def test_a_submit_that_failed_leaves_nothing_reserved_to_give_back() -> None:
    action, job = _move(source="node1", target="bnode2"), _job(JobState.running)
    steps = forward_steps(action, job, A, 1, B)
    _ran(steps, 0, "sbatch: error: invalid partition")
    assert _plan(compensation_steps(action, steps, "a", 2)) == [("withdraw", "connector.b")]


@pytest.mark.parametrize(
    ("job", "target", "source", "why"),
    [
        (_job(JobState.running, checkpointable=False), B, "node1", "cannot checkpoint"),
        (_job(JobState.pending, spec=None), B, None, "no submit spec"),
        (_job(JobState.finished), B, None, "nothing to move"),
        (_job(JobState.running, spec=PORTABLE), _cluster(3, "c", SchedulerKind.sim), "n", "pinned"),
        (_job(JobState.running, spec=PORTABLE), _cluster(4, "d", SchedulerKind.kueue), "n", "pin"),
        (_job(JobState.pending), _cluster(5, "e", SchedulerKind.kubernetes), None, "no portable"),
        (_job(JobState.pending), _cluster(6, "f", SchedulerKind.armada), None, "no portable"),
        (_job(JobState.pending), None, None, "no target cluster"),
        (_job(JobState.pending), A, None, "other than a"),
    ],
)
def test_a_move_the_recipe_cannot_run_is_refused_saying_why(
    job: Job, target: Cluster | None, source: str | None, why: str
) -> None:
    action = _move(**({"source": source, "target": "t1"} if source else {}))
    with pytest.raises(Unplannable, match=why):
        forward_steps(action, job, A, 1, target)


def _pending(gpus: int = 2) -> Job:
    return _job(JobState.pending).model_copy(update={"gpus_requested": gpus})


def test_a_pending_job_moving_to_slurm_has_its_planned_node_held_before_it_may_start() -> None:
    # B runs Slurm and the plan names the node it counted on: B's copy is submitted held
    # and pinned there, the node is reserved for it, and only then is it let go; A's copy
    # is cancelled after B runs it, and the node given back at the end.
    action, job = _move(target="bnode1"), _pending()
    steps = forward_steps(action, job, A, 1, B)
    assert _plan(steps) == [
        ("hold", "connector.a"),
        ("submit", "connector.b"),
        ("reserve", "connector.b"),
        ("release", "connector.b"),
        ("confirm", "connector.b"),
        ("cancel", "connector.a"),
        ("unreserve", "connector.b"),
    ]
    steps[1].result = {"external_id": "9001"}
    sent = {s.name: _message(action, job, s, steps) for s in steps}
    assert sent["hold"]["workload_id"] == "41" and sent["hold"]["args"]["pending"] is True
    submit = sent["submit"]
    assert submit["workload_id"] == "41" and submit["args"]["name"] == "shaper-5-41"
    assert submit["args"]["hold"] is True and submit["args"]["nodes"] == ["bnode1"]
    # The reservation, its release, the confirm and the give-back are about B's copy.
    reserve = sent["reserve"]
    assert reserve["workload_id"] == "9001"
    assert reserve["args"]["gpus"] == {"bnode1": 2} and reserve["args"]["counts_on"] == []
    assert reserve["args"]["ttl_s"] > 0
    assert sent["release"]["workload_id"] == "9001"
    assert "if_held" not in sent["release"]["args"]  # B's held copy is let go, not "if held"
    assert sent["confirm"]["workload_id"] == "9001"
    assert sent["confirm"]["args"]["expect"] == "accepted"
    assert sent["cancel"]["workload_id"] == "41" and sent["cancel"]["args"]["moved_away"]
    assert sent["unreserve"]["workload_id"] == "9001"
    assert len({s.idempotency_key for s in steps}) == len(steps)  # two releases, two keys
    # A's cancel and B's give-back are sent until answered.
    assert [answered_or_given_up(action, s) for s in steps] == [True] * 5 + [False, False]


def test_a_pending_job_planned_onto_two_nodes_has_its_gpus_held_on_each() -> None:
    action, job = _move(target="bnode1,bnode2"), _pending(gpus=4)
    steps = forward_steps(action, job, A, 1, B)
    steps[1].result = {"external_id": "9001"}
    submit, reserve = (_message(action, job, s, steps) for s in steps[1:3])
    assert submit["args"]["nodes"] == ["bnode1", "bnode2"]
    assert reserve["args"]["gpus"] == {"bnode1": 2, "bnode2": 2}


@pytest.mark.parametrize(
    "target",
    [
        _cluster(2, "b", SchedulerKind.kubernetes),
        _cluster(2, "b", SchedulerKind.armada),
        _cluster(2, "b", SchedulerKind.ray),
        _cluster(2, "b", SchedulerKind.kueue),
        _cluster(2, "b", SchedulerKind.sim),  # holds GPUs, but places nothing itself
    ],
    ids=lambda c: c.scheduler,
)
def test_a_pending_job_moving_where_nothing_holds_nodes_for_it_keeps_todays_order(
    target: Cluster,
) -> None:
    action, job = _move(target="bnode1"), _job(JobState.pending, spec=PORTABLE)
    steps = forward_steps(action, job, A, 1, target)
    assert [s.name for s in steps] == ["hold", "submit", "confirm", "cancel"]
    steps[1].result = {"external_id": "9001"}
    submit = _message(action, job, steps[1], steps)
    assert "hold" not in submit["args"] and "nodes" not in submit["args"]


def test_a_pending_move_to_slurm_that_names_no_node_leaves_the_placing_to_b() -> None:
    steps = forward_steps(_move(), _pending(), A, 1, B)
    assert [s.name for s in steps] == ["hold", "submit", "confirm", "cancel"]


@pytest.mark.parametrize(
    ("failed_at", "error", "compensation"),
    [
        (1, "sbatch: error: invalid partition", ["withdraw@b", "release@a"]),
        # B's own queue took bnode1 since the plan: nothing is left anywhere but A's copy,
        # pending and released as it was.
        (2, "cannot hold 2 GPUs on bnode1 for 9001: held by 77 (2)", None),
        (2, f"{NO_ANSWER} from connector.b", None),  # made, perhaps: given back
        (3, "slurmctld down", None),
        (4, "job 9001 is PENDING: it has not started yet", None),
        (5, "job 41 is RUNNING and this move did not cancel it", None),
    ],
)
def test_a_pending_move_to_slurm_gives_the_node_back_and_the_job_stays_home_when_undone(
    failed_at: int, error: str, compensation: list[str] | None
) -> None:
    action, job = _move(target="bnode1"), _pending()
    steps = forward_steps(action, job, A, 1, B)
    _ran(steps, failed_at, error)
    steps[1].result = {"external_id": "9001"}
    undo = compensation_steps(action, steps, "a", 2)
    expected = compensation or ["withdraw@b", "unreserve@b", "release@a"]
    assert [f"{s.name}@{s.queue.removeprefix('connector.')}" for s in undo] == expected
    sent = {s.name: _message(action, job, s, [*steps, *undo]) for s in undo}
    assert sent["release"]["workload_id"] == "41" and sent["release"]["args"]["if_held"]
    assert sent["withdraw"]["args"]["name"] == "shaper-5-41"
    if "unreserve" in sent:
        assert sent["unreserve"]["workload_id"] == "9001"


def test_a_pending_move_whose_home_copy_is_cancelled_is_not_undone_by_its_give_back() -> None:
    action, job = _move(target="bnode1"), _pending()
    steps = forward_steps(action, job, A, 1, B)
    _ran(steps, 6, "slurmctld down")
    assert compensation_steps(action, steps, "a", 2) == []
