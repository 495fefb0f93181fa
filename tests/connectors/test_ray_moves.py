"""A pending job moved between Ray clusters (issue 16), at the connector: the spec in
telemetry, ``submit`` and ``withdraw`` (connectors.base.SupportsSubmit) against the real
Ray test cluster (tests/support/ray_cluster.py).

The "two clusters" are two connectors on the one Ray cluster, each with its own held-jobs
file: source A reports the job and its spec, target B submits the spec as a new job. Both
see every Ray job, so each test looks only at the jobs it made; submission ids are unique
for the cluster's life, shared with the other Ray tests, hence a fresh suffix per test.
The first tests call the connectors in the saga's order by hand (hold@A → submit@B →
cancel@A, then withdraw@B); the next sends those steps through each cluster's step
executor as app/actions/messages.py builds them, which also refuses a move whose job
started running before its hold; the last confirms B's copy (confirm@B, between the
submit and the cancel) as Ray runs it, or fails it first.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from app.actions.messages import move_name
from connectors import registry
from connectors.actions import ConnectorStepExecutor
from connectors.base import ConnectorError, SupportsSubmit
from connectors.ray import RayConnector, RayConnectorConfig
from connectors.ray.translate import HELD_REASON
from tests.support.ray_cluster import RayCluster, ray_cluster_fixture, wait_for
from wire.steps import StepReport, StepRequest
from wire.telemetry import JobReport, JobState, PortableSpec, SchedulerKind, SubmitSpec

__all__ = ["ray_cluster_fixture"]  # the fixture, found by pytest where it is imported

SLEEPER = "sleep 600"  # no Python driver: cheap on the tests' two cores


@pytest.fixture
def ray(ray_cluster: RayCluster) -> Iterator[RayCluster]:
    """The cluster with no job running, before and after the test."""
    ray_cluster.stop_all_jobs()
    yield ray_cluster
    ray_cluster.stop_all_jobs()


@pytest.fixture
def clusters(ray: RayCluster, tmp_path: Path) -> Iterator[tuple[RayConnector, RayConnector]]:
    """Connectors of "ray-a" (the source) and "ray-b" (the target) on the one Ray cluster."""
    made = []
    for name in ("ray-a", "ray-b"):
        connector = registry.create(
            SchedulerKind.ray,
            cluster=name,
            dashboard_url=ray.dashboard_url,
            # Ray's REST answers leave out what an entrypoint asked for: the GCS says it.
            gcs_address=ray.gcs_address,
            state_dir=str(tmp_path / name),
        )
        assert isinstance(connector, RayConnector)
        made.append(connector)
    yield made[0], made[1]
    for connector in made:
        connector.close()


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex[:6]}"


def submit_to_ray(ray: RayCluster, submission_id: str, entrypoint: str, **fields: Any) -> None:
    """A job as a user submits it through the Jobs API."""
    response = httpx.post(
        f"{ray.dashboard_url}/api/jobs/",
        json={"entrypoint": entrypoint, "submission_id": submission_id, **fields},
        timeout=30,
    )
    response.raise_for_status()


def status(ray: RayCluster, submission_id: str) -> str | None:
    response = httpx.get(f"{ray.dashboard_url}/api/jobs/{submission_id}", timeout=30)
    if response.status_code == 404:
        return None
    response.raise_for_status()
    return str(response.json()["status"])


def until(ray: RayCluster, submission_id: str, wanted: str) -> None:
    wait_for(f"Ray job {submission_id} {wanted}", lambda: status(ray, submission_id) == wanted)


def report(connector: RayConnector, external_id: str) -> JobReport | None:
    return next((j for j in connector.read_state().jobs if j.external_id == external_id), None)


def moved_spec(entrypoint: str = SLEEPER, **native: Any) -> SubmitSpec:
    return SubmitSpec(scheduler=SchedulerKind.ray, native={"entrypoint": entrypoint, **native})


def test_a_held_job_moves_to_the_other_cluster_and_runs_there(
    ray: RayCluster, clusters: tuple[RayConnector, RayConnector]
) -> None:
    source, target = clusters
    assert isinstance(target, SupportsSubmit)
    job = unique("mover")
    submit_to_ray(
        ray,
        job,
        SLEEPER,
        metadata={"shaper.io/priority": "7", "shaper.io/team": "vision"},
        runtime_env={"env_vars": {"MODEL": "small"}},
        entrypoint_num_cpus=0.5,
    )
    until(ray, job, "RUNNING")
    running = report(source, job)
    assert running is not None and running.state is JobState.running
    assert running.submit is not None  # a running job carries its spec too
    expected = {
        "entrypoint": SLEEPER,
        "runtime_env": {"env_vars": {"MODEL": "small"}},
        "metadata": {"shaper.io/priority": "7", "shaper.io/team": "vision"},
        "entrypoint_num_cpus": 0.5,
    }
    assert running.submit.scheduler is SchedulerKind.ray
    assert running.submit.native == expected
    without_gcs = RayConnector(RayConnectorConfig(cluster="ray-c", dashboard_url=ray.dashboard_url))
    with without_gcs:
        blind = report(without_gcs, job)
    assert blind is not None and blind.submit is None  # it cannot say what the driver asked

    # Preempted and held by a plan of A's (a running Ray job's hold stops nothing): it is
    # pending, and a pending job moves.
    source.requeue(job, hold=True)
    held = report(source, job)
    assert held is not None and held.state is JobState.pending and held.reason == HELD_REASON
    # The held copy's next submission carries A's attempt and job id: the spec does not.
    assert held.submit is not None and held.submit.native == expected

    name = f"shaper-1-{job}"
    moved = target.submit(held.submit, name=name)
    assert target.submit(held.submit, name=name) == moved  # a resent submit: the same job
    until(ray, moved, "RUNNING")
    arrived = report(target, moved)
    assert arrived is not None and arrived.priority == 7 and arrived.team == "vision"
    assert arrived.state is JobState.running and arrived.submit is not None
    assert arrived.submit.native["metadata"] == expected["metadata"]
    of_the_move = [
        j for j in ray.get("/api/jobs/") if (j.get("metadata") or {}).get("shaper.io/move") == name
    ]
    assert [j["submission_id"] for j in of_the_move] == [moved]

    source.cancel(job)  # the move's last step
    assert source.held.get(job) is None

    # The move undone (its compensation): B's copy stopped, once.
    assert target.withdraw(name) == moved
    assert status(ray, moved) == "STOPPED"
    assert target.withdraw(name) is None
    assert target.withdraw("shaper-1-never-submitted") is None


def test_a_job_submitted_held_waits_for_its_release(
    ray: RayCluster, clusters: tuple[RayConnector, RayConnector]
) -> None:
    _, target = clusters
    name = unique("shaper-2-held")
    moved = target.submit(moved_spec(metadata={"shaper.io/gpus": "2"}), name=name, hold=True)
    assert target.submit(moved_spec(), name=name, hold=True) == moved
    assert status(ray, moved) is None  # Ray has no held job: the connector keeps it
    waiting = report(target, moved)
    assert waiting is not None and waiting.state is JobState.pending
    assert waiting.reason == HELD_REASON and waiting.gpus_requested == 2
    assert waiting.submit is not None and waiting.submit.native["entrypoint"] == SLEEPER

    target.release(moved)
    until(ray, moved, "RUNNING")
    assert target.held.get(moved) is None
    assert target.withdraw(name) == moved
    assert status(ray, moved) == "STOPPED"

    # Withdrawn while still held: its record is dropped, nothing ever reached Ray.
    dropped = unique("shaper-3-held")
    kept = target.submit(moved_spec(), name=dropped, hold=True)
    assert target.withdraw(dropped) == kept
    assert report(target, kept) is None and status(ray, kept) is None
    assert target.withdraw(dropped) is None


def test_a_pinned_submission_runs_its_driver_on_that_node(
    ray: RayCluster, clusters: tuple[RayConnector, RayConnector], tmp_path: Path
) -> None:
    _, target = clusters
    record = tmp_path / "nodes"
    name = unique("shaper-4-pinned")
    spec = moved_spec(f"sh -c 'echo $SHAPER_NODES > {record}; sleep 600'")
    moved = target.submit(spec, name=name, nodes=["ray-w2"], hold=True)
    target.release(moved)
    until(ray, moved, "RUNNING")
    assert ray.job(moved)["driver_node_id"] == ray.node_ids()["ray-w2"]
    wait_for("the job to say where it was sent", lambda: record.exists() and record.read_text())
    assert record.read_text().strip() == "ray-w2"
    with pytest.raises(ConnectorError, match="no live node named nowhere") as refused:
        target.submit(moved_spec(), name=unique("shaper-5-pinned"), nodes=["nowhere"])
    assert not refused.value.retryable


def test_a_withdraw_after_the_moved_job_ran_is_refused(
    ray: RayCluster, clusters: tuple[RayConnector, RayConnector]
) -> None:
    _, target = clusters
    name = unique("shaper-6-done")
    moved = target.submit(moved_spec("true"), name=name)
    until(ray, moved, "SUCCEEDED")
    with pytest.raises(ConnectorError, match="already ran here and ended SUCCEEDED") as refused:
        target.withdraw(name)
    assert not refused.value.retryable


def test_a_spec_of_another_scheduler_runs_only_through_its_portable_form(
    ray: RayCluster, clusters: tuple[RayConnector, RayConnector], tmp_path: Path
) -> None:
    _, target = clusters
    slurm = SubmitSpec(scheduler=SchedulerKind.slurm, native={"script": "#!/bin/sh\nsleep 1\n"})
    name = unique("shaper-7-slurm")
    with pytest.raises(ConnectorError, match="no portable form") as refused:
        target.submit(slurm, name=name)
    assert not refused.value.retryable
    assert report(target, name) is None

    done = tmp_path / "portable"
    portable = slurm.model_copy(
        update={
            "portable": PortableSpec(
                command=[sys.executable, "-c", f"open({str(done)!r}, 'w').write('ran')"],
                gpus=1,
            )
        }
    )
    moved = target.submit(portable, name=name)
    until(ray, moved, "SUCCEEDED")
    assert done.read_text() == "ran"


def step(kind: str, job: str, /, *, generation: int = 1, **args: Any) -> StepRequest:
    """A step as app/actions/messages.py builds it for a connector's queue."""
    return StepRequest(
        action_id=1,
        key=f"a1:{kind}:{uuid.uuid4().hex[:6]}",
        step=kind,
        phase="forward" if generation == 1 else "compensate",
        workload_id=job,
        generation=generation,
        args={"source_node": None, "target_node": None, "replicas": 0, **args},
    )


def ok(report: StepReport) -> StepReport:
    assert report.ok, report.error
    return report


def test_a_waiting_job_moves_through_the_steps_and_a_running_one_does_not(
    ray: RayCluster, clusters: tuple[RayConnector, RayConnector], tmp_path: Path
) -> None:
    source, target = clusters
    at_a = ConnectorStepExecutor(source, cluster="ray-a", state_dir=tmp_path / "steps-a")
    at_b = ConnectorStepExecutor(target, cluster="ray-b", state_dir=tmp_path / "steps-b")
    # Preempted by a plan of A's and held there: a pending job to Shaper. (A job whose
    # driver waits in Ray for its entrypoint's resources is pending too, but Ray cannot
    # stop it before they come free: see connectors/ray/connector.py.)
    waiting = unique("waiting")
    submit_to_ray(ray, waiting, SLEEPER, entrypoint_num_gpus=1)
    until(ray, waiting, "RUNNING")
    ok(at_a.run(step("requeue", waiting, hold=True)))
    pending = report(source, waiting)
    assert pending is not None and pending.state is JobState.pending
    assert pending.submit is not None
    assert pending.submit.native["entrypoint_num_gpus"] == 1  # from the GCS, kept held

    ok(at_a.run(step("hold", waiting, pending=True)))
    assert status(ray, waiting) == "STOPPED" and source.held.get(waiting) is not None
    name = move_name(1, waiting)
    spec = pending.submit.model_dump(mode="json")
    moved_to: dict[str, Any] = {"name": name, "source_cluster": "ray-a"}
    submitted = ok(at_b.run(step("submit", waiting, spec=spec, **moved_to)))
    moved = submitted.result["external_id"]
    until(ray, moved, "RUNNING")
    assert ray.job(moved)["metadata"]["shaper.io/move"] == name
    ok(at_a.run(step("cancel", waiting)))
    assert source.held.get(waiting) is None

    # The move compensated after all (generation 2): B's copy withdrawn; a late submit of
    # the superseded generation is fenced off and submits nothing.
    withdrawn = ok(at_b.run(step("withdraw", waiting, generation=2, **moved_to)))
    assert withdrawn.result["external_id"] == moved and status(ray, moved) == "STOPPED"
    late = at_b.run(step("submit", waiting, spec=spec, **moved_to))
    assert not late.ok and status(ray, moved) == "STOPPED"

    # A job whose driver started before its hold is left running, and the move refused.
    runner = unique("runner")
    submit_to_ray(ray, runner, SLEEPER)
    until(ray, runner, "RUNNING")
    refused = at_a.run(step("hold", runner, pending=True))
    assert (refused.ok, refused.retryable) == (False, False)
    assert "only a pending job is held for a move" in (refused.error or "")
    assert status(ray, runner) == "RUNNING" and source.held.get(runner) is None


def test_a_moved_job_is_confirmed_once_its_entrypoint_runs_and_rejected_if_ray_fails_it_first(
    ray: RayCluster, clusters: tuple[RayConnector, RayConnector], tmp_path: Path
) -> None:
    """The confirm a pending job's move runs at its target before it cancels the home copy
    (``expect: accepted``): Ray takes any submission and builds its runtime environment
    while it is PENDING, so PENDING is "not yet" (retryable); RUNNING is accepted; a job Ray
    fails before its entrypoint ran (a runtime environment it cannot build) is rejected
    for good, and the move's withdraw then finds nothing to stop."""
    _, target = clusters
    at_b = ConnectorStepExecutor(target, cluster="ray-b", state_dir=tmp_path / "steps-b")
    answers: dict[str, list[StepReport]] = {"fine": [], "broken": []}

    def confirmed(which: str, job: str) -> bool:
        answer = at_b.run(step("confirm", job, expect="accepted"))
        answers[which].append(answer)
        return answer.ok or not answer.retryable

    fine = target.submit(moved_spec(), name=unique("shaper-8-fine"))
    wait_for("the moved job's confirm", lambda: confirmed("fine", fine))
    *before, verdict = answers["fine"]
    assert verdict.ok and verdict.result["summary"] == f"job {fine} is RUNNING", verdict.error
    assert all(a.retryable and "has not started" in (a.error or "") for a in before)

    broken_name = unique("shaper-8-broken")
    broken = target.submit(
        moved_spec(runtime_env={"conda": "shaper-no-such-conda-env"}), name=broken_name
    )
    wait_for("the broken job's confirm", lambda: confirmed("broken", broken), timeout=120)
    *before, verdict = answers["broken"]
    assert not verdict.ok and not verdict.retryable
    assert f"job {broken} is FAILED (RUNTIME_ENV_SETUP_FAILURE" in (verdict.error or "")
    assert "before its entrypoint ran: the scheduler rejected the moved job" in (
        verdict.error or ""
    )
    assert all(a.retryable for a in before)
    assert target.withdraw(broken_name) is None  # nothing ran: the home copy takes over

    unknown = at_b.run(step("confirm", unique("shaper-never"), expect="accepted"))
    assert not unknown.ok and unknown.retryable and "Ray does not list" in (unknown.error or "")
