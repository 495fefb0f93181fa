"""Jobs move between two real Slurm clusters through the whole control plane (issue 16),
with nothing simulated: a pending job, and a running checkpointable one.

Cluster A (``hpc-test``: the session's test cluster, node1-3 with 2 GPUs each) is full; a
job waits there. Cluster B (``hpc-b``: tests/support/second_slurm_cluster.py, bnode1-2,
its own slurmctld) is idle. Both clusters' connectors (telemetry and scheduler-level
steps), the API on PostgreSQL and a control-plane Celery worker run as separate processes
on a private Redis; the two clusters are one federation group. The group's plan proposes
the move; an operator approves it; A's connector holds the job, B's submits it from the
batch script A reported, B's confirms that Slurm has it queued or running, and A's
cancels A's copy. The job runs on B with its own script, A's copy is gone, and the control
plane sees it at B.

A running counter (``shaper agent exec --wait`` around tests/support/counter.py, 100 MB of
state, node agents on all five nodes) moves from A's node1 to B's bnode2: CRIU checkpoints
it on node1, B's connector submits it held and pinned to bnode2, the image is copied and
staged there under B's job id, B's connector releases the job, and when Slurm starts it
the job's body restores the counter, which goes on from its count; then A's job is
cancelled and node1's image dropped.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from sqlmodel import Session, select

from agent import procs
from app.actions.models import Action, ActionKind, ActionState
from app.clusters.models import Cluster
from app.core.lookup import row_id
from app.federation import service as federation_service
from app.federation.models import FederationGroupCreate
from app.jobs.models import Job
from tests.connectors.conftest import SecondSlurmCluster, SlurmCluster
from tests.support.counter import count_of, next_count, progress_of
from tests.support.deployment import api
from tests.support.deployment import deployment as deployment_of
from tests.support.pipeline import Pipeline
from tests.support.plans import action_state, wait_until_settled

A, B = "hpc-test", "hpc-b"
NODES = {A: ("node1", "node2", "node3"), B: ("bnode1", "bnode2")}
WAIT_S = 60.0


@pytest.fixture(scope="module")
def deployment(
    slurm_cluster: SlurmCluster,
    slurm_b_cluster: SecondSlurmCluster,
    make_postgres_database: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("slurm-federation")
    root.chmod(0o755)

    def group(session: Session, now: datetime) -> None:
        federation_service.create_group(
            session=session, group_in=FederationGroupCreate(name="site"), now=now, actor=None
        )
        for name in (A, B):
            federation_service.add_cluster(
                session=session, name="site", cluster=name, now=now, actor=None
            )

    scopes = ["operator", "viewer", f"connector:{A}", f"connector:{B}"]
    scopes += [f"agent:{cluster}/{node}" for cluster, nodes in NODES.items() for node in nodes]
    env = {
        "SHAPER_CYCLE_PERIOD_S": "86400",  # the test plans the group itself
        "SHAPER_SCHEDULER_START_WAIT_S": "45",
    }
    with deployment_of(
        root=root,
        database_url=make_postgres_database("slurm_federation"),
        clusters=[(A, "slurm"), (B, "slurm")],
        scopes=scopes,
        env=env,
        setup=group,
    ) as running:
        pipeline: Pipeline = running["pipeline"]
        for cluster, nodes in NODES.items():
            for node in nodes:
                pipeline.start_agent(node, cluster=cluster)
        base = running["base"]
        pipeline.start_connector("slurm", A, base, *slurm_cluster.connector_settings)
        pipeline.start_connector("slurm", B, base, *slurm_b_cluster.connector_settings)
        yield running


def _jobs(deployment: dict[str, Any], cluster: str) -> dict[str, dict[str, Any]]:
    items = api(deployment, "GET", f"/jobs?cluster={cluster}&limit=1000", "viewer")["items"]
    return {job["external_id"]: job for job in items}


def _wait_for(what: str, condition: Any, deployment: dict[str, Any]) -> Any:
    found: list[Any] = []

    def holds() -> bool:
        value = condition()
        if value:
            found.append(value)
        return bool(value)

    assert procs.wait_until(holds, timeout=WAIT_S, interval=0.5), (
        f"{what} never happened\n{deployment['pipeline'].logs()}"
    )
    return found[-1]


def test_a_job_waiting_in_the_full_cluster_moves_to_the_idle_one_and_runs_there(
    slurm: SlurmCluster, slurm_b: SecondSlurmCluster, deployment: dict[str, Any]
) -> None:
    root: Path = deployment["root"]
    fillers = [slurm.sbatch("--gres=gpu:h100:2", f"--nodelist=node{n}") for n in (1, 2, 3)]
    for job_id in fillers:
        slurm.wait_state(job_id, "RUNNING")
    marker = root / "moved.out"
    waiting = slurm.sbatch(
        "--gres=gpu:h100:2",
        "--job-name=waiting",
        "--comment=shaper:kind=training,priority=50",
        command=f'echo "ran on $SLURM_CLUSTER_NAME $SLURMD_NODENAME" > {marker}; sleep 600',
    )
    assert slurm.job(waiting)["state"] == "PENDING"
    _wait_for(
        "the control plane seeing the waiting job and both clusters' nodes",
        lambda: (
            _jobs(deployment, A).get(waiting, {}).get("state") == "pending"
            and len(api(deployment, "GET", f"/nodes?cluster={B}", "viewer")["items"]) == 2
        ),
        deployment,
    )

    planned = api(deployment, "POST", "/federation-groups/site/plan", "operator")
    assert len(planned["proposed"]) == 1, planned
    (action_id,) = planned["proposed"]
    action = api(deployment, "GET", f"/actions/{action_id}", "viewer")
    assert (action["kind"], action["cluster"], action["target_cluster"]) == ("move", A, B)
    assert action["job_external_id"] == waiting and action["state"] == "proposed"

    api(deployment, "POST", f"/actions/{action_id}/approve", "operator")
    pipeline: Pipeline = deployment["pipeline"]
    final = wait_until_settled(
        pipeline.engine,
        [action_id],
        timeout_s=2 * WAIT_S,
        context=lambda: f"A: {slurm.squeue()}\nB: {slurm_b.squeue()}\n{pipeline.logs()}",
    )[action_id]
    state, steps = action_state(pipeline.engine, action_id)
    assert final == "succeeded", (state, [(s.name, s.state, s.error) for s in steps])
    assert [(s.name, s.queue) for s in steps] == [
        ("hold", f"connector.{A}"),
        ("submit", f"connector.{B}"),
        ("confirm", f"connector.{B}"),
        ("cancel", f"connector.{A}"),
    ]
    arrived = steps[1].result["external_id"]

    # B runs it, from the script A reported; A's copy is gone; the job ran once, at B.
    slurm_b.wait_state(arrived, "RUNNING")
    assert procs.wait_until(marker.exists, timeout=WAIT_S), slurm_b.job(arrived)
    assert marker.read_text().split()[:3] == ["ran", "on", "shaper-b"]
    assert slurm.job(waiting)["state"] == "CANCELLED"
    assert f"shaper-move:shaper-{action_id}-{waiting}" in slurm_b.scontrol_job(arrived)
    at_b = _wait_for(
        "the control plane seeing the job run at B",
        lambda: (
            _jobs(deployment, B).get(arrived, {}).get("state") == "running"
            and _jobs(deployment, B)[arrived]
        ),
        deployment,
    )
    assert at_b["name"] == "waiting"
    assert _jobs(deployment, A)[waiting]["state"] == "cancelled"

    # Planned again: nothing left to move (the job runs at B).
    again = api(deployment, "POST", "/federation-groups/site/plan", "operator")
    assert again["proposed"] == [] and again["approved"] == []


def _operator_move(deployment: dict[str, Any], job_id: str, source: str, target: str) -> int:
    """A move of a running job, as an operator's plan would carry it (the group plan moves
    only pending jobs)."""
    engine = deployment["pipeline"].engine
    with Session(engine) as session:
        job = session.exec(select(Job).where(Job.external_id == job_id)).one()
        target_cluster = session.exec(select(Cluster).where(Cluster.name == B)).one()
        now = datetime.now(UTC)
        action = Action(
            cluster_id=job.cluster_id,
            target_cluster_id=target_cluster.id,
            job_id=job.id,
            kind=ActionKind.move,
            state=ActionState.proposed,
            idempotency_key=f"e2e:move:{job_id}",
            reason="end-to-end test",
            source_node=source,
            target_node=target,
            created_at=now,
            updated_at=now,
        )
        session.add(action)
        session.commit()
        return row_id(action)


def test_a_running_counter_moves_to_the_other_cluster_and_counts_on(
    slurm: SlurmCluster, slurm_b: SecondSlurmCluster, deployment: dict[str, Any]
) -> None:
    root: Path = deployment["root"]
    job_id, count_file = slurm.submit_counter(root, "travelling", "--nodelist=node1")
    slurm.wait_state(job_id, "RUNNING")
    assert procs.wait_until(lambda: count_of(count_file) >= 10, timeout=WAIT_S), procs.read_tail(
        slurm.jobs_dir / f"{job_id}.out"
    )
    first = progress_of(count_file)
    _wait_for(
        "the control plane seeing the counter run on node1 with its submit spec",
        lambda: (
            (job := _jobs(deployment, A).get(job_id)) is not None
            and job["state"] == "running"
            and [a["node"] for a in job["allocations"]] == ["node1"]
            and _stored_spec(deployment, job_id)
        ),
        deployment,
    )

    # B's next job id must differ from the counter's id at A: the job resumes at B under
    # B's id, while its image names A's (a held job that ends at once moves B's ids on).
    while int(slurm_b.sbatch("--hold", command="true")) <= int(job_id):
        pass
    action_id = _operator_move(deployment, job_id, "node1", "bnode2")
    api(deployment, "POST", f"/actions/{action_id}/approve", "operator")
    pipeline: Pipeline = deployment["pipeline"]
    final = wait_until_settled(
        pipeline.engine,
        [action_id],
        timeout_s=3 * WAIT_S,
        context=lambda: f"A: {slurm.squeue()}\nB: {slurm_b.squeue()}\n{pipeline.logs()}",
    )[action_id]
    state, steps = action_state(pipeline.engine, action_id)
    arrived = steps[1].result.get("external_id")
    assert final == "succeeded", (
        state,
        [(s.name, s.state, s.error) for s in steps],
        slurm_b.scontrol_job(arrived) if arrived else None,
        # The job's output path came with its options: A's jobs directory, B's job id.
        procs.read_tail(slurm.jobs_dir / f"{arrived}.out", lines=30),
        pipeline.logs(),
    )
    assert [(s.name, s.queue) for s in steps] == [
        ("checkpoint", f"agent.{A}.node1"),
        ("submit", f"connector.{B}"),
        ("transfer", f"agent.{B}.bnode2"),
        ("stage", f"agent.{B}.bnode2"),
        ("release", f"connector.{B}"),
        ("confirm", f"agent.{B}.bnode2"),
        ("cancel", f"connector.{A}"),
        ("release", f"agent.{A}.node1"),
    ]
    assert steps[0].result["image"]["size_bytes"] >= 100 << 20

    assert arrived != job_id
    # B runs it on bnode2; A's job has ended; the counter went on from its count: the same
    # process, restored from the checkpoint that crossed clusters, not a fresh start.
    row = slurm_b.wait_state(arrived, "RUNNING")
    assert row["nodelist"] == "bnode2"
    assert slurm.wait_for(
        "A's copy to end",
        lambda: slurm.job(job_id)["state"] in ("CANCELLED", "COMPLETED"),
    )
    at_success = count_of(count_file)
    assert at_success > first["count"]
    assert progress_of(count_file)["started_at"] == first["started_at"]
    assert next_count(count_file, at_success) > at_success
    # Nothing of it is left on node1: its image is deleted, no process counts there.
    assert not (pipeline.state_dir("node1") / "images" / job_id).exists()
    slurm_b.run("scancel", arrived)


def _stored_spec(deployment: dict[str, Any], job_id: str) -> bool:
    with Session(deployment["pipeline"].engine) as session:
        job = session.exec(select(Job).where(Job.external_id == job_id)).first()
        return job is not None and job.submit_spec is not None
