"""Builders for API payloads: valid by default, overridable field by field."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlmodel import Session

from app.actions.models import Action, ActionKind
from app.clusters import service as cluster_service
from app.clusters.models import ClusterCreate
from app.plans.models import Plan
from app.telemetry import service as telemetry_service
from tests.support.clock import T0
from wire.telemetry import SchedulerKind, TelemetrySnapshot


def node(name: str = "n1", **fields: Any) -> dict[str, Any]:
    return {
        "name": name,
        "gpu_model": "H100",
        "gpu_count": 8,
        "cpu_cores": 128,
        "memory_mib": 1_048_576,
        "labels": {"rack": "r1"},
        "state": "up",
        **fields,
    }


def job(external_id: str = "j1", **fields: Any) -> dict[str, Any]:
    return {
        "external_id": external_id,
        "name": external_id,
        "team": "vision",
        "queue": "default",
        "kind": "training",
        "priority": 10,
        "gpus_requested": 2,
        "state": "pending",
        "submit_time": T0.isoformat(),
        **fields,
    }


def running(external_id: str, node_name: str, indices: list[int], **fields: Any) -> dict[str, Any]:
    return job(
        external_id,
        state="running",
        start_time=T0.isoformat(),
        gpus_requested=len(indices),
        allocations=[{"node": node_name, "gpu_indices": indices}],
        **fields,
    )


def snapshot(
    seq: int,
    *,
    session: str = "s1",
    nodes: list[dict[str, Any]] | None = None,
    jobs: list[dict[str, Any]] | None = None,
    samples: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    return {
        "kind": "snapshot",
        "connector_session": session,
        "seq": seq,
        "nodes": nodes if nodes is not None else [node("n1"), node("n2")],
        "jobs": jobs or [],
        "samples": samples or [],
    }


def delta(seq: int, *, session: str = "s1", **fields: Any) -> dict[str, Any]:
    return {"kind": "delta", "connector_session": session, "seq": seq, **fields}


def util_sample(node_name: str, at: datetime, value: float) -> dict[str, Any]:
    return {"at": at.isoformat(), "metric": "gpu_util", "node": node_name, "value": value}


def migration_plan(
    session: Session,
    *,
    cluster_id: int,
    now: datetime,
    moves: int = 1,
    reason: str = "defragment n1",
    **plan_fields: Any,
) -> tuple[Plan, list[Action]]:
    """A stored CP-SAT plan of ``moves`` proposed migrations n1 → n2 (jobs j1, j2, …), as
    the API lists and decides them; ``plan_fields`` override the plan's columns."""
    fields: dict[str, Any] = {
        "cluster_id": cluster_id,
        "created_at": now,
        "policy": "shaper",
        "engine": "cp-sat",
        "mode": "advise",
        "status": "OPTIMAL",
        "objective": 1.0,
        "best_bound": 1.0,
        "gap": 0.0,
        "wall_time_s": 0.1,
        "decisions": [{"job": "j1", "action": "migrate", "reason": reason}],
    }
    plan = Plan(**{**fields, **plan_fields})
    session.add(plan)
    session.commit()
    actions = [
        Action(
            plan_id=plan.id,
            cluster_id=cluster_id,
            kind=ActionKind.migrate,
            idempotency_key=f"plan-{plan.id}-j{i + 1}",
            reason=reason,
            source_node="n1",
            target_node="n2",
            created_at=now,
            updated_at=now,
        )
        for i in range(moves)
    ]
    session.add_all(actions)
    session.commit()
    return plan, actions


def registered_with(session: Session, name: str, push: dict[str, Any], *, now: datetime) -> None:
    """A simulated cluster ``name`` registered, and ``push`` (a ``snapshot``) ingested."""
    cluster_service.register_cluster(
        session=session, now=now, cluster_in=ClusterCreate(name=name, scheduler=SchedulerKind.sim)
    )
    telemetry_service.ingest(
        session=session,
        cluster_name=name,
        push=TelemetrySnapshot.model_validate(push),
        now=now,
    )
