"""Plans and their actions in a test database: storing a proposed plan, reading an
action's state and steps, waiting until actions settle. Shared by the pipeline tests
(tests/actions) and the end-to-end tests against real schedulers (Slurm in
tests/connectors, Kubernetes and Kueue in tests/k8s)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy.engine import Engine
from sqlmodel import Session, col, select

from agent import procs
from app.actions.models import Action, ActionState, ActionStep
from app.core.lookup import row_id
from app.jobs.models import Job

TERMINAL = {"succeeded", "failed", "compensated", "cancelled", "rejected"}


def planned_actions(engine: Engine, plan_id: int) -> list[tuple[Action, str]]:
    """The plan's actions in order, with the external id of the job each acts on."""
    with Session(engine) as session:
        rows = session.exec(
            select(Action, Job)
            .join(Job, col(Action.job_id) == col(Job.id))
            .where(Action.plan_id == plan_id)
            .order_by(col(Action.id))
        ).all()
        return [(action, job.external_id) for action, job in rows]


def action_state(engine: Engine, action_id: int) -> tuple[str, list[ActionStep]]:
    with Session(engine) as session:
        action = session.get(Action, action_id)
        assert action is not None
        steps = list(
            session.exec(
                select(ActionStep).where(ActionStep.action_id == action_id).order_by(ActionStep.seq)  # type: ignore[arg-type]
            )
        )
        return action.state, steps


def wait_until_settled(
    engine: Engine, action_ids: list[int], *, timeout_s: float, context: Callable[[], str]
) -> dict[int, str]:
    """Until every action has reached a terminal state; returns their states. One still
    open after ``timeout_s`` fails the test, naming each action's state and steps, then
    what ``context()`` tells of the scheduler (its queue, the connector's log)."""

    def settled() -> bool:
        return all(action_state(engine, a)[0] in TERMINAL for a in action_ids)

    if not procs.wait_until(settled, timeout=timeout_s, interval=0.5):
        raise AssertionError(
            "actions stuck: "
            + "; ".join(
                f"{a} {state} {[(s.name, s.state, s.error) for s in steps]}"
                for a in action_ids
                for state, steps in [action_state(engine, a)]
            )
            + f"\n{context()}"
        )
    return {a: action_state(engine, a)[0] for a in action_ids}


def stored_plan(engine: Engine, steps: list[dict[str, Any]], *, tag: str = "e2e-plan") -> list[int]:
    """A proposed plan shaped as the shaping cycle shapes one (app/shaping/cycle.py), for
    the end-to-end tests against real schedulers: ``steps`` are action fields with ``job``
    (the scheduler's external id), ``after`` (indices into ``steps``: the action's
    prerequisites) and, optionally, ``state`` (proposed unless given: a plan decided in
    part). Returns ``[plan id, action ids…]``."""
    from app.plans.models import Plan, PlanState

    created = datetime.now(UTC)
    with Session(engine) as session:
        jobs = {j.external_id: j for j in session.exec(select(Job)).all()}
        cluster_id = jobs[steps[0]["job"]].cluster_id
        plan = Plan(
            cluster_id=cluster_id,
            created_at=created,
            policy="shaper",
            engine="test",
            mode="advise",
            status="FEASIBLE",
            state=PlanState.proposed,
        )
        session.add(plan)
        session.flush()
        rows: list[Action] = []
        for index, fields in enumerate(steps):
            fields = dict(fields)
            job = jobs[fields.pop("job")]
            fields.pop("after", None)
            rows.append(
                Action(
                    plan_id=plan.id,
                    cluster_id=cluster_id,
                    job_id=job.id,
                    state=fields.pop("state", ActionState.proposed),
                    idempotency_key=f"{tag}:{plan.id}:{index}",
                    reason=f"plan {plan.id}: end-to-end test",
                    created_at=created,
                    updated_at=created,
                    **fields,
                )
            )
        session.add_all(rows)
        session.flush()
        for row, fields in zip(rows, steps, strict=True):
            row.depends_on = sorted(row_id(rows[i]) for i in fields.get("after", ()))
        session.commit()
        return [row_id(plan), *(row_id(row) for row in rows)]
