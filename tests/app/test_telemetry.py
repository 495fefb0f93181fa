from __future__ import annotations

import json
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlmodel import Session

from app.core.clock import FrozenClock
from app.jobs.models import Allocation
from app.telemetry.models import TelemetrySample
from tests.app.builders import delta, job, node, running, snapshot, util_sample
from tests.conftest import T0

URL = "/api/v1/clusters/alpha/telemetry"


@pytest.fixture
def alpha(client: TestClient, auth: dict) -> None:
    response = client.post(
        "/api/v1/clusters", headers=auth["admin"], json={"name": "alpha", "scheduler": "slurm"}
    )
    assert response.status_code == 201


def _jobs(client: TestClient, auth: dict, **params: str) -> dict[str, dict]:
    page = client.get(
        "/api/v1/jobs", headers=auth["viewer"], params={"cluster": "alpha", **params}
    ).json()
    return {j["external_id"]: j for j in page["items"]}


def _counts(session: Session) -> tuple[int, int]:
    samples = session.execute(select(func.count()).select_from(TelemetrySample)).scalar_one()
    allocations = session.execute(select(func.count()).select_from(Allocation)).scalar_one()
    return samples, allocations


@pytest.mark.usefixtures("alpha")
def test_snapshot_is_stored_and_visible(client: TestClient, auth: dict) -> None:
    body = snapshot(
        1,
        jobs=[running("j1", "n1", [0, 1]), job("j2", gpus_requested=4)],
        samples=[util_sample("n1", T0, 0.5)],
    )
    ack = client.post(URL, headers=auth["connector_alpha"], json=body)
    assert ack.status_code == 200, ack.text
    assert ack.json() == {
        "cluster": "alpha",
        "seq": 1,
        "duplicate": False,
        "nodes_written": 2,
        "jobs_written": 2,
        "jobs_finished": 0,
        "allocations_written": 1,
        "samples_written": 1,
    }
    jobs = _jobs(client, auth)
    assert jobs["j1"]["state"] == "running"
    assert jobs["j1"]["allocations"][0]["node"] == "n1"
    assert jobs["j1"]["allocations"][0]["gpu_indices"] == [0, 1]
    assert jobs["j2"]["allocations"] == []
    nodes = client.get("/api/v1/nodes", headers=auth["viewer"], params={"sort": "name"}).json()
    assert [(n["name"], n["gpus_allocated"]) for n in nodes["items"]] == [("n1", 2), ("n2", 0)]
    cluster = client.get("/api/v1/clusters/alpha", headers=auth["viewer"]).json()
    assert cluster["connector_status"] == "connected" and cluster["last_seq"] == 1
    assert (cluster["node_count"], cluster["gpu_count"]) == (2, 16)


@pytest.mark.usefixtures("alpha")
def test_replayed_sequence_is_acknowledged_without_a_second_write(
    client: TestClient, auth: dict, session: Session
) -> None:
    body = snapshot(5, jobs=[running("j1", "n1", [0])], samples=[util_sample("n1", T0, 0.9)])
    assert client.post(URL, headers=auth["connector_alpha"], json=body).json()["duplicate"] is False
    before = _counts(session)
    replay = client.post(URL, headers=auth["connector_alpha"], json=body)
    assert replay.status_code == 200 and replay.json()["duplicate"] is True
    assert replay.json()["samples_written"] == 0
    older = client.post(URL, headers=auth["connector_alpha"], json=snapshot(4))
    assert older.json()["duplicate"] is True
    assert _counts(session) == before


@pytest.mark.usefixtures("alpha")
def test_deltas_follow_and_gaps_ask_for_a_snapshot(
    client: TestClient, auth: dict, clock: FrozenClock
) -> None:
    headers = auth["connector_alpha"]
    early = client.post(URL, headers=headers, json=delta(1, jobs=[job("j9")]))
    assert early.status_code == 409
    assert early.json()["error"]["code"] == "snapshot_required"
    assert early.json()["error"]["field"] == "connector_session"

    assert client.post(URL, headers=headers, json=snapshot(1, jobs=[job("j1")])).status_code == 200
    clock.advance(60)
    started = delta(2, jobs=[running("j1", "n2", [3])])
    assert client.post(URL, headers=headers, json=started).json()["jobs_written"] == 1
    assert _jobs(client, auth)["j1"]["allocations"][0]["node"] == "n2"

    gap = client.post(URL, headers=headers, json=delta(4, jobs=[job("j2")]))
    assert gap.status_code == 409
    assert gap.json()["error"]["field"] == "seq"
    assert gap.json()["error"]["details"] == {"expected_seq": 3}
    assert "j2" not in _jobs(client, auth)

    other_session = client.post(URL, headers=headers, json=delta(3, session="s2"))
    assert other_session.status_code == 409

    done = client.post(URL, headers=headers, json=delta(3, removed_jobs=["j1"]))
    assert done.json()["jobs_finished"] == 1
    finished = _jobs(client, auth)["j1"]
    assert finished["state"] == "finished" and finished["allocations"] == []

    restarted = client.post(URL, headers=headers, json=snapshot(0, session="s2"))
    assert restarted.status_code == 200 and restarted.json()["duplicate"] is False


@pytest.mark.usefixtures("alpha")
def test_snapshot_replaces_state_and_finishes_vanished_jobs(
    client: TestClient, auth: dict, clock: FrozenClock, session: Session
) -> None:
    headers = auth["connector_alpha"]
    first = snapshot(1, jobs=[running("j1", "n1", [0, 1]), running("j2", "n2", [0]), job("j3")])
    client.post(URL, headers=headers, json=first)
    clock.advance(600)
    # j1 moved to n2, j2 vanished, j3 unchanged, n1 vanished.
    second = snapshot(2, nodes=[node("n2")], jobs=[running("j1", "n2", [4, 5]), job("j3")])
    ack = client.post(URL, headers=headers, json=second).json()
    # Only j2's row changes (it finished); j1's move shows in its allocations: one closed and
    # one opened for j1, one closed for j2.
    assert (ack["jobs_finished"], ack["jobs_written"], ack["allocations_written"]) == (1, 1, 3)
    jobs = _jobs(client, auth)
    assert jobs["j2"]["state"] == "finished"
    assert jobs["j2"]["end_time"].startswith((T0 + timedelta(seconds=600)).isoformat()[:19])
    assert jobs["j1"]["allocations"][0]["node"] == "n2"
    nodes = client.get("/api/v1/nodes", headers=auth["viewer"], params={"state": "down"}).json()
    assert [n["name"] for n in nodes["items"]] == ["n1"]
    closed = session.execute(
        select(func.count()).select_from(Allocation).where(Allocation.released_at.is_not(None))
    ).scalar_one()
    assert closed == 2  # j1's old placement and j2's


@pytest.mark.usefixtures("alpha")
@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        (snapshot(1, nodes=[node("n1"), node("n2", gpu_model="B999")]), 422, "nodes[1].gpu_model"),
        (snapshot(1, nodes=[node("n1", gpu_count=-1)]), 422, "nodes[0].gpu_count"),
        (snapshot(1, nodes=[node("n1", gpu_count="many")]), 422, "nodes[0].gpu_count"),
        (snapshot(1, jobs=[job("j1"), job("j1")]), 422, "jobs[1].external_id"),
        (snapshot(1, jobs=[job("j1", gpus_requested=-2)]), 422, "jobs[0].gpus_requested"),
        (snapshot(1, jobs=[running("j1", "n9", [0])]), 422, "jobs[0].allocations[0].node"),
        (
            snapshot(1, jobs=[running("j1", "n1", [8])]),
            422,
            "jobs[0].allocations[0].gpu_indices[0]",
        ),
        (
            snapshot(1, jobs=[job("j1", allowed_gpu_models=["H100", "Z1"])]),
            422,
            "jobs[0].allowed_gpu_models[1]",
        ),
        (snapshot(1, samples=[util_sample("n7", T0, 0.1)]), 422, "samples[0].node"),
        (snapshot(1, jobs=[job("j1", state="exploded")]), 422, "jobs[0].state"),
        (snapshot(1, jobs=[job("j1", colour="red")]), 422, "jobs[0].colour"),
        (snapshot(-1), 422, "seq"),
        ({"kind": "everything", "connector_session": "s1", "seq": 1}, 422, "kind"),
    ],
)
def test_bad_input_names_the_field_and_writes_nothing(
    client: TestClient, auth: dict, session: Session, body: dict, status: int, field: str
) -> None:
    response = client.post(URL, headers=auth["connector_alpha"], json=body)
    assert response.status_code == status, response.text
    assert response.json()["error"]["field"] == field
    assert client.get("/api/v1/jobs", headers=auth["viewer"]).json()["total"] == 0
    assert client.get("/api/v1/nodes", headers=auth["viewer"]).json()["total"] == 0
    assert _counts(session) == (0, 0)
    assert client.get("/api/v1/clusters/alpha", headers=auth["viewer"]).json()["last_seq"] is None


@pytest.mark.usefixtures("alpha")
def test_malformed_json_and_oversized_payloads(client: TestClient, auth: dict) -> None:
    headers = {**auth["connector_alpha"], "Content-Type": "application/json"}
    broken = client.post(URL, headers=headers, content=b'{"kind": "snapshot", "seq": ')
    assert broken.status_code == 400
    assert broken.json()["error"]["code"] == "malformed_json"
    assert broken.json()["error"]["field"] == "body"

    jobs = [job(f"job-{i}", name="x" * 200) for i in range(1000)]  # ~450 KiB > 256 KiB limit
    huge = client.post(URL, headers=headers, content=json.dumps(snapshot(1, jobs=jobs)))
    assert huge.status_code == 413
    assert huge.json()["error"]["code"] == "payload_too_large"
    assert client.get("/api/v1/jobs", headers=auth["viewer"]).json()["total"] == 0


def test_unknown_cluster_is_404(client: TestClient, auth: dict) -> None:
    response = client.post(
        "/api/v1/clusters/ghost/telemetry", headers=auth["admin"], json=snapshot(1)
    )
    assert response.status_code == 404
    assert response.json()["error"]["id"] == "ghost"


@pytest.mark.usefixtures("alpha")
def test_large_snapshot_round_trip_updates_in_bulk(client: TestClient, auth: dict) -> None:
    """Enough rows to take the bulk (COPY on PostgreSQL) insert and update paths."""
    headers = auth["connector_alpha"]
    nodes = [node(f"n{i}") for i in range(50)]
    jobs = [running(f"j{i}", f"n{i % 50}", [i // 50]) for i in range(300)]
    assert (
        client.post(URL, headers=headers, json=snapshot(1, nodes=nodes, jobs=jobs)).json()[
            "jobs_written"
        ]
        == 300
    )
    changed = [running(f"j{i}", f"n{i % 50}", [i // 50], priority=99) for i in range(300)]
    ack = client.post(URL, headers=headers, json=snapshot(2, nodes=nodes, jobs=changed)).json()
    assert (ack["jobs_written"], ack["allocations_written"]) == (300, 0)
    top = _jobs(client, auth, sort="-priority", limit="5")
    assert {j["priority"] for j in top.values()} == {99}
    unchanged = client.post(URL, headers=headers, json=snapshot(3, nodes=nodes, jobs=changed))
    assert unchanged.json()["jobs_written"] == 0 and unchanged.json()["nodes_written"] == 0
