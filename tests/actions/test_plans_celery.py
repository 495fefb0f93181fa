"""A plan approved whole, on PostgreSQL with Redis and Celery workers: the control worker
runs the sagas in dependency order; a simulated cluster's connector and node agents answer
them from their own worker process (tests/actions/sim_site.py), where a rival job arrives
the moment the plan's move frees GPUs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sqlmodel import Session, col, select

from agent import procs
from app.actions.models import TERMINAL_ACTION_STATES, Action, ActionKind, ActionState
from app.clusters import service as cluster_service
from app.clusters.models import ClusterCreate, ShapingMode
from app.plans.models import Plan
from app.shaping.cycle import run_cycle
from app.telemetry import service as telemetry_service
from tests.actions.conftest import Api, _token, start_test_worker
from tests.actions.helpers import now
from tests.support.pipeline import Pipeline
from wire.telemetry import ClusterState, SchedulerKind, TelemetrySnapshot

SITE = "simlab"


def _push(pipeline: Pipeline, state_file: Path, seq: int) -> dict[str, Any]:
    raw = json.loads(state_file.read_text())
    state = ClusterState.model_validate({k: v for k, v in raw.items() if k != "reservations"})
    with Session(pipeline.engine) as session:
        telemetry_service.ingest(
            session=session,
            cluster_name=SITE,
            push=TelemetrySnapshot.of(state, connector_session="sim-site", seq=seq),
            now=now(),
        )
    return raw


def _where(raw: dict[str, Any]) -> dict[str, tuple[str, list[str]]]:
    return {
        job["external_id"]: (job["state"], sorted(a["node"] for a in job["allocations"]))
        for job in raw["jobs"]
    }


def test_an_approved_plan_runs_in_order_over_celery_and_the_freed_gpus_stay_reserved(
    running_pipeline: Pipeline, api: Api
) -> None:
    pipeline = running_pipeline
    with Session(pipeline.engine) as session:
        cluster_service.register_cluster(
            session=session,
            now=now(),
            cluster_in=ClusterCreate(
                name=SITE, scheduler=SchedulerKind.sim, mode=ShapingMode.advise
            ),
        )
        scopes = [f"connector:{SITE}", f"agent:{SITE}/a", f"agent:{SITE}/b"]
        tokens = {scope: _token(session, scope) for scope in scopes}
    state_file = pipeline.root / f"{SITE}-state.json"
    start_test_worker(
        pipeline,
        "sim-site",
        "tests.actions.sim_site",
        [f"connector.{SITE}", f"agent.{SITE}.a", f"agent.{SITE}.b"],
        {
            "SHAPER_SIM_SITE": SITE,
            "SHAPER_SIM_SITE_STATE": str(state_file),
            "SHAPER_SIM_SITE_TOKENS": json.dumps(tokens),
            "SHAPER_SIM_SITE_RIVAL_AFTER": "checkpoint",
        },
    )
    try:
        before = _where(_push(pipeline, state_file, 1))
        assert before["big"] == ("pending", [])
        with Session(pipeline.engine, expire_on_commit=False) as session:
            result = run_cycle(session=session, cluster_name=SITE, now=now(), policy="shaper")
            actions = session.exec(
                select(Action).where(Action.plan_id == result.plan_id).order_by(col(Action.id))
            ).all()
        start = next(a for a in actions if a.kind == ActionKind.start)
        move = next(a for a in actions if a.kind == ActionKind.migrate)
        assert move.id in start.depends_on and start.target_node == move.source_node

        approved = api.post(f"/plans/{result.plan_id}/approve", "operator")
        assert approved.status_code == 200, approved.text

        def settled() -> bool:
            with Session(pipeline.engine) as session:
                states = session.exec(
                    select(Action.state).where(Action.plan_id == result.plan_id)
                ).all()
            return all(ActionState(s) in TERMINAL_ACTION_STATES for s in states)

        assert procs.wait_until(settled, timeout=120, interval=0.2), pipeline.logs()
        listed = api.get("/actions", params={"plan_id": result.plan_id}).json()["items"]
        assert {a["state"] for a in listed} == {"succeeded"}, listed
        after = _where(json.loads(state_file.read_text()))
        assert after["big"] == ("running", [start.target_node])
        assert after["rival"] == ("pending", [])  # it arrived first in FIFO order, and waits
        with Session(pipeline.engine) as session:
            plan = session.get(Plan, result.plan_id)
            assert plan is not None and plan.state == "approved"
    finally:
        pipeline.stop("sim-site")
