"""``gpu_latest_samples``: each GPU's newest utilization and memory sample, kept by the
connector's ingest and the node agents' samples, read by the cluster map, on both
backends."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlmodel import Session, col, select

from app.clusters import service as cluster_service
from app.core import migrate
from app.core.clock import FrozenClock
from app.core.db import make_engine
from app.gpu_models import service as gpu_model_service
from app.nodes import cluster_map
from app.nodes.models import MapNode, Node
from app.telemetry import service as telemetry_service
from app.telemetry.models import NODE_WIDE, GpuLatestSample, TelemetrySample
from tests.app.builders import delta, node, registered_with, snapshot
from tests.support.clock import T0
from wire.telemetry import SampleReport, TelemetryDelta


def _sample(
    at: datetime, value: float, *, gpu: int | None = 0, metric: str = "gpu_util", on: str = "n1"
) -> dict[str, Any]:
    sample = {"at": at.isoformat(), "metric": metric, "node": on, "value": value}
    return sample if gpu is None else {**sample, "gpu_index": gpu}


def _push(session: Session, seq: int, samples: list[dict[str, Any]], now: datetime) -> None:
    push = TelemetryDelta.model_validate(delta(seq, samples=samples))
    telemetry_service.ingest(session=session, cluster_name="alpha", push=push, now=now)


def _rows(session: Session) -> dict[tuple[str, str, int], tuple[datetime, float]]:
    rows = session.exec(
        select(Node.name, GpuLatestSample).join(Node, col(Node.id) == GpuLatestSample.node_id)
    ).all()
    return {(name, str(r.metric), r.gpu_index): (r.at, r.value) for name, r in rows}


def _map_nodes(session: Session, now: datetime, *, from_latest: bool) -> dict[str, MapNode]:
    drawn = cluster_map.cluster_map(
        session=session, cluster="alpha", now=now, from_latest=from_latest
    )
    return {n.name: n for n in drawn.nodes}


@pytest.mark.parametrize("from_latest", [False, True], ids=["window", "latest"])
def test_a_late_older_sample_does_not_replace_a_newer_one(
    session: Session, clock: FrozenClock, from_latest: bool
) -> None:
    now = clock.now()
    newer, older = now - timedelta(minutes=1), now - timedelta(minutes=3)
    registered_with(
        session,
        "alpha",
        snapshot(
            1,
            samples=[
                _sample(newer, 0.9),
                _sample(newer, 40.0, metric="gpu_mem_used_gib", gpu=None),
                # Not a GPU figure the map shows: not kept.
                _sample(newer, 0.5, metric="cpu_util", gpu=None),
            ],
        ),
        now=now,
    )
    # The connector sends late what it measured before; the node's agent too.
    _push(session, 2, [_sample(older, 0.1), _sample(newer + timedelta(seconds=5), 0.7, gpu=1)], now)
    telemetry_service.record_node_samples(
        session=session,
        cluster_name="alpha",
        node_name="n1",
        samples=[
            SampleReport.model_validate(_sample(older, 2.0, metric="gpu_mem_used_gib", gpu=None))
        ],
        now=now,
    )
    assert _rows(session) == {
        ("n1", "gpu_util", 0): (newer, 0.9),
        ("n1", "gpu_util", 1): (newer + timedelta(seconds=5), 0.7),
        ("n1", "gpu_mem_used_gib", NODE_WIDE): (newer, 40.0),
    }
    n1 = _map_nodes(session, now, from_latest=from_latest)["n1"]
    assert n1.util[:3] == [0.9, 0.7, None]
    assert n1.mem_used_gib == [40.0] * 8
    # A newer one, from either writer, does; one at the same instant too (written later).
    _push(session, 3, [_sample(now, 0.2)], now)
    telemetry_service.record_node_samples(
        session=session,
        cluster_name="alpha",
        node_name="n1",
        samples=[
            SampleReport.model_validate(_sample(now, 0.3)),
            SampleReport.model_validate(_sample(newer, 8.0, metric="gpu_mem_used_gib", gpu=None)),
        ],
        now=now,
    )
    assert _rows(session)[("n1", "gpu_util", 0)] == (now, 0.3)
    assert _rows(session)[("n1", "gpu_mem_used_gib", NODE_WIDE)] == (newer, 8.0)
    n1 = _map_nodes(session, now, from_latest=from_latest)["n1"]
    assert n1.util[:2] == [0.3, 0.7] and n1.mem_used_gib == [8.0] * 8


@pytest.mark.parametrize("from_latest", [False, True], ids=["window", "latest"])
def test_a_sample_older_than_the_maps_window_is_not_shown(
    session: Session, clock: FrozenClock, from_latest: bool
) -> None:
    now = clock.now()
    window = cluster_map.MEASURED_WINDOW
    registered_with(
        session,
        "alpha",
        snapshot(
            1,
            samples=[
                _sample(now - timedelta(minutes=1), 0.9),
                # The latest of n2, but older than the window: n2 is not measured now.
                _sample(now - window - timedelta(seconds=1), 0.4, on="n2", gpu=None),
            ],
        ),
        now=now,
    )
    nodes = _map_nodes(session, now, from_latest=from_latest)
    assert nodes["n1"].util[0] == 0.9
    assert nodes["n2"].util == [None] * 8
    # n1's sample ages out of the window as the clock moves on.
    at_edge = _map_nodes(session, now - timedelta(minutes=1) + window, from_latest=from_latest)
    assert at_edge["n1"].util[0] == 0.9
    later = now + window
    assert _map_nodes(session, later, from_latest=from_latest)["n1"].util[0] is None


def test_a_nodes_rows_go_with_its_cluster_and_stay_while_it_is_down(
    session: Session, clock: FrozenClock
) -> None:
    now = clock.now()
    registered_with(
        session,
        "alpha",
        snapshot(1, nodes=[node("n1"), node("n2")], samples=[_sample(now, 0.5, on="n2")]),
        now=now,
    )
    # n2 leaves the cluster's report: marked down, drawn with what it last measured.
    telemetry_service.ingest(
        session=session,
        cluster_name="alpha",
        push=TelemetryDelta.model_validate(delta(2, removed_nodes=["n2"])),
        now=now,
    )
    n2 = _map_nodes(session, now, from_latest=True)["n2"]
    assert (n2.state, n2.util[0]) == ("down", 0.5)
    cluster_service.delete_cluster(session=session, name="alpha", now=now)
    assert session.exec(select(GpuLatestSample)).all() == []


def test_a_connector_and_node_agents_writing_the_same_gpus_at_once_keep_the_newest(
    make_postgres_database: Any,
) -> None:
    """On PostgreSQL, where writers run at once: the connector's ingest and two node
    agents report the same GPUs in lock step, round after round, each in its own
    transaction; none deadlocks or is refused, and the table ends as the newest sample of
    each GPU and metric among all those stored."""
    url = make_postgres_database("latest_writers")
    migrate.upgrade(url)
    engine = make_engine(url, pool_size=4)
    rounds, start = 15, T0 + timedelta(hours=1)
    barrier = threading.Barrier(3, timeout=120)
    failures: list[BaseException] = []

    def at(round_: int, rng: random.Random, parity: int) -> datetime:
        # Whole rounds of 10 s, late by up to two; the connector's µs even and the agents'
        # odd: no two writers stamp one GPU at the same instant (a tie goes to the one
        # that commits last, not to the sample's id).
        late = rng.randrange(3)
        micro = rng.randrange(5 * 10**6) * 2 + parity
        return start + timedelta(seconds=10 * (round_ - late), microseconds=micro)

    def connector(session: Session, round_: int, rng: random.Random) -> None:
        samples = [
            _sample(at(round_, rng, 0), rng.random(), gpu=gpu, on=name, metric=metric)
            for name in ("n1", "n2")
            for gpu in range(8)
            for metric in ("gpu_util", "gpu_mem_used_gib")
        ]
        now = start + timedelta(seconds=10 * round_ + 10)
        _push(session, round_ + 2, samples, now)

    def agent(name: str) -> Callable[[Session, int, random.Random], None]:
        def write(session: Session, round_: int, rng: random.Random) -> None:
            samples = [
                SampleReport.model_validate(
                    _sample(at(round_, rng, 1), rng.random(), gpu=gpu, on=name)
                )
                for gpu in reversed(range(8))
            ]
            now = start + timedelta(seconds=10 * round_ + 10)
            telemetry_service.record_node_samples(
                session=session, cluster_name="alpha", node_name=name, samples=samples, now=now
            )

        return write

    def run(write: Callable[[Session, int, random.Random], None], seed: int) -> None:
        rng = random.Random(seed)
        try:
            for round_ in range(rounds):
                barrier.wait()
                with Session(engine) as session:
                    write(session, round_, rng)
        except BaseException as exc:
            failures.append(exc)
            barrier.abort()

    try:
        with Session(engine) as session:
            gpu_model_service.ensure_default_catalogue(session=session)
            registered_with(session, "alpha", snapshot(1), now=start)
        threads = [
            threading.Thread(target=run, args=(write, seed))
            for seed, write in enumerate((connector, agent("n1"), agent("n2")))
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert failures == []
        with Session(engine) as session:
            samples = session.exec(
                select(TelemetrySample).order_by(col(TelemetrySample.at), col(TelemetrySample.id))
            ).all()
            newest = {(s.node_id, str(s.metric), s.gpu_index): (s.at, s.value) for s in samples}
            kept = {
                (r.node_id, str(r.metric), r.gpu_index): (r.at, r.value)
                for r in session.exec(select(GpuLatestSample)).all()
            }
        assert len(kept) == 2 * 8 * 2 and kept == newest
    finally:
        engine.dispose()
