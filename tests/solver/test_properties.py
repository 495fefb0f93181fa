"""Property: no policy's plan ever fails ``validate``, on random instances."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.instances import EveryRule, random_instance
from solver.plan import ReasonCode
from solver.policies import POLICY_NAMES, get_policy
from solver.relaxation import global_upper_bound
from solver.validate import validate

from .plan_checks import every_policy_plans_legally, placed_where_it_says


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
@given(
    seed=st.integers(min_value=0, max_value=2**32 - 1),
    nodes=st.integers(min_value=1, max_value=10),
    pending=st.integers(min_value=0, max_value=20),
)
def test_no_policy_plan_ever_fails_validate(seed: int, nodes: int, pending: int) -> None:
    inst = random_instance(seed, EveryRule(nodes, pending))
    every_policy_plans_legally(inst)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    derandomize=True,
)
@given(
    seed=st.integers(min_value=0, max_value=2**32 - 1),
    nodes=st.integers(min_value=1, max_value=10),
    pending=st.integers(min_value=0, max_value=20),
)
def test_no_policy_touches_a_frozen_job(seed: int, nodes: int, pending: int) -> None:
    inst = random_instance(seed, EveryRule(nodes, pending, shaper_history=True))
    bound = global_upper_bound(inst)
    for name in POLICY_NAMES:
        plan = get_policy(name).plan(inst)
        assert validate(inst, plan) == [], name  # rule 11: frozen jobs untouched
        assert plan.stats.objective <= bound + 1e-6, name
        placed_where_it_says(plan)
        for job_id in inst.frozen_ids:
            job = inst.job_by_id[job_id]
            assert plan.placement.get(job_id, {}) == job.placement, (name, job_id)
            if not job.is_running and not job.is_elastic:
                assert plan.pending[job_id].code is ReasonCode.dwell, (name, job_id)


@settings(max_examples=30, deadline=None, derandomize=True)
@given(seed=st.integers(min_value=0, max_value=2**32 - 1))
def test_shaper_is_never_worse_than_its_greedy_seed(seed: int) -> None:
    inst = random_instance(seed, EveryRule(nodes=8, pending=16))
    greedy = get_policy("shaper").plan(
        inst.model_copy(update={"config": inst.config.model_copy(update={"use_cp_sat": False})})
    )
    shaped = get_policy("shaper").plan(inst)
    assert shaped.stats.objective >= greedy.stats.objective - 1e-6


@pytest.mark.parametrize("seed", [83, 104])
def test_a_services_reason_names_only_nodes_its_action_leaves(seed: int) -> None:
    # Found by a wider sweep of random instances: a service that grew onto a node this
    # cycle and was moved off it again for a gang said "replicas moved off n2", a node its
    # action (from its placement at the snapshot) never held.
    inst = random_instance(seed * 7919, EveryRule(1 + seed % 10, seed % 21))
    for use_cp_sat in (False, True):
        config = inst.config.model_copy(update={"use_cp_sat": use_cp_sat, "time_limit_s": 0.5})
        plan = get_policy("shaper").plan(inst.model_copy(update={"config": config}))
        assert validate(inst, plan) == []
        placed_where_it_says(plan)
