"""Save-migrate-resume of a running Slurm job, end to end, with nothing simulated.

A real three-node Slurm runs a batch job whose body is ``shaper agent exec --wait`` around
the example counter (100 MB of state). Around it run the real parts of a deployment:
the API on PostgreSQL, a control-plane Celery worker, one node agent per Slurm node and
the Slurm connector (telemetry and scheduler-level steps), all separate processes on a
private Redis. An operator approves a migration; CRIU checkpoints the counter on its node,
the image is copied and staged on the target, the connector requeues the job pinned
there, and when Slurm starts it again the job's body restores the counter instead of
starting it over.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import Session, select

from agent import procs
from app.actions.models import ActionKind
from app.jobs.models import Job
from tests.connectors.conftest import SlurmCluster
from tests.support.counter import count_of, next_count, progress_of
from tests.support.deployment import api
from tests.support.deployment import deployment as deployment_of
from tests.support.pipeline import Pipeline
from tests.support.plans import action_state, stored_plan, wait_until_settled

CLUSTER = "hpc-test"
NODES = ("node1", "node2", "node3")
WAIT_S = 60.0
# How long a confirm waits for Slurm to start the requeued job where it was staged. One that
# fails waits all of it (three tests here do, one of them twice); one that succeeds needs
# about 7 s: cred_expire (5 s), the next scheduler pass (sched_interval=1) and the restore.
START_WAIT_S = 20.0


@pytest.fixture(scope="module")
def migration_cluster(slurm_cluster: SlurmCluster) -> SlurmCluster:
    """The Slurm the deployment is built around (test_slurm_current.py: Slurm 24.11's)."""
    return slurm_cluster


@pytest.fixture(scope="module")
def deployment(
    migration_cluster: SlurmCluster,
    make_postgres_database: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Any]]:
    """API, control worker, three node agents and the connector, around the Slurm cluster."""
    root = tmp_path_factory.mktemp("slurm-deployment")
    root.chmod(0o755)
    scopes = ["operator", "viewer", f"connector:{CLUSTER}"]
    scopes += [f"agent:{CLUSTER}/{node}" for node in NODES]
    env = {
        "SHAPER_CYCLE_PERIOD_S": "86400",  # the test proposes; no cycle supersedes it
        # Slurm here holds a requeued job for cred_expire = 5 s, not 120 s.
        "SHAPER_SCHEDULER_START_WAIT_S": str(START_WAIT_S),
    }
    with deployment_of(
        root=root,
        database_url=make_postgres_database("slurm_migration"),
        clusters=[(CLUSTER, "slurm")],
        scopes=scopes,
        env=env,
    ) as running:
        pipeline: Pipeline = running["pipeline"]
        for node in NODES:
            pipeline.start_agent(node, cluster=CLUSTER)
        pipeline.start_connector(
            "slurm", CLUSTER, running["base"], *migration_cluster.connector_settings
        )
        yield running


def _known_job(deployment: dict[str, Any], job_id: str, node: str) -> dict[str, Any]:
    """The job as the control plane sees it, once telemetry shows it running on node."""

    last: list[Any] = []

    def seen() -> dict[str, Any] | None:
        items = api(deployment, "GET", f"/jobs?cluster={CLUSTER}&limit=1000", "viewer")["items"]
        for job in items:
            if job["external_id"] == job_id:
                last[:] = [job]
                if [a["node"] for a in job["allocations"]] == [node]:
                    return job
        return None

    found: list[dict[str, Any]] = []

    def shown() -> bool:
        job = seen()
        if job is not None:
            found.append(job)
        return job is not None

    assert procs.wait_until(shown, timeout=WAIT_S, interval=0.5), (
        f"telemetry never showed job {job_id} on {node}: {last}"
    )
    return found[-1]


def _propose(deployment: dict[str, Any], job_id: str, kind: ActionKind, **nodes: str) -> int:
    from app.actions.models import Action, ActionState

    engine = deployment["pipeline"].engine
    with Session(engine) as session:
        job = session.exec(select(Job).where(Job.external_id == job_id)).one()
        now = datetime.now(UTC)
        action = Action(
            cluster_id=job.cluster_id,
            job_id=job.id,
            kind=kind,
            state=ActionState.proposed,
            idempotency_key=f"e2e:{job_id}:{kind.value}",
            reason="end-to-end test",
            source_node=nodes.get("source"),
            target_node=nodes.get("target"),
            created_at=now,
            updated_at=now,
        )
        session.add(action)
        session.commit()
        return action.id  # type: ignore[return-value]


def _approve_and_wait(
    deployment: dict[str, Any], action_id: int, slurm: SlurmCluster, job_id: str
) -> str:
    api(deployment, "POST", f"/actions/{action_id}/approve", "operator")
    states = wait_until_settled(
        deployment["pipeline"].engine,
        [action_id],
        timeout_s=2 * WAIT_S + 60,
        context=lambda: (
            f"Slurm: {slurm.job(job_id)}\njob output:\n"
            f"{procs.read_tail(slurm.jobs_dir / f'{job_id}.out', lines=30)}"
        ),
    )
    return states[action_id]


def _gres_used(slurm: SlurmCluster, node: str) -> str:
    shown = slurm.run("scontrol", "show", "node", "-d", node)
    match = re.search(r"GresUsed=(\S+)", shown)
    assert match, shown
    return match.group(1)


def test_a_running_slurm_job_is_checkpointed_requeued_to_another_node_and_resumes(
    slurm: SlurmCluster, deployment: dict[str, Any]
) -> None:
    root: Path = deployment["root"]
    job_id, count_file = slurm.submit_counter(root, "migrating", "--nodelist=node1")
    slurm.wait_state(job_id, "RUNNING")
    assert procs.wait_until(lambda: count_of(count_file) >= 10, timeout=WAIT_S), procs.read_tail(
        slurm.jobs_dir / f"{job_id}.out"
    )
    first = progress_of(count_file)
    known = _known_job(deployment, job_id, "node1")
    assert known["checkpointable"] and known["kind"] == "training"

    action_id = _propose(deployment, job_id, ActionKind.migrate, source="node1", target="node2")
    final = _approve_and_wait(deployment, action_id, slurm, job_id)

    pipeline: Pipeline = deployment["pipeline"]
    state, steps = action_state(pipeline.engine, action_id)
    assert final == "succeeded", (
        state,
        [(s.name, s.state, s.error) for s in steps],
        pipeline.logs(),
    )
    assert [(s.name, s.queue) for s in steps] == [
        ("checkpoint", f"agent.{CLUSTER}.node1"),
        ("transfer", f"agent.{CLUSTER}.node2"),
        ("stage", f"agent.{CLUSTER}.node2"),
        ("requeue", f"connector.{CLUSTER}"),
        ("confirm", f"agent.{CLUSTER}.node2"),
        ("release", f"agent.{CLUSTER}.node1"),
    ]
    assert steps[0].result["image"]["size_bytes"] >= 100 << 20
    # Slurm runs the same job on node2 now, restarted once; node1's GPUs are free.
    row = slurm.wait_state(job_id, "RUNNING")
    assert row["nodelist"] == "node2"
    assert "Restarts=1" in slurm.scontrol_job(job_id)
    assert _gres_used(slurm, "node1").startswith("gpu:h100:0")
    # The counter went on from its count: the same process, restored, not a fresh start.
    at_success = count_of(count_file)
    assert (
        at_success > first["count"] and progress_of(count_file)["started_at"] == first["started_at"]
    )
    assert next_count(count_file, at_success) > at_success
    # The control plane's own view follows from the connector's telemetry.
    _known_job(deployment, job_id, "node2")


def test_a_preempted_slurm_job_is_checkpointed_first_and_resumes_from_its_checkpoint(
    slurm: SlurmCluster, deployment: dict[str, Any]
) -> None:
    """The cluster is full; a more important job waits. Shaper preempts the counter:
    checkpoint, image staged where it ran, requeue. The waiting job takes the GPUs; when it
    ends, Slurm runs the counter again and it goes on from its checkpoint."""
    root: Path = deployment["root"]
    job_id, count_file = slurm.submit_counter(root, "preempted", "--nodelist=node1")
    fillers = [
        slurm.sbatch("--gres=gpu:h100:2", f"--nodelist={node}", "--job-name=filler")
        for node in ("node2", "node3")
    ]
    for waiting_on in (job_id, *fillers):
        slurm.wait_state(waiting_on, "RUNNING")
    assert procs.wait_until(lambda: count_of(count_file) >= 10, timeout=WAIT_S)
    first = progress_of(count_file)
    urgent = slurm.sbatch("--gres=gpu:h100:2", "--job-name=urgent")
    assert slurm.job(urgent)["state"] == "PENDING"
    _known_job(deployment, job_id, "node1")

    action_id = _propose(deployment, job_id, ActionKind.preempt, source="node1")
    final = _approve_and_wait(deployment, action_id, slurm, job_id)

    pipeline: Pipeline = deployment["pipeline"]
    _state, steps = action_state(pipeline.engine, action_id)
    assert final == "succeeded", [(s.name, s.state, s.error) for s in steps]
    assert [(s.name, s.queue) for s in steps] == [
        ("checkpoint", f"agent.{CLUSTER}.node1"),
        ("stage", f"agent.{CLUSTER}.node1"),
        ("requeue", f"connector.{CLUSTER}"),
    ]
    # The urgent job gets the freed GPUs; the counter waits in the queue, not running.
    assert slurm.wait_state(urgent, "RUNNING")["nodelist"] == "node1"
    assert slurm.job(job_id)["state"] == "PENDING"
    at_preemption = count_of(count_file)
    assert not procs.wait_until(lambda: count_of(count_file) != at_preemption, timeout=2.0)

    # Held: even when the GPUs free up, it runs again only when a plan starts it. Unheld, it
    # would run within 7 s: its requeue's cred_expire (5 s) and a scheduler pass (1 s).
    slurm.run("scancel", urgent)
    assert not procs.wait_until(lambda: slurm.job(job_id)["state"] == "RUNNING", timeout=10.0)
    assert "Priority=0 " in slurm.scontrol_job(job_id)  # what Slurm shows for a held job
    start_id = _propose(deployment, job_id, ActionKind.start, target="node1")
    assert _approve_and_wait(deployment, start_id, slurm, job_id) == "succeeded"
    _state, start_steps = action_state(pipeline.engine, start_id)
    assert [(s.name, s.state) for s in start_steps] == [
        ("start", "succeeded"),
        ("confirm", "succeeded"),  # seen running where the plan put it
    ]
    assert slurm.wait_state(job_id, "RUNNING")["nodelist"] == "node1"
    # Resumed from the checkpoint: the same process image, counting on from where it was.
    assert next_count(count_file, at_preemption) > at_preemption
    assert progress_of(count_file)["started_at"] == first["started_at"]
    assert count_of(count_file) > first["count"]


def test_a_migration_whose_target_never_runs_the_job_sends_it_home_to_resume(
    slurm: SlurmCluster, deployment: dict[str, Any]
) -> None:
    """The target is drained after the plan was made: the requeued job never starts there.
    The confirm gives up; compensation fences the target, stages the image the checkpoint
    left on the source and requeues the job back there, where it resumes."""
    root: Path = deployment["root"]
    job_id, count_file = slurm.submit_counter(root, "homecoming", "--nodelist=node1")
    slurm.wait_state(job_id, "RUNNING")
    assert procs.wait_until(lambda: count_of(count_file) >= 10, timeout=WAIT_S)
    first = progress_of(count_file)
    _known_job(deployment, job_id, "node1")
    slurm.run("scontrol", "update", "NodeName=node2", "State=DRAIN", "Reason=shaper-test")
    try:
        action_id = _propose(deployment, job_id, ActionKind.migrate, source="node1", target="node2")
        final = _approve_and_wait(deployment, action_id, slurm, job_id)
        pipeline: Pipeline = deployment["pipeline"]
        _state, steps = action_state(pipeline.engine, action_id)
        assert final == "compensated", [(s.name, s.state, s.error) for s in steps]
        assert [(s.phase, s.name, s.queue.split(".")[-1], s.state) for s in steps] == [
            ("forward", "checkpoint", "node1", "succeeded"),
            ("forward", "transfer", "node2", "succeeded"),
            ("forward", "stage", "node2", "succeeded"),
            ("forward", "requeue", CLUSTER, "succeeded"),
            ("forward", "confirm", "node2", "failed"),
            ("forward", "release", "node1", "skipped"),
            ("compensate", "release", "node2", "succeeded"),
            ("compensate", "stage", "node1", "succeeded"),
            ("compensate", "requeue", CLUSTER, "succeeded"),
            ("compensate", "confirm", "node1", "succeeded"),
        ]
        assert {s.generation for s in steps if s.phase == "compensate"} == {2}
        assert slurm.job(job_id)["state"] == "RUNNING"
        assert slurm.job(job_id)["nodelist"] == "node1"
        at_home = count_of(count_file)
        assert at_home > first["count"]
        assert progress_of(count_file)["started_at"] == first["started_at"]
        assert next_count(count_file, at_home) > at_home
        # The target is fenced: a late copy of the old generation's image would be refused.
        assert not (pipeline.state_dir("node2") / "images" / job_id).exists()
    finally:
        slurm.run("scontrol", "update", "NodeName=node2", "State=RESUME")


def test_a_move_that_loses_both_target_and_source_leaves_the_job_queued_with_its_checkpoint(
    slurm: SlurmCluster, deployment: dict[str, Any]
) -> None:
    """The demo's stranding case on a real Slurm: the target is drained after the plan was
    made, and a job waiting for the source's GPUs takes them once the move requeues the
    counter. Neither node can take it back; the saga fails and says so, the job waits in
    Slurm's queue pinned to its source with the image staged there, shown as displaced by
    the API; when the source frees, Slurm runs it and it resumes from its checkpoint."""
    root: Path = deployment["root"]
    job_id, count_file = slurm.submit_counter(root, "stranded", "--nodelist=node1")
    slurm.wait_state(job_id, "RUNNING")
    assert procs.wait_until(lambda: count_of(count_file) >= 10, timeout=WAIT_S)
    first = progress_of(count_file)
    _known_job(deployment, job_id, "node1")
    # Waits for node1's GPUs, and gets them the moment the move requeues the counter.
    rival = slurm.sbatch("--gres=gpu:h100:2", "--nodelist=node1", "--job-name=rival")
    assert slurm.job(rival)["state"] == "PENDING"
    slurm.run("scontrol", "update", "NodeName=node2", "State=DRAIN", "Reason=shaper-test")
    try:
        action_id = _propose(deployment, job_id, ActionKind.migrate, source="node1", target="node2")
        final = _approve_and_wait(deployment, action_id, slurm, job_id)
        pipeline: Pipeline = deployment["pipeline"]
        _state, steps = action_state(pipeline.engine, action_id)
        assert final == "failed", [(s.name, s.state, s.error) for s in steps]
        assert [(s.phase, s.name, s.state) for s in steps][-4:] == [
            ("compensate", "release", "succeeded"),
            ("compensate", "stage", "succeeded"),
            ("compensate", "requeue", "succeeded"),
            ("compensate", "confirm", "failed"),
        ]
        assert slurm.job(rival)["state"] == "RUNNING"
        assert slurm.job(job_id)["state"] == "PENDING"  # queued, not lost and not held
        shown = api(deployment, "GET", f"/jobs?cluster={CLUSTER}&limit=1000", "viewer")
        (row,) = [j for j in shown["items"] if j["external_id"] == job_id]
        assert row["displaced_at"] is not None
        assert "checkpoint" in row["displaced_reason"]

        slurm.run("scancel", rival)
        assert slurm.wait_state(job_id, "RUNNING")["nodelist"] == "node1"
        at_home = count_of(count_file)
        assert next_count(count_file, at_home) > at_home
        assert progress_of(count_file)["started_at"] == first["started_at"]  # restored
        assert count_of(count_file) > first["count"]
    finally:
        slurm.run("scontrol", "update", "NodeName=node2", "State=RESUME")


# --- whole plans: reservations hold what a move frees, and what it leaves -------------------


def _plan(deployment: dict[str, Any], steps: list[dict[str, Any]]) -> list[int]:
    """A proposed plan (tests.support.plans.stored_plan): each move and start after a
    ``reserve`` of its target, what frees GPUs for a job after that job's reservation."""
    return stored_plan(deployment["pipeline"].engine, steps)


def _approve_plan_and_wait(
    deployment: dict[str, Any], ids: list[int], slurm: SlurmCluster
) -> dict[int, str]:
    plan_id, *action_ids = ids
    api(deployment, "POST", f"/plans/{plan_id}/approve", "operator")
    return wait_until_settled(
        deployment["pipeline"].engine,
        action_ids,
        timeout_s=3 * WAIT_S + 60,
        context=lambda: f"Slurm: {slurm.squeue()}\nreservations: {slurm.reservations()}",
    )


def test_an_approved_plan_moves_a_job_and_the_freed_node_waits_for_the_planned_start(
    slurm: SlurmCluster, deployment: dict[str, Any]
) -> None:
    """node1 and node2 are half used; a two-GPU job waits (held, as a job Shaper stopped
    does). The plan moves the counter from node1 to node2 and starts the waiting job on
    node1. A rival submitted once the plan is approved would take node1 the moment the
    move frees it (the control case is in test_slurm_reservations.py): the reservations
    keep it for the planned job, and are given back once both jobs run where planned."""
    root: Path = deployment["root"]
    mover, count_file = slurm.submit_counter(root, "mover", "--nodelist=node1", gpus=1)
    slurm.sbatch("--gres=gpu:h100:1", "--nodelist=node2", "--job-name=filler")
    slurm.sbatch("--gres=gpu:h100:2", "--nodelist=node3", "--job-name=blocker")
    slurm.wait_state(mover, "RUNNING")
    assert procs.wait_until(lambda: count_of(count_file) >= 10, timeout=WAIT_S)
    first = progress_of(count_file)
    planned = slurm.sbatch("--gres=gpu:h100:2", "-H", "--job-name=planned")
    _known_job(deployment, mover, "node1")
    assert procs.wait_until(
        lambda: any(
            j["external_id"] == planned
            for j in api(deployment, "GET", f"/jobs?cluster={CLUSTER}", "viewer")["items"]
        ),
        timeout=WAIT_S,
    )

    ids = _plan(
        deployment,
        [
            {"job": mover, "kind": ActionKind.reserve, "target_node": "node2",
             "target_placement": {"node2": 1}, "counts_on": [mover]},
            {"job": mover, "kind": ActionKind.migrate, "source_node": "node1",
             "target_node": "node2", "source_placement": {"node1": 1},
             "target_placement": {"node2": 1}, "after": [0, 2]},
            {"job": planned, "kind": ActionKind.reserve, "target_node": "node1",
             "target_placement": {"node1": 2}, "counts_on": [mover, planned]},
            {"job": planned, "kind": ActionKind.start, "target_node": "node1",
             "target_placement": {"node1": 2}, "after": [1, 2]},
        ],
    )  # fmt: skip
    rival = slurm.sbatch("--gres=gpu:h100:2", "--job-name=rival")
    final = _approve_plan_and_wait(deployment, ids, slurm)

    assert list(final.values()) == ["succeeded"] * 4, final
    assert slurm.job(planned)["nodelist"] == "node1"
    assert slurm.job(mover)["nodelist"] == "node2"
    assert slurm.job(rival)["state"] == "PENDING"
    # The counter went on from its checkpoint on node2.
    at_end = count_of(count_file)
    assert next_count(count_file, at_end) > at_end
    assert progress_of(count_file)["started_at"] == first["started_at"]
    # The plan gives the reservations back once its actions have ended (unreserve actions).
    assert slurm.wait_for("the reservations to be given back", lambda: not slurm.reservations())
    assert slurm.job(planned)["state"] == "RUNNING" and slurm.job(mover)["state"] == "RUNNING"


def test_a_planned_move_that_loses_its_target_comes_back_to_its_held_source(
    slurm: SlurmCluster, deployment: dict[str, Any]
) -> None:
    """The stranding case again, now as the cycle plans it: the move's reservation holds
    its source as well as its target until the job runs again. The target is drained
    after the plan was made and a rival waits for node1; the rival does not get it, the
    move fails, and the job comes back to node1 from its checkpoint, not displaced."""
    root: Path = deployment["root"]
    mover, count_file = slurm.submit_counter(root, "held-home", "--nodelist=node1")
    slurm.wait_state(mover, "RUNNING")
    assert procs.wait_until(lambda: count_of(count_file) >= 10, timeout=WAIT_S)
    first = progress_of(count_file)
    _known_job(deployment, mover, "node1")
    rival = slurm.sbatch("--gres=gpu:h100:2", "--nodelist=node1", "--job-name=rival")
    ids = _plan(
        deployment,
        [
            {"job": mover, "kind": ActionKind.reserve, "target_node": "node2",
             "target_placement": {"node2": 2}, "counts_on": [mover]},
            {"job": mover, "kind": ActionKind.migrate, "source_node": "node1",
             "target_node": "node2", "source_placement": {"node1": 2},
             "target_placement": {"node2": 2}, "after": [0]},
        ],
    )  # fmt: skip
    slurm.run("scontrol", "update", "NodeName=node2", "State=DRAIN", "Reason=shaper-test")
    try:
        final = _approve_plan_and_wait(deployment, ids, slurm)
        reserve_id, move_id = ids[1:]
        _state, steps = action_state(deployment["pipeline"].engine, move_id)
        assert final == {reserve_id: "succeeded", move_id: "compensated"}, (
            "\n".join(f"{s.phase} {s.name} {s.state} {s.error}" for s in steps)
            + "\n"
            + deployment["pipeline"].logs()
        )
        assert slurm.job(rival)["state"] == "PENDING"
        assert slurm.wait_state(mover, "RUNNING")["nodelist"] == "node1"
        at_home = count_of(count_file)
        assert next_count(count_file, at_home) > at_home
        assert progress_of(count_file)["started_at"] == first["started_at"]  # restored
        shown = api(deployment, "GET", f"/jobs?cluster={CLUSTER}&limit=1000", "viewer")
        (row,) = [j for j in shown["items"] if j["external_id"] == mover]
        assert row["displaced_at"] is None
        assert slurm.wait_for("the reservation to be given back", lambda: not slurm.reservations())
    finally:
        slurm.run("scontrol", "update", "NodeName=node2", "State=RESUME")
