"""The why-idle replay's sweep: a state is built again only when it changed, so a long
queue of a few shapes is classified once per change of those shapes, not per job."""

from __future__ import annotations

import random
from datetime import timedelta

import pytest
from fastapi.testclient import TestClient
from sqlmodel import Session

from app.clusters import service as cluster_service
from app.core.clock import FrozenClock
from app.core.lookup import row_id
from app.diagnosis.history import Window, _Sweep, replay
from tests.app.builders import job, node, snapshot
from tests.support.clock import T0

TELEMETRY = "/api/v1/clusters/alpha/telemetry"


@pytest.mark.parametrize("seed", range(20))
def test_the_sweep_holds_what_started_and_has_not_ended(seed: int) -> None:
    rng = random.Random(seed)
    spans = []
    for _ in range(rng.randint(0, 40)):
        start = rng.choice([rng.uniform(0, 100), float(rng.randint(0, 10))])
        end = rng.choice([start + rng.uniform(0, 30), start, start - 1.0, float("inf")])
        spans.append((start, end))
    spans.sort(key=lambda span: span[0])
    times = sorted({rng.uniform(0, 120) for _ in range(30)} | {s for s, _ in spans})
    sweep, before = _Sweep(spans), set[int]()
    for t in times:
        added, dropped = sweep.advance(t)
        expected = [i for i, (start, end) in enumerate(spans) if start <= t < end]
        assert list(sweep.active) == expected  # in order of start, as the classifier reads
        assert set(added) == set(expected) - before and set(dropped) == before - set(expected)
        before = set(expected)


def test_a_queue_of_two_shapes_is_two_states(
    client: TestClient, auth: dict[str, dict[str, str]], clock: FrozenClock, session: Session
) -> None:
    """40 jobs submitted a minute apart, of two shapes: x's 2 GPUs on A100s only (from
    T0), y's gang of 2 × 8 on any model (from T0 + 1 min). n1 (H100) idles for
    heterogeneity until y's first job comes, queue_order after; n2 (A100) queue_order."""
    client.post(
        "/api/v1/clusters", headers=auth["admin"], json={"name": "alpha", "scheduler": "sim"}
    )
    jobs = [
        job(f"j{k}", team="x", gpus_requested=2, allowed_gpu_models=["A100-80G"])
        if k % 2 == 0
        else job(f"j{k}", team="y", gpus_requested=16, gang_size=2)
        for k in range(40)
    ]
    for k, queued in enumerate(jobs):
        queued["submit_time"] = (T0 + timedelta(minutes=k)).isoformat()
    clock.advance(45 * 60)
    nodes = [node("n1"), node("n2", gpu_model="A100-80G")]
    response = client.post(
        TELEMETRY, headers=auth["connector_alpha"], json=snapshot(1, nodes=nodes, jobs=jobs)
    )
    assert response.status_code == 200, response.text

    until = T0 + timedelta(hours=1)
    row = cluster_service.get_cluster(session=session, name="alpha")
    window = Window(row_id(row), "alpha", T0, until, bucket_s=3600, busy_threshold=0.1)
    states = [state for _, _, state in replay(session, window)]
    assert len(states) == 40  # T0, each later submit minute, until
    distinct = [s for i, s in enumerate(states) if i == 0 or s is not states[i - 1]]
    assert [sorted(j.team for j in s.queue) for s in distinct] == [["x"], ["x", "y"]]

    body = client.get(
        "/api/v1/diagnosis",
        headers=auth["viewer"],
        params={"cluster": "alpha", "since": T0.isoformat(), "until": until.isoformat()},
    ).json()
    causes = {c["cause"]: c["gpu_hours"] for c in body["causes"] if c["gpu_hours"]}
    assert causes == {"heterogeneity": round(8 / 60, 6), "queue_order": round(16 - 8 / 60, 6)}
    assert body["idle_gpu_hours"] == pytest.approx(sum(causes.values()))
