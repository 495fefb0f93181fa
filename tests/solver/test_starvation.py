"""The starvation guard: the first starving job in the value order that does not fit gets
an EASY-backfill reservation, which later jobs and a CP-SAT plan must leave alone. A job
past its SLA's max queue wait always starves; ``starvation_guard_s`` adds a wait bound for
every job."""

from __future__ import annotations

from solver.instance import SlaPolicy
from solver.plan import ReasonCode
from solver.policies import get_policy
from solver.validate import validate

from .builders import FAST, NOW, instance, job, node, running

HOUR = 3600.0


def _cluster(gang_submit: float, **config: object):  # type: ignore[no-untyped-def]
    # n1: 4 GPUs free, its other 4 held by a job ending in 1 h; n2 full for 5 h. Nothing
    # running may be stopped or moved, so the 8-GPU gang waits for n1 to empty at +1 h.
    keep = {"preemptible": False, "checkpointable": False, "start_time": NOW - HOUR}
    jobs = [
        running("ends-soon", {"n1": 4}, expected_runtime_s=2 * HOUR, **keep),
        running("ends-late", {"n2": 8}, expected_runtime_s=6 * HOUR, **keep),
        job("gang", gpus=8, submit_time=gang_submit, team="research", expected_runtime_s=HOUR),
        job("long-small", gpus=2, priority=0.5, expected_runtime_s=3 * HOUR),
        job("short-small", gpus=2, priority=0.5, expected_runtime_s=0.5 * HOUR),
    ]
    return instance(
        [node("n1"), node("n2")],
        jobs,
        policies=(SlaPolicy(team="research", max_queue_wait_s=2 * HOUR),),
        config=FAST.model_copy(update=config),
    )


def test_a_gang_past_its_max_wait_keeps_its_gpus_from_jobs_that_would_delay_it() -> None:
    inst = _cluster(gang_submit=NOW - 3 * HOUR)  # past its SLA's 2 h
    plan = get_policy("shaper").plan(inst)
    assert not validate(inst, plan)
    # Only the job that ends before n1 empties may use n1's free GPUs.
    assert set(plan.placement) - {"ends-soon", "ends-late"} == {"short-small"}
    assert plan.pending["long-small"].code is ReasonCode.backfill_reservation
    assert "reserved" in plan.pending["gang"].message


def test_without_a_bound_or_the_guard_small_jobs_take_the_free_gpus() -> None:
    inst = _cluster(gang_submit=NOW - 60)  # not past any bound
    placed = set(get_policy("shaper").plan(inst).placement)
    assert {"long-small", "short-small"} <= placed
    # The same young gang under a 30-second guard: reserved for.
    guarded = _cluster(gang_submit=NOW - 60, starvation_guard_s=30.0)
    assert "long-small" not in get_policy("shaper").plan(guarded).placement


def test_the_priority_baseline_has_no_guard() -> None:
    inst = _cluster(gang_submit=NOW - 3 * HOUR)
    assert "long-small" in get_policy("priority").plan(inst).placement
