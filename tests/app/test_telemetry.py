from __future__ import annotations

import gc
import json
from datetime import timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select
from sqlmodel import Session

from app.core.clock import FrozenClock
from app.gpu_models.service import by_case
from app.jobs.models import Allocation
from app.main import create_app
from app.telemetry import service as telemetry_service
from app.telemetry.model_names import spelt_as_catalogue
from app.telemetry.models import TelemetrySample
from tests.app.builders import delta, job, node, running, snapshot, util_sample
from tests.support.clock import T0
from wire.telemetry import TelemetrySnapshot

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
    # An older sequence number that was never accepted is not a duplicate: it is refused.
    older = client.post(URL, headers=auth["connector_alpha"], json=snapshot(4))
    assert older.status_code == 409 and older.json()["error"]["code"] == "out_of_order"
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
    assert _jobs(client, auth)["j1"]["time_limit_s"] is None
    clock.advance(60)
    started = delta(2, jobs=[running("j1", "n2", [3], time_limit_s=5400.0)])
    assert client.post(URL, headers=headers, json=started).json()["jobs_written"] == 1
    assert _jobs(client, auth)["j1"]["allocations"][0]["node"] == "n2"
    assert _jobs(client, auth)["j1"]["time_limit_s"] == 5400.0

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
        (snapshot(1, jobs=[job("j1", time_limit_s=0)]), 422, "jobs[0].time_limit_s"),
        (snapshot(1, jobs=[job("j1", time_limit_s=1e12)]), 422, "jobs[0].time_limit_s"),
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
        (snapshot(1, jobs=[job("j1", speeds={"H100": 0})]), 422, "jobs[0].speeds.H100"),
        (snapshot(1, jobs=[job("j1", speeds={"H100": 1e-309})]), 422, "jobs[0].speeds.H100"),
        (snapshot(1, jobs=[job("j1", speeds={"H100": 0.009})]), 422, "jobs[0].speeds.H100"),
        (snapshot(1, jobs=[job("j1", speeds={"H100": 101})]), 422, "jobs[0].speeds.H100"),
        (snapshot(1, jobs=[job("j1", speeds={"H100": "fast"})]), 422, "jobs[0].speeds.H100"),
        (
            snapshot(1, jobs=[job("j1", speeds={f"m{i}": 1.0 for i in range(65)})]),
            422,
            "jobs[0].speeds",
        ),
        (
            snapshot(1, jobs=[job("svc", shape="elastic", max_replicas=2, speeds={"H100": 2})]),
            422,
            "jobs[0]",
        ),
        (snapshot(1, samples=[util_sample("n7", T0, 0.1)]), 422, "samples[0].node"),
        (snapshot(1, jobs=[job("j1", state="exploded")]), 422, "jobs[0].state"),
        (snapshot(1, jobs=[job("j1", colour="red")]), 422, "jobs[0].colour"),
        (snapshot(-1), 422, "seq"),
        (
            snapshot(1, nodes=[node("n1", labels={f"k{i}": "v" for i in range(257)})]),
            422,
            "nodes[0].labels",
        ),
        (
            snapshot(1, nodes=[node("n1", labels={"x" * 318: "v"})]),
            422,
            f"nodes[0].labels.{'x' * 318}.[key]",  # the key at fault
        ),
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


@pytest.mark.usefixtures("alpha")
def test_push_body_is_parsed_once_by_the_wire_schema(
    client: TestClient, auth: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The route reads its body with ``service.parse_push`` (one pydantic-core pass over the
    bytes, the path bench/ingest.py times), FastAPI takes the model as it is, and the
    garbage collector stays paused from the parse to the end of the ingest."""
    parse_push, ingest = telemetry_service.parse_push, telemetry_service.ingest
    seen: list[tuple[str, object, bool]] = []

    def parse_spy(body: bytes) -> object:
        push = parse_push(body)
        seen.append(("parse", push, gc.isenabled()))
        return push

    def ingest_spy(**kwargs: Any) -> object:
        seen.append(("ingest", kwargs["push"], gc.isenabled()))
        return ingest(**kwargs)

    monkeypatch.setattr(telemetry_service, "parse_push", parse_spy)
    monkeypatch.setattr(telemetry_service, "ingest", ingest_spy)
    assert gc.isenabled()
    body = snapshot(1, jobs=[running("j1", "n1", [0, 1])])
    ack = client.post(URL, headers=auth["connector_alpha"], json=body)
    assert ack.status_code == 200, ack.text
    assert ack.json()["allocations_written"] == 1
    assert [(step, enabled) for step, _, enabled in seen] == [
        ("parse", False),
        ("ingest", False),
    ]
    assert isinstance(seen[0][1], TelemetrySnapshot) and seen[1][1] is seen[0][1]
    assert gc.isenabled()


@pytest.mark.usefixtures("alpha")
@pytest.mark.parametrize(
    ("content", "content_type", "status", "code", "field"),
    [
        (b"", "application/json", 422, "invalid", "body"),
        (b'{"kind": "snapshot"', "application/json", 400, "malformed_json", "body"),
        (b"[1, 2]", "application/json", 422, "invalid", "body"),
        (
            b'{"kind": "snapshot", "connector_session": "s1"}',
            "application/json",
            422,
            "invalid",
            "seq",
        ),
        (json.dumps(snapshot(1)).encode(), "text/plain", 422, "invalid", "body"),
        (json.dumps(snapshot(1)).encode(), None, 422, "invalid", "body"),
    ],
)
def test_body_errors_are_answered_as_by_any_route(
    client: TestClient,
    auth: dict,
    content: bytes,
    content_type: str | None,
    status: int,
    code: str,
    field: str,
) -> None:
    """Empty, malformed, non-object and non-JSON bodies get FastAPI's usual answers."""
    headers = dict(auth["connector_alpha"])
    if content_type is not None:
        headers["Content-Type"] = content_type
    response = client.post(URL, headers=headers, content=content)
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code
    assert response.json()["error"]["field"] == field


def test_bad_body_without_a_token_is_still_401(client: TestClient) -> None:
    response = client.post(
        URL, content=b'{"kind": "snapshot"', headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 401


def test_openapi_still_describes_the_push_body() -> None:
    schema = create_app().openapi()
    operation = schema["paths"]["/api/v1/clusters/{cluster}/telemetry"]["post"]
    body = operation["requestBody"]["content"]["application/json"]["schema"]
    assert operation["requestBody"]["required"] is True
    assert body["discriminator"]["propertyName"] == "kind"
    assert {ref["$ref"] for ref in body["oneOf"]} == {
        "#/components/schemas/TelemetrySnapshot",
        "#/components/schemas/TelemetryDelta",
    }
    assert "JobReport" in schema["components"]["schemas"]
    assert operation["x-required-scope"] == "connector:{cluster}"


@pytest.mark.usefixtures("alpha")
def test_json_columns_round_trip_through_the_bulk_paths(client: TestClient, auth: dict) -> None:
    """JSON columns go to COPY as pre-serialised text (decoded again for SQLite); unchanged
    rows compare equal to what was stored, so a replay of the same state writes nothing."""
    headers = auth["connector_alpha"]
    nodes = [node(f"n{i}", labels={"rack": f"r{i % 3}", "zone": "a"}) for i in range(50)]
    jobs = [
        running(f"j{i}", f"n{i % 50}", [7 - i // 50, 0] if i < 50 else [i // 50])
        | {"allowed_gpu_models": ["H100", "A100-80G"] if i % 2 else []}
        | ({"speeds": {"H100": 1.5, "A100-80G": 0.75}} if i % 3 == 0 else {})
        for i in range(300)
    ]
    first = client.post(URL, headers=headers, json=snapshot(1, nodes=nodes, jobs=jobs)).json()
    assert (first["jobs_written"], first["allocations_written"]) == (300, 300)
    stored = _jobs(client, auth, limit="500")
    assert stored["j1"]["allowed_gpu_models"] == ["H100", "A100-80G"]
    assert stored["j2"]["allowed_gpu_models"] == []
    assert stored["j3"]["allocations"][0]["gpu_indices"] == [0, 7]  # sorted
    assert stored["j3"]["speeds"] == {"A100-80G": 0.75, "H100": 1.5}
    assert stored["j1"]["speeds"] == {}
    listed = client.get("/api/v1/nodes", headers=auth["viewer"], params={"limit": "100"}).json()
    assert {n["name"]: n["labels"] for n in listed["items"]}["n4"] == {"rack": "r1", "zone": "a"}
    # The same speeds, named in another order: the same stored text.
    for report in jobs:
        if "speeds" in report:
            report["speeds"] = dict(reversed(report["speeds"].items()))
    again = client.post(URL, headers=headers, json=snapshot(2, nodes=nodes, jobs=jobs)).json()
    assert (again["nodes_written"], again["jobs_written"], again["allocations_written"]) == (
        0,
        0,
        0,
    )


def test_ingest_benchmark_runs_and_agrees_with_the_api(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """bench/ingest.py at a small size: its direct path and the whole POST write the same
    rows (it asserts so), so the benchmark keeps timing what the route does."""
    from bench import ingest as bench_ingest

    monkeypatch.setattr(
        "sys.argv", ["ingest", "--nodes", "20", "--jobs", "120", "--repeat", "2", "--skip-naive"]
    )
    monkeypatch.setenv("COLUMNS", "200")
    bench_ingest.main()
    out = capsys.readouterr().out
    assert "shaper: first snapshot, whole POST in-process" in out
    assert "20 nodes × 8 GPUs, 120 jobs" in out


@pytest.mark.usefixtures("alpha")
def test_an_elastic_training_jobs_range_is_kept_once_its_scheduler_forgets_it(
    client: TestClient, auth: dict
) -> None:
    """Slurm reports ``sbatch --nodes=1-3`` only while the job waits; once it runs, its
    node count is what it got. The stored range stays until a report gives another."""
    elastic = {"gang_size": 1, "min_replicas": 1, "max_replicas": 3, "replicas": 3}
    pushes = [
        snapshot(1, jobs=[job("e", **elastic), job("rigid")]),
        delta(2, jobs=[running("e", "n1", [0, 1]), running("rigid", "n2", [0, 1])]),
    ]
    for body in pushes:
        assert client.post(URL, headers=auth["connector_alpha"], json=body).status_code == 200
    jobs = _jobs(client, auth)
    assert jobs["e"]["state"] == "running"
    assert (jobs["e"]["min_replicas"], jobs["e"]["max_replicas"], jobs["e"]["replicas"]) == (
        1,
        3,
        3,
    )
    assert (jobs["rigid"]["min_replicas"], jobs["rigid"]["max_replicas"]) == (0, 0)
    regrown = running("e", "n1", [0, 1], min_replicas=2, max_replicas=4, replicas=4)
    body = delta(3, jobs=[regrown])
    assert client.post(URL, headers=auth["connector_alpha"], json=body).status_code == 200
    jobs = _jobs(client, auth)
    assert (jobs["e"]["min_replicas"], jobs["e"]["max_replicas"], jobs["e"]["replicas"]) == (
        2,
        4,
        4,
    )
    # Ended, and its id given to a new rigid job (a scheduler that lost its state): the
    # new job does not inherit the range.
    ended = running("e", "n1", [0, 1], min_replicas=2, max_replicas=4, replicas=4)
    ended.update(state="finished", allocations=[], end_time=T0.isoformat())
    for seq, report in ((4, ended), (5, job("e"))):
        body = delta(seq, jobs=[report])
        assert client.post(URL, headers=auth["connector_alpha"], json=body).status_code == 200
    assert _jobs(client, auth)["e"]["max_replicas"] == 0


@pytest.mark.usefixtures("alpha")
def test_gpu_model_names_are_taken_in_the_catalogues_spelling(
    client: TestClient, auth: dict
) -> None:
    """Slurm sites type GRES in lower case (``gpu:h100:2``): a name that differs from a
    catalogue name only in case is that model, in nodes, allowed models and speeds, stored
    in the catalogue's spelling, so that a replay of the same push writes nothing. A name
    the catalogue lacks is refused with what to do about it."""
    headers = auth["connector_alpha"]
    jobs = [
        running("j1", "n1", [0, 1], allowed_gpu_models=["h100"], speeds={"h100": 2.0}),
        job("j2", allowed_gpu_models=["a100-80g", "H100"]),
    ]
    body = snapshot(1, nodes=[node("n1", gpu_model="h100"), node("n2")], jobs=jobs)
    first = client.post(URL, headers=headers, json=body)
    assert first.status_code == 200, first.text
    nodes = client.get("/api/v1/nodes", headers=auth["viewer"]).json()["items"]
    assert {n["name"]: n["gpu_model"] for n in nodes} == {"n1": "H100", "n2": "H100"}
    stored = _jobs(client, auth)
    assert (stored["j1"]["allowed_gpu_models"], stored["j1"]["speeds"]) == (["H100"], {"H100": 2.0})
    assert stored["j2"]["allowed_gpu_models"] == ["A100-80G", "H100"]
    again = client.post(URL, headers=headers, json={**body, "seq": 2}).json()
    assert (again["nodes_written"], again["jobs_written"]) == (0, 0)
    same = delta(3, nodes=[node("n1", gpu_model="h100")], jobs=jobs)
    resent = client.post(URL, headers=headers, json=same).json()
    assert (resent["nodes_written"], resent["jobs_written"], resent["allocations_written"]) == (
        0,
        0,
        0,
    )

    refused = client.post(
        URL, headers=headers, json=snapshot(4, nodes=[node("n1", gpu_model="a100")])
    )
    assert refused.status_code == 422
    error = refused.json()["error"]
    assert error["field"] == "nodes[0].gpu_model"
    assert (
        "unknown GPU model 'a100'" in error["message"] and "gpu_model_aliases" in error["message"]
    )


def test_only_a_name_one_catalogue_name_differs_from_in_case_is_rewritten() -> None:
    catalogue = ["H100", "Gpu1", "GPU1", "x1"]
    assert by_case(catalogue) == {"h100": "H100", "x1": "x1"}
    push = TelemetrySnapshot.model_validate(
        snapshot(
            1,
            nodes=[node("n1", gpu_model="gpu1"), node("n2", gpu_model="X1"), node("n3")],
            jobs=[job("j1")],
        )
    )
    spelt = spelt_as_catalogue(push, catalogue)
    assert [n.gpu_model for n in spelt.nodes] == ["gpu1", "x1", "H100"]  # gpu1: ambiguous
    assert spelt.jobs[0] is push.jobs[0]
    plain = TelemetrySnapshot.model_validate(snapshot(1))
    assert spelt_as_catalogue(plain, catalogue) is plain
