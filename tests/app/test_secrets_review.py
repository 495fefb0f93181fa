"""Secrets that a route-scope test cannot see: what a viewer reads of the saga's steps, and
what ``repr()`` of the settings shows.

SQLite only (``engine`` below): nothing here depends on the database's kind.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine
from sqlmodel import Session, select

from app.actions.models import ActionStep, StepState
from app.clusters.models import Cluster
from app.core.config import Settings
from app.core.lookup import row_id
from tests.app.builders import migration_plan, registered_with, snapshot
from tests.support.clock import T0
from wire.steps import StepPhase

SECRET = "hf_not-for-viewers"
CHECKPOINT_RESULT: dict[str, Any] = {
    "image": {
        "workload": {
            "id": "w-1",
            "command": ["python", "train.py"],
            "env": {"HF_TOKEN": SECRET, "PATH": "/usr/bin"},
            "cwd": "/home/alice",
            "log_path": "/var/lib/shaper/agent/workloads/w-1/output.log",
        },
        "backend": "signal",
        "image_dir": "/var/lib/shaper/agent/images/w-1",
    },
    "summary": "signal image of 1 MiB in 0.10 s",
}


@pytest.fixture
def engine(sqlite_engine: Engine) -> Engine:
    return sqlite_engine


def _checkpointed_move(session: Session, now: datetime) -> tuple[int, int]:
    """(plan id, action id) of a move whose checkpoint step answered with its image."""
    registered_with(session, "alpha", snapshot(1), now=now)
    cluster = session.exec(select(Cluster).where(Cluster.name == "alpha")).one()
    plan, (action,) = migration_plan(session, cluster_id=row_id(cluster), now=now)
    session.add(
        ActionStep(
            action_id=row_id(action),
            seq=0,
            phase=StepPhase.forward,
            name="checkpoint",
            queue="agent.alpha.n1",
            state=StepState.succeeded,
            idempotency_key=f"{action.idempotency_key}:forward:checkpoint",
            attempts=1,
            result=CHECKPOINT_RESULT,
            sent_at=now,
            finished_at=now,
        )
    )
    session.commit()
    return row_id(plan), row_id(action)


@pytest.mark.parametrize("path", ["/api/v1/actions/{action}/steps", "/api/v1/plans/{plan}/steps"])
def test_a_viewer_reads_the_names_of_a_checkpointed_workloads_environment_not_its_values(
    client: TestClient, session: Session, auth: dict[str, dict[str, str]], path: str
) -> None:
    """A checkpoint's result is the image, with the environment the job started with (its
    API keys, passwords); the steps are published to every viewer token."""
    plan_id, action_id = _checkpointed_move(session, T0)

    response = client.get(path.format(plan=plan_id, action=action_id), headers=auth["viewer"])

    assert response.status_code == 200, response.text
    assert SECRET not in response.text
    (step,) = response.json()
    env = step["result"]["image"]["workload"]["env"]
    assert env == {"HF_TOKEN": "***", "PATH": "***"}
    assert step["result"]["summary"] == CHECKPOINT_RESULT["summary"]


def test_the_stored_checkpoint_keeps_its_environment_for_the_restore(
    client: TestClient, session: Session, auth: dict[str, dict[str, str]]
) -> None:
    """Only the published copy is hidden: the restore on the target node reads the stored
    result (``app.actions.messages``) and needs the values."""
    _, action_id = _checkpointed_move(session, T0)

    client.get(f"/api/v1/actions/{action_id}/steps", headers=auth["viewer"])

    stored = session.exec(select(ActionStep).where(ActionStep.action_id == action_id)).one()
    assert stored.result["image"]["workload"]["env"]["HF_TOKEN"] == SECRET


def test_settings_repr_hides_the_database_and_broker_passwords() -> None:
    """``repr(settings)`` is what a traceback with locals, a debugger or an error reporter
    shows."""
    settings = Settings(
        environment="test",
        database_url="postgresql+psycopg://shaper:db-password@db:5432/shaper",
        broker_url="redis://:broker-password@redis:6379/0",
    )

    shown = repr(settings) + str(settings)

    assert "db-password" not in shown
    assert "broker-password" not in shown
    assert settings.resolved_database_url.endswith("@db:5432/shaper")  # still there to use


def test_a_node_agents_token_cannot_report_for_another_node_of_its_cluster(
    client: TestClient, session: Session, auth: dict[str, dict[str, str]]
) -> None:
    """The route-scope matrix tries ``agent:alpha/n1`` on n1 only; its neighbour n2 is as
    foreign to it as another cluster."""
    registered_with(session, "alpha", snapshot(1), now=T0)
    sample = {"at": T0.isoformat(), "metric": "cpu_util", "node": "n2", "value": 0.5}

    response = client.post(
        "/api/v1/clusters/alpha/nodes/n2/samples",
        json={"samples": [sample]},
        headers=auth["agent_alpha_n1"],
    )

    assert response.status_code == 403, response.text
    assert response.json()["error"]["details"]["required_scope"] == "agent:alpha/n2"
