"""The shaping cycle plans on a real Ray cluster and the saga carries the plan out there,
end to end.

Around the shared Ray test cluster (tests/support/ray_cluster.py: two workers with 4 GPUs
each by Ray's count) run the real parts of a deployment (tests/support/deployment.py):
the API on PostgreSQL over HTTP, a control-plane Celery worker and the Ray connector
(``python -m connectors.runner --kind ray``: telemetry, and the scheduler-level steps on
queue ``connector.<cluster>``), separate processes on a private Redis. No plan is built
by hand: ``run_cycle`` plans from what the connector pushed, an operator approves the
plan through the API, and its actions reach Ray only through the connector.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlmodel import Session

from app.actions.models import ActionKind
from app.core.lookup import row_id
from app.plans.models import Plan
from app.shaping.cycle import run_cycle
from solver import SolverConfig
from tests.support.deployment import api
from tests.support.deployment import deployment as deployment_of
from tests.support.plans import action_state, planned_actions, wait_until_settled
from tests.support.ray_cluster import JOBS_DIR, RayCluster, ray_cluster_fixture, wait_for
from wire.queues import connector_queue

__all__ = ["ray_cluster_fixture"]  # the fixture, found by pytest where it is imported

pytestmark = pytest.mark.slow

CLUSTER = "ray-e2e"
WAIT_S = 90.0
# Submission ids are unique for a Ray cluster's life, which the connector tests share.
LOW, OTHER, HIGH = "e2e-low", "e2e-other", "e2e-high"
HELD_REASON = "held by Shaper until a plan starts it"


@pytest.fixture(scope="module")
def deployment(
    ray_cluster: RayCluster,
    make_postgres_database: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Any]]:
    """The API, a control worker and the Ray connector around the Ray test cluster."""
    root = tmp_path_factory.mktemp("ray-deployment")
    with deployment_of(
        root=root,
        database_url=make_postgres_database("ray_end_to_end"),
        clusters=[(CLUSTER, "ray")],
        scopes=["operator", "viewer", f"connector:{CLUSTER}"],
        # The test runs the cycle itself; no periodic one plans meanwhile.
        env={"SHAPER_CYCLE_PERIOD_S": "86400"},
    ) as running:
        running["pipeline"].start_connector(
            "ray",
            CLUSTER,
            running["base"],
            f"dashboard_url={ray_cluster.dashboard_url}",
            f"gcs_address={ray_cluster.gcs_address}",
            f"state_dir={root / 'ray-held'}",
        )
        yield running


@pytest.fixture
def ray(ray_cluster: RayCluster) -> Iterator[RayCluster]:
    """The cluster with no job running, before and after the test."""
    ray_cluster.stop_all_jobs()
    yield ray_cluster
    ray_cluster.stop_all_jobs()


def _train(ray: RayCluster, name: str, **metadata: str) -> Path:
    """The placement-group job of tests/connectors/data/ray with one bundle of 4 GPUs: a
    whole worker; returns the file it records each run's resume pointer in.

    One bundle, not two spread over the workers: a plan could not start such a job again
    once held. The connector reports it as one 8-GPU piece (Ray says nothing of gangs),
    and even as a gang the solver places a gang's replicas within one group of nodes
    with the same labels (solver/state.py ``find_gang``), while every Ray node has its
    own ``ray.io/node-id`` and ``shaper.io/node`` labels."""
    record = ray.directory / f"{name}.runs"
    ray.submit(
        f"{sys.executable} {JOBS_DIR / 'shaper_ray_train.py'} 4 1 {record}",
        submission_id=name,
        metadata=metadata,
    )
    return record


def _runs(record: Path) -> list[str]:
    return record.read_text().splitlines() if record.exists() else []


def _jobs(deployment: dict[str, Any]) -> dict[str, dict[str, Any]]:
    items = api(deployment, "GET", f"/jobs?cluster={CLUSTER}&limit=1000", "viewer")["items"]
    return {job["external_id"]: job for job in items}


def _until_the_api_shows(
    deployment: dict[str, Any], what: str, condition: Callable[[dict[str, Any]], bool]
) -> dict[str, dict[str, Any]]:
    """The cluster's jobs in the API once ``condition(jobs)`` holds; on timeout, the
    failure shows what the API last said of the test's jobs."""
    seen: list[dict[str, Any]] = [{}]

    def holds() -> dict[str, Any] | None:
        seen[0] = _jobs(deployment)
        return seen[0] if condition(seen[0]) else None

    try:
        return wait_for(f"the API to show {what}", holds, WAIT_S)  # type: ignore[no-any-return]
    except AssertionError as error:
        shown = {
            name: {k: job.get(k) for k in ("state", "reason", "gpus_requested", "allocations")}
            for name, job in seen[0].items()
            if name in (LOW, OTHER, HIGH)
        }
        raise AssertionError(f"{error}; it shows {shown}") from None


def _gpus(job: dict[str, Any]) -> dict[str, int]:
    return {a["node"]: a["gpu_count"] for a in job["allocations"]}


def _cycle(deployment: dict[str, Any], config: SolverConfig | None = None) -> int:
    with Session(deployment["pipeline"].engine) as session:
        result = run_cycle(
            session=session,
            cluster_name=CLUSTER,
            now=datetime.now(UTC),
            policy="shaper",
            config=config,
        )
    if not result.actions or result.kept or result.violations:
        with Session(deployment["pipeline"].engine) as session:
            plan = session.get(Plan, result.plan_id)
            assert plan is not None
            raise AssertionError(f"{result}: {plan.decisions} {plan.summary}")
    return result.plan_id


def _approve_and_wait(
    deployment: dict[str, Any], ray: RayCluster, plan_id: int, action_ids: list[int]
) -> None:
    """Approve the plan as an operator; its actions' saga runs until they all succeed."""
    pipeline = deployment["pipeline"]
    api(deployment, "POST", f"/plans/{plan_id}/approve", "operator")
    states = wait_until_settled(
        pipeline.engine,
        action_ids,
        timeout_s=2 * WAIT_S,
        context=lambda: (
            f"Ray jobs: {[(j.get('submission_id'), j['status']) for j in ray.get('/api/jobs/')]}"
            f"\n{pipeline.logs()}"
        ),
    )
    assert set(states.values()) == {"succeeded"}, (states, pipeline.logs())


def test_the_shaping_cycle_preempts_a_low_priority_ray_job_and_the_saga_carries_it_out(
    ray: RayCluster, deployment: dict[str, Any]
) -> None:
    """Both workers' GPUs are held by training jobs, one of low priority that checkpoints
    itself; a high-priority job's placement group waits. The cycle, on the connector's
    telemetry, plans to stop the low job (requeued, held: Ray cannot keep a stopped job,
    so the connector keeps its next submission) and start the high one; approved through
    the API, the saga runs it through the connector, and Ray runs the high job where the
    low one was. When the high job is done, a second cycle starts the low one again: a new
    submission that resumes from its checkpoint directory."""
    engine = deployment["pipeline"].engine
    checkpoints = str(deployment["root"] / "low-checkpoints")
    low_runs = _train(
        ray,
        LOW,
        **{
            "shaper.io/priority": "10",
            "shaper.io/kind": "training",
            "shaper.io/checkpoint-dir": checkpoints,
        },
    )
    other_runs = _train(ray, OTHER, **{"shaper.io/priority": "40", "shaper.io/kind": "training"})
    for runs in (low_runs, other_runs):
        wait_for(f"{runs.stem} to hold its GPUs", lambda runs=runs: _runs(runs), WAIT_S)
    high_runs = _train(ray, HIGH, **{"shaper.io/priority": "90"})

    # Telemetry: a worker's 4 GPUs for each training job, the high job asking for 4.
    jobs = _until_the_api_shows(
        deployment,
        "both workers busy and the high job asking for 4 GPUs",
        lambda jobs: (
            all(
                sum(_gpus(jobs.get(name, {"allocations": []})).values()) == 4
                for name in (LOW, OTHER)
            )
            and HIGH in jobs
            and jobs[HIGH]["gpus_requested"] == 4
        ),
    )
    assert _gpus(jobs[HIGH]) == {} and _runs(high_runs) == []
    assert {**_gpus(jobs[LOW]), **_gpus(jobs[OTHER])}.keys() == {"ray-w1", "ray-w2"}
    (low_node,) = _gpus(jobs[LOW])

    # --- cycle 1: stop the low job for the high one (policy "shaper") -------------------
    # The low job cannot be checkpointed by a node agent (no shaper.io/checkpointable):
    # its preemption is the scheduler's alone, requeue then confirm (app/actions/recipes).
    plan_id = _cycle(deployment)
    planned = planned_actions(engine, plan_id)
    assert sorted(job for _, job in planned) == [HIGH, LOW], planned
    by_job = {job: action for action, job in planned}
    stop, start = by_job[LOW], by_job[HIGH]
    assert stop.kind == ActionKind.preempt and stop.source_placement == {low_node: 4}, stop
    assert start.kind == ActionKind.start and start.target_placement == {low_node: 4}, start
    assert start.depends_on == [row_id(stop)]

    _approve_and_wait(deployment, ray, plan_id, [row_id(stop), row_id(start)])
    queue = connector_queue(CLUSTER)
    for action, steps in ((stop, ["requeue", "confirm"]), (start, ["start", "confirm"])):
        _, rows = action_state(engine, row_id(action))
        assert [(s.name, s.queue) for s in rows] == [(name, queue) for name in steps]
    _, stop_steps = action_state(engine, row_id(stop))
    assert stop_steps[0].result["held"] is True

    # Ray's view: the low submission stopped, the high job placed and working, the other
    # training job untouched.
    assert ray.job(LOW)["status"] == "STOPPED"
    wait_for(f"{HIGH} to get its GPUs", lambda: _runs(high_runs) == ["resumed_from="], WAIT_S)
    assert ray.job(HIGH)["status"] == "RUNNING" and ray.job(OTHER)["status"] == "RUNNING"
    assert _runs(other_runs) == ["resumed_from="]
    assert f"{LOW}.r1" not in {j.get("submission_id") for j in ray.get("/api/jobs/")}
    # The connector holds the low job's next submission, resuming from its checkpoints.
    held = json.loads((deployment["root"] / "ray-held" / "held-jobs.json").read_text())
    submission = held[LOW]["submission"]
    assert submission["submission_id"] == f"{LOW}.r1" and held[LOW]["hold"] is True
    assert submission["runtime_env"]["env_vars"]["SHAPER_RESUME_FROM"] == checkpoints
    assert submission["metadata"]["shaper.io/step"] == stop_steps[0].idempotency_key
    assert submission["metadata"]["shaper.io/gpus"] == "4"  # what its placement group asked
    _until_the_api_shows(
        deployment,
        "the high job running where the low one was, and the low one held for its 4 GPUs",
        lambda jobs: (
            jobs[HIGH]["state"] == "running"
            and _gpus(jobs[HIGH]) == {low_node: 4}
            and jobs[LOW]["state"] == "pending"
            and jobs[LOW]["reason"] == HELD_REASON
            and jobs[LOW]["gpus_requested"] == 4
        ),
    )

    # --- cycle 2: the high job is done; the low one starts again --------------------------
    httpx.post(f"{ray.dashboard_url}/api/jobs/{HIGH}/stop", timeout=30).raise_for_status()
    _until_the_api_shows(
        deployment, "the high job ended", lambda jobs: jobs[HIGH]["state"] == "cancelled"
    )
    # The solver leaves a job Shaper stopped alone for its dwell time (10 minutes by
    # default): this cycle is asked for none rather than run 10 minutes later.
    plan_id = _cycle(deployment, SolverConfig(dwell_s=0))
    planned = planned_actions(engine, plan_id)
    assert [(job, action.kind) for action, job in planned] == [(LOW, ActionKind.start)]
    (restart,) = (action for action, _ in planned)
    assert restart.target_placement == {low_node: 4}
    _approve_and_wait(deployment, ray, plan_id, [row_id(restart)])
    _, rows = action_state(engine, row_id(restart))
    assert [(s.name, s.queue) for s in rows] == [("start", queue), ("confirm", queue)]

    resubmitted = ray.job(f"{LOW}.r1")
    assert resubmitted["status"] == "RUNNING"
    assert resubmitted["metadata"]["shaper.io/job"] == LOW
    assert resubmitted["metadata"]["shaper.io/attempt"] == "1"
    assert resubmitted["runtime_env"]["env_vars"]["SHAPER_RESUME_FROM"] == checkpoints
    wait_for("the resubmission to record its start", lambda: len(_runs(low_runs)) == 2)
    assert _runs(low_runs) == ["resumed_from=", f"resumed_from={checkpoints}"]
    _until_the_api_shows(
        deployment,
        "the low job running again where it was",
        lambda jobs: (
            jobs[LOW]["state"] == "running"
            and _gpus(jobs[LOW]) == {low_node: 4}
            and jobs[LOW]["restart_count"] == 1
        ),
    )
