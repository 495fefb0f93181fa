"""The idle-GPU classifier: each cause, the precedence between them, and the books: the
causes add up to the idle GPUs counted GPU by GPU, on hand-made and random clusters."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from solver.diagnosis import (
    AllocationAt,
    ClusterAt,
    IdleCause,
    IdleHours,
    NodeAt,
    QueuedJobAt,
    classify,
)
from solver.diagnosis.causes import PRECEDENCE
from solver.instance import NodeState

H100, A100 = "H100", "A100"


def _causes(cluster: ClusterAt) -> dict[IdleCause, int]:
    return {cause: gpus for cause, gpus in classify(cluster).gpus_by_cause().items() if gpus}


def _node(name: str = "n1", gpus: int = 8, model: str = H100, **fields: object) -> NodeAt:
    return NodeAt(name=name, gpu_model=model, gpus=gpus, **fields)  # type: ignore[arg-type]


def test_no_demand_when_nothing_is_queued() -> None:
    cluster = ClusterAt(nodes=(_node(),), allocations=(AllocationAt("n1", "x", 3),))
    assert _causes(cluster) == {IdleCause.no_demand: 5}
    assert classify(cluster).busy == 3


def test_heterogeneity_when_no_queued_job_accepts_the_model() -> None:
    cluster = ClusterAt(
        nodes=(_node("h", model=H100), _node("a", gpus=4, model=A100)),
        allocations=(AllocationAt("a", "x", 4),),
        queue=(QueuedJobAt("x", 2, gpu_models=frozenset({A100})),),
    )
    assert _causes(cluster) == {IdleCause.heterogeneity: 8}


def test_quota_when_every_accepting_job_is_of_a_team_at_its_cap() -> None:
    cluster = ClusterAt(
        nodes=(_node("n1"), _node("n2")),
        allocations=(AllocationAt("n1", "x", 8),),
        queue=(QueuedJobAt("x", 2),),
        quota_caps={"x": 9},  # 8 held + 2 asked > 9
    )
    diagnosis = classify(cluster)
    assert _causes(cluster) == {IdleCause.quota: 8}
    assert {share.team for share in diagnosis.idle} == {"x"}


def test_queue_order_when_an_admissible_job_fits_and_waits() -> None:
    cluster = ClusterAt(nodes=(_node(),), queue=(QueuedJobAt("x", 2),), quota_caps={"x": 2})
    assert _causes(cluster) == {IdleCause.queue_order: 8}


def test_fragmentation_when_no_admissible_job_fits_any_node() -> None:
    # 3 + 3 free GPUs; the queued job needs 4 on one node.
    cluster = ClusterAt(
        nodes=(_node("n1", gpus=4), _node("n2", gpus=4)),
        allocations=(AllocationAt("n1", "x", 1), AllocationAt("n2", "x", 1)),
        queue=(QueuedJobAt("y", 4),),
    )
    assert _causes(cluster) == {IdleCause.fragmentation: 6}


def test_gang_waiting_where_a_member_fits_but_the_gang_does_not() -> None:
    # A gang of two 8-GPU members: n1 has room for one, n2 for none.
    cluster = ClusterAt(
        nodes=(_node("n1"), _node("n2")),
        allocations=(AllocationAt("n2", "x", 4),),
        queue=(QueuedJobAt("y", 16, members=2),),
    )
    diagnosis = classify(cluster)
    by_node = {share.node: share.cause for share in diagnosis.idle}
    assert by_node == {"n1": IdleCause.gang_waiting, "n2": IdleCause.fragmentation}


def test_a_job_limited_to_few_nodes_needs_its_share_on_each() -> None:
    """The simulator's 12-GPU job on at most 2 nodes needs 6 on some node: 4 free GPUs on
    each of three nodes hold it neither per node nor as a whole."""
    nodes = tuple(_node(f"n{i}") for i in range(3))
    allocations = tuple(AllocationAt(f"n{i}", "x", 4) for i in range(3))
    job = QueuedJobAt("y", 12, members=12, max_nodes=2)
    assert job.smallest_piece == 6
    cluster = ClusterAt(nodes=nodes, allocations=allocations, queue=(job,))
    assert _causes(cluster) == {IdleCause.fragmentation: 12}


def test_draining_and_down_nodes() -> None:
    cluster = ClusterAt(
        nodes=(
            _node("d", state=NodeState.down),
            _node("r", state=NodeState.draining),
        ),
        # On a down node even held GPUs do no work; on a draining one they still run.
        allocations=(AllocationAt("d", "x", 2), AllocationAt("r", "x", 2)),
        queue=(QueuedJobAt("y", 1),),
    )
    assert _causes(cluster) == {IdleCause.draining_down: 14}
    assert classify(cluster).busy == 2


def test_reservation_of_free_gpus_and_of_replicas_above_demand() -> None:
    cluster = ClusterAt(
        nodes=(_node(reserved_gpus=2, reserved_for="svc"),),
        allocations=(AllocationAt("n1", "inference", 4, busy=0.0, above_demand=3),),
        queue=(QueuedJobAt("y", 1),),
    )
    # 3 replicas above demand (reservation, not allocated_idle though measured at 0), the
    # 4th measured idle, 2 free reserved, 2 free open for the queued job.
    assert _causes(cluster) == {
        IdleCause.reservation: 5,
        IdleCause.allocated_idle: 1,
        IdleCause.queue_order: 2,
    }


def test_allocated_idle_needs_a_measurement_below_the_threshold() -> None:
    cluster = ClusterAt(
        nodes=(_node(gpus=6),),
        allocations=(
            AllocationAt("n1", "x", 2, busy=0.05),
            AllocationAt("n1", "x", 2, busy=0.5),
            AllocationAt("n1", "x", 2, busy=None),
        ),
        busy_threshold=0.1,
    )
    assert _causes(cluster) == {IdleCause.allocated_idle: 2}
    assert classify(cluster).busy == 4


def test_precedence_heterogeneity_before_quota_before_shape() -> None:
    """A job of a capped team that accepts only A100 waits; H100 GPUs are idle for
    heterogeneity even though the team is at its cap, and A100 GPUs for quota even though
    the job would not fit them either."""
    cluster = ClusterAt(
        nodes=(_node("h", model=H100), _node("a", gpus=2, model=A100)),
        queue=(QueuedJobAt("x", 4, gpu_models=frozenset({A100})),),
        quota_caps={"x": 0},
    )
    by_node = {share.node: share.cause for share in classify(cluster).idle}
    assert by_node == {"h": IdleCause.heterogeneity, "a": IdleCause.quota}


def test_precedence_an_admissible_fitting_job_beats_a_blocked_one() -> None:
    """One job fits and could start; another is quota-blocked; a third is too big: the
    free GPUs are idle for queue order, and their team is the fitting job's."""
    cluster = ClusterAt(
        nodes=(_node(),),
        queue=(QueuedJobAt("big", 16), QueuedJobAt("capped", 1), QueuedJobAt("small", 2)),
        quota_caps={"capped": 0},
    )
    (share,) = classify(cluster).idle
    assert (share.cause, share.team) == (IdleCause.queue_order, "small")


def test_precedence_order_is_declared() -> None:
    assert PRECEDENCE[0] is IdleCause.draining_down
    assert PRECEDENCE.index(IdleCause.quota) < PRECEDENCE.index(IdleCause.fragmentation)
    assert len(set(PRECEDENCE)) == len(IdleCause)


def test_allocations_beyond_a_node_are_trimmed_and_the_books_still_balance() -> None:
    cluster = ClusterAt(
        nodes=(_node(gpus=4),),
        allocations=(AllocationAt("n1", "x", 3), AllocationAt("n1", "y", 3, busy=0.0)),
    )
    diagnosis = classify(cluster)
    assert (diagnosis.busy, _causes(cluster)) == (3, {IdleCause.allocated_idle: 1})


# ------------------------------------------------------------------ the books, at random


def _idle_gpu_by_gpu(cluster: ClusterAt) -> int:
    """The oracle: walk every GPU of every node and decide whether it does work."""
    idle = 0
    for node in cluster.nodes:
        slots: list[bool] = []  # one per GPU held, True when that GPU works
        for allocation in cluster.allocations:
            if allocation.node != node.name:
                continue
            for index in range(allocation.gpus):
                above_demand = index < allocation.above_demand
                measured_idle = (
                    allocation.busy is not None and allocation.busy < cluster.busy_threshold
                )
                slots.append(not above_demand and not measured_idle)
        slots = slots[: node.gpus]
        if node.state is NodeState.down:
            idle += node.gpus
        else:
            idle += node.gpus - sum(slots)
    return idle


def random_cluster(seed: int) -> ClusterAt:
    rng = random.Random(seed)
    models = (H100, A100, "L4")
    teams = ("a", "b", "c")
    nodes = tuple(
        NodeAt(
            name=f"n{i}",
            gpu_model=rng.choice(models),
            gpus=rng.choice((1, 2, 4, 8)),
            state=rng.choice([NodeState.up] * 4 + list(NodeState)),
            reserved_gpus=rng.choice((0, 0, 0, 1, 3)),
        )
        for i in range(rng.randint(0, 8))
    )
    allocations = tuple(
        AllocationAt(
            node=rng.choice(nodes).name,
            team=rng.choice(teams),
            gpus=rng.randint(1, 6),
            busy=rng.choice((None, 0.0, 0.05, 0.5, 1.0)),
            above_demand=rng.choice((0, 0, 1, 2)),
        )
        for _ in range(rng.randint(0, 10) if nodes else 0)
    )
    queue = []
    for _ in range(rng.randint(0, 6)):
        members = rng.choice((1, 1, 2, 4))
        queue.append(
            QueuedJobAt(
                team=rng.choice(teams),
                gpus=members * rng.choice((1, 2, 4, 8)),
                gpu_models=frozenset(rng.sample(models, rng.randint(0, 2))),
                members=members,
                max_nodes=rng.choice((None, 1, 2)),
            )
        )
    caps = {team: rng.randint(0, 16) for team in teams if rng.random() < 0.5}
    return ClusterAt(nodes, allocations, tuple(queue), caps, rng.choice((0.1, 0.3)))


@settings(max_examples=300, deadline=None)
@given(st.integers(min_value=0, max_value=2**32))
def test_causes_add_up_to_the_idle_gpus_counted_one_by_one(seed: int) -> None:
    cluster = random_cluster(seed)
    diagnosis = classify(cluster)
    counted = _idle_gpu_by_gpu(cluster)
    assert sum(share.gpus for share in diagnosis.idle) == counted
    assert diagnosis.capacity - diagnosis.busy == counted
    assert all(share.gpus > 0 for share in diagnosis.idle)
    if not cluster.queue:
        queue_causes = set(PRECEDENCE[PRECEDENCE.index(IdleCause.heterogeneity) :])
        assert not queue_causes & {share.cause for share in diagnosis.idle}


@settings(max_examples=100, deadline=None)
@given(
    st.integers(min_value=0, max_value=2**32),
    st.lists(st.floats(min_value=0, max_value=20_000, allow_nan=False), min_size=2, max_size=8),
)
def test_idle_hours_add_up_over_time_and_buckets(seed: int, times: list[float]) -> None:
    """Diagnoses held over random intervals, split at hour boundaries: per bucket and in
    total, the causes add up to capacity − busy, and capacity to GPUs × time."""
    times = sorted(times)
    hours = IdleHours(origin=times[0] - 1234.5)
    expected_capacity = 0.0
    expected_idle = 0.0
    for index, (start, end) in enumerate(zip(times, times[1:], strict=False)):
        cluster = random_cluster(seed + index)
        diagnosis = classify(cluster)
        hours.add(diagnosis, cluster="c", start=start, end=end)
        expected_capacity += diagnosis.capacity * (end - start) / 3600
        expected_idle += _idle_gpu_by_gpu(cluster) * (end - start) / 3600
    by_cause = sum(hours.hours_by_cause().values())
    assert by_cause == pytest.approx(expected_idle, rel=1e-9, abs=1e-9)
    assert hours.idle_gpu_hours == pytest.approx(expected_idle, rel=1e-9, abs=1e-9)
    assert hours.capacity_gpu_hours == pytest.approx(expected_capacity, rel=1e-9, abs=1e-9)
    per_bucket: dict[int, float] = {}
    for row in hours.rows():
        per_bucket[row.bucket] = per_bucket.get(row.bucket, 0.0) + row.gpu_hours
    for row in hours.capacity_rows():
        per_bucket[row.bucket] = per_bucket.get(row.bucket, 0.0) - (
            row.capacity_gpu_hours - row.busy_gpu_hours
        )
    assert all(abs(gap) < 1e-6 for gap in per_bucket.values())


def test_an_interval_across_hours_is_split_at_the_boundaries() -> None:
    diagnosis = classify(ClusterAt(nodes=(_node(gpus=2),)))
    hours = IdleHours(origin=0.0)
    hours.add(diagnosis, cluster="c", start=1800.0, end=9000.0)  # 0:30 → 2:30
    assert [(row.bucket, row.gpu_hours) for row in hours.rows()] == [(0, 1.0), (1, 2.0), (2, 1.0)]
