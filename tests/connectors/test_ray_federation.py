"""A pending Ray job moves to another Ray cluster through the whole control plane (issue
16): the saga's hold@A → submit@B → confirm@B → cancel@A, each step sent to a connector
process.

The two clusters ("ray-fa", "ray-fb", one federation group) are two connector processes
on the one Ray test cluster (tests/support/ray_cluster.py), each with its own held-jobs
file: a second Ray head would cost another ~30 s and 600 MB on the tests' two cores. So
each cluster's telemetry shows every Ray job; the test looks at A's view of the job that
moves and B's view of the job that arrives. The job is pending at A because A holds it (a
preemption: the Ray jobs Shaper moves are those it holds, connectors/ray/connector.py);
an operator's move action, approved through the API, carries it to B.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlmodel import Session, select

from app.actions.models import Action, ActionKind, ActionState
from app.clusters.models import Cluster
from app.core.lookup import row_id
from app.federation import service as federation_service
from app.federation.models import FederationGroupCreate
from app.jobs.models import Job
from connectors.ray import RayConnector, RayConnectorConfig
from tests.support.deployment import api
from tests.support.deployment import deployment as deployment_of
from tests.support.plans import action_state, wait_until_settled
from tests.support.ray_cluster import RayCluster, ray_cluster_fixture, wait_for

__all__ = ["ray_cluster_fixture"]  # the fixture, found by pytest where it is imported

pytestmark = pytest.mark.slow

A, B = "ray-fa", "ray-fb"
WAIT_S = 90.0


@pytest.fixture(scope="module")
def deployment(
    ray_cluster: RayCluster,
    make_postgres_database: Any,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("ray-federation")

    def group(session: Session, now: datetime) -> None:
        federation_service.create_group(
            session=session, group_in=FederationGroupCreate(name="site"), now=now, actor=None
        )
        for name in (A, B):
            federation_service.add_cluster(
                session=session, name="site", cluster=name, now=now, actor=None
            )

    with deployment_of(
        root=root,
        database_url=make_postgres_database("ray_federation"),
        clusters=[(A, "ray"), (B, "ray")],
        scopes=["operator", "viewer", f"connector:{A}", f"connector:{B}"],
        env={"SHAPER_CYCLE_PERIOD_S": "86400"},  # nothing plans but the test
        setup=group,
    ) as running:
        for name in (A, B):
            running["pipeline"].start_connector(
                "ray",
                name,
                running["base"],
                f"dashboard_url={ray_cluster.dashboard_url}",
                f"gcs_address={ray_cluster.gcs_address}",
                f"state_dir={root / f'held-{name}'}",
            )
        yield running


def _job(deployment: dict[str, Any], cluster: str, external_id: str) -> dict[str, Any]:
    items = api(deployment, "GET", f"/jobs?cluster={cluster}&limit=1000", "viewer")["items"]
    return next((job for job in items if job["external_id"] == external_id), {})


def _submit_spec(deployment: dict[str, Any], external_id: str) -> dict[str, Any] | None:
    with Session(deployment["pipeline"].engine) as session:
        cluster = session.exec(select(Cluster).where(Cluster.name == A)).one()
        job = session.exec(
            select(Job).where(Job.cluster_id == cluster.id, Job.external_id == external_id)
        ).one_or_none()
        return json.loads(job.submit_spec) if job is not None and job.submit_spec else None


def _move(deployment: dict[str, Any], external_id: str) -> int:
    """A move of A's job to B, as an operator's (or the group plan's) action carries it."""
    with Session(deployment["pipeline"].engine) as session:
        source = session.exec(select(Cluster).where(Cluster.name == A)).one()
        target = session.exec(select(Cluster).where(Cluster.name == B)).one()
        job = session.exec(
            select(Job).where(Job.cluster_id == source.id, Job.external_id == external_id)
        ).one()
        now = datetime.now(UTC)
        action = Action(
            cluster_id=row_id(source),
            target_cluster_id=row_id(target),
            job_id=row_id(job),
            kind=ActionKind.move,
            state=ActionState.proposed,
            idempotency_key=f"e2e:move:{external_id}",
            reason="end-to-end test",
            created_at=now,
            updated_at=now,
        )
        session.add(action)
        session.commit()
        return row_id(action)


def test_a_job_held_in_one_ray_cluster_moves_to_the_other_and_runs_there(
    ray_cluster: RayCluster, deployment: dict[str, Any]
) -> None:
    ray = ray_cluster
    root: Path = deployment["root"]
    waiting = f"fed-{uuid.uuid4().hex[:6]}"
    marker = root / "moved.out"
    httpx.post(
        f"{ray.dashboard_url}/api/jobs/",
        json={
            "entrypoint": f"sh -c 'echo ran $SHAPER_FROM > {marker}; sleep 600'",
            "submission_id": waiting,
            "runtime_env": {"env_vars": {"SHAPER_FROM": "ray-fa"}},
            "metadata": {"shaper.io/priority": "50", "shaper.io/kind": "training"},
            "entrypoint_num_cpus": 0.25,
        },
        timeout=30,
    ).raise_for_status()
    wait_for(f"{waiting} to run", lambda: ray.job(waiting)["status"] == "RUNNING")
    # A plan of A's preempts it and holds it there (the requeue step, done by hand here).
    with RayConnector(
        RayConnectorConfig(
            cluster=A,
            dashboard_url=ray.dashboard_url,
            gcs_address=ray.gcs_address,
            state_dir=root / f"held-{A}",
        )
    ) as at_a:
        at_a.requeue(waiting, hold=True)
    marker.unlink(missing_ok=True)
    spec = wait_for(
        "A's telemetry to show the held job with its spec",
        lambda: (
            _job(deployment, A, waiting).get("state") == "pending"
            and _submit_spec(deployment, waiting)
        ),
        WAIT_S,
    )
    assert spec["scheduler"] == "ray"
    assert spec["native"]["entrypoint_num_cpus"] == 0.25

    action_id = _move(deployment, waiting)
    api(deployment, "POST", f"/actions/{action_id}/approve", "operator")
    pipeline = deployment["pipeline"]
    final = wait_until_settled(
        pipeline.engine,
        [action_id],
        timeout_s=2 * WAIT_S,
        context=lambda: (
            f"Ray jobs: {[(j.get('submission_id'), j['status']) for j in ray.get('/api/jobs/')]}"
            f"\n{pipeline.logs()}"
        ),
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
    assert arrived == f"shaper-{action_id}-{waiting}"

    # B runs it, with its runtime environment; A holds it no more: it ran once, at B.
    wait_for(f"{arrived} to run", lambda: ray.job(arrived)["status"] == "RUNNING")
    wait_for("the moved job to start", marker.exists)
    assert marker.read_text().split() == ["ran", "ray-fa"]
    assert ray.job(arrived)["metadata"]["shaper.io/move"] == arrived
    assert not json.loads((root / f"held-{A}" / "held-jobs.json").read_text())
    at_b = wait_for(
        "B's telemetry to show the job running",
        lambda: (job := _job(deployment, B, arrived)).get("state") == "running" and job,
        WAIT_S,
    )
    assert at_b["priority"] == 50
    assert _job(deployment, A, waiting)["state"] == "cancelled"
    httpx.post(f"{ray.dashboard_url}/api/jobs/{arrived}/stop", timeout=30)
