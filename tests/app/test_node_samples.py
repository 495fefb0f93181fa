"""Node agents report their own node: CPU, memory (and GPUs where NVML exists)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, func, select
from sqlmodel import Session

from agent.telemetry import NodeSampler, push_samples
from app.clusters import service as cluster_service
from app.clusters.models import ClusterCreate
from app.core import migrate
from app.core.db import make_engine
from app.gpu_models import service as gpu_model_service
from app.telemetry import service as telemetry_service
from app.telemetry.models import TelemetrySample
from tests.app.builders import node, snapshot
from tests.support.clock import T0
from tests.support.live_server import app_on, serve, tokens_for
from wire.telemetry import NodeReport, TelemetrySnapshot

URL = "/api/v1/clusters/alpha/nodes/n1/samples"


def _sample(metric: str, value: float, **fields: Any) -> dict[str, Any]:
    return {"at": T0.isoformat(), "metric": metric, "value": value, "node": "n1", **fields}


@pytest.fixture
def alpha(client: TestClient, auth: dict) -> None:
    client.post(
        "/api/v1/clusters", headers=auth["admin"], json={"name": "alpha", "scheduler": "sim"}
    )
    client.post(
        "/api/v1/clusters/alpha/telemetry",
        headers=auth["connector_alpha"],
        json=snapshot(1, nodes=[node("n1"), node("n2")]),
    )


def _count(session: Session) -> int:
    return session.execute(select(func.count()).select_from(TelemetrySample)).scalar_one()


@pytest.mark.usefixtures("alpha")
def test_agent_reports_its_own_node(client: TestClient, auth: dict, session: Session) -> None:
    body = {
        "samples": [
            _sample("cpu_util", 0.4),
            _sample("mem_used_mib", 1024.0),
            _sample("gpu_util", 0.9, gpu_index=3),
        ]
    }
    response = client.post(URL, headers=auth["agent_alpha_n1"], json=body)
    assert response.status_code == 200, response.text
    assert response.json() == {"accepted": 3}
    assert _count(session) == 3
    other = client.post(
        "/api/v1/clusters/alpha/nodes/n2/samples", headers=auth["agent_alpha_n1"], json=body
    )
    assert other.status_code == 403


@pytest.mark.usefixtures("alpha")
@pytest.mark.parametrize(
    ("samples", "field"),
    [
        ([_sample("cpu_util", 0.1), _sample("cpu_util", 0.1, node="n2")], "samples[1].node"),
        (
            [{"at": T0.isoformat(), "metric": "demand_replicas", "value": 1, "job": "j"}],
            "samples[0].metric",
        ),
        ([_sample("gpu_util", 0.5, gpu_index=8)], "samples[0].gpu_index"),
        ([_sample("cpu_util", -1)], "samples[0].value"),
        ([], "samples"),
    ],
)
def test_bad_samples_name_the_field_and_store_nothing(
    client: TestClient, auth: dict, session: Session, samples: list, field: str
) -> None:
    response = client.post(URL, headers=auth["agent_alpha_n1"], json={"samples": samples})
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == field
    assert _count(session) == 0


def test_unknown_node_is_404(client: TestClient, auth: dict) -> None:
    client.post(
        "/api/v1/clusters", headers=auth["admin"], json={"name": "alpha", "scheduler": "sim"}
    )
    response = client.post(URL, headers=auth["admin"], json={"samples": [_sample("cpu_util", 0)]})
    assert response.status_code == 404 and response.json()["error"]["id"] == "n1"


def test_sampler_reads_this_machine_and_pushes_over_http(make_postgres_database: Any) -> None:
    url = make_postgres_database("node_samples")
    migrate.upgrade(url)
    engine: Engine = make_engine(url)
    with Session(engine) as session:
        gpu_model_service.ensure_default_catalogue(session=session)
        cluster_service.register_cluster(
            session=session, now=T0, cluster_in=ClusterCreate(name="alpha")
        )
        telemetry_service.ingest(
            session=session,
            cluster_name="alpha",
            now=T0,
            push=TelemetrySnapshot(connector_session="s", seq=1, nodes=[NodeReport(name="n1")]),
        )
        tokens = tokens_for(session, T0, ["agent:alpha/n1"])
    sampler = NodeSampler("n1")
    sum(range(200_000))  # some CPU work between the two readings
    samples = sampler.sample()
    by_metric = {s.metric.value: s.value for s in samples}
    lines = Path("/proc/meminfo").read_text().splitlines()
    meminfo = dict(line.split(":", 1) for line in lines)
    total_mib = int(meminfo["MemTotal"].split()[0]) / 1024
    assert 0.0 <= by_metric["cpu_util"] <= 1.0
    assert 0 < by_metric["mem_used_mib"] < total_mib
    with serve(app_on(engine)) as base:
        accepted = push_samples(
            samples, control_plane=base, cluster="alpha", node="n1", token=tokens["agent:alpha/n1"]
        )
    with Session(engine) as session:
        stored = session.execute(select(func.count()).select_from(TelemetrySample)).scalar_one()
    engine.dispose()
    assert accepted == len(samples) == stored
