"""Input models: shape checks, references, derived values."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from solver.instance import Instance, Job, MigrationCostModel, SlaPolicy

from .builders import MODELS, NOW, instance, job, node, running, service


def test_placement_must_be_whole_replicas() -> None:
    with pytest.raises(ValidationError, match="multiple of gpus_per_replica"):
        Job(id="j", gpus_per_replica=4, placement={"n": 2})
    with pytest.raises(ValidationError, match="holds 4 GPUs"):
        Job(id="j", gpus_per_replica=1, replicas=1, placement={"n": 4})


def test_unknown_references_are_refused() -> None:
    with pytest.raises(ValidationError, match="unknown gpu_model"):
        Instance(gpu_models=MODELS, nodes=(node("n", model="tpu"),))
    with pytest.raises(ValidationError, match="unknown node"):
        instance([node("n")], [running("r", {"ghost": 1})])
    with pytest.raises(ValidationError, match="duplicate job"):
        instance([node("n")], [job("x"), job("x")])


def test_weights_policies_and_overdue() -> None:
    inst = instance(
        [node("n")],
        [job("a", team="t", priority=2.0, submit_time=NOW - 100), job("b", team="other")],
        policies=(SlaPolicy(team="t", priority_weight=3.0, max_queue_wait_s=50),),
    )
    a, b = inst.jobs
    assert inst.weight(a) == 6.0
    assert inst.weight(b) == 1.0
    assert inst.is_overdue(a) and not inst.is_overdue(b)
    assert inst.policy_for(b).team == "other"


def test_elastic_demand_is_clamped_and_peaks_within_the_horizon() -> None:
    svc = service("s", (1, 3, 9, 2), min_replicas=2, max_replicas=6)
    assert [svc.demand_at(step) for step in range(5)] == [2, 3, 6, 2, 2]
    assert svc.peak_demand(3600) == 2
    assert svc.peak_demand(2 * 3600) == 3
    assert svc.peak_demand(24 * 3600) == 6


def test_migration_cost_model() -> None:
    model = MigrationCostModel(bandwidth_mib_per_s=100, overhead_s=10, default_checkpoint_mib=1000)
    movable = running("m", {"n": 2}, checkpointable=True)
    assert model.migration_seconds(movable) == 30
    stuck = running("s", {"n": 2}, start_time=NOW - 600)
    assert model.preemption_lost_seconds(stuck, NOW) == 600


def test_instance_and_plan_round_trip_through_json() -> None:
    from solver.plan import Plan
    from solver.policies import get_policy

    inst = instance(
        [node("n", taints=frozenset({"spot"}))],
        [
            running("r", {"n": 2}, gpu_indices={"n": (0, 1)}, tolerations=frozenset({"spot"})),
            service("s", (1, 2), tolerations=frozenset({"spot"})),
            job("p", 2, allowed_gpu_models=frozenset({"a100"})),
        ],
    )
    again = Instance.model_validate_json(inst.model_dump_json())
    assert again == inst
    plan = get_policy("shaper").plan(inst)
    assert Plan.model_validate_json(plan.model_dump_json()) == plan


def test_model_copy_rebuilds_derived_lookups() -> None:
    inst = instance([node("n")], [job("x")])
    assert list(inst.job_by_id) == ["x"]
    copied = inst.model_copy(update={"jobs": (job("y"),)})
    assert list(copied.job_by_id) == ["y"]
    assert list(inst.job_by_id) == ["x"]
