"""An elastic training job shrunk instead of stopped, and a gang moved to other nodes, on a
real Slurm, end to end.

Around the real three-node Slurm (tests/connectors/conftest.py: 2 GPUs per node) run the
real parts of a deployment (tests/support/deployment.py): the API on PostgreSQL over
HTTP, a control-plane Celery worker and the Slurm connector (telemetry, and the
scheduler-level steps on queue ``connector.<cluster>``), separate processes on a private
Redis. No plan is built by hand: ``run_cycle`` plans from what the connector pushed, an
operator approves it through the API, and its actions reach Slurm only through the
connector.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlmodel import Session

from agent import procs
from app.actions.models import ActionKind
from app.core.lookup import row_id
from app.plans.models import Plan
from app.shaping.cycle import run_cycle
from tests.connectors.conftest import SlurmCluster
from tests.support.deployment import api
from tests.support.deployment import deployment as deployment_of
from tests.support.plans import action_state, planned_actions, stored_plan, wait_until_settled
from wire.queues import connector_queue

pytestmark = pytest.mark.slow

CLUSTER = "hpc-elastic"
WAIT_S = 60.0


@pytest.fixture(scope="module")
def deployment(
    slurm_cluster: SlurmCluster,
    make_postgres_database: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Any]]:
    """API, control worker and the Slurm connector, around the Slurm test cluster."""
    root = tmp_path_factory.mktemp("slurm-elastic")
    with deployment_of(
        root=root,
        database_url=make_postgres_database("slurm_elastic"),
        clusters=[(CLUSTER, "slurm")],
        scopes=["operator", "viewer", f"connector:{CLUSTER}"],
        env={"SHAPER_CYCLE_PERIOD_S": "86400"},  # the test runs the cycle itself
    ) as running:
        running["pipeline"].start_connector(
            "slurm", CLUSTER, running["base"], *slurm_cluster.connector_settings
        )
        yield running


def _jobs(deployment: dict[str, Any]) -> dict[str, dict[str, Any]]:
    items = api(deployment, "GET", f"/jobs?cluster={CLUSTER}&limit=1000", "viewer")["items"]
    return {job["external_id"]: job for job in items}


def _gpus(job: dict[str, Any]) -> dict[str, int]:
    return {a["node"]: a["gpu_count"] for a in job["allocations"]}


def _until_the_api_shows(
    deployment: dict[str, Any], what: str, condition: Callable[[dict[str, Any]], bool]
) -> dict[str, dict[str, Any]]:
    seen: list[dict[str, Any]] = [{}]

    def holds() -> bool:
        seen[0] = _jobs(deployment)
        return condition(seen[0])

    assert procs.wait_until(holds, timeout=WAIT_S, interval=0.5), (
        f"the API never showed {what}: {seen[0]}"
    )
    return seen[0]


def test_the_cycle_shrinks_an_elastic_job_for_a_higher_priority_one_instead_of_stopping_it(
    slurm: SlurmCluster, deployment: dict[str, Any]
) -> None:
    """A low-priority training job that may run on 1 to 3 nodes holds all three; a
    high-priority job asks for one node. The cycle shrinks the elastic job to two nodes
    (Slurm ends its tasks on the third; it is not requeued) and starts the other job
    there, where ``priority`` would have stopped the whole job."""
    engine = deployment["pipeline"].engine
    elastic = slurm.sbatch(
        "--nodes=3",
        "--gres=gpu:h100:2",
        "--job-name=elastic",
        "--comment=shaper:kind=training,priority=10,nodes=1-3,checkpointable=true",
    )
    slurm.wait_state(elastic, "RUNNING")
    urgent = slurm.sbatch(
        "--gres=gpu:h100:2", "--job-name=urgent", "--comment=shaper:kind=training,priority=90"
    )
    jobs = _until_the_api_shows(
        deployment,
        "the elastic job on 3 nodes and the urgent one waiting",
        lambda jobs: (
            elastic in jobs
            and urgent in jobs
            and sum(_gpus(jobs[elastic]).values()) == 6
            and jobs[urgent]["state"] == "pending"
        ),
    )
    assert (jobs[elastic]["min_replicas"], jobs[elastic]["max_replicas"]) == (1, 3)

    with Session(engine) as session:
        result = run_cycle(
            session=session, cluster_name=CLUSTER, now=datetime.now(UTC), policy="shaper"
        )
    with Session(engine) as session:
        plan = session.get(Plan, result.plan_id)
        assert plan is not None
        decisions = plan.decisions
    assert result.actions and not result.violations, (result, decisions)
    planned = planned_actions(engine, result.plan_id)
    by_kind = {(job, action.kind): action for action, job in planned}
    shrink = by_kind[(elastic, ActionKind.resize)]
    start = by_kind[(urgent, ActionKind.start)]
    assert len(shrink.source_placement) == 3 and len(shrink.target_placement) == 2, shrink
    assert shrink.target_replicas == 2 and "shrunk from 3 to 2 replicas" in (shrink.reason or "")
    (freed,) = set(shrink.source_placement) - set(shrink.target_placement)
    assert start.target_placement == {freed: 2}
    assert row_id(shrink) in start.depends_on
    assert ActionKind.preempt not in {action.kind for action, _ in planned}

    api(deployment, "POST", f"/plans/{result.plan_id}/approve", "operator")
    ids = [row_id(action) for action, _ in planned]
    states = wait_until_settled(
        engine,
        ids,
        timeout_s=2 * WAIT_S,
        context=lambda: f"Slurm: {slurm.squeue()}\n{deployment['pipeline'].logs()}",
    )
    assert set(states.values()) == {"succeeded"}, (states, deployment["pipeline"].logs())
    queue = connector_queue(CLUSTER)
    _, steps = action_state(engine, row_id(shrink))
    assert [(s.name, s.queue) for s in steps] == [("resize", queue), ("confirm", queue)]

    # Slurm: the elastic job runs on the two nodes the plan kept, never requeued, and the
    # urgent job on the one it gave back.
    row = slurm.job(elastic)
    assert row["state"] == "RUNNING" and row["numnodes"] == "2"
    assert re.search(r"\bRestarts=0\b", slurm.scontrol_job(elastic))
    assert slurm.job(urgent)["state"] == "RUNNING" and slurm.job(urgent)["nodelist"] == freed
    _until_the_api_shows(
        deployment,
        "the elastic job on 2 nodes and the urgent one where it was",
        lambda jobs: (
            _gpus(jobs[elastic]) == dict(shrink.target_placement)
            and _gpus(jobs[urgent]) == {freed: 2}
            and (jobs[elastic]["min_replicas"], jobs[elastic]["max_replicas"]) == (1, 3)
        ),
    )


def test_an_approved_growth_restarts_the_job_on_the_nodes_held_for_it(
    slurm: SlurmCluster, deployment: dict[str, Any]
) -> None:
    """A growth as the cycle shapes it (a running job's growth pays only with an expected
    run time, which this young cluster has no history for: the plan is stored by hand):
    the job's target nodes are reserved first, then the resize requeues it held and
    pinned there, sizes it to three nodes and releases it into the reservation; it runs
    again on all three, and the plan gives the reservation back."""
    engine = deployment["pipeline"].engine
    job_id = slurm.sbatch(
        "--nodes=1",
        "-w",
        "node2",
        "--gres=gpu:h100:2",
        "--comment=shaper:kind=training,nodes=1-3,checkpointable=true",
    )
    slurm.wait_state(job_id, "RUNNING")
    _until_the_api_shows(
        deployment,
        "the job on node2",
        lambda jobs: _gpus(jobs.get(job_id, {"allocations": []})) == {"node2": 2},
    )
    everywhere = {"node1": 2, "node2": 2, "node3": 2}
    ids = stored_plan(
        engine,
        [
            {"job": job_id, "kind": ActionKind.reserve, "target_node": "node1,node2,node3",
             "target_placement": everywhere, "counts_on": [job_id]},
            {"job": job_id, "kind": ActionKind.resize, "source_node": "node2",
             "target_node": "node1,node2,node3", "source_placement": {"node2": 2},
             "target_placement": everywhere, "target_replicas": 3, "after": [0]},
        ],
    )  # fmt: skip
    plan_id, reserve, grow = ids
    api(deployment, "POST", f"/plans/{plan_id}/approve", "operator")
    states = wait_until_settled(
        engine,
        [reserve, grow],
        timeout_s=2 * WAIT_S,
        context=lambda: f"Slurm: {slurm.squeue()}\n{deployment['pipeline'].logs()}",
    )
    assert states == {reserve: "succeeded", grow: "succeeded"}, states
    row = slurm.job(job_id)
    assert (row["state"], row["nodelist"], row["numnodes"]) == ("RUNNING", "node[1-3]", "3")
    assert re.search(r"\bRestarts=1\b", slurm.scontrol_job(job_id))  # restarted once
    assert slurm.wait_for("the reservation to be given back", lambda: not slurm.reservations())
    _until_the_api_shows(
        deployment, "the job on all three nodes", lambda jobs: _gpus(jobs[job_id]) == everywhere
    )


def test_an_approved_gang_move_restarts_the_job_on_its_new_nodes(
    slurm: SlurmCluster, deployment: dict[str, Any]
) -> None:
    """A gang's migrate (an upgrade onto faster GPUs, ``SolverConfig.gang_upgrades``; this
    cluster has one GPU model, so the plan is stored by hand): requeued held and pinned to
    its new nodes, started there and confirmed there only, all through the connector; the
    job takes its time to stop, as one writing its checkpoint does."""
    engine = deployment["pipeline"].engine
    job_id = slurm.sbatch(
        "--nodes=2",
        "-w",
        "node1,node2",
        "--gres=gpu:h100:2",
        "--comment=shaper:kind=training,checkpointable=true",
        command="trap 'sleep 5' TERM; sleep 600 & wait",
    )
    slurm.wait_state(job_id, "RUNNING")
    before = {"node1": 2, "node2": 2}
    _until_the_api_shows(
        deployment,
        "the gang on node1 and node2",
        lambda jobs: _gpus(jobs.get(job_id, {"allocations": []})) == before,
    )
    after = {"node2": 2, "node3": 2}
    (plan_id, move) = stored_plan(
        engine,
        [
            {"job": job_id, "kind": ActionKind.migrate, "source_node": "node1,node2",
             "target_node": "node2,node3", "source_placement": before,
             "target_placement": after},
        ],
    )  # fmt: skip
    api(deployment, "POST", f"/plans/{plan_id}/approve", "operator")
    states = wait_until_settled(
        engine,
        [move],
        timeout_s=2 * WAIT_S,
        context=lambda: f"Slurm: {slurm.squeue()}\n{deployment['pipeline'].logs()}",
    )
    assert states == {move: "succeeded"}, (states, deployment["pipeline"].logs())
    queue = connector_queue(CLUSTER)
    _, steps = action_state(engine, move)
    assert [(s.name, s.queue) for s in steps] == [
        ("requeue", queue),
        ("start", queue),
        ("confirm", queue),
    ]
    row = slurm.job(job_id)
    assert (row["state"], row["nodelist"], row["numnodes"]) == ("RUNNING", "node[2-3]", "2")
    assert re.search(r"\bRestarts=1\b", slurm.scontrol_job(job_id))  # restarted once
    _until_the_api_shows(
        deployment, "the gang on node2 and node3", lambda jobs: _gpus(jobs[job_id]) == after
    )
