"""Elastic training jobs (block jobs with ``max_replicas``: ``solver.elastic_training``):
the shaper shrinks them instead of stopping work or leaving a job waiting, starts them
smaller when their asked size does not fit, and grows them into GPUs nothing else takes;
the baselines run them at the size they ask. One node "a" of 8 A100s unless said."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from bench.instances import EveryRule, random_instance
from solver.elastic_training import GROWN_WEIGHT, SHRINK_WEIGHT, split
from solver.instance import Instance, Job
from solver.plan import ActionKind, ReasonCode
from solver.validate import validate

from .builders import FAST, NOW, instance, job, node, plan_from, plan_with, running
from .plan_checks import every_policy_plans_legally

HOUR = 3600.0
OFF = FAST.model_copy(update={"elastic_training": False})


def elastic(
    job_id: str, asks: int, low: int, high: int, held: dict[str, int] | None = None, **kw: Any
) -> Job:
    """An elastic training job of one-GPU replicas asking ``asks`` (``low``..``high``),
    running on ``held`` when given (checkpointable, 10 h left)."""
    kw.setdefault("checkpointable", True)
    kw.setdefault("expected_runtime_s", 11 * HOUR)
    if held:
        kw.setdefault("start_time", NOW - HOUR)
        kw.setdefault("submit_time", NOW - 2 * HOUR)
    return job(
        job_id, replicas=asks, min_replicas=low, max_replicas=high, placement=held or {}, **kw
    )


def actions(plan: Any) -> dict[str, tuple[ActionKind, int | None, ReasonCode]]:
    return {a.job_id: (a.kind, a.replicas, a.reason.code) for a in plan.actions}


def test_an_elastic_job_states_a_range_that_holds_its_size() -> None:
    with pytest.raises(ValidationError, match="needs 1 <= min_replicas <= replicas"):
        job("e", replicas=4, max_replicas=8)  # min_replicas 0
    with pytest.raises(ValidationError, match="needs 1 <= min_replicas <= replicas"):
        job("e", replicas=9, min_replicas=2, max_replicas=8)
    with pytest.raises(ValidationError, match="holds 9 replicas, outside 2..8"):
        job("e", replicas=4, min_replicas=2, max_replicas=8, placement={"a": 9})
    with pytest.raises(ValidationError, match="a share of a GPU or a MIG slice"):
        job("e", replicas=1, min_replicas=1, max_replicas=2, gpu_milli=500)
    grown = job("e", replicas=4, min_replicas=2, max_replicas=8, placement={"a": 6})
    assert grown.is_resizable and grown.held_gpus == 6 and grown.total_gpus == 8 // 2
    with pytest.raises(ValidationError, match="holds 6 GPUs but replicas"):
        job("rigid", replicas=4, placement={"a": 6})


def test_the_shaper_shrinks_an_elastic_job_for_a_job_of_equal_priority() -> None:
    jobs = [elastic("e", 8, 4, 8, held={"a": 8}), job("k", gpus=4, expected_runtime_s=HOUR)]
    inst = instance([node("a")], jobs)
    plan = plan_with("shaper", inst)
    assert plan.placement == {"e": {"a": 4}, "k": {"a": 4}}
    kind, replicas, code = actions(plan)["e"]
    assert (kind, replicas, code) == (ActionKind.resize, 4, ReasonCode.shrunk)
    assert "shrunk from 8 to 4 replicas" in plan.actions_for("e")[0].reason.message
    # Priority stops only lower-priority work: k waits for all of e's GPUs.
    assert "k" not in plan_with("priority", inst).placement
    # Switched off, the shaper treats e as rigid too.
    assert "k" not in plan_with("shaper", instance([node("a")], jobs, config=OFF)).placement


def test_a_shrink_never_goes_below_the_minimum_nor_happens_for_nothing() -> None:
    jobs = [elastic("e", 8, 4, 8, held={"a": 8}), job("k", gpus=6, expected_runtime_s=HOUR)]
    plan = plan_with("shaper", instance([node("a")], jobs))
    assert plan.placement == {"e": {"a": 8}} and not plan.actions


def test_grown_replicas_go_back_to_any_job_the_asked_ones_only_to_one_worth_more() -> None:
    # e asks 4 and holds 8: its 4 grown replicas weigh GROWN_WEIGHT of it, the 2 between
    # its minimum and its ask SHRINK_WEIGHT.
    e = elastic("e", 4, 2, 8, held={"a": 8})
    parts = split(instance([node("a")], [e]))
    weights = sorted(j.priority for j in parts.inner.jobs if j.id != "e")
    assert weights == [GROWN_WEIGHT] * 4 + [SHRINK_WEIGHT] * 2
    core = parts.inner.job_by_id["e"]
    assert core.placement == {"a": 2} and not core.is_resizable and core.preemptible is False
    low: dict[str, Any] = {"priority": 0.2, "expected_runtime_s": HOUR}
    plan = plan_with("shaper", instance([node("a")], [e, job("k", gpus=4, **low)]))
    assert plan.placement == {"e": {"a": 4}, "k": {"a": 4}}
    # Six GPUs for a low-priority job would cut into e's asked size: not done.
    plan = plan_with("shaper", instance([node("a")], [e, job("k", gpus=6, **low)]))
    assert "k" not in plan.placement and plan.placement["e"] == {"a": 8}


def test_a_pending_elastic_job_starts_smaller_when_its_ask_does_not_fit() -> None:
    jobs = [running("r", {"a": 6}, expected_runtime_s=5 * HOUR), elastic("e", 4, 2, 4)]
    inst = instance([node("a")], jobs)
    plan = plan_with("shaper", inst)
    assert plan.placement["e"] == {"a": 2}
    assert "started at 2 of the 4 replicas it asks" in plan.actions_for("e")[0].reason.message
    # The start says the size (a scheduler that sizes jobs itself is told it: Slurm).
    assert actions(plan)["e"][:2] == (ActionKind.start, 2)
    assert "e" not in plan_with("priority", inst).placement
    # Not even its minimum fits: it waits, with a reason.
    jobs = [running("r", {"a": 7}, expected_runtime_s=5 * HOUR), elastic("e", 4, 2, 4)]
    plan = plan_with("shaper", instance([node("a")], jobs))
    assert "e" not in plan.placement and "e" in plan.pending


def test_a_running_elastic_job_grows_into_idle_gpus_when_the_time_saved_pays() -> None:
    inst = instance([node("a")], [elastic("e", 4, 2, 8, held={"a": 4})])
    plan = plan_with("shaper", inst)
    assert plan.placement == {"e": {"a": 8}}
    assert actions(plan)["e"] == (ActionKind.resize, 8, ReasonCode.grown)
    assert not plan_with("priority", inst).actions
    # Two minutes left: doubling saves a minute, less than twice the restart.
    soon = elastic("e", 4, 2, 8, held={"a": 4}, expected_runtime_s=HOUR + 120)
    assert not plan_with("shaper", instance([node("a")], [soon])).actions
    # Without a checkpoint it cannot restart at another size.
    stuck = elastic("e", 4, 2, 8, held={"a": 4}, checkpointable=False)
    assert not plan_with("shaper", instance([node("a")], [stuck])).actions
    # Shaper acted on it a minute ago: it is left as it is (dwell).
    frozen = elastic("e", 4, 2, 8, held={"a": 4}, last_acted_at=NOW - 60)
    assert not plan_with("shaper", instance([node("a")], [frozen])).actions


def test_growth_stays_on_models_no_slower_and_within_the_node_limit() -> None:
    # 2-GPU nodes, one GPU free on c and on d: at 6 replicas it could spread over four
    # nodes, but max_nodes 2 for the 4 it asks allows 3 at 5 or 6 replicas.
    nodes = [node(n, gpus=2) for n in "abcd"]
    filler = running("f", {"c": 1, "d": 1}, gpus=1, expected_runtime_s=20 * HOUR)
    e = elastic("e", 4, 1, 8, held={"a": 2, "b": 2}, max_nodes=2)
    plan = plan_with("shaper", instance(nodes, [filler, e]))
    assert plan.placement["e"] == {"a": 2, "b": 2, "c": 1}
    # On H100s, it does not grow onto the slower A100s.
    nodes = [node("h", gpus=4, model="h100"), node("a", gpus=4)]
    plan = plan_with("shaper", instance(nodes, [elastic("e", 2, 1, 8, held={"h": 2})]))
    assert plan.placement["e"] == {"h": 4}


def test_a_job_started_this_cycle_grows_at_no_cost_and_the_plan_is_one_action() -> None:
    inst = instance([node("a")], [elastic("e", 2, 1, 6)])
    plan = plan_with("shaper", inst)
    assert plan.placement == {"e": {"a": 6}}
    assert actions(plan)["e"][:2] == (ActionKind.start, 6)
    assert plan_with("priority", inst).placement == {"e": {"a": 2}}


def test_the_baselines_and_the_switch_leave_a_grown_job_as_it_is() -> None:
    jobs = [elastic("e", 4, 2, 8, held={"a": 8}), job("k", gpus=2, expected_runtime_s=HOUR)]
    for policy in ("fifo", "backfill", "priority"):
        plan = plan_with(policy, instance([node("a")], jobs))
        assert plan.placement["e"] == {"a": 8} and "k" not in plan.placement
    plan = plan_with("shaper", instance([node("a")], jobs, config=OFF))
    assert plan.placement["e"] == {"a": 8} and "k" not in plan.placement


def test_validation_refuses_resizes_out_of_range_or_without_a_checkpoint() -> None:
    e = elastic("e", 4, 2, 6, held={"a": 4})
    inst = instance([node("a"), node("b", cluster="c2")], [e])
    assert validate(inst, plan_from(inst, {"e": {"a": 6}})) == []
    too_many = [str(v) for v in validate(inst, plan_from(inst, {"e": {"a": 8}}))]
    assert too_many == ["gang [e]: holds 8 replicas, outside 2..6"]
    away = [str(v) for v in validate(inst, plan_from(inst, {"e": {"b": 6}}))]
    assert away == ["elastic training [e]: resized into another cluster"]
    stuck = elastic("e", 4, 2, 6, held={"a": 4}, checkpointable=False)
    inst = instance([node("a")], [stuck])
    assert [str(v) for v in validate(inst, plan_from(inst, {"e": {"a": 5}}))] == [
        "elastic training [e]: resized without a checkpoint to restart from"
    ]


def with_elastic_jobs(inst: Instance, seed: int) -> Instance:
    """``inst`` with about half its whole-GPU block jobs made elastic: pending ones asking
    their size within a drawn range, running ones asking a size near the one they hold."""
    rng = random.Random(seed)
    jobs = []
    for j in inst.jobs:
        if j.is_elastic or j.is_fractional or j.is_mig or rng.random() < 0.5:
            jobs.append(j)
            continue
        held = j.held_gpus // j.gpus_per_replica
        asks = rng.randint(max(1, held - 2), held + 2) if held else j.replicas
        low = rng.randint(1, min(asks, held) if held else asks)
        high = max(asks, held) + rng.randint(0, 3)
        jobs.append(
            Job(**{**j.model_dump(), "replicas": asks, "min_replicas": low, "max_replicas": high})
        )
    return inst.model_copy(update={"jobs": tuple(jobs)})


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
@given(
    seed=st.integers(min_value=0, max_value=2**32 - 1),
    nodes=st.integers(min_value=1, max_value=10),
    pending=st.integers(min_value=0, max_value=20),
    history=st.booleans(),
)
def test_no_policy_plan_with_elastic_jobs_fails_validate(
    seed: int, nodes: int, pending: int, history: bool
) -> None:
    inst = with_elastic_jobs(random_instance(seed, EveryRule(nodes, pending, history)), seed)
    for name, plan in every_policy_plans_legally(inst).items():
        if name != "shaper":  # only the shaper resizes a block job
            resized = [a.job_id for a in plan.actions if a.kind is ActionKind.resize]
            assert all(inst.job_by_id[j].is_elastic for j in resized), name


def test_a_grown_job_may_spread_over_nodes_in_proportion_to_its_size() -> None:
    e = elastic("e", 2, 1, 8, max_nodes=1)
    assert [e.node_limit(r) for r in (1, 2, 3, 4, 8)] == [1, 1, 2, 2, 4]
    assert job("rigid", replicas=2, max_nodes=1).node_limit(8) == 1
    # Two 2-GPU nodes: it asks 2 on one node and grows onto the other at 4.
    nodes = [node("a", gpus=2), node("b", gpus=2)]
    plan = plan_with("shaper", instance(nodes, [elastic("e", 2, 1, 8, max_nodes=1)]))
    assert plan.placement["e"] == {"a": 2, "b": 2}
    inst = instance(nodes, [e])
    assert [str(v) for v in validate(inst, plan_from(inst, {"e": {"a": 1, "b": 1}}))] == [
        "gang [e]: 2 nodes > max_nodes 1"
    ]
    # Grown over 3 nodes, it may shrink to 3 replicas on them (the limit at 3 is 2).
    grown = elastic("g", 2, 1, 8, held={"a": 2, "b": 1, "c": 1}, max_nodes=1)
    nodes3 = [node(n, gpus=2) for n in "abc"]
    inst = instance(nodes3, [grown])
    assert validate(inst, plan_from(inst, {"g": {"a": 1, "b": 1, "c": 1}})) == []


def test_only_what_may_be_shrunk_again_grows_and_a_non_preemptible_job_is_not_shrunk() -> None:
    # Not checkpointable: neither started bigger than it asks nor smaller.
    stuck = elastic("e", 2, 1, 8, checkpointable=False)
    assert plan_with("shaper", instance([node("a")], [stuck])).placement["e"] == {"a": 2}
    busy = [running("r", {"a": 7}, expected_runtime_s=5 * HOUR), stuck]
    assert "e" not in plan_with("shaper", instance([node("a")], busy)).placement
    # Its scheduler cannot be told where it goes: no resize.
    fixed = elastic("e", 4, 2, 8, held={"a": 4}, migratable=False)
    assert not plan_with("shaper", instance([node("a")], [fixed])).actions
    # Restarts off (migration lever): a running job does not grow; one starting still does.
    no_moves = FAST.model_copy(update={"migration": False})
    inst = instance([node("a")], [elastic("e", 4, 2, 8, held={"a": 4})], config=no_moves)
    assert not plan_with("shaper", inst).actions
    inst = instance([node("a")], [elastic("e", 2, 1, 6)], config=no_moves)
    assert plan_with("shaper", inst).placement["e"] == {"a": 6}
    # Not preemptible: it is not shrunk for another job either.
    jobs = [
        elastic("e", 8, 4, 8, held={"a": 8}, preemptible=False),
        job("k", gpus=4, expected_runtime_s=HOUR),
    ]
    assert "k" not in plan_with("shaper", instance([node("a")], jobs)).placement


def test_no_growth_while_shares_of_a_gpu_wait() -> None:
    share = job("f", gpu_milli=500, priority=10.0)
    inst = instance([node("a")], [elastic("e", 4, 2, 8, held={"a": 4}), share])
    plan = plan_with("shaper", inst)
    assert plan.placement["e"] == {"a": 4} and "f" in plan.placement


def test_a_job_moved_or_resized_lately_does_not_grow_back() -> None:
    lately = elastic("e", 4, 2, 8, held={"a": 4}, last_moved_at=NOW - 900)
    assert not plan_with("shaper", instance([node("a")], [lately])).actions
    earlier = elastic("e", 4, 2, 8, held={"a": 4}, last_moved_at=NOW - 2400)
    assert plan_with("shaper", instance([node("a")], [earlier])).placement["e"] == {"a": 8}


def test_growth_and_smaller_starts_have_switches_of_their_own() -> None:
    no_growth = FAST.model_copy(update={"elastic_growth": False})
    inst = instance([node("a")], [elastic("e", 4, 2, 8, held={"a": 4})], config=no_growth)
    assert not plan_with("shaper", inst).actions
    no_smaller = FAST.model_copy(update={"elastic_smaller_starts": False})
    busy = [running("r", {"a": 6}, expected_runtime_s=5 * HOUR), elastic("e", 4, 2, 4)]
    assert "e" not in plan_with("shaper", instance([node("a")], busy, config=no_smaller)).placement
