"""Federated moves between simulated clusters: a pending job's SubmitSpec in telemetry, the
`submit` step through the target's executor (idempotent by key and by name, fenced by the
source job's generation), and the source's copy cancelled through its own executor."""

from __future__ import annotations

import itertools
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from connectors.actions import ConnectorStepExecutor
from connectors.base import ConnectorError
from connectors.sim import SimCluster, SiteSpec
from connectors.sim.cluster import KEEP_FINISHED
from wire.steps import Outcome, StepRequest
from wire.telemetry import JobKind, JobReport, JobState, PortableSpec, SchedulerKind, SubmitSpec

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


def _site(name: str, *nodes: tuple[str, str, int]) -> SiteSpec:
    return SiteSpec(
        name=name, nodes=nodes, teams=("research",), kinds=(JobKind.training,), arrivals_per_hour=0
    )


def _clusters(clock: Clock) -> tuple[SimCluster, SimCluster]:
    """A: one 8-GPU H100 node, full; B: two 8-GPU H100 nodes, empty."""
    a = SimCluster(_site("lab-a", ("a1", "H100", 8)), start=T0, seed=1, clock=clock)
    b = SimCluster(
        _site("lab-b", ("b1", "H100", 8), ("b2", "H100", 8)), start=T0, seed=1, clock=clock
    )
    return a, b


def _job(job_id: str, gpus: int, **fields: Any) -> JobReport:
    return JobReport(external_id=job_id, gpus_requested=gpus, submit_time=T0, **fields)


_keys = itertools.count(1)


def _step(step: str, workload_id: str, *, generation: int = 1, key: str = "", **args: Any) -> Any:
    return StepRequest(
        action_id=11,
        key=key or f"a11:forward:{step}:{next(_keys)}",
        step=step,
        workload_id=workload_id,
        generation=generation,
        args=args,
    )


def _pending_spec(cluster: SimCluster, job_id: str) -> SubmitSpec:
    report = next(j for j in cluster.read_state().jobs if j.external_id == job_id)
    assert report.state is JobState.pending
    assert report.submit is not None
    return report.submit


def test_a_pending_job_moves_to_another_cluster_once_and_its_source_copy_is_cancelled(
    tmp_path: Path,
) -> None:
    clock = Clock()
    a, b = _clusters(clock)
    a.submit(_job("busy", 8), timedelta(hours=5))
    a.submit(
        _job("wait", 4, name="train-7", team="vision", priority=50, checkpointable=True),
        timedelta(hours=2),
    )
    # A is full: "wait" waits, and carries how to submit it elsewhere (so does "busy").
    running = next(j for j in a.read_state().jobs if j.external_id == "busy")
    assert running.state is JobState.running and running.submit is not None
    spec = _pending_spec(a, "wait")
    assert spec.scheduler is SchedulerKind.sim
    assert spec.native["gpus"] == 4 and spec.native["work_s"] == 2 * 3600
    assert spec.native["team"] == "vision" and spec.native["checkpointable"] is True

    on_a = ConnectorStepExecutor(a, cluster="lab-a", state_dir=tmp_path / "a")
    on_b = ConnectorStepExecutor(b, cluster="lab-b", state_dir=tmp_path / "b")
    submit = _step("submit", "wait", generation=4, spec=spec.model_dump(mode="json"), name="mv-11")
    first = on_b.run(submit)
    assert first.ok and first.outcome is Outcome.executed, first.error
    new_id = first.result["external_id"]
    moved = next(j for j in b.read_state().jobs if j.external_id == new_id)
    assert moved.state is JobState.running and moved.gpus_requested == 4
    assert (moved.name, moved.team, moved.priority) == ("train-7", "vision", 50)

    # The same step again (its answer was lost): answered from the journal, same job.
    again = on_b.run(submit)
    assert again.outcome is Outcome.duplicate and again.result == first.result
    # A new delivery under another key but the same move name: the job it submitted before.
    other_key = on_b.run(
        _step("submit", "wait", generation=4, spec=spec.model_dump(mode="json"), name="mv-11")
    )
    assert other_key.outcome is Outcome.executed and other_key.result["external_id"] == new_id
    assert [j.id for j in b.jobs.values() if j.move_name == "mv-11"] == [new_id]

    # Only now does A let go of its copy.
    cancelled = on_a.run(_step("cancel", "wait", generation=4))
    assert cancelled.ok, cancelled.error
    assert a.jobs["wait"].state is JobState.cancelled

    # The moved job needs the run time it had (it starts over: a pending job moves bare).
    clock.now = T0 + timedelta(hours=2, seconds=1)
    finished = next(j for j in b.read_state().jobs if j.external_id == new_id)
    assert finished.state is JobState.finished and finished.submit is None


def test_a_spec_the_cluster_cannot_run_is_refused_for_good_with_the_reason(
    tmp_path: Path,
) -> None:
    _, b = _clusters(Clock())
    on_b = ConnectorStepExecutor(b, cluster="lab-b", state_dir=tmp_path)
    slurm_spec = SubmitSpec(scheduler=SchedulerKind.slurm, native={"script": "#!/bin/sh\n"})
    step = _step("submit", "42", spec=slurm_spec.model_dump(mode="json"), name="mv-1")
    report = on_b.run(step)
    assert not report.ok and not report.retryable
    assert "a slurm job cannot run here: its spec has no portable form" in (report.error or "")
    # Journalled: a resend gets the same answer without trying again.
    assert on_b.run(step).outcome is Outcome.duplicate

    too_big = SubmitSpec(scheduler=SchedulerKind.sim, native={"gpus": 24, "work_s": 60})
    report = on_b.run(_step("submit", "43", spec=too_big.model_dump(mode="json"), name="mv-2"))
    assert not report.ok and not report.retryable
    assert "needs 24 GPUs, the cluster has 16" in (report.error or "")

    wrong_model = SubmitSpec(
        scheduler=SchedulerKind.sim,
        native={"gpus": 1, "work_s": 60, "allowed_gpu_models": ["MI300X"]},
    )
    report = on_b.run(_step("submit", "44", spec=wrong_model.model_dump(mode="json"), name="mv-3"))
    assert "needs 1 GPUs of MI300X, the cluster has 0" in (report.error or "")

    malformed = on_b.run(_step("submit", "45", spec={"scheduler": "nope"}, name="mv-4"))
    assert malformed.outcome is Outcome.refused and "not a SubmitSpec" in (malformed.error or "")
    nameless = on_b.run(_step("submit", "46", spec=too_big.model_dump(mode="json")))
    assert nameless.outcome is Outcome.refused and "args.name" in (nameless.error or "")
    assert not any(job.move_name for job in b.jobs.values())


def test_a_portable_spec_of_another_scheduler_runs_as_a_simulated_job(tmp_path: Path) -> None:
    _, b = _clusters(Clock())
    portable = SubmitSpec(
        scheduler=SchedulerKind.kubernetes,
        native={"job": {"kind": "Job"}},
        portable=PortableSpec(image="trainer:1", command=["python", "train.py"], gpus=2),
    )
    on_b = ConnectorStepExecutor(b, cluster="lab-b", state_dir=tmp_path)
    report = on_b.run(_step("submit", "ns/job", spec=portable.model_dump(mode="json"), name="mv-9"))
    assert report.ok, report.error
    job = b.jobs[report.result["external_id"]]
    assert job.report.gpus_requested == 2 and job.state is JobState.running


def test_a_submit_is_fenced_by_its_source_job_not_by_a_local_job_of_the_same_id(
    tmp_path: Path,
) -> None:
    a, b = _clusters(Clock())
    a.submit(_job("busy", 8), timedelta(hours=5))
    a.submit(_job("7", 2), timedelta(hours=1))
    spec = _pending_spec(a, "7").model_dump(mode="json")
    b.submit(_job("7", 1), timedelta(hours=1))  # B has a job "7" of its own
    on_b = ConnectorStepExecutor(b, cluster="lab-b", state_dir=tmp_path)

    moved = on_b.run(
        _step("submit", "7", generation=9, spec=spec, name="mv-5", source_cluster="lab-a")
    )
    assert moved.ok, moved.error
    # B's own job 7, at its own (lower) generation, is not fenced by A's job 7.
    held = on_b.run(_step("hold", "7", generation=1))
    assert held.ok and held.outcome is Outcome.executed, held.error
    # A superseded move of A's job 7 (an older generation) is refused, and submits nothing.
    stale = on_b.run(
        _step("submit", "7", generation=8, spec=spec, name="mv-4", source_cluster="lab-a")
    )
    assert stale.outcome is Outcome.refused and "stale generation 8" in (stale.error or "")
    assert sorted(j.move_name or "" for j in b.jobs.values() if j.move_name) == ["mv-5"]


def test_a_withdraw_cancels_the_moved_job_once_and_a_later_submit_brings_nothing_back(
    tmp_path: Path,
) -> None:
    a, b = _clusters(Clock())
    a.submit(_job("busy", 8), timedelta(hours=5))
    a.submit(_job("wait", 4), timedelta(hours=2))
    spec = _pending_spec(a, "wait")
    moved = b.submit(spec, name="mv-21")
    assert b.jobs[moved].state is JobState.running

    assert b.withdraw("mv-21") == moved
    assert b.jobs[moved].state is JobState.cancelled and not b.jobs[moved].placement
    assert b.free() == {"b1": list(range(8)), "b2": list(range(8))}
    # Again (a resent compensation): nothing left to cancel, nothing changes.
    before = b.jobs[moved].report
    assert b.withdraw("mv-21") is None
    assert b.jobs[moved].report == before
    # A move that never arrived; and a late submit of the withdrawn move submits nothing.
    assert b.withdraw("mv-never") is None
    assert b.submit(spec, name="mv-21") == moved
    assert [j.id for j in b.jobs.values() if j.move_name] == [moved]
    assert b.jobs[moved].state is JobState.cancelled


def test_a_move_whose_job_already_ran_at_the_target_cannot_be_withdrawn() -> None:
    clock = Clock()
    a, b = _clusters(clock)
    a.submit(_job("busy", 8), timedelta(hours=5))
    a.submit(_job("wait", 4), timedelta(hours=2))
    moved = b.submit(_pending_spec(a, "wait"), name="mv-41")
    clock.now += timedelta(hours=2, seconds=1)
    b.advance_to(clock.now)
    assert b.jobs[moved].state is JobState.finished
    with pytest.raises(ConnectorError, match="already ran here and finished") as refused:
        b.withdraw("mv-41")
    assert not refused.value.retryable


def test_a_withdraw_step_reports_the_job_and_fences_a_late_submit(tmp_path: Path) -> None:
    a, b = _clusters(Clock())
    a.submit(_job("busy", 8), timedelta(hours=5))
    a.submit(_job("7", 2), timedelta(hours=1))
    spec = _pending_spec(a, "7").model_dump(mode="json")
    b.submit(_job("7", 1), timedelta(hours=1))  # B has a job "7" of its own
    on_b = ConnectorStepExecutor(b, cluster="lab-b", state_dir=tmp_path)
    moved = on_b.run(
        _step("submit", "7", generation=3, spec=spec, name="mv-31", source_cluster="lab-a")
    )
    assert moved.ok, moved.error
    new_id = moved.result["external_id"]

    withdrawn = on_b.run(_step("withdraw", "7", generation=4, name="mv-31", source_cluster="lab-a"))
    assert withdrawn.ok and withdrawn.outcome is Outcome.executed, withdrawn.error
    assert withdrawn.result["external_id"] == new_id and withdrawn.result["name"] == "mv-31"
    assert b.jobs[new_id].state is JobState.cancelled
    assert b.jobs["7"].state is JobState.running  # B's own job 7 is not touched
    nothing = on_b.run(_step("withdraw", "7", generation=4, name="mv-31", source_cluster="lab-a"))
    assert nothing.ok and nothing.result["external_id"] is None

    # The superseded saga's submit arrives late (another move name): refused, nothing new.
    late = on_b.run(
        _step("submit", "7", generation=3, spec=spec, name="mv-30", source_cluster="lab-a")
    )
    assert late.outcome is Outcome.refused and "stale generation 3" in (late.error or "")
    assert [j.move_name for j in b.jobs.values() if j.move_name] == ["mv-31"]
    # B's own job 7, at its own generation, is fenced by neither.
    held = on_b.run(_step("hold", "7", generation=1))
    assert held.ok and held.outcome is Outcome.executed, held.error

    nameless = on_b.run(_step("withdraw", "7", generation=4, source_cluster="lab-a"))
    assert nameless.outcome is Outcome.refused and "args.name" in (nameless.error or "")


def _report(cluster: SimCluster, job_id: str) -> JobReport:
    return next(j for j in cluster.read_state().jobs if j.external_id == job_id)


def test_a_running_job_carries_the_run_time_it_has_left_when_it_can_checkpoint() -> None:
    clock = Clock()
    a, _ = _clusters(clock)
    a.submit(_job("ckpt", 4, checkpointable=True), timedelta(hours=3))
    a.submit(_job("plain", 4), timedelta(hours=3))
    clock.now = T0 + timedelta(hours=1)
    ckpt, plain = _report(a, "ckpt"), _report(a, "plain")
    assert ckpt.state is JobState.running and plain.state is JobState.running
    assert ckpt.submit is not None and plain.submit is not None
    # Its move checkpoints it and the job submitted there starts with no progress of its
    # own: it needs what is left. One that cannot checkpoint starts over.
    assert ckpt.submit.native["work_s"] == 2 * 3600
    assert ckpt.submit.native["checkpointable"] is True
    assert plain.submit.native["work_s"] == 3 * 3600
    clock.now = T0 + timedelta(hours=2)
    left = _report(a, "ckpt").submit
    assert left is not None and left.native["work_s"] == 3600  # read anew, not cached


def test_a_held_pinned_submit_waits_for_its_release_and_starts_on_its_node(
    tmp_path: Path,
) -> None:
    clock = Clock()
    a, b = _clusters(clock)
    a.submit(_job("run", 4, name="train-9", checkpointable=True), timedelta(hours=3))
    clock.now = T0 + timedelta(hours=1)
    spec = _report(a, "run").submit
    assert spec is not None
    on_b = ConnectorStepExecutor(b, cluster="lab-b", state_dir=tmp_path)
    submit = _step(
        "submit",
        "run",
        spec=spec.model_dump(mode="json"),
        name="mv-41",
        nodes=["b2"],
        hold=True,
        source_cluster="lab-a",
    )
    report = on_b.run(submit)
    assert report.ok and report.outcome is Outcome.executed, report.error
    assert report.result["held"] is True and report.result["nodes"] == ["b2"]
    new_id = report.result["external_id"]

    # Held: B is empty and it fits, yet it waits (its image is not staged yet).
    clock.now += timedelta(minutes=5)
    waiting = _report(b, new_id)
    assert waiting.state is JobState.pending and waiting.reason == "JobHeldUser"
    assert b.free() == {"b1": list(range(8)), "b2": list(range(8))}

    # Resent under another key: the same job, not submitted again.
    again = on_b.run(
        _step(
            "submit",
            "run",
            spec=spec.model_dump(mode="json"),
            name="mv-41",
            nodes=["b1"],
            hold=True,
            source_cluster="lab-a",
        )
    )
    assert again.ok and again.result["external_id"] == new_id, again.error
    assert [j.id for j in b.jobs.values() if j.move_name == "mv-41"] == [new_id]

    released = on_b.run(_step("release", new_id))
    assert released.ok, released.error
    started = _report(b, new_id)
    assert started.state is JobState.running
    assert [a.node for a in started.allocations] == ["b2"]  # where it was pinned, not b1
    # It needs the two hours it had left, not the three it had in all.
    clock.now += timedelta(hours=2, seconds=1)
    assert _report(b, new_id).state is JobState.finished

    # A resend after it started leaves it as it is: not held again.
    assert b.submit(spec, name="mv-41", nodes=["b1"], hold=True) == new_id
    assert b.jobs[new_id].held is False


def test_a_pin_to_nodes_the_cluster_lacks_or_that_cannot_hold_the_job_is_refused(
    tmp_path: Path,
) -> None:
    _, b = _clusters(Clock())
    on_b = ConnectorStepExecutor(b, cluster="lab-b", state_dir=tmp_path)
    spec = SubmitSpec(scheduler=SchedulerKind.sim, native={"gpus": 12, "work_s": 60})
    nowhere = on_b.run(
        _step("submit", "50", spec=spec.model_dump(mode="json"), name="mv-50", nodes=["zz9"])
    )
    assert not nowhere.ok and not nowhere.retryable
    assert "cannot pin the job to zz9: no such node here" in (nowhere.error or "")
    too_small = on_b.run(
        _step("submit", "51", spec=spec.model_dump(mode="json"), name="mv-51", nodes=["b1"])
    )
    assert not too_small.ok and "needs 12 GPUs, the nodes it is pinned to (b1) have 8" in (
        too_small.error or ""
    )
    bad_hold = on_b.run(
        _step("submit", "52", spec=spec.model_dump(mode="json"), name="mv-52", hold="yes")
    )
    assert bad_hold.outcome is Outcome.refused and "args.hold" in (bad_hold.error or "")
    assert not any(job.move_name for job in b.jobs.values())


def test_a_moved_copy_is_confirmed_while_queued_or_running_and_refused_once_rejected(
    tmp_path: Path,
) -> None:
    """The confirm a pending job's move runs at its target (``expect: accepted``): a copy
    the scheduler has not listed yet is "not yet" (retryable); queued or running is
    accepted; refused before it ran is rejected for good, and then nothing is withdrawn;
    a copy that ran and then failed is the job's own failure: the move took place."""
    clock = Clock()
    a, b = _clusters(clock)
    a.submit(_job("busy", 8), timedelta(hours=5))
    a.submit(_job("wait", 4), timedelta(hours=2))
    a.submit(_job("also", 4), timedelta(hours=2))
    b.submit(_job("local", 16), timedelta(hours=1))  # B's own user fills it: copies queue
    on_b = ConnectorStepExecutor(b, cluster="lab-b", state_dir=tmp_path)

    unknown = on_b.run(_step("confirm", "lab-b-in9", expect="accepted"))
    assert not unknown.ok and unknown.retryable
    assert "does not report job lab-b-in9 yet" in (unknown.error or "")

    queued = b.submit(_pending_spec(a, "wait"), name="mv-60")
    seen = on_b.run(_step("confirm", queued, expect="accepted"))
    assert seen.ok, seen.error
    assert seen.result["summary"] == f"job {queued} is pending (Resources)"
    assert seen.result["accepted"] is True

    other = b.submit(_pending_spec(a, "also"), name="mv-61")
    b.refuse(other, "InvalidImage")
    rejected = on_b.run(_step("confirm", other, expect="accepted"))
    assert not rejected.ok and not rejected.retryable
    assert f"job {other} is failed (InvalidImage) without having run" in (rejected.error or "")
    assert b.withdraw("mv-61") is None  # nothing ran there: compensation releases the home copy

    clock.now += timedelta(hours=1, seconds=1)  # B's own job ends: the queued copy starts
    assert b.check_arrival(queued) == f"job {queued} is running"
    with pytest.raises(ConnectorError, match="running, not queued"):
        b.refuse(queued, "too late")

    wrong = on_b.run(_step("confirm", queued, expect="arrived"))
    assert wrong.outcome is Outcome.refused and "'accepted'" in (wrong.error or "")


def test_a_moved_jobs_home_copy_is_cancelled_once_by_its_step_and_not_over_someone_elses_end(
    tmp_path: Path,
) -> None:
    """``cancel_moved`` (SupportsMovedCancel) at a pending job's home: the held job is
    stamped with the step's key and cancelled; the same step again changes nothing; a job
    someone else cancelled, or that started, mid-move fails the step for good (the move is
    undone), as does another move's cancel of a job this one cancelled; a job the cluster
    has forgotten leaves the move standing."""
    clock = Clock()
    a, _ = _clusters(clock)
    a.submit(_job("busy", 8), timedelta(hours=5))
    for job_id in ("moved", "user-cancelled", "started"):
        a.submit(_job(job_id, 4), timedelta(hours=1))
        a.hold(job_id)

    a.cancel_moved("moved", key="mv-1:forward:cancel")
    assert a.jobs["moved"].state is JobState.cancelled
    assert a.jobs["moved"].moved_by == "mv-1:forward:cancel"
    ended = a.jobs["moved"].report
    a.cancel_moved("moved", key="mv-1:forward:cancel")  # a resent step: its own cancel
    assert a.jobs["moved"].report == ended
    with pytest.raises(ConnectorError, match="this move did not cancel it") as other_move:
        a.cancel_moved("moved", key="mv-2:forward:cancel")
    assert not other_move.value.retryable

    a.cancel("user-cancelled")  # its user, mid-move
    with pytest.raises(ConnectorError, match="it is cancelled and this move did not cancel it"):
        a.cancel_moved("user-cancelled", key="mv-3:forward:cancel")

    a.cancel("busy")
    a.release("started")  # someone lifts the hold: it starts at home
    assert a.jobs["started"].state is JobState.running
    with pytest.raises(ConnectorError, match="it is running") as running:
        a.cancel_moved("started", key="mv-4:forward:cancel")
    assert not running.value.retryable
    assert a.jobs["started"].state is JobState.running  # left alone

    # Ended and forgotten since (as Slurm purges after MinJobAge): whoever ended it, the
    # target's copy is the only one left, so the move stands.
    clock.now += KEEP_FINISHED + timedelta(hours=6)
    a.read_state()
    assert "user-cancelled" not in a.jobs
    a.cancel_moved("user-cancelled", key="mv-3:forward:cancel")
