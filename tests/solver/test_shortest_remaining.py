"""Preemptive shortest remaining time (``SolverConfig.shortest_remaining``,
``solver.greedy.shortest_remaining``): a short pending job stops a long checkpointable one
of its weight, and only when the rule allows it."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from bench.instances import EveryRule, random_instance
from solver.instance import Instance, Job, SlaPolicy
from solver.plan import ActionKind, Plan, ReasonCode
from solver.policies import get_policy
from solver.validate import validate

from .builders import FAST, NOW, instance, job, node, plan_with, running
from .plan_checks import placed_where_it_says

HOUR = 3600.0
ON = FAST.model_copy(update={"shortest_remaining": True})
assert not FAST.shortest_remaining  # off by default


def _long(**kw: Any) -> Job:
    """A checkpointable 8-GPU job that started an hour ago with 20 h left."""
    kw.setdefault("checkpointable", True)
    kw.setdefault("expected_runtime_s", 21 * HOUR)
    return running("long", {"n1": 8}, **kw)


def _short(hours: float = 1.0, **kw: Any) -> Job:
    return job("short", replicas=8, expected_runtime_s=hours * HOUR, **kw)


def _plan(jobs: list[Job], on: bool = True, policies: tuple[SlaPolicy, ...] = ()) -> Plan:
    return plan_with("shaper", instance([node("n1")], jobs, policies, config=ON if on else FAST))


def _stopped(plan: Plan) -> set[str]:
    return {a.job_id for a in plan.actions if a.kind in (ActionKind.preempt, ActionKind.requeue)}


def test_a_short_job_stops_a_long_checkpointable_one_of_its_weight() -> None:
    plan = _plan([_long(), _short()])
    assert set(plan.placement) == {"short"}
    assert _stopped(plan) == {"long"}
    (stop,) = plan.actions_for("long")
    assert stop.kind is ActionKind.requeue  # checkpointed, not killed
    assert stop.reason.code is ReasonCode.preempted_by_higher_priority
    assert "shorter work first" in stop.reason.message
    # Off (the default), equal weights never stop each other.
    off = _plan([_long(), _short()], on=False)
    assert set(off.placement) == {"long"}
    assert not _stopped(off)


def test_the_stop_cost_counts_against_the_gain() -> None:
    # The same pair as "stop too costly" below, with a 20 GB image: 2 × (1.5 h + 70 s) < 5 h.
    plan = _plan([_long(expected_runtime_s=6 * HOUR), _short(hours=1.5)])
    assert _stopped(plan) == {"long"}


def test_a_small_short_job_stops_the_smallest_victim_that_frees_enough() -> None:
    jobs = [
        running("wide", {"n1": 6}, checkpointable=True, expected_runtime_s=21 * HOUR),
        running("narrow", {"n1": 2}, checkpointable=True, expected_runtime_s=21 * HOUR),
        job("short", replicas=2, expected_runtime_s=HOUR),
    ]
    plan = _plan(jobs)
    assert _stopped(plan) == {"narrow"}
    assert set(plan.placement) == {"wide", "short"}


def test_no_stop_when_the_rule_does_not_allow_it() -> None:
    cases: dict[str, list[Job]] = {
        "not checkpointable": [_long(checkpointable=False), _short()],
        "not preemptible": [_long(preemptible=False), _short()],
        "stopped once today already": [_long(preemptions_today=1), _short()],
        "within its dwell time": [_long(last_acted_at=NOW - 60), _short()],
        # 2 × (10.5 h + checkpoint and restore) > 20 h left.
        "not short enough": [_long(), _short(hours=10.5)],
        # 5 h left, 1.5 h to run: a 2 TB image's checkpoint and restore (1.1 h) tip it.
        "stop too costly": [
            _long(expected_runtime_s=6 * HOUR, checkpoint_size_mib=2_000_000),
            _short(hours=1.5),
        ],
        "heavier victim": [_long(priority=2.0), _short()],
        # Waited 13 h since submission: requeued, its aging credit would put it first.
        "aged victim": [_long(submit_time=NOW - 13 * HOUR), _short()],
        "no estimate": [_long(expected_runtime_s=None), _short()],
        # It ends in 20 min anyway: waiting is cheaper than stopping anything.
        "ends soon": [_long(expected_runtime_s=HOUR + 1200), _short()],
    }
    for why, jobs in cases.items():
        plan = _plan(jobs)
        assert not _stopped(plan), why
        assert "short" not in plan.placement, why


def test_the_daily_preemption_limit_of_the_victims_policy_holds() -> None:
    limit = (SlaPolicy(team="default", max_preemptions_per_day=0),)
    plan = _plan([_long(), _short()], policies=limit)
    assert not _stopped(plan)


def _short_and_long(inst: Instance) -> Instance:
    """Every running block job checkpointable with 20 h left and not stopped today, every
    pending one 1 h long, and the lever on: the rule's case, on a random instance."""
    jobs = []
    for j in inst.jobs:
        if not j.is_elastic and j.is_running:
            runtime = inst.now - (j.start_time or inst.now) + 20 * HOUR
            long = {"checkpointable": True, "expected_runtime_s": runtime, "preemptions_today": 0}
            j = j.model_copy(update=long)
        elif not j.is_elastic:
            j = j.model_copy(update={"expected_runtime_s": HOUR})
        jobs.append(j)
    config = inst.config.model_copy(update={"shortest_remaining": True})
    return inst.model_copy(update={"jobs": tuple(jobs), "config": config})


@settings(max_examples=40, deadline=None, derandomize=True)
@given(
    seed=st.integers(min_value=0, max_value=2**32 - 1),
    nodes=st.integers(min_value=1, max_value=10),
    pending=st.integers(min_value=0, max_value=20),
)
def test_plans_with_the_lever_stay_valid(seed: int, nodes: int, pending: int) -> None:
    inst = _short_and_long(random_instance(seed, EveryRule(nodes, pending)))
    plan = get_policy("shaper").plan(inst)
    assert validate(inst, plan) == []
    placed_where_it_says(plan)
