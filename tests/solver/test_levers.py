"""The shaper's levers (``SolverConfig.migration``, ``preemption``, ``replica_moves``,
``lookahead``, ``elastic_resize``): each turned off removes what it does, and nothing
else, so that the simulator's ablation rows attribute every gain."""

from __future__ import annotations

import pytest

from solver.plan import ActionKind, ReasonCode
from solver.policies import get_policy
from solver.validate import validate

from .builders import FAST, NOW, instance, job, node, running, service


def _kinds(inst) -> set[ActionKind]:  # type: ignore[no-untyped-def]
    plan = get_policy("shaper").plan(inst)
    assert not validate(inst, plan)
    return {a.kind for a in plan.actions}


def test_without_migration_a_gang_is_not_made_room_for_by_moving_work() -> None:
    jobs = [
        running("r1", {"a": 4}, checkpointable=True, preemptible=False),
        running("r2", {"b": 4}, checkpointable=True, preemptible=False),
        job("p", 8),
    ]
    nodes = [node("a"), node("b")]
    assert ActionKind.migrate in _kinds(instance(nodes, jobs))
    off = FAST.model_copy(update={"migration": False})
    assert ActionKind.migrate not in _kinds(instance(nodes, jobs, config=off))


def test_a_job_that_fits_one_node_moves_only_what_is_in_its_way() -> None:
    # 3 GPUs free on a, 2 on b: the 4-GPU job fits nowhere until the 1-GPU job on a
    # moves to b; the 4-GPU job that cannot move stays on a.
    jobs = [
        running("small", {"a": 1}, checkpointable=True, preemptible=False),
        running("stays", {"a": 4}, preemptible=False),
        running("fixed", {"b": 6}, preemptible=False),
        job("p", 4),
    ]
    nodes = [node("a"), node("b")]
    plan = get_policy("shaper").plan(instance(nodes, jobs))
    assert not validate(instance(nodes, jobs), plan)
    assert plan.placement["p"] == {"a": 4}
    assert plan.placement["small"] == {"b": 1}
    assert {a.job_id for a in plan.actions if a.kind is ActionKind.migrate} == {"small"}
    off = FAST.model_copy(update={"migration": False})
    assert ActionKind.start not in _kinds(instance(nodes, jobs, config=off))


def test_service_replicas_move_to_empty_a_node_for_a_gang() -> None:
    # One replica of each of two services on each of two nodes: 14 of 16 GPUs free and
    # nowhere for the 8-GPU gang, until one replica restarts beside the other.
    jobs = [
        service("chat", (1,), {"a": 1}, preemptible=False),
        service("embed", (1,), {"b": 1}, preemptible=False),
        job("gang", 8),
    ]
    nodes = [node("a"), node("b")]
    plan = get_policy("shaper").plan(instance(nodes, jobs))
    assert not validate(instance(nodes, jobs), plan)
    assert plan.placement["gang"] in ({"a": 8}, {"b": 8})
    emptied = next(iter(plan.placement["gang"]))
    moved = [a for a in plan.actions if a.kind is ActionKind.resize]
    assert len(moved) == 1 and moved[0].replicas == 1  # same size, another node
    assert emptied in moved[0].from_placement and emptied not in moved[0].to_placement
    assert moved[0].reason.code is ReasonCode.defragmentation
    off = FAST.model_copy(update={"replica_moves": False})
    kinds = _kinds(instance(nodes, jobs, config=off))
    assert ActionKind.start not in kinds and ActionKind.resize not in kinds


@pytest.mark.parametrize(
    ("chat", "moves"),
    [
        # One replica on a: moving it would stop the service while the gang starts.
        ({"a": 1}, False),
        # Two, one on a and one on b: the one on b stays, the one on a may go.
        ({"a": 1, "b": 1}, True),
    ],
)
def test_shrinking_first_a_move_keeps_a_replica_where_it_is(
    chat: dict[str, int], moves: bool
) -> None:
    """``replica_moves_shrink_first`` (the control plane's): a move is a shrink, then the
    growth back once the gang runs, so the service must keep a replica meanwhile."""
    jobs = [
        service("chat", (len(chat),), chat, preemptible=False),
        service("embed", (1,), {"b": 1}, preemptible=False),
        job("gang", 8),
    ]
    nodes = [node("a"), node("b"), node("c", gpus=2)]
    config = FAST.model_copy(update={"replica_moves_shrink_first": True})
    plan = get_policy("shaper").plan(instance(nodes, jobs, config=config))
    assert ("gang" in plan.placement) is moves, plan.placement
    if moves:
        assert plan.placement["gang"] == {"a": 8}
        assert "a" not in plan.placement["chat"] and plan.placement["chat"].get("b") == 1


def test_without_migration_a_frozen_resident_is_not_blamed_on_the_budget() -> None:
    # With migration off, a dwell-frozen checkpointable job is not a move the budget
    # held back: the gang waits for fragmentation, whatever replica_moves says.
    jobs = [
        running("held", {"a": 4}, checkpointable=True, last_acted_at=NOW - 60),
        running("pinned", {"b": 4}, preemptible=False),
        job("gang", 8, max_nodes=1),
    ]
    off = FAST.model_copy(update={"migration": False, "use_cp_sat": False})
    plan = get_policy("shaper").plan(instance([node("a"), node("b")], jobs, config=off))
    assert plan.pending["gang"].code is ReasonCode.fragmentation


def test_without_preemption_higher_priority_work_waits() -> None:
    jobs = [running("low", {"a": 8}, priority=1.0), job("high", 8, priority=10.0)]
    assert _kinds(instance([node("a")], jobs)) & {ActionKind.preempt, ActionKind.requeue}
    off = FAST.model_copy(update={"preemption": False})
    kinds = _kinds(instance([node("a")], jobs, config=off))
    assert not kinds & {ActionKind.preempt, ActionKind.requeue, ActionKind.start}


def test_without_service_resize_a_service_keeps_its_daily_peak() -> None:
    # Demand 1 now, 4 later in the day: following demand shrinks it to 1; off, it keeps 4.
    chat = service("chat", (1, 1, 4), placement={"a": 4})
    nodes = [node("a")]
    follow = get_policy("shaper").plan(instance(nodes, [chat]))
    assert sum(follow.placement["chat"].values()) < 4
    off = FAST.model_copy(update={"elastic_resize": False})
    peak = get_policy("shaper").plan(instance(nodes, [chat], config=off))
    assert sum(peak.placement["chat"].values()) == 4


def test_the_look_ahead_counts_gpus_that_free_up_before_the_peak() -> None:
    # The service needs 6 more GPUs in 2 h. Node a has 6 free GPUs plus 2 held by the
    # service; b's 8 GPUs are held by a job. A long 4-GPU job fits on a now.
    def jobs(b_ends_in_s: float) -> list:  # type: ignore[type-arg]
        return [
            service("s", (2, 2, 8), {"a": 2}, min_replicas=1),
            running("b-job", {"b": 8}, expected_runtime_s=b_ends_in_s + 3600.0),
            job("long", 4, expected_runtime_s=36_000),
        ]

    nodes = [node("a"), node("b")]
    # b frees its 8 GPUs within the hour: the peak can take those, so the long job starts.
    freed = get_policy("shaper").plan(instance(nodes, jobs(1800.0)))
    assert "long" in freed.placement
    # b runs on past the peak: a's GPUs are all the service will have, so they are kept.
    kept = get_policy("shaper").plan(instance(nodes, jobs(10 * 3600.0)))
    assert kept.pending["long"].code is ReasonCode.forecast_reservation
    # And with the look-ahead off, it starts either way.
    off = FAST.model_copy(update={"lookahead": False})
    assert (
        "long"
        in get_policy("shaper").plan(instance(nodes, jobs(10 * 3600.0), config=off)).placement
    )


def test_the_look_ahead_keeps_no_gpus_from_a_job_that_has_waited_its_aging_period() -> None:
    # As above, b runs on past the peak, so a's free GPUs are all the service will have;
    # but the long job has waited 13 h, past the 12 h aging period: a forecast peak must
    # not keep it waiting for ever (where services peak at different hours, some peak is
    # always within the look-ahead).
    def jobs(waited_s: float) -> list:  # type: ignore[type-arg]
        return [
            service("s", (2, 2, 8), {"a": 2}, min_replicas=1),
            running("b-job", {"b": 8}, expected_runtime_s=11 * 3600.0),
            job("long", 4, expected_runtime_s=36_000, submit_time=NOW - waited_s),
        ]

    nodes = [node("a"), node("b")]
    assert FAST.aging_s == 12 * 3600.0
    fresh = get_policy("shaper").plan(instance(nodes, jobs(11 * 3600.0)))
    assert fresh.pending["long"].code is ReasonCode.forecast_reservation
    aged = get_policy("shaper").plan(instance(nodes, jobs(13 * 3600.0)))
    assert "long" in aged.placement
    off = FAST.model_copy(update={"lookahead_spares_aged": False})
    kept = get_policy("shaper").plan(instance(nodes, jobs(13 * 3600.0), config=off))
    assert kept.pending["long"].code is ReasonCode.forecast_reservation


def test_the_look_ahead_times_a_peak_from_the_start_of_its_forecast_step() -> None:
    # Forecast steps are clock hours: a cycle 30 minutes into step 0 sees step 1 begin in
    # 30 minutes. b's job ends in 45: before the step's start counted from now (60 min),
    # after it counted from the step's origin, so only the origin keeps a's GPUs.
    def jobs(origin: float | None) -> list:  # type: ignore[type-arg]
        return [
            service("s", (2, 8), {"a": 2}, min_replicas=1, forecast_origin=origin),
            running("b-job", {"b": 8}, expected_runtime_s=3600.0 + 2700.0),
            job("long", 4, expected_runtime_s=36_000),
        ]

    nodes = [node("a"), node("b")]
    kept = get_policy("shaper").plan(instance(nodes, jobs(NOW - 1800.0)))
    assert kept.pending["long"].code is ReasonCode.forecast_reservation
    for origin in (None, NOW):  # step 0 begins now: the peak is an hour off
        assert "long" in get_policy("shaper").plan(instance(nodes, jobs(origin))).placement


def test_the_look_ahead_counts_gpus_a_service_may_take_back_from_checkpointable_work() -> None:
    # The service needs 2 more GPUs in 2 h. Node a: the service's 2, 2 free, and 4 held by
    # a long job. A long, immovable 2-GPU job would take the 2 free GPUs.
    def jobs(**resident: object) -> list:  # type: ignore[type-arg]
        return [
            service("s", (2, 2, 4), {"a": 2}, min_replicas=1, priority=8),
            running("resident", {"a": 4}, expected_runtime_s=20 * 3600.0, **resident),
            job("long", 2, priority=3, expected_runtime_s=10 * 3600.0),
        ]

    nodes = [node("a")]
    # The resident is checkpointable, preemptible and worth less than the service: at the
    # peak the service stops it (losing at most a checkpoint interval), so the free GPUs
    # need not wait for the peak and the long job starts now.
    takeable = get_policy("shaper").plan(
        instance(nodes, jobs(checkpointable=True, last_checkpoint_time=NOW - 600, priority=1))
    )
    assert "long" in takeable.placement
    # Not checkpointable: the service may not stop it, the free GPUs are all it will have.
    kept = get_policy("shaper").plan(instance(nodes, jobs(priority=1)))
    assert kept.pending["long"].code is ReasonCode.forecast_reservation
    # Worth as much as the service: not a job the service's growth would stop.
    equal = get_policy("shaper").plan(
        instance(nodes, jobs(checkpointable=True, last_checkpoint_time=NOW - 600, priority=8))
    )
    assert equal.pending["long"].code is ReasonCode.forecast_reservation
    # Without preemption the service cannot stop anything: the GPUs are kept.
    no_stops = FAST.model_copy(update={"preemption": False})
    off = get_policy("shaper").plan(
        instance(
            nodes,
            jobs(checkpointable=True, last_checkpoint_time=NOW - 600, priority=1),
            config=no_stops,
        )
    )
    assert off.pending["long"].code is ReasonCode.forecast_reservation
