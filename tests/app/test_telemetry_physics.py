"""Telemetry that cannot be a cluster's state is refused whole (422 naming the field),
on both backends: the impossible states a probe once got stored, and their neighbours
that are possible and must still be accepted."""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlmodel import Session

from app.jobs.models import Allocation, Job
from app.telemetry.models import TelemetrySample
from tests.app.builders import delta, job, node, running, snapshot, util_sample
from tests.support.clock import T0

URL = "/api/v1/clusters/alpha/telemetry"
SAMPLES_URL = "/api/v1/clusters/alpha/nodes/n1/samples"
ALL_GPUS = list(range(8))


@pytest.fixture
def alpha(client: TestClient, auth: dict) -> None:
    response = client.post(
        "/api/v1/clusters", headers=auth["admin"], json={"name": "alpha", "scheduler": "slurm"}
    )
    assert response.status_code == 201


def _rows(session: Session) -> tuple[int, int, int]:
    def count(model: Any) -> int:
        return session.execute(select(func.count()).select_from(model)).scalar_one()

    return count(Job), count(Allocation), count(TelemetrySample)


def _sample(metric: str, value: Any, **fields: Any) -> dict[str, Any]:
    return {"at": T0.isoformat(), "metric": metric, "value": value, "node": "n1", **fields}


def _counted(external_id: str, node_name: str, gpus: int, **fields: Any) -> dict[str, Any]:
    """A running job whose scheduler only counts GPUs (Kubernetes)."""
    return job(
        external_id,
        state="running",
        start_time=T0.isoformat(),
        gpus_requested=gpus,
        allocations=[{"node": node_name, "gpu_count": gpus}],
        **fields,
    )


def _held(external_id: str, node_name: str, indices: list[int], **fields: Any) -> dict[str, Any]:
    """``running`` with any of its fields overridden (state, request, times)."""
    return {**running(external_id, node_name, indices), **fields}


IMPOSSIBLE = {
    "five jobs on the same eight GPUs": (
        snapshot(1, jobs=[running(f"j{k}", "n1", ALL_GPUS) for k in range(5)]),
        "jobs[1].allocations[0].gpu_indices[0]",
    ),
    "five counted jobs over one node": (
        snapshot(1, jobs=[_counted(f"j{k}", "n1", 8) for k in range(5)]),
        "jobs[1].allocations[0]",
    ),
    "three jobs on one GPU index": (
        snapshot(1, jobs=[running(f"j{k}", "n1", [3]) for k in range(3)]),
        "jobs[1].allocations[0].gpu_indices[0]",
    ),
    "allocation on a down node": (
        snapshot(1, nodes=[node("n1", state="down")], jobs=[running("j1", "n1", [0])]),
        "jobs[0].allocations[0].node",
    ),
    "a pending job holding GPUs": (
        snapshot(1, jobs=[_held("j1", "n1", [0], state="pending")]),
        "jobs[0].allocations",
    ),
    "a finished job holding GPUs": (
        snapshot(1, jobs=[_held("j1", "n1", [0], state="finished")]),
        "jobs[0].allocations",
    ),
    "eight GPUs for a job that requested one": (
        snapshot(1, jobs=[_held("j1", "n1", ALL_GPUS, gpus_requested=1)]),
        "jobs[0].allocations",
    ),
    "an elastic service beyond its replicas": (
        snapshot(
            1,
            jobs=[
                _held(
                    "svc",
                    "n1",
                    [0, 1, 2],
                    shape="elastic",
                    gpus_requested=1,
                    min_replicas=1,
                    replicas=2,
                    max_replicas=2,
                )
            ],
        ),
        "jobs[0].allocations",
    ),
    "end before start": (
        snapshot(1, jobs=[_held("j1", "n1", [0], end_time="2026-11-01T00:00:00+00:00")]),
        "jobs[0].end_time",
    ),
    "start before submit": (
        snapshot(1, jobs=[_held("j1", "n1", [0], start_time="2026-11-01T00:00:00+00:00")]),
        "jobs[0].start_time",
    ),
    "gpu_util of 5": (
        snapshot(1, samples=[util_sample("n1", T0, 5.0)]),
        "samples[0].value",
    ),
    "cpu_util above one": (
        snapshot(1, samples=[_sample("cpu_util", 1.01)]),
        "samples[0].value",
    ),
    "more GPU memory than one GPU could have": (
        snapshot(1, samples=[_sample("gpu_mem_used_gib", 5000.0, gpu_index=0)]),
        "samples[0].value",
    ),
    "a sample dated year 1": (
        snapshot(1, samples=[_sample("gpu_util", 0.5, at="0001-01-01T00:00:00+00:00")]),
        "samples[0].at",
    ),
    "a sample dated 9999-12-31": (
        snapshot(1, samples=[_sample("gpu_util", 0.5, at="9999-12-31T23:59:59+00:00")]),
        "samples[0].at",
    ),
    "a submit time before 2000": (
        snapshot(1, jobs=[job("j1", submit_time="1970-01-01T00:00:00+00:00")]),
        "jobs[0].submit_time",
    ),
    "a sent_at two days ahead": (
        {**snapshot(1), "sent_at": "2026-11-04T12:00:01+00:00"},
        "sent_at",
    ),
    "a speed on a GPU model the catalogue does not have": (
        snapshot(1, jobs=[job("j1", speeds={"H100": 2.0, "B300": 4.0})]),
        "jobs[0].speeds.B300",
    ),
    "a node with more memory than any machine": (
        snapshot(1, nodes=[node("n1", memory_mib=2**40)]),
        "nodes[0].memory_mib",
    ),
}


@pytest.mark.usefixtures("alpha")
@pytest.mark.parametrize(("body", "field"), IMPOSSIBLE.values(), ids=IMPOSSIBLE.keys())
def test_impossible_snapshots_are_refused_whole(
    client: TestClient, auth: dict, session: Session, body: dict, field: str
) -> None:
    response = client.post(URL, headers=auth["connector_alpha"], json=body)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert (error["code"], error["field"]) == ("invalid", field), error
    assert _rows(session) == (0, 0, 0)
    assert client.get("/api/v1/clusters/alpha", headers=auth["viewer"]).json()["last_seq"] is None


@pytest.mark.usefixtures("alpha")
@pytest.mark.parametrize("literal", [b"Infinity", b"-Infinity", b"NaN", b"1e309"])
def test_numbers_that_are_not_finite_are_refused(
    client: TestClient, auth: dict, session: Session, literal: bytes
) -> None:
    body = json.dumps(snapshot(1, samples=[util_sample("n1", T0, 0.25)])).encode()
    body = body.replace(b"0.25", literal)
    headers = {**auth["connector_alpha"], "Content-Type": "application/json"}
    response = client.post(URL, headers=headers, content=body)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == "samples[0].value"
    assert _rows(session) == (0, 0, 0)


POSSIBLE = {
    "jobs side by side on one node": [running("j1", "n1", [0, 1, 2, 3]), running("j2", "n1", [4])],
    "counted and indexed jobs filling a node": [
        running("j1", "n1", [0, 1, 2, 3]),
        _counted("j2", "n1", 4),
    ],
    "a suspended job keeps its GPUs": [_held("j1", "n1", [0], state="suspended")],
    "a job on a draining node": [running("j1", "n3", [0])],
    "an elastic service scaling down": [
        _held(
            "svc",
            "n1",
            [0, 1, 2],
            shape="elastic",
            gpus_requested=1,
            min_replicas=1,
            replicas=1,
            max_replicas=4,
        )
    ],
    "a job that ended": [
        job(
            "j1",
            state="finished",
            start_time=T0.isoformat(),
            end_time=T0.isoformat(),
        )
    ],
}


@pytest.mark.usefixtures("alpha")
@pytest.mark.parametrize("jobs", POSSIBLE.values(), ids=POSSIBLE.keys())
def test_possible_states_are_accepted(client: TestClient, auth: dict, jobs: list) -> None:
    nodes = [node("n1"), node("n2"), node("n3", state="draining")]
    samples = [
        util_sample("n1", T0, 1.0),
        _sample("gpu_mem_used_gib", 141.0, gpu_index=7),
        _sample("gpu_mem_used_gib", 8 * 141.0),
    ]
    body = {**snapshot(1, nodes=nodes, jobs=jobs, samples=samples), "sent_at": T0.isoformat()}
    response = client.post(URL, headers=auth["connector_alpha"], json=body)
    assert response.status_code == 200, response.text


@pytest.fixture
def placed(client: TestClient, auth: dict, alpha: None) -> None:
    """j1 holds GPUs 0-3 of n1; j2 waits."""
    body = snapshot(1, jobs=[running("j1", "n1", [0, 1, 2, 3]), job("j2", gpus_requested=1)])
    assert client.post(URL, headers=auth["connector_alpha"], json=body).status_code == 200


DELTAS = {
    "a GPU the stored job holds": (
        delta(2, jobs=[running("j2", "n1", [3])]),
        "jobs[0].allocations[0].gpu_indices[0]",
    ),
    "more GPUs than the node has left": (
        delta(2, jobs=[_counted("j2", "n1", 5)]),
        "jobs[0].allocations[0]",
    ),
    "a node shrinking under its jobs": (
        delta(2, nodes=[node("n1", gpu_count=2)]),
        "nodes[0].gpu_count",
    ),
    "a node going down under its jobs": (
        delta(2, nodes=[node("n1", state="down")]),
        "nodes[0].state",
    ),
    "a node removed under its jobs": (delta(2, removed_nodes=["n1"]), "removed_nodes[0]"),
}


@pytest.mark.usefixtures("placed")
@pytest.mark.parametrize(("body", "field"), DELTAS.values(), ids=DELTAS.keys())
def test_deltas_are_judged_merged_with_the_stored_state(
    client: TestClient, auth: dict, session: Session, body: dict, field: str
) -> None:
    before = _rows(session)
    response = client.post(URL, headers=auth["connector_alpha"], json=body)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == field
    assert _rows(session) == before
    assert client.get("/api/v1/clusters/alpha", headers=auth["viewer"]).json()["last_seq"] == 1


@pytest.mark.usefixtures("placed")
def test_a_delta_that_moves_jobs_is_judged_on_where_they_end_up(
    client: TestClient, auth: dict
) -> None:
    # j1 leaves GPUs 0-3 in the same delta that gives GPU 3 to j2: no conflict.
    moved = delta(2, jobs=[running("j1", "n1", [4, 5, 6, 7]), running("j2", "n1", [3])])
    assert client.post(URL, headers=auth["connector_alpha"], json=moved).status_code == 200
    # j1 finishes (removed): its GPUs are free for j3.
    freed = delta(3, removed_jobs=["j1"], jobs=[running("j3", "n1", [4, 5, 6, 7])])
    response = client.post(URL, headers=auth["connector_alpha"], json=freed)
    assert response.status_code == 200, response.text


@pytest.mark.usefixtures("alpha")
@pytest.mark.parametrize(
    ("sample", "field"),
    [
        (_sample("gpu_util", 5.0, gpu_index=0), "samples[0].value"),
        (_sample("mem_used_mib", 2.0**40), "samples[0].value"),
        (_sample("cpu_util", 0.5, at="9999-12-31T00:00:00+00:00"), "samples[0].at"),
    ],
)
def test_node_agent_samples_meet_the_same_bounds(
    client: TestClient, auth: dict, session: Session, sample: dict, field: str
) -> None:
    assert client.post(URL, headers=auth["connector_alpha"], json=snapshot(1)).status_code == 200
    response = client.post(SAMPLES_URL, headers=auth["agent_alpha_n1"], json={"samples": [sample]})
    assert response.status_code == 422, response.text
    assert response.json()["error"]["field"] == field
    assert _rows(session)[2] == 0
