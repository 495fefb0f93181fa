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

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
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
from app.policies import service as policy_service
from app.policies.models import SlaPolicyCreate, SlaPolicySpec, TeamPolicy
from connectors.slurm.connector import SlurmConnector
from tests.connectors.conftest import SecondSlurmCluster, SlurmCluster
from tests.support.counter import count_of, next_count, progress_of
from tests.support.deployment import api
from tests.support.deployment import deployment as deployment_of
from tests.support.pipeline import Pipeline
from tests.support.plans import action_state, wait_until_settled
from tests.support.refusing_slurm import RefusingSlurm, leaving_a_reservation, reservation_state

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


def _wait_for(what: str, condition: Any, deployment: dict[str, Any], interval: float = 0.5) -> Any:
    found: list[Any] = []

    def holds() -> bool:
        value = condition()
        if value:
            found.append(value)
        return bool(value)

    assert procs.wait_until(holds, timeout=WAIT_S, interval=interval), (
        f"{what} never happened\n{deployment['pipeline'].logs()}"
    )
    return found[-1]


def _waiting_at_full_a(
    slurm: SlurmCluster, deployment: dict[str, Any], name: str, marker: Path
) -> str:
    """A job waiting on A, whose three nodes are full, seen by the control plane with B's
    nodes: its id."""
    fillers = [slurm.sbatch("--gres=gpu:h100:2", f"--nodelist=node{n}") for n in (1, 2, 3)]
    for job_id in fillers:
        slurm.wait_state(job_id, "RUNNING")
    waiting = slurm.sbatch(
        "--gres=gpu:h100:2",
        f"--job-name={name}",
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
    return waiting


def _proposed_move(deployment: dict[str, Any], waiting: str) -> tuple[int, str]:
    """The group plan's one proposal, the waiting job's move to B: its id and the node of
    B it was planned onto."""
    planned = api(deployment, "POST", "/federation-groups/site/plan", "operator")
    assert len(planned["proposed"]) == 1, planned
    (action_id,) = planned["proposed"]
    action = api(deployment, "GET", f"/actions/{action_id}", "viewer")
    assert (action["kind"], action["cluster"], action["target_cluster"]) == ("move", A, B)
    assert action["job_external_id"] == waiting and action["state"] == "proposed"
    assert action["target_node"] in NODES[B], action
    return action_id, action["target_node"]


def _step(deployment: dict[str, Any], action_id: int, name: str) -> Any:
    """The move's forward step of that name; None before the move has been dispatched."""
    _, steps = action_state(deployment["pipeline"].engine, action_id)
    return next((s for s in steps if s.name == name and s.phase == "forward"), None)


def test_a_job_waiting_in_the_full_cluster_moves_to_the_idle_one_and_runs_there(
    slurm: SlurmCluster, slurm_b: SecondSlurmCluster, deployment: dict[str, Any]
) -> None:
    """The node of B the plan counted on is held for the job from before its copy may
    start there until A's copy is gone: B's own queue cannot take it in between."""
    root: Path = deployment["root"]
    marker = root / "moved.out"
    waiting = _waiting_at_full_a(slurm, deployment, "waiting", marker)
    action_id, node = _proposed_move(deployment, waiting)

    # A's connector stops answering once it has held A's copy: the move waits at A's
    # cancel after B's copy runs, with B's node still held for it.
    pipeline: Pipeline = deployment["pipeline"]
    connector_a = pipeline.workers[f"connector-{A}"].process.pid
    api(deployment, "POST", f"/actions/{action_id}/approve", "operator")
    # Looked at often: A's cancel can follow its hold within 0.2 s (a clean-clone run saw
    # the whole move end between two looks 0.5 s apart, before A was stopped).
    _wait_for(
        "A's hold of the waiting job",
        lambda: getattr(_step(deployment, action_id, "hold"), "state", None) == "succeeded",
        deployment,
        interval=0.01,
    )
    os.killpg(connector_a, signal.SIGSTOP)
    try:
        cancel = _wait_for(
            "the move reaching A's cancel",
            lambda: (step := _step(deployment, action_id, "cancel")).state == "sent" and step,
            deployment,
        )
        arrived = _step(deployment, action_id, "submit").result["external_id"]
        reservation = f"shaper-{arrived}"
        assert _step(deployment, action_id, "reserve").result["gpus"] == {node: 2}
        # B runs its copy on the planned node, in the reservation made for it, while A's
        # copy still waits there, held.
        row = slurm_b.wait_state(arrived, "RUNNING")
        assert row["nodelist"] == node
        assert reservation in slurm_b.reservations()
        assert f"Reservation={reservation}" in slurm_b.scontrol_job(arrived)
        assert slurm.job(waiting)["state"] == "PENDING"
        assert cancel.attempts == 1
    finally:
        os.killpg(connector_a, signal.SIGCONT)

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
        ("reserve", f"connector.{B}"),
        ("release", f"connector.{B}"),
        ("confirm", f"connector.{B}"),
        ("cancel", f"connector.{A}"),
        ("unreserve", f"connector.{B}"),
    ]
    # Given back once A's copy is gone; the job runs on at B, out of it.
    assert reservation not in slurm_b.reservations()
    assert f"Reservation={reservation}" not in slurm_b.scontrol_job(arrived)

    # B runs it, from the script A reported; A's copy is gone; the job ran once, at B.
    assert slurm_b.job(arrived)["state"] == "RUNNING"
    assert procs.wait_until(marker.exists, timeout=WAIT_S), slurm_b.job(arrived)
    assert marker.read_text().split() == ["ran", "on", "shaper-b", node]
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
    slurm_b.run("scancel", arrived)


def test_a_waiting_jobs_move_whose_planned_node_was_taken_meanwhile_leaves_it_at_home(
    slurm: SlurmCluster, slurm_b: SecondSlurmCluster, deployment: dict[str, Any]
) -> None:
    """B's own queue took the node the plan counted on after the plan: the reservation is
    refused, B's held copy withdrawn, and the job waits at A as before, released, never
    cancelled there and never run at B."""
    root: Path = deployment["root"]
    marker = root / "stayed.out"
    waiting = _waiting_at_full_a(slurm, deployment, "stays", marker)
    action_id, node = _proposed_move(deployment, waiting)
    squatter = slurm_b.sbatch(f"--nodelist={node}", "--gres=gpu:h100:2", command="sleep 600")
    slurm_b.wait_state(squatter, "RUNNING")

    final, state, steps = _approve_and_settle(deployment, action_id, slurm, slurm_b, 2)
    assert final == "compensated", (state, [(s.name, s.state, s.error) for s in steps])
    by_step = {(str(s.phase), str(s.name)): s for s in steps}
    reserve = by_step["forward", "reserve"]
    assert reserve.state == "failed" and f"held by {squatter} (2)" in (reserve.error or "")
    for name in ("release", "confirm", "cancel", "unreserve"):
        assert by_step["forward", name].state == "skipped", name
    assert [(s.name, s.queue, s.state) for s in steps if s.phase == "compensate"] == [
        ("withdraw", f"connector.{B}", "succeeded"),
        ("unreserve", f"connector.{B}", "succeeded"),
        ("release", f"connector.{A}", "succeeded"),
    ]
    held = by_step["forward", "submit"].result["external_id"]
    assert slurm_b.wait_for(
        "B's held copy withdrawn",
        lambda: slurm_b.job(held)["state"] in ("CANCELLED", "COMPLETED"),
    )
    assert not [r for r in slurm_b.reservations() if r.startswith("shaper-")]
    # At A as it was: pending, no longer held, its own job; it never ran anywhere.
    row = slurm.job(waiting)
    assert row["state"] == "PENDING" and "Held" not in row["reason"], row
    assert not marker.exists()
    assert _wait_for(
        "the control plane seeing the job wait at A",
        lambda: _jobs(deployment, A).get(waiting, {}).get("state") == "pending",
        deployment,
    )
    slurm_b.run("scancel", squatter)


def _approve_and_settle(
    deployment: dict[str, Any],
    action_id: int,
    slurm: SlurmCluster,
    slurm_b: SecondSlurmCluster,
    periods: int,
) -> tuple[str, str, list[Any]]:
    """Approve the move and wait until it ends (``periods`` × WAIT_S at most): its final
    state, its state as read, and its steps."""
    api(deployment, "POST", f"/actions/{action_id}/approve", "operator")
    pipeline: Pipeline = deployment["pipeline"]
    final = wait_until_settled(
        pipeline.engine,
        [action_id],
        timeout_s=periods * WAIT_S,
        context=lambda: f"A: {slurm.squeue()}\nB: {slurm_b.squeue()}\n{pipeline.logs()}",
    )[action_id]
    state, steps = action_state(pipeline.engine, action_id)
    return final, state, steps


def _operator_move(deployment: dict[str, Any], job_id: str, source: str, target: str) -> int:
    """A move of a running job made by an operator, not by the group plan."""
    engine = deployment["pipeline"].engine
    with Session(engine) as session:
        job = _job_at_a(session, job_id)
        assert job is not None
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


def _counter_on_node1(
    slurm: SlurmCluster, deployment: dict[str, Any], name: str
) -> tuple[str, Path, dict[str, Any]]:
    """The CRIU counter running on A's node1, counting, and seen by the control plane with
    its submit spec: its job id, count file and first progress."""
    job_id, count_file = slurm.submit_counter(deployment["root"], name, "--nodelist=node1")
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
    return job_id, count_file, first


def test_a_running_counter_moves_to_the_other_cluster_and_counts_on(
    slurm: SlurmCluster, slurm_b: SecondSlurmCluster, deployment: dict[str, Any]
) -> None:
    job_id, count_file, first = _counter_on_node1(slurm, deployment, "travelling")

    # B's next job id must differ from the counter's id at A: the job resumes at B under
    # B's id, while its image names A's (a held job that ends at once moves B's ids on).
    while int(slurm_b.sbatch("--hold", command="true")) <= int(job_id):
        pass
    action_id = _operator_move(deployment, job_id, "node1", "bnode2")
    final, state, steps = _approve_and_settle(deployment, action_id, slurm, slurm_b, 3)
    pipeline: Pipeline = deployment["pipeline"]
    arrived = steps[0].result.get("external_id")
    assert final == "succeeded", (
        state,
        [(s.name, s.state, s.error) for s in steps],
        slurm_b.scontrol_job(arrived) if arrived else None,
        # The job's output path came with its options: A's jobs directory, B's job id.
        procs.read_tail(slurm.jobs_dir / f"{arrived}.out", lines=30),
        pipeline.logs(),
    )
    assert [(s.name, s.queue) for s in steps] == [
        ("submit", f"connector.{B}"),
        ("reserve", f"connector.{B}"),
        ("checkpoint", f"agent.{A}.node1"),
        ("transfer", f"agent.{B}.bnode2"),
        ("stage", f"agent.{B}.bnode2"),
        ("release", f"connector.{B}"),
        ("confirm", f"agent.{B}.bnode2"),
        ("cancel", f"connector.{A}"),
        ("release", f"agent.{A}.node1"),
        ("unreserve", f"connector.{B}"),
    ]
    assert steps[2].result["image"]["size_bytes"] >= 100 << 20
    # bnode2 was held for B's copy before the counter stopped at A, and given back after.
    assert steps[1].result["gpus"] == {"bnode2": 2}
    assert f"shaper-{arrived}" not in slurm_b.reservations()

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


def test_the_group_plan_moves_a_running_counter_away_so_that_a_gang_starts_at_home(
    slurm: SlurmCluster, slurm_b: SecondSlurmCluster, deployment: dict[str, Any]
) -> None:
    """The group plan's own proposal, carried out: A's 2-node gang waits behind the counter
    on node1 (node3 is taken by a job that cannot checkpoint), B has one node free and
    cannot take the gang. The plan moves the running counter to bnode2; the counter counts
    on there, and Slurm starts the gang on node1 and node2."""
    root: Path = deployment["root"]
    job_id, count_file = slurm.submit_counter(root, "make-room", "--nodelist=node1")
    # Above the others' priority and unable to checkpoint: nothing preempts or moves them.
    keep = "--comment=shaper:kind=training,priority=95"
    filler = slurm.sbatch("--gres=gpu:h100:2", "--nodelist=node3", keep)
    b_filler = slurm_b.sbatch("--gres=gpu:h100:2", "--nodelist=bnode1", keep)
    for cluster, running in ((slurm, job_id), (slurm, filler), (slurm_b, b_filler)):
        cluster.wait_state(running, "RUNNING")
    gang = slurm.sbatch(
        "--nodes=2",
        "--gres=gpu:h100:2",
        "--job-name=gang",
        "--comment=shaper:kind=training,priority=90",
    )
    assert procs.wait_until(lambda: count_of(count_file) >= 5, timeout=WAIT_S), procs.read_tail(
        slurm.jobs_dir / f"{job_id}.out"
    )
    first = progress_of(count_file)
    # B's job ids above the counter's at A (see the test above).
    while int(slurm_b.sbatch("--hold", command="true")) <= int(job_id):
        pass
    _wait_for(
        "the control plane seeing the counter run, the gang wait and B's filler run",
        lambda: (
            (jobs := _jobs(deployment, A)).get(job_id, {}).get("state") == "running"
            and jobs.get(gang, {}).get("state") == "pending"
            and _jobs(deployment, B).get(b_filler, {}).get("state") == "running"
            and _stored_spec(deployment, job_id)
        ),
        deployment,
    )

    # The site's SLA: the team's running jobs are not preempted (so A alone cannot start
    # the gang), though a checkpointable one may be moved.
    with _sla(deployment, TeamPolicy(team="root", preemptible=False)):
        planned = api(deployment, "POST", "/federation-groups/site/plan", "operator")
    assert len(planned["proposed"]) == 1, planned
    (action_id,) = planned["proposed"]
    action = api(deployment, "GET", f"/actions/{action_id}", "viewer")
    assert (action["kind"], action["cluster"], action["target_cluster"]) == ("move", A, B)
    assert action["job_external_id"] == job_id, (action, planned)
    assert (action["source_node"], action["target_node"]) == ("node1", "bnode2")

    final, state, steps = _approve_and_settle(deployment, action_id, slurm, slurm_b, 3)
    assert final == "succeeded", (state, [(s.name, s.state, s.error) for s in steps])
    arrived = steps[0].result["external_id"]
    row = slurm_b.wait_state(arrived, "RUNNING")
    assert row["nodelist"] == "bnode2"
    # The gang takes the room the move made; the counter went on from its count at B.
    gang_row = slurm.wait_state(gang, "RUNNING")
    assert gang_row["nodelist"] == "node[1-2]"
    at_b = count_of(count_file)
    assert at_b > first["count"]
    assert progress_of(count_file)["started_at"] == first["started_at"]
    assert next_count(count_file, at_b) > at_b
    for cluster, job in ((slurm, gang), (slurm, filler), (slurm_b, arrived), (slurm_b, b_filler)):
        cluster.run("scancel", job)


def test_a_running_move_whose_target_node_was_taken_meanwhile_leaves_the_job_untouched(
    slurm: SlurmCluster, slurm_b: SecondSlurmCluster, deployment: dict[str, Any]
) -> None:
    """B's own queue took bnode2 after the move was decided: the reservation is refused
    before anything stops the counter at A, B's held copy is withdrawn, and the counter
    counts on at A, never checkpointed."""
    job_id, count_file, first = _counter_on_node1(slurm, deployment, "stay-home")
    squatter = slurm_b.sbatch("--nodelist=bnode2", "--gres=gpu:h100:2", command="sleep 600")
    slurm_b.wait_state(squatter, "RUNNING")

    action_id = _operator_move(deployment, job_id, "node1", "bnode2")
    final, state, steps = _approve_and_settle(deployment, action_id, slurm, slurm_b, 2)
    pipeline: Pipeline = deployment["pipeline"]
    assert final == "compensated", (state, [(s.name, s.state, s.error) for s in steps])
    by_step = {(str(s.phase), str(s.name)): s for s in steps}
    reserve = by_step["forward", "reserve"]
    assert reserve.state == "failed" and f"held by {squatter} (2)" in (reserve.error or "")
    assert by_step["forward", "checkpoint"].state == "skipped"
    assert [(s.name, s.state) for s in steps if s.phase == "compensate"] == [
        ("withdraw", "succeeded"),
        ("unreserve", "succeeded"),
    ]
    held = by_step["forward", "submit"].result["external_id"]
    assert slurm_b.wait_for(
        "B's held copy withdrawn",
        lambda: slurm_b.job(held)["state"] in ("CANCELLED", "COMPLETED"),
    )
    assert not [r for r in slurm_b.reservations() if r.startswith("shaper-")]
    # The counter never stopped: the same process counts on at A, and left no image.
    assert slurm.job(job_id)["state"] == "RUNNING"
    now = count_of(count_file)
    assert next_count(count_file, now) > now
    assert progress_of(count_file)["started_at"] == first["started_at"]
    assert not (pipeline.state_dir("node1") / "images" / job_id).exists()
    slurm.run("scancel", job_id)
    slurm_b.run("scancel", squatter)


def test_a_give_back_that_slurm_will_not_take_the_job_out_of_ends_the_reservation_now(
    slurm_b: SecondSlurmCluster,
) -> None:
    """A move's last step gives the target's reservation back, and is sent until answered.
    Should Slurm refuse to take the running job out of it (so that its delete answers "in
    use"), the connector ends the reservation now instead of answering "not now" for as
    long as the job runs: the node is free for B's own queue at once, the job runs on
    (FLEX), and the upkeep deletes the ended reservation once the job has gone. The job
    may start, and the give-back come, within the second the reservation was made: Slurm
    takes the end then too (tests/connectors/test_slurm_reservations.py makes that case
    certain)."""
    refusing = RefusingSlurm(refuses=leaving_a_reservation)
    connector = SlurmConnector(slurm_b.config(), run=refusing)
    slurm_b.connectors.append(connector)
    moved = slurm_b.sbatch("--hold", "--nodelist=bnode1", "--gres=gpu:h100:1")
    connector.reserve(moved, gpus={"bnode1": 1}, ttl_s=600, counts_on=[])
    connector.release(moved)  # into its reservation
    slurm_b.wait_state(moved, "RUNNING")
    reservation = f"shaper-{moved}"
    assert f"Reservation={reservation}" in slurm_b.scontrol_job(moved)

    connector.unreserve(moved)  # answered, not "not now"

    assert refusing.refused, "the job was never asked out of its reservation"
    # Ended (Slurm marks it so on a later pass), or gone should Slurm have purged it.
    assert slurm_b.wait_for(
        "the reservation to end",
        lambda: reservation_state(slurm_b, reservation) in ("INACTIVE", None),
    )
    # bnode1's other GPU is anyone's again; the moved job runs on.
    other = slurm_b.sbatch("--nodelist=bnode1", "--gres=gpu:h100:1")
    slurm_b.wait_state(other, "RUNNING")
    assert slurm_b.job(moved)["state"] == "RUNNING"
    slurm_b.run("scancel", moved)
    slurm_b.wait_for("the moved job to end", lambda: slurm_b.job(moved)["state"] != "RUNNING")
    # The upkeep deletes the ended reservation (as one whose job has gone, or, while Slurm
    # still lists the job ending, as one that ended), unless Slurm purged it first (it
    # drops an ended reservation itself once no job is in it: seen in a full run); either
    # way it must be gone.
    tidied = connector.upkeep()
    assert tidied in (
        [],
        [f"deleted reservation {reservation}: job {moved} has gone"],
        [f"deleted reservation {reservation}: it ended before job {moved}'s plan gave it back"],
    ), tidied
    assert reservation_state(slurm_b, reservation) is None
    slurm_b.run("scancel", other)


def _job_at_a(session: Session, job_id: str) -> Job | None:
    # Both clusters number their jobs from 1: B may have a job of the same id.
    return session.exec(
        select(Job).join(Cluster).where(Job.external_id == job_id, Cluster.name == A)
    ).one_or_none()


@contextmanager
def _sla(deployment: dict[str, Any], *teams: TeamPolicy) -> Iterator[None]:
    engine = deployment["pipeline"].engine
    spec = SlaPolicySpec(teams=list(teams))
    with Session(engine) as session:
        policy_service.create_policy(
            session=session,
            policy_in=SlaPolicyCreate(name="e2e-keep-running", spec=spec),
            by="test",
            now=datetime.now(UTC),
        )
    try:
        yield
    finally:
        with Session(engine) as session:
            policy_service.delete_policy(
                session=session, name="e2e-keep-running", by="test", now=datetime.now(UTC)
            )


def _stored_spec(deployment: dict[str, Any], job_id: str) -> bool:
    with Session(deployment["pipeline"].engine) as session:
        job = _job_at_a(session, job_id)
        return job is not None and job.submit_spec is not None
