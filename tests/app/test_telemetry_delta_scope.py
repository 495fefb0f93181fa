"""A delta is checked and written against the stored rows it names or touches, not the
whole cluster (app/telemetry/ingest.py, ``_Scope``), on both backends.

Proof by comparison: every push goes to two clusters, ``alpha`` ingested as the service
does now and ``beta`` with the scope switched off (``_NAMED_LIMIT`` below any set, so every
delta reads the whole cluster, as ingest did before), and after each push the two hold
the same rows — jobs, nodes, the allocation history, samples, the sequence — or refused
it naming the same field. The refused deltas are those whose conflict is with another
job on the same node that the delta does not name."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from sqlmodel import Session

from app.clusters.models import Cluster
from app.core.clock import FrozenClock
from app.jobs.models import Allocation, Job
from app.nodes.models import Node
from app.telemetry import ingest
from app.telemetry.models import TelemetrySample
from tests.app.builders import delta, job, node, running, snapshot, util_sample
from tests.support.clock import T0

JOBS = Job.__table__  # type: ignore[attr-defined]
NODES = Node.__table__  # type: ignore[attr-defined]
ALLOCATIONS = Allocation.__table__  # type: ignore[attr-defined]
SAMPLES = TelemetrySample.__table__  # type: ignore[attr-defined]
CLUSTERS = Cluster.__table__  # type: ignore[attr-defined]


def _counted(external_id: str, node_name: str, gpus: int) -> dict[str, Any]:
    return job(
        external_id,
        state="running",
        start_time=T0.isoformat(),
        gpus_requested=gpus,
        allocations=[{"node": node_name, "gpu_count": gpus}],
    )


def _job_sample(external_id: str, node_name: str) -> dict[str, Any]:
    return {**util_sample(node_name, T0, 0.5), "job": external_id}


NODES_AT_START = [node(f"n{i}") for i in range(1, 7)]
JOBS_AT_START = [
    running("j1", "n1", [0, 1, 2, 3]),
    running("j2", "n1", [4, 5]),
    running("j3", "n2", list(range(8))),
    running("j4", "n3", [0, 1]),
    job("j5", gpus_requested=2),
    job("j6", gpus_requested=1),
    running("j7", "n5", [0]),
]

# (delta body less kind/session/seq, the field a refusal names or None when accepted)
STEPS: list[tuple[dict[str, Any], str | None]] = [
    ({"jobs": [running("j1", "n1", [0, 1, 2, 3], priority=99)]}, None),
    ({"jobs": [running("j5", "n1", [6, 7])]}, None),
    # j2 holds GPU 5 of n1; the delta names only j6.
    ({"jobs": [running("j6", "n1", [5])]}, "jobs[0].allocations[0].gpu_indices[0]"),
    # n1 is full (j1, j2, j5), by count.
    ({"jobs": [_counted("j6", "n1", 1)]}, "jobs[0].allocations[0]"),
    # j1 moves to n4: its GPUs on n1 are released, and j6 may take one.
    ({"jobs": [running("j1", "n4", [0, 1, 2, 3])]}, None),
    ({"jobs": [running("j6", "n1", [0])]}, None),
    # n2 goes down under j3, a job the delta does not name.
    ({"nodes": [node("n2", state="down")]}, "nodes[0].state"),
    ({"nodes": [node("n5", gpu_count=0)]}, "nodes[0].gpu_count"),
    ({"removed_nodes": ["n4"]}, "removed_nodes[0]"),
    ({"jobs": [job("j3", state="finished", end_time=T0.isoformat())]}, None),
    ({"nodes": [node("n2", state="down")]}, None),
    ({"removed_jobs": ["j4"], "removed_nodes": ["n6"]}, None),
    # A new node and a new job on it, a new job on GPUs j4 left, samples naming stored jobs.
    (
        {
            "nodes": [node("n7")],
            "jobs": [running("j8", "n7", [0, 1]), running("j9", "n3", [0, 1])],
            "samples": [_job_sample("j7", "n5"), _job_sample("j4", "n3")],
        },
        None,
    ),
    ({"samples": [_job_sample("nope", "n5")]}, "samples[0].job"),
    ({"samples": [util_sample("n9", T0, 0.5)]}, "samples[0].node"),
    ({"jobs": [running("j2", "n7", [1])]}, "jobs[0].allocations[0].gpu_indices[0]"),
    ({"jobs": [job("j2", state="pending")], "samples": [util_sample("n1", T0, 0.1)]}, None),
    ({"jobs": [running("j6", "n9", [0])]}, "jobs[0].allocations[0].node"),
]


@pytest.fixture
def clusters(client: TestClient, auth: dict) -> None:
    for name in ("alpha", "beta"):
        response = client.post(
            "/api/v1/clusters", headers=auth["admin"], json={"name": name, "scheduler": "slurm"}
        )
        assert response.status_code == 201


def _stored(session: Session, cluster: str) -> dict[str, Any]:
    """Everything ingest writes for ``cluster``, by name instead of row id."""
    cluster_id = session.execute(
        sa.select(CLUSTERS.c.id).where(CLUSTERS.c.name == cluster)
    ).scalar_one()
    job_names = dict(
        session.execute(
            sa.select(JOBS.c.id, JOBS.c.external_id).where(JOBS.c.cluster_id == cluster_id)
        ).all()
    )
    node_names = dict(
        session.execute(
            sa.select(NODES.c.id, NODES.c.name).where(NODES.c.cluster_id == cluster_id)
        ).all()
    )

    def rows(table: sa.Table, where: Any, skip: set[str]) -> list[tuple[Any, ...]]:
        result = []
        for row in session.execute(sa.select(table).where(where)).mappings():
            values = []
            for key, value in row.items():
                if key in skip:
                    continue
                if key == "job_id":
                    value = job_names.get(value)
                elif key == "node_id":
                    value = node_names.get(value)
                values.append((key, repr(value)))
            result.append(tuple(values))
        return sorted(result)

    return {
        "seq": session.execute(
            sa.select(CLUSTERS.c.last_seq).where(CLUSTERS.c.id == cluster_id)
        ).scalar_one(),
        "jobs": rows(JOBS, JOBS.c.cluster_id == cluster_id, {"id", "cluster_id"}),
        "nodes": rows(NODES, NODES.c.cluster_id == cluster_id, {"id", "cluster_id"}),
        "allocations": rows(ALLOCATIONS, ALLOCATIONS.c.job_id.in_(list(job_names)), {"id"}),
        "samples": rows(SAMPLES, SAMPLES.c.cluster_id == cluster_id, {"id", "cluster_id"}),
    }


def _push_both(
    client: TestClient,
    auth: dict,
    session: Session,
    monkeypatch: pytest.MonkeyPatch,
    body: dict[str, Any],
) -> tuple[int, Any]:
    """``body`` to alpha (scoped) and beta (the whole cluster read); both must answer
    alike and then hold the same rows. Returns alpha's status and answer."""
    acks = {}
    for cluster in ("alpha", "beta"):
        with monkeypatch.context() as patch:
            if cluster == "beta":  # every set over the limit: the whole cluster is read
                patch.setattr(ingest, "_NAMED_LIMIT", -1)
            response = client.post(
                f"/api/v1/clusters/{cluster}/telemetry",
                headers=auth[f"connector_{cluster}"],
                json=body,
            )
        answer = response.json()
        answer.pop("cluster", None)
        acks[cluster] = (response.status_code, answer)
    assert acks["alpha"] == acks["beta"], (body, acks)
    assert _stored(session, "alpha") == _stored(session, "beta"), body
    return acks["alpha"]


@pytest.mark.usefixtures("clusters")
def test_a_delta_is_stored_and_refused_as_against_the_whole_cluster(
    client: TestClient,
    auth: dict,
    session: Session,
    clock: FrozenClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    read: dict[str, list[int]] = {"nodes": [], "jobs": []}

    def spy(name: str, kind: str) -> Callable[..., Any]:
        real = getattr(ingest, name)

        def wrapper(*args: Any) -> Any:
            rows = real(*args)
            read[kind].append(len(rows))
            return rows

        return wrapper

    monkeypatch.setattr(ingest, "_stored_nodes", spy("_stored_nodes", "nodes"))
    monkeypatch.setattr(ingest, "_stored_jobs", spy("_stored_jobs", "jobs"))

    def push(body: dict[str, Any]) -> tuple[int, Any]:
        return _push_both(client, auth, session, monkeypatch, body)

    status, _ = push(snapshot(1, nodes=NODES_AT_START, jobs=JOBS_AT_START))
    assert status == 200
    seq = 2
    for step, (fields, refused_at) in enumerate(STEPS):
        clock.advance(60)
        read["nodes"].clear()
        read["jobs"].clear()
        status, answer = push(delta(seq, **fields))
        if refused_at is None:
            assert status == 200, (step, answer)
            seq += 1
        else:
            assert status == 422, (step, answer)
            assert answer["error"]["field"] == refused_at, step
        # alpha read only the rows the delta names (beta: the whole cluster, 6+ nodes and
        # 7+ jobs); an accepted one with new rows reads again after inserting them.
        named_nodes = {n["name"] for n in fields.get("nodes", [])} | set(
            fields.get("removed_nodes", [])
        )
        named_nodes |= {a["node"] for j in fields.get("jobs", []) for a in j.get("allocations", [])}
        named_nodes |= {s["node"] for s in fields.get("samples", [])}
        named_jobs = {j["external_id"] for j in fields.get("jobs", [])}
        named_jobs |= set(fields.get("removed_jobs", [])) | {
            s["job"] for s in fields.get("samples", []) if "job" in s
        }
        assert read["nodes"][0] <= len(named_nodes), step
        assert read["jobs"][0] <= len(named_jobs), step

    # The allocation history is kept the same way: j1's move closed its n1 allocation.
    stored = _stored(session, "alpha")
    j1 = [dict(a) for a in stored["allocations"] if dict(a)["job_id"] == "'j1'"]
    assert sorted(a["released_at"] == "None" for a in j1) == [False, True]
    # A snapshot of the same cluster afterwards changes nothing more on either.
    clock.advance(60)
    final = [running("j1", "n4", [0, 1, 2, 3], priority=99), running("j5", "n1", [6, 7])]
    status, answer = push(snapshot(seq, nodes=NODES_AT_START, jobs=final))
    assert status == 200, answer


FUZZ_NODES = [f"n{i}" for i in range(5)]


def _random_job(rng: random.Random) -> dict[str, Any]:
    """One of 12 jobs in a random state, holding random GPUs (by index or by count) on
    random nodes, an unknown one (n9) at times: often impossible, on purpose."""
    state = rng.choice(["pending", "running", "running", "suspended", "finished"])
    fields: dict[str, Any] = {"state": state, "priority": rng.randint(0, 3)}
    if state in ("running", "suspended"):
        allocations: list[dict[str, Any]] = []
        for name in rng.sample([*FUZZ_NODES, "n9"], rng.choice([0, 1, 1, 2])):
            gpus = rng.randint(1, 4)
            if rng.random() < 0.5:
                allocations.append({"node": name, "gpu_indices": rng.sample(range(9), gpus)})
            else:
                allocations.append({"node": name, "gpu_count": gpus})
        held = sum(a.get("gpu_count", len(a.get("gpu_indices", []))) for a in allocations)
        fields |= {
            "start_time": T0.isoformat(),
            "allocations": allocations,
            "gpus_requested": max(1, held),
        }
    return job(f"j{rng.randrange(12)}", **fields)


def _random_delta(rng: random.Random, seq: int) -> dict[str, Any]:
    draw = rng.random()
    if draw < 0.6:
        jobs = {j["external_id"]: j for j in (_random_job(rng) for _ in range(rng.choice([1, 2])))}
        return delta(seq, jobs=list(jobs.values()))
    if draw < 0.7:
        return delta(seq, removed_jobs=[f"j{rng.randrange(12)}"])
    if draw < 0.8:
        state = rng.choice(["up", "draining", "down"])
        reported = node(rng.choice(FUZZ_NODES), state=state, gpu_count=rng.choice([4, 8, 8]))
        return delta(seq, nodes=[reported])
    if draw < 0.85:
        return delta(seq, removed_nodes=[rng.choice(FUZZ_NODES)])
    sample = util_sample(rng.choice([*FUZZ_NODES, "n9"]), T0, 0.5)
    return delta(seq, samples=[{**sample, "job": f"j{rng.randrange(14)}"}])


@pytest.mark.usefixtures("clusters")
@pytest.mark.parametrize("seed", [3, 11])
def test_random_deltas_are_stored_and_refused_as_against_the_whole_cluster(
    client: TestClient,
    auth: dict,
    session: Session,
    clock: FrozenClock,
    monkeypatch: pytest.MonkeyPatch,
    seed: int,
) -> None:
    """Random deltas, most of them impossible, on a small cluster: alpha and beta agree
    push after push (a refusal naming the same field and holder)."""
    rng = random.Random(seed)
    body = snapshot(1, nodes=[node(name) for name in FUZZ_NODES])
    assert _push_both(client, auth, session, monkeypatch, body)[0] == 200
    seq, accepted = 2, 0
    for _ in range(40):
        clock.advance(10)
        status, _answer = _push_both(client, auth, session, monkeypatch, _random_delta(rng, seq))
        if status == 200:
            seq, accepted = seq + 1, accepted + 1
    assert 8 < accepted < 40  # both outcomes were exercised
