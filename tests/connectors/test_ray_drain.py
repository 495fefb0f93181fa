"""An operator's drain of a real Ray node (issue 17), end to end: ``POST
/clusters/{cluster}/nodes/{node}/drain`` on the control plane (SQLite), its saga's steps
answered in-process by the Ray connector's step executor on a real Ray cluster
(tests/support/ray_cluster.py), the node drained through Ray's GCS and read back draining
(or gone: Ray lets an idle drained node leave). A resent drain succeeds, and an undrain is
refused saying that Ray has none.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine
from sqlmodel import Session

from app.actions import local, saga, tasks
from app.actions.router import get_dispatcher
from app.clusters import service as cluster_service
from app.clusters.models import ClusterCreate
from app.core import migrate
from app.core.db import make_engine
from app.gpu_models import service as gpu_model_service
from app.telemetry import service as telemetry_service
from connectors import registry
from connectors.actions import ConnectorStepExecutor
from connectors.ray import RayConnector
from tests.app.test_federation_moves import Group
from tests.support.live_server import app_on, tokens_for
from tests.support.ray_cluster import RayCluster, ray_cluster_fixture
from wire.queues import connector_queue
from wire.steps import Outcome, StepRequest
from wire.telemetry import NodeState, SchedulerKind, TelemetrySnapshot

__all__ = ["ray_cluster_fixture"]  # the fixture, found by pytest where it is imported

CLUSTER = "ray-drain"
NODE = "ray-w5"  # a worker of its own: a drained idle Ray node leaves the cluster


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    url = f"sqlite:///{tmp_path / 'shaper.db'}"
    migrate.upgrade(url)
    made = make_engine(url)
    with Session(made) as session:
        gpu_model_service.ensure_default_catalogue(session=session)
        session.commit()
    yield made
    made.dispose()


@pytest.fixture
def connector(ray_cluster: RayCluster, tmp_path: Path) -> Iterator[RayConnector]:
    made = registry.create(
        SchedulerKind.ray,
        cluster=CLUSTER,
        dashboard_url=ray_cluster.dashboard_url,
        gcs_address=ray_cluster.gcs_address,
        state_dir=str(tmp_path / "connector"),
    )
    assert isinstance(made, RayConnector)
    yield made
    made.close()


def _node_step(name: str, generation: int, **args: Any) -> StepRequest:
    """A node's step as app/actions/messages.py builds it (its key: its name)."""
    return StepRequest(
        action_id=generation,
        key=name,
        step=name,
        workload_id=NODE,
        generation=generation,
        args=args,
    )


def test_an_operator_drains_a_ray_node_through_the_saga(
    ray_cluster: RayCluster,
    connector: RayConnector,
    engine: Engine,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ray_cluster.add_worker(NODE, gpus=1)
    now = datetime.now(UTC)
    state = connector.read_state()
    assert {n.name: n.state for n in state.nodes}[NODE] is NodeState.up
    with Session(engine) as session:
        cluster_service.register_cluster(
            session=session,
            now=now,
            cluster_in=ClusterCreate(name=CLUSTER, scheduler=SchedulerKind.ray),
        )
        telemetry_service.ingest(
            session=session,
            cluster_name=CLUSTER,
            push=TelemetrySnapshot.of(state, connector_session="test", seq=1),
            now=now,
        )
        token = tokens_for(session, now, ["operator"])["operator"]

    saga_of = Group(engine, None, None)  # type: ignore[arg-type]  # its saga helpers only
    executor = ConnectorStepExecutor(connector, cluster=CLUSTER, state_dir=tmp_path / "steps")

    def answer(queue: str, step: dict[str, Any]) -> dict[str, Any]:
        report = executor.handle(step)
        assert report is not None
        return report.model_dump(mode="json")

    monkeypatch.setattr(tasks, "get_engine", lambda: engine)
    monkeypatch.setattr(tasks, "_timings", lambda: {"step_timeout_s": 30.0, "start_wait_s": 60.0})
    monkeypatch.setattr(saga, "CONFIRM_POLL_S", 0.5)
    local.register(connector_queue(CLUSTER), answer)
    try:
        with TestClient(app_on(engine)) as client:
            client.app.dependency_overrides[get_dispatcher] = lambda: lambda action_id: None  # type: ignore[attr-defined]
            response = client.post(
                f"/api/v1/clusters/{CLUSTER}/nodes/{NODE}/drain",
                headers={"Authorization": f"Bearer {token}"},
                json={"reason": "shaper test: drain"},
            )
        assert response.status_code == 202, response.text
        action_id = response.json()["id"]
        saga_of.run_sagas(seconds=90)
    finally:
        local.unregister(connector_queue(CLUSTER))
    action = saga_of.action(action_id)
    assert action.state == "succeeded", (action.error, saga_of.steps(action_id))
    assert saga_of.steps(action_id) == [
        ("forward", "drain", connector_queue(CLUSTER), "succeeded"),
        ("forward", "confirm", connector_queue(CLUSTER), "succeeded"),
    ]
    reported = {n.name: n.state for n in connector.read_state().nodes}.get(NODE, NodeState.down)
    assert reported in (NodeState.draining, NodeState.down)

    # The executor alone, as the saga would send them: a resent drain (another action's
    # key) of the drained node succeeds; an undrain is refused, saying Ray has none.
    again = executor.run(_node_step("drain", action_id + 1, reason="again"))
    assert again.ok and again.outcome is Outcome.executed, again.error
    undrain = executor.run(_node_step("undrain", action_id + 2))
    assert not undrain.ok and not undrain.retryable
    assert "Ray has no undrain" in (undrain.error or ""), undrain.error
