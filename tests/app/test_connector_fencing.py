"""One live connector session per cluster; replays told apart by content; 64-bit seq."""

from __future__ import annotations

from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlmodel import Session, select

from app.clusters.models import Cluster
from app.core import migrate
from app.core.clock import FrozenClock
from app.core.db import make_engine
from tests.app.builders import delta, job, running, snapshot, util_sample
from tests.support.clock import T0
from wire.telemetry import MAX_SEQ, REPLAY_WINDOW

URL = "/api/v1/clusters/alpha/telemetry"


@pytest.fixture
def alpha(client: TestClient, auth: dict) -> None:
    response = client.post(
        "/api/v1/clusters", headers=auth["admin"], json={"name": "alpha", "scheduler": "slurm"}
    )
    assert response.status_code == 201


@pytest.fixture
def push(client: TestClient, auth: dict, alpha: None) -> Any:
    def post(body: dict[str, Any]) -> Any:
        return client.post(URL, headers=auth["connector_alpha"], json=body)

    return post


def _state(client: TestClient, auth: dict, external_id: str) -> str:
    page = client.get("/api/v1/jobs", headers=auth["viewer"], params={"cluster": "alpha"}).json()
    return next(j["state"] for j in page["items"] if j["external_id"] == external_id)


def _cluster(session: Session) -> Cluster:
    cluster = session.exec(select(Cluster).where(Cluster.name == "alpha")).one()
    session.refresh(cluster)
    return cluster


def _code(response: Any) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


def test_a_superseded_session_cannot_bring_finished_jobs_back(
    push: Any, client: TestClient, auth: dict, clock: FrozenClock, session: Session
) -> None:
    assert push(snapshot(5, session="A", jobs=[running("j1", "n1", [0])])).status_code == 200
    clock.advance(30)
    # B starts (A's replacement): j1 has finished by now.
    finished = job("j1", state="finished", start_time=T0.isoformat(), end_time=T0.isoformat())
    assert push(snapshot(1, session="B", jobs=[finished])).status_code == 200
    clock.advance(30)
    late = push(snapshot(10, session="A", jobs=[running("j1", "n1", [0])]))
    assert _code(late) == (409, "stale_session")
    assert late.json()["error"]["field"] == "connector_session"
    assert push(delta(6, session="A", jobs=[running("j1", "n1", [0])])).status_code == 409
    assert _state(client, auth, "j1") == "finished"

    cluster = _cluster(session)
    assert (cluster.connector_session, cluster.last_seq) == ("B", 1)
    assert cluster.connector_session_since == T0.replace(second=30)
    [loser] = cluster.superseded_sessions
    assert (loser["session"], loser["last_seq"]) == ("A", 5)
    assert loser["since"] == T0.isoformat()


def test_two_connectors_on_one_cluster_do_not_flip_its_state(
    push: Any, client: TestClient, auth: dict, clock: FrozenClock
) -> None:
    accepted = {"A": 0, "B": 0}
    for k in range(20):
        connector = "A" if k % 2 == 0 else "B"
        # A sees j1 running, B sees it pending: each push would flip it without fencing.
        j1 = running("j1", "n1", [0]) if connector == "A" else job("j1", gpus_requested=1)
        response = push(snapshot(k, session=connector, jobs=[j1]))
        if response.status_code == 200:
            accepted[connector] += 1
        else:
            assert _code(response) == (409, "stale_session")
        clock.advance(15)
    # A's first push and every one of B's: B took over once and kept the cluster.
    assert accepted == {"A": 1, "B": 10}
    assert _state(client, auth, "j1") == "pending"


def test_replays_are_told_apart_by_content(push: Any, session: Session) -> None:
    body = snapshot(7, jobs=[running("j1", "n1", [0])], samples=[util_sample("n1", T0, 0.5)])
    assert push(body).json()["duplicate"] is False
    exact = push(body)
    assert exact.status_code == 200 and exact.json()["duplicate"] is True
    # The same content written differently (key order, defaults spelt out) is the same push.
    reordered = dict(reversed(list(body.items())))
    assert push({**reordered, "sent_at": None}).json()["duplicate"] is True

    other = push(snapshot(7, jobs=[running("j1", "n1", [1])]))
    assert _code(other) == (409, "replay_mismatch")
    assert other.json()["error"]["field"] == "seq"

    never_sent = push(snapshot(6))
    assert _code(never_sent) == (409, "out_of_order")
    assert never_sent.json()["error"]["details"] == {"last_seq": 7}
    assert _cluster(session).last_seq == 7

    assert push(delta(8, jobs=[running("j1", "n1", [2])])).json()["duplicate"] is False
    assert push(delta(8, jobs=[running("j1", "n1", [2])])).json()["duplicate"] is True
    assert _code(push(delta(8, jobs=[running("j1", "n1", [3])]))) == (409, "replay_mismatch")


def test_skipped_seqs_are_counted_as_gaps_and_exported(
    push: Any, session: Session, client: TestClient, auth: dict
) -> None:
    """seq 1 and 2 land, 3 and 4 never do (a delta refused for its gap), then snapshot 5:
    two skipped. A new session taking over starts afresh and adds none; /metrics says so."""
    assert push(snapshot(1)).status_code == 200
    assert push(delta(2)).status_code == 200
    assert _code(push(delta(4))) == (409, "snapshot_required")
    assert push(snapshot(5)).status_code == 200
    assert _cluster(session).seq_gaps == 2
    assert push(snapshot(40, session="s2")).status_code == 200  # takes over: not a gap
    assert _cluster(session).seq_gaps == 2
    metrics = client.get("/metrics", headers=auth["viewer"]).text
    assert 'shaper_telemetry_seq_gaps_total{cluster="alpha"} 2.0' in metrics


def test_only_the_last_pushes_can_be_replayed(push: Any) -> None:
    for seq in range(REPLAY_WINDOW + 1):
        assert push(snapshot(seq)).status_code == 200
    # seq 0 was accepted, but is out of the window: it cannot be told from one never sent.
    assert _code(push(snapshot(0))) == (409, "out_of_order")
    assert push(snapshot(1)).json()["duplicate"] is True


def test_seq_is_a_64_bit_integer(push: Any, client: TestClient, auth: dict) -> None:
    epoch_ms = 1_795_000_000_000  # connectors may number pushes by epoch milliseconds
    assert push(snapshot(epoch_ms)).status_code == 200
    assert push(delta(epoch_ms + 1, jobs=[job("j1")])).status_code == 200
    assert push(snapshot(MAX_SEQ - 1)).status_code == 200
    assert push(delta(MAX_SEQ, jobs=[job("j2")])).status_code == 200
    cluster = client.get("/api/v1/clusters/alpha", headers=auth["viewer"]).json()
    assert cluster["last_seq"] == MAX_SEQ

    too_big = push(snapshot(MAX_SEQ + 1, session="s2"))
    assert too_big.status_code == 422
    assert too_big.json()["error"]["field"] == "seq"
    assert str(MAX_SEQ) in too_big.json()["error"]["message"]


def _insert_cluster(connection: sa.Connection, *, seq: int) -> None:
    connection.execute(
        sa.text(
            "INSERT INTO clusters (name, scheduler, description, mode, policy,"
            " connector_status, connector_session, last_seq, created_at)"
            " VALUES ('a', 'slurm', '', 'observe', 'shaper', 'connected', 's1', :seq,"
            " CURRENT_TIMESTAMP)"
        ),
        {"seq": seq},
    )
    connection.execute(
        sa.text(
            "INSERT INTO nodes (cluster_id, name, gpu_count, cpu_cores, memory_mib, labels,"
            " state, updated_at) VALUES (1, 'n1', 8, 1, 1, '{}', 'up', CURRENT_TIMESTAMP)"
        )
    )


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
def test_the_upgrade_keeps_clusters_and_their_nodes(
    backend: str, make_postgres_database: Any, tmp_path: Any
) -> None:
    url = (
        make_postgres_database("fencing")
        if backend == "postgres"
        else f"sqlite:///{tmp_path / 'fencing.db'}"
    )
    migrate.upgrade(url, "7d1e5a9c3b42")
    engine = make_engine(url)
    with engine.begin() as connection:
        _insert_cluster(connection, seq=41)
    migrate.upgrade(url)
    with engine.begin() as connection:
        connection.execute(sa.text("UPDATE clusters SET last_seq = :seq"), {"seq": MAX_SEQ})
        row = connection.execute(
            sa.text("SELECT connector_session, last_seq, recent_pushes FROM clusters")
        ).one()
        nodes = connection.execute(sa.text("SELECT count(*) FROM nodes")).scalar_one()
    engine.dispose()
    assert (row[0], row[1], nodes) == ("s1", MAX_SEQ, 1)
    assert row[2] in ([], "[]")
