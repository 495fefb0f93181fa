"""Federated moves with Armada as target (and as source) at the connector: the spec in
telemetry, ``submit``, ``withdraw`` and ``check_arrival`` (connectors.armada.moves), and a
whole move between two Armada connectors through their action executors with the step
messages the saga builds.

Against the project's Armada test server (tests/support/armada_server.py: the official
armada-client over a real gRPC connection to servicers built on armada-client's generated
code), not a real Armada, which cannot run here (it needs Pulsar besides PostgreSQL and
Redis). The "two clusters" of a move are two connectors on the one server following
different job sets.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from app.actions.messages import move_name, step_message
from app.actions.models import Action, ActionKind, ActionStep, StepState
from app.actions.recipes import compensation_steps, forward_steps
from app.clusters.models import Cluster
from app.jobs.models import Job
from connectors.actions import ConnectorStepExecutor
from connectors.armada import ArmadaConnector, NewJob
from connectors.armada.jobs import HOME_QUEUE_ANNOTATION, RESUME_FROM_ENV, WORKLOAD_ANNOTATION
from connectors.armada.moves import move_client_id
from connectors.armada.specs import MOVE_MARK
from connectors.base import ConnectorError, SupportsArrivalCheck, SupportsSubmit
from tests.support.armada_server import ArmadaTestServer
from tests.support.armada_site import HOLD_QUEUE, connector_for, start_server
from wire.steps import StepReport
from wire.telemetry import JobReport, JobState, PortableSpec, SchedulerKind, SubmitSpec

PORTABLE = SubmitSpec(
    scheduler=SchedulerKind.slurm,
    native={"script": "#!/bin/sh\ntrain\n"},
    portable=PortableSpec(
        image="registry.local/train:2",
        command=["python", "train.py"],
        gpus=2,
        cpus=4,
        memory_mib=8192,
        env={"EPOCHS": "3"},
    ),
)
MOVE = "shaper-41-7"
# Where moved jobs without a followed queue of their own land on the target.
LANDING = {"queue": "prod", "job_set": "serve"}
# The namespaces the target lets moved jobs run in (none by default).
ACCEPT = ["default", "research"]


@pytest.fixture
def server() -> Iterator[ArmadaTestServer]:
    server = start_server()
    yield server
    server.stop()


@pytest.fixture
def target(server: ArmadaTestServer) -> Iterator[ArmadaConnector]:
    with connector_for(server, move_job_set=LANDING, accept_namespaces=ACCEPT) as connector:
        yield connector


def report_of(connector: ArmadaConnector, external_id: str) -> JobReport:
    return next(j for j in connector.read_state().jobs if j.external_id == external_id)


def moved_jobs(server: ArmadaTestServer, name: str) -> list[str]:
    return [j.job_id for j in server.jobs.values() if j.spec.annotations.get(MOVE_MARK) == name]


def test_the_connector_is_a_move_target() -> None:
    assert issubclass(ArmadaConnector, SupportsSubmit)
    assert issubclass(ArmadaConnector, SupportsArrivalCheck)


def test_a_held_job_carries_its_armada_spec_without_what_only_its_cluster_means(
    server: ArmadaTestServer, target: ArmadaConnector
) -> None:
    job_id = target.submit_job(
        "research",
        "train",
        NewJob(
            image="registry.local/train:1",
            gpus=4,
            priority=3,
            labels={"shaper.io/team": "vision"},
            annotations={"shaper.io/checkpointable": "true"},
            node_selector={"kubernetes.io/hostname": "a1", "nvidia.com/gpu.product": "H100"},
        ),
    )
    target.hold(job_id)
    report = report_of(target, job_id)
    assert report.state is JobState.pending and "held" in (report.reason or "")
    assert report.submit is not None and report.submit.scheduler is SchedulerKind.armada
    native = report.submit.native
    assert (native["queue"], native["job_set"]) == ("research", "train")  # its home queue
    job = native["job"]
    assert job["priority"] == 3 and job["labels"] == {"shaper.io/team": "vision"}
    assert job["annotations"] == {"shaper.io/checkpointable": "true"}  # no lineage marks
    (pod,) = job["pod_specs"]
    assert pod["nodeSelector"] == {"nvidia.com/gpu.product": "H100"}  # no pin to a1
    assert pod["containers"][0]["image"] == "registry.local/train:1"
    assert "client_id" not in job
    with connector_for(server, submit_specs=False) as without:
        assert without.read_state().jobs[0].submit is None


def test_a_submit_resent_with_one_name_makes_one_job(
    server: ArmadaTestServer, target: ArmadaConnector
) -> None:
    first = target.submit(PORTABLE, name=MOVE)
    assert target.submit(PORTABLE, name=MOVE) == first
    assert moved_jobs(server, MOVE) == [first]
    made = server.job(first)
    assert (made.queue, made.job_set) == ("prod", "serve")  # move_job_set
    assert made.spec.client_id == move_client_id(MOVE)  # Armada's own deduplication too
    (pod,) = made.spec.pod_specs
    (container,) = pod.containers
    assert container.image == "registry.local/train:2"
    assert list(container.command) == ["python", "train.py"]
    assert {e.name: e.value for e in container.env} == {"EPOCHS": "3"}
    requests = {k: v.string for k, v in container.resources.requests.items()}
    assert requests == {"nvidia.com/gpu": "2", "cpu": "4000m", "memory": "8192Mi"}
    assert made.spec.namespace == "default"
    assert server.schedule() == [first]
    report = report_of(target, first)
    assert report.state is JobState.running and report.queue == "prod"
    # Released and resent later: still the one job.
    assert target.submit(PORTABLE, name=MOVE) == first


def test_a_held_submit_is_not_leased_until_its_release_and_resumes_where_told(
    server: ArmadaTestServer, target: ArmadaConnector
) -> None:
    held = target.submit(PORTABLE, name=MOVE, hold=True, nodes=["b1"])
    assert server.job(held).queue == HOLD_QUEUE
    assert server.job(held).spec.annotations[HOME_QUEUE_ANNOTATION] == "prod"
    assert server.schedule() == []
    report = report_of(target, held)
    assert report.state is JobState.pending and "held" in (report.reason or "")
    assert report.required_nodes == ["b1"] and report.queue == "prod"
    assert "is queued in queue shaper-held" in target.check_arrival(held)
    # Resent while held: answered, not held again.
    assert target.submit(PORTABLE, name=MOVE, hold=True, nodes=["b1"]) == held

    target.set_resume_pointer(held, "/var/lib/shaper/staged/train/1")
    target.release(held)
    (started,) = server.schedule()
    job = server.job(started)
    assert (job.queue, job.node) == ("prod", "b1")
    assert job.spec.annotations[WORKLOAD_ANNOTATION] == held
    env = {e.name: e.value for e in job.spec.pod_specs[0].containers[0].env}
    assert env[RESUME_FROM_ENV] == "/var/lib/shaper/staged/train/1"
    report = report_of(target, held)
    assert report.state is JobState.running and report.allocations[0].node == "b1"
    assert target.submit(PORTABLE, name=MOVE, hold=True) == held


def test_arrival_is_accepted_while_armada_holds_the_job_and_rejected_if_it_never_ran(
    server: ArmadaTestServer, target: ArmadaConnector
) -> None:
    with pytest.raises(ConnectorError, match="reports no job 01ABSENT") as absent:
        target.check_arrival("01ABSENT")
    assert absent.value.retryable  # not yet: asked again

    queued = target.submit(PORTABLE, name="shaper-1-q")
    assert "is queued in queue prod" in target.check_arrival(queued)
    server.reject(queued, "no executor has a node this job fits")
    with pytest.raises(ConnectorError, match="rejected by Armada: no executor") as refused:
        target.check_arrival(queued)
    assert not refused.value.retryable
    assert target.withdraw("shaper-1-q") is None  # nothing ran, nothing to cancel

    running = target.submit(PORTABLE, name="shaper-2-r")
    server.schedule()
    assert "is running" in target.check_arrival(running)
    server.finish(server.jobs_of("prod", "serve")[-1].job_id, failed="exit code 1")
    assert "after it ran here: the move took place" in target.check_arrival(running)

    cancelled = target.submit(PORTABLE, name="shaper-3-c")
    target.api.cancel("prod", "serve", cancelled)  # someone cancels it in Armada
    with pytest.raises(ConnectorError, match="cancelled in queue prod") as gone:
        target.check_arrival(cancelled)
    assert not gone.value.retryable


def test_a_withdraw_cancels_a_waiting_or_running_copy_and_refuses_one_that_ran(
    server: ArmadaTestServer, target: ArmadaConnector
) -> None:
    waiting = target.submit(PORTABLE, name="shaper-1-w")
    assert target.withdraw("shaper-1-w") == waiting
    assert server.job(waiting).state == "cancelled"
    assert target.withdraw("shaper-1-w") == waiting  # resent: answered as the first was
    assert target.withdraw("shaper-9-never") is None

    running = target.submit(PORTABLE, name="shaper-2-r")
    assert server.schedule() == [running]
    assert target.withdraw("shaper-2-r") == running
    assert server.job(running).state == "cancelled"

    done = target.submit(PORTABLE, name="shaper-3-d")
    assert server.schedule() == [done]
    server.finish(done)
    with pytest.raises(ConnectorError, match="already ran here and ended") as ran:
        target.withdraw("shaper-3-d")
    assert not ran.value.retryable


def test_a_withdraw_resent_after_cancelling_a_running_copy_answers_as_the_first_did(
    server: ArmadaTestServer, target: ArmadaConnector
) -> None:
    running = target.submit(PORTABLE, name=MOVE)
    assert server.schedule() == [running]
    assert "is running" in target.check_arrival(running)
    assert target.withdraw(MOVE) == running
    # The cancel says it was the withdraw's: not a job that ran and ended here.
    assert server.job(running).cancel_reason == f"shaper: withdrawn by move {MOVE}"
    assert target.withdraw(MOVE) == running
    with pytest.raises(ConnectorError, match="withdrawn by its move") as confirm:
        target.check_arrival(running)
    assert not confirm.value.retryable

    # A connector that did not make the cancel (a restart) asks Armada why (GetJobDetails).
    with connector_for(server, move_job_set=LANDING) as restarted:
        assert restarted.withdraw(MOVE) == running

    # Someone else's cancel of a copy that ran is still the move having taken place.
    other = target.submit(PORTABLE, name="shaper-5-x")
    assert server.schedule() == [other]
    target.api.cancel("prod", "serve", other)
    with pytest.raises(ConnectorError, match="already ran here and ended") as ran:
        target.withdraw("shaper-5-x")
    assert not ran.value.retryable


def test_a_release_whose_cancel_is_seen_before_the_new_job_is_not_yet_known(
    server: ArmadaTestServer, target: ArmadaConnector
) -> None:
    held = target.submit(PORTABLE, name=MOVE, hold=True)
    assert "is queued in queue shaper-held" in target.check_arrival(held)
    # The landing job set's events lag behind the hold queue's (one Pulsar stream each).
    server.lag("prod", "serve")
    target.release(held)
    with pytest.raises(ConnectorError, match="next job is not in the followed") as early:
        target.check_arrival(held)
    assert early.value.retryable  # asked again, not rejected
    with pytest.raises(ConnectorError, match="next job is not in the followed") as retried:
        target.withdraw(MOVE)
    assert retried.value.retryable  # not None while the released job is queued

    server.lag("prod", "serve", lagging=False)
    assert "is queued in queue prod" in target.check_arrival(held)
    assert target.withdraw(MOVE) == held
    (released,) = [j for j in moved_jobs(server, MOVE) if server.job(j).queue == "prod"]
    assert server.job(released).state == "cancelled"

    # A restarted connector (no memory of the cancel) asks Armada why it was cancelled.
    other = target.submit(PORTABLE, name="shaper-6-h", hold=True)
    server.lag("prod", "serve")
    target.release(other)
    with connector_for(server, move_job_set=LANDING) as restarted:
        with pytest.raises(ConnectorError, match="next job is not") as seen:
            restarted.check_arrival(other)
        assert seen.value.retryable


def test_a_spec_armada_cannot_run_is_refused_for_good_saying_why(
    server: ArmadaTestServer, target: ArmadaConnector
) -> None:
    slurm_only = SubmitSpec(scheduler=SchedulerKind.slurm, native={"script": "#!/bin/sh\n"})
    no_image = SubmitSpec(
        scheduler=SchedulerKind.ray, portable=PortableSpec(command=["python", "x.py"], gpus=1)
    )
    bad_native = SubmitSpec(scheduler=SchedulerKind.armada, native={"job": {"pod_specs": 3}})
    no_pod = SubmitSpec(scheduler=SchedulerKind.armada, native={"job": {"priority": 1}})
    cases = [
        (slurm_only, MOVE, None, "its spec has no portable form"),
        (no_image, MOVE, None, "names no container image"),
        (bad_native, MOVE, None, "not an Armada job submission"),
        (no_pod, MOVE, None, "no pod spec with a container"),
        (PORTABLE, "bad name!", None, "move name"),
        (PORTABLE, MOVE, ["z9"], "no node z9 is declared"),
        (PORTABLE, MOVE, ["a1", "a2"], "one pod, on one node"),
    ]
    for spec, name, nodes, why in cases:
        with pytest.raises(ConnectorError, match=why) as refused:
            target.submit(spec, name=name, nodes=nodes)
        assert not refused.value.retryable
    with (
        connector_for(server, accept_namespaces=ACCEPT) as nowhere,
        pytest.raises(ConnectorError, match="no followed"),
    ):
        nowhere.submit(PORTABLE, name=MOVE)
    with (
        connector_for(
            server, hold_queue=None, move_job_set=LANDING, accept_namespaces=ACCEPT
        ) as unheld,
        pytest.raises(ConnectorError, match="no hold_queue"),
    ):
        unheld.submit(PORTABLE, name=MOVE, hold=True)
    assert moved_jobs(server, MOVE) == []


def test_a_moved_job_runs_only_in_a_namespace_the_operator_named_for_moved_jobs(
    server: ArmadaTestServer, target: ArmadaConnector
) -> None:
    # By default a connector takes no moved job, and says which setting allows one.
    with (
        connector_for(server, move_job_set=LANDING) as closed,
        pytest.raises(
            ConnectorError,
            match=r"namespace default does not take moved jobs \(accept_namespaces: none; add",
        ) as refused,
    ):
        closed.submit(PORTABLE, name=MOVE)
    assert not refused.value.retryable
    # An Armada job keeps the namespace it names: one not listed is refused, nothing made.
    source = target.submit_job(
        "research", "train", NewJob(image="registry.local/train:1", gpus=1, namespace="secrets")
    )
    spec = report_of(target, source).submit
    assert spec is not None and spec.native["job"]["namespace"] == "secrets"
    with pytest.raises(
        ConnectorError,
        match=r"namespace secrets does not take moved jobs \(accept_namespaces: default, research",
    ) as refused:
        target.submit(spec, name="shaper-41-8")
    assert not refused.value.retryable
    assert moved_jobs(server, "shaper-41-8") == [] and moved_jobs(server, MOVE) == []
    # A listed one is taken.
    research = target.submit_job(
        "research", "train", NewJob(image="registry.local/train:1", gpus=1, namespace="research")
    )
    spec = report_of(target, research).submit
    assert spec is not None
    made = target.submit(spec, name="shaper-41-9")
    assert server.job(made).spec.namespace == "research"


# --- a whole move between two Armada connectors, through their executors ----------------

SOURCE, TARGET = "armada-a", "armada-b"


def _cluster(id_: int, name: str) -> Cluster:
    return Cluster(id=id_, name=name, scheduler=SchedulerKind.armada)


class Move:
    """One move action's steps, with their messages built as the saga builds them."""

    def __init__(self, job_id: str, spec: SubmitSpec) -> None:
        self.action = Action(
            id=5,
            cluster_id=1,
            target_cluster_id=2,
            job_id=7,
            kind=ActionKind.move,
            idempotency_key=f"move:{SOURCE}:7:0:{TARGET}",
        )
        self.job = Job(
            id=7,
            cluster_id=1,
            external_id=job_id,
            gpus_requested=4,
            state=JobState.pending,
            submit_spec=spec.model_dump_json(),
        )
        self.steps = forward_steps(
            self.action, self.job, _cluster(1, SOURCE), 1, _cluster(2, TARGET)
        )

    def run(self, executor: ConnectorStepExecutor, step: ActionStep) -> StepReport:
        message = step_message(self.action, self.job, step, self.steps, 30.0).kwargs["step"]
        report = executor.handle(message)
        assert report is not None
        step.state = StepState.succeeded if report.ok else StepState.failed
        step.result, step.error = report.result, report.error
        return report


@pytest.fixture
def two_sites(server: ArmadaTestServer) -> Iterator[tuple[ArmadaConnector, ArmadaConnector]]:
    source = connector_for(
        server, cluster=SOURCE, job_sets=[{"queue": "research", "job_set": "train"}]
    )
    target = connector_for(
        server,
        cluster=TARGET,
        job_sets=[{"queue": "research", "job_set": "sweep"}, LANDING],
        accept_namespaces=ACCEPT,
    )
    with source, target:
        yield source, target


def _waiting_job(source: ArmadaConnector) -> str:
    job_id = source.submit_job(
        "research",
        "train",
        NewJob(image="registry.local/train:1", gpus=4, labels={"shaper.io/team": "research"}),
    )
    report = report_of(source, job_id)
    assert report.state is JobState.pending and report.submit is not None
    return job_id


def test_a_waiting_job_moves_from_one_armada_to_another_through_the_saga_steps(
    server: ArmadaTestServer, two_sites: tuple[ArmadaConnector, ArmadaConnector], tmp_path: Path
) -> None:
    source, target = two_sites
    job_id = _waiting_job(source)
    move = Move(job_id, report_of(source, job_id).submit)  # type: ignore[arg-type]
    assert [(s.name, s.queue) for s in move.steps] == [
        ("hold", f"connector.{SOURCE}"),
        ("submit", f"connector.{TARGET}"),
        ("confirm", f"connector.{TARGET}"),
        ("cancel", f"connector.{SOURCE}"),
    ]
    at_a = ConnectorStepExecutor(source, cluster=SOURCE, state_dir=tmp_path / "a")
    at_b = ConnectorStepExecutor(target, cluster=TARGET, state_dir=tmp_path / "b")
    hold, submit, confirm, cancel = move.steps

    assert move.run(at_a, hold).ok
    assert "held" in (report_of(source, job_id).reason or "")
    submitted = move.run(at_b, submit)
    assert submitted.ok, submitted.error
    copy = submitted.result["external_id"]
    assert server.job(copy).spec.annotations[MOVE_MARK] == move_name(5, job_id)
    # Its own queue, in the job set the target follows there.
    assert (server.job(copy).queue, server.job(copy).job_set) == ("research", "sweep")
    resent = move.run(at_b, submit)
    assert resent.result["external_id"] == copy
    confirmed = move.run(at_b, confirm)
    assert confirmed.ok and confirmed.result["accepted"], confirmed.error
    assert move.run(at_a, cancel).ok

    assert server.schedule() == [copy]
    assert report_of(target, copy).state is JobState.running
    assert report_of(source, job_id).state is JobState.cancelled
    assert len(moved_jobs(server, move_name(5, job_id))) == 1


def test_a_copy_armada_rejects_undoes_the_move_and_the_job_waits_at_home_again(
    server: ArmadaTestServer, two_sites: tuple[ArmadaConnector, ArmadaConnector], tmp_path: Path
) -> None:
    source, target = two_sites
    job_id = _waiting_job(source)
    move = Move(job_id, report_of(source, job_id).submit)  # type: ignore[arg-type]
    at_a = ConnectorStepExecutor(source, cluster=SOURCE, state_dir=tmp_path / "a")
    at_b = ConnectorStepExecutor(target, cluster=TARGET, state_dir=tmp_path / "b")
    hold, submit, confirm, _ = move.steps
    assert move.run(at_a, hold).ok
    copy = move.run(at_b, submit).result["external_id"]
    server.reject(copy, "exceeds the largest node of every executor")
    refused = move.run(at_b, confirm)
    assert not refused.ok and not refused.retryable
    assert "rejected by Armada" in (refused.error or "")

    undo = compensation_steps(move.action, move.steps, SOURCE, 2)
    assert [(s.name, s.queue) for s in undo] == [
        ("withdraw", f"connector.{TARGET}"),
        ("release", f"connector.{SOURCE}"),
    ]
    withdraw, release = undo
    move.steps += undo
    withdrawn = move.run(at_b, withdraw)
    assert withdrawn.ok and withdrawn.result["external_id"] is None
    assert move.run(at_a, release).ok
    back = report_of(source, job_id)
    assert back.state is JobState.pending and "held" not in (back.reason or "")
    assert server.schedule() != [] and report_of(source, job_id).state is JobState.running
