"""Plans that act as one: dwell time, move budget and locks freeze a job in every policy;
a preemption must pay for itself; a victim is only stopped for a job that takes its GPUs."""

from __future__ import annotations

import pytest

from solver.instance import Instance, Job, SlaPolicy, SolverConfig
from solver.plan import ActionKind, Plan, ReasonCode
from solver.policies import POLICY_NAMES
from solver.validate import validate

from .builders import FAST, NOW, instance, job, node, plan_from, plan_with, running, service

HOUR = 3600.0


# -- Instance.is_frozen ----------------------------------------------------------------


def frozen(inst: Instance, job_id: str) -> bool:
    return inst.is_frozen(inst.job_by_id[job_id])


def test_dwell_budget_and_lock_freeze_a_block_job() -> None:
    inst = instance(
        [node("n1")],
        [
            running("fresh", {"n1": 1}, last_acted_at=NOW - 599),
            running("settled", {"n1": 1}, last_acted_at=NOW - 600),
            running("busy", {"n1": 1}, last_acted_at=NOW - 3000, actions_last_hour=3),
            running("calm", {"n1": 1}, actions_last_hour=2),
            running("locked", {"n1": 1}, locked=True),
            job("requeued", last_acted_at=NOW - 60),
        ],
    )
    assert inst.frozen_ids == {"fresh", "busy", "locked", "requeued"}
    fresh = inst.frozen_because(inst.job_by_id["fresh"])
    assert fresh == "Shaper acted on it 599 s ago; dwell time 600 s"
    assert "move budget spent" in (inst.frozen_because(inst.job_by_id["busy"]) or "")
    assert "in flight" in (inst.frozen_because(inst.job_by_id["locked"]) or "")
    assert inst.frozen_because(inst.job_by_id["settled"]) is None


def test_no_dwell_when_disabled() -> None:
    config = FAST.model_copy(update={"dwell_s": 0.0, "max_actions_per_job_hour": 1000})
    inst = instance(
        [node("n1")],
        [running("r", {"n1": 1}, last_acted_at=NOW - 1, actions_last_hour=50)],
        config=config,
    )
    assert not frozen(inst, "r")


def test_overdue_pending_job_is_never_frozen_unless_locked() -> None:
    late = SlaPolicy(team="late", max_queue_wait_s=60)
    inst = instance(
        [node("n1")],
        [
            job("stranded", overdue=True, last_acted_at=NOW - 10, actions_last_hour=9),
            job("sla-late", team="late", submit_time=NOW - 600, last_acted_at=NOW - 10),
            job("stranded-locked", overdue=True, locked=True),
            running("was-stranded", {"n1": 1}, overdue=True, last_acted_at=NOW - 10),
        ],
        policies=(late,),
    )
    assert inst.overdue_ids == {"stranded", "sla-late", "stranded-locked"}
    assert inst.frozen_ids == {"stranded-locked", "was-stranded"}


def test_services_are_frozen_only_by_a_lock() -> None:
    inst = instance(
        [node("n1")],
        [
            service("s", (2,), {"n1": 1}, last_acted_at=NOW - 10, actions_last_hour=9),
            service("t", (2,), {"n1": 1}, locked=True),
        ],
    )
    assert inst.frozen_ids == {"t"}


# -- every policy leaves frozen jobs alone ----------------------------------------------


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_frozen_pending_job_is_not_started(policy: str) -> None:
    inst = instance(
        [node("n1", gpus=4)],
        [job("requeued", gpus=2, last_acted_at=NOW - 120, priority=4.0), job("other", gpus=2)],
    )
    plan = plan_with(policy, inst)
    assert "requeued" not in plan.placement
    reason = plan.pending["requeued"]
    assert reason.code is ReasonCode.dwell
    assert reason.message == "Shaper acted on it 120 s ago; dwell time 600 s"
    assert "other" in plan.placement  # a frozen head job does not block the queue


@pytest.mark.parametrize("policy", ["priority", "shaper"])
def test_frozen_victim_is_not_preempted(policy: str) -> None:
    def scene(**victim: object) -> Instance:
        return instance(
            [node("n1", gpus=8)],
            [
                running("low", {"n1": 8}, last_checkpoint_time=NOW - 60, **victim),
                job("high", gpus=8, priority=4.0),
            ],
        )

    plan = plan_with(policy, scene())
    assert "high" in plan.placement and "low" not in plan.placement  # the control case
    for victim in ({"last_acted_at": NOW - 300}, {"actions_last_hour": 3}, {"locked": True}):
        plan = plan_with(policy, scene(**victim))
        assert plan.placement["low"] == {"n1": 8}, victim
        assert plan.pending["high"].code is ReasonCode.disruption_budget, victim


def test_frozen_job_is_not_migrated() -> None:
    def scene(frozen: set[str]) -> Instance:
        residents = [
            running(
                name,
                {where: 4},
                checkpointable=True,
                last_acted_at=NOW - 60 if name in frozen else None,
            )
            for name, where in (("r1", "n1"), ("r2", "n2"))
        ]
        return instance([node("n1"), node("n2")], [*residents, job("big", gpus=8)])

    plan = plan_with("shaper", scene(set()))
    assert "big" in plan.placement
    plan = plan_with("shaper", scene({"r1"}))
    assert plan.placement["r1"] == {"n1": 4}
    assert plan.placement["big"] == {"n2": 8} and plan.placement["r2"] == {"n1": 4}
    plan = plan_with("shaper", scene({"r1", "r2"}))
    assert plan.actions == []
    assert plan.pending["big"].code is ReasonCode.disruption_budget


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_locked_service_keeps_its_replicas(policy: str) -> None:
    grow = instance([node("n1")], [service("s", (4,), {"n1": 1})])
    assert plan_with(policy, grow).placement["s"] == {"n1": 4}
    locked = instance([node("n1")], [service("s", (4,), {"n1": 1}, locked=True)])
    assert plan_with(policy, locked).actions == []
    shrink = instance([node("n1")], [service("s", (1,), {"n1": 4}, locked=True)])
    assert plan_with(policy, shrink).placement["s"] == {"n1": 4}


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_stranded_job_goes_first_despite_its_dwell(policy: str) -> None:
    inst = instance(
        [node("n1", gpus=4)],
        [
            job("stranded", gpus=4, overdue=True, last_acted_at=NOW - 30, submit_time=NOW),
            job("valuable", gpus=4, priority=4.0, submit_time=NOW - 5000),
        ],
    )
    plan = plan_with(policy, inst)
    assert plan.placement["stranded"] == {"n1": 4}
    assert plan.actions_for("stranded")[0].reason.code is ReasonCode.overdue


@pytest.mark.parametrize("policy", POLICY_NAMES)
def test_locked_overdue_job_stays_pending(policy: str) -> None:
    inst = instance([node("n1", gpus=4)], [job("starting", gpus=4, overdue=True, locked=True)])
    plan = plan_with(policy, inst)  # validate's rule 10 does not ask for it either
    assert plan.actions == []
    assert plan.pending["starting"].code is ReasonCode.dwell


# -- the validator's dwell rule -------------------------------------------------------


def dwell_violations(inst: Instance, target: dict[str, dict[str, int]]) -> list[str]:
    return [v.message for v in validate(inst, plan_from(inst, target)) if v.rule == "dwell"]


def test_validate_rejects_touching_a_frozen_job() -> None:
    nodes = [node("n1"), node("n2")]
    jobs = [
        running("moved", {"n1": 2}, checkpointable=True, last_acted_at=NOW - 60),
        running("stopped", {"n1": 2}, actions_last_hour=3),
        job("started", gpus=2, last_acted_at=NOW - 60),
        service("resized", (4,), {"n2": 1}, locked=True),
    ]
    inst = instance(nodes, jobs)
    untouched = {"moved": {"n1": 2}, "stopped": {"n1": 2}, "resized": {"n2": 1}}
    assert dwell_violations(inst, untouched) == []
    assert validate(inst, plan_from(inst, untouched)) == []
    touched = {"moved": {"n2": 2}, "started": {"n1": 2}, "resized": {"n2": 3}}
    assert dwell_violations(inst, touched) == [
        "moved while frozen: Shaper acted on it 60 s ago; dwell time 600 s",
        "resized while frozen: an action is in flight on it",
        "started while frozen: Shaper acted on it 60 s ago; dwell time 600 s",
        "stopped while frozen: move budget spent: 3 Shaper actions in the past hour (at most 3)",
    ]
    relaxed = inst.model_copy(update={"config": inst.config.model_copy(update={"dwell_s": 30.0})})
    assert dwell_violations(relaxed, touched) == [
        "resized while frozen: an action is in flight on it",
        "stopped while frozen: move budget spent: 3 Shaper actions in the past hour (at most 3)",
    ]


# -- a preemption must pay for itself -------------------------------------------------


def preemption_scene(**victim: object) -> Instance:
    """A 3× job needs the whole node that a 1× non-checkpointable job holds."""
    return instance(
        [node("n1", gpus=8)],
        [
            running("victim", {"n1": 8}, start_time=NOW - 6 * HOUR, **victim),
            job("urgent", gpus=8, priority=3.0),
        ],
    )


@pytest.mark.parametrize("policy", ["priority", "shaper"])
def test_no_preemption_that_loses_hours_of_work(policy: str) -> None:
    # Six hours since its start, no checkpoint: the stop would lose the 4 h cap of work,
    # 8 × (1 + 4) = 40 value units against the 3 × 8 = 24 the job gains.
    plan = plan_with(policy, preemption_scene())
    assert plan.placement["victim"] == {"n1": 8}
    reason = plan.pending["urgent"]
    assert reason.code is ReasonCode.insufficient_capacity
    assert reason.message.startswith("stopping lower-priority work for it would cost more")


@pytest.mark.parametrize("policy", ["priority", "shaper"])
def test_preemption_that_pays_still_happens(policy: str) -> None:
    # Checkpointed ten minutes ago: 8 × (1 + 1/6) ≈ 9.3 value units < 24.
    plan = plan_with(policy, preemption_scene(last_checkpoint_time=NOW - 600))
    assert plan.placement["urgent"] == {"n1": 8}
    (stop,) = plan.actions_for("victim")
    assert stop.kind is ActionKind.preempt
    assert stop.reason.message.startswith("stopped for urgent, which takes its GPUs on n1")
    # A checkpointable victim loses only its checkpoint write.
    plan = plan_with(policy, preemption_scene(checkpointable=True))
    assert plan.actions_for("victim")[0].kind is ActionKind.requeue


def test_the_shaper_does_not_stop_a_job_about_to_end() -> None:
    # The victim checkpointed an hour ago: stopping it loses 8 GPU-hours, 8 × (1 + 1) = 16
    # value units against the 3 × 8 = 24 the job gains, so priority stops it. It ends in
    # ten minutes, though: the job gains only those ten minutes, 24 / 6 = 4 units, against
    # 8 × (1/6 + 1) ≈ 9.3, and the shaper lets it finish.
    ends_soon = {"last_checkpoint_time": NOW - HOUR, "expected_runtime_s": 6 * HOUR + 600}
    assert plan_with("priority", preemption_scene(**ends_soon)).placement["urgent"] == {"n1": 8}
    plan = plan_with("shaper", preemption_scene(**ends_soon))
    assert plan.placement["victim"] == {"n1": 8}
    assert plan.pending["urgent"].message.startswith("stopping lower-priority work for it")
    # With five hours left the trade is the same as priority's, and the shaper stops it.
    ends_late = {"last_checkpoint_time": NOW - HOUR, "expected_runtime_s": 11 * HOUR}
    assert plan_with("shaper", preemption_scene(**ends_late)).placement["urgent"] == {"n1": 8}


# -- stopped only for a job that takes the GPUs ------------------------------------------


def gang_scene() -> Instance:
    """A 4-GPU gang that only fits once lower-priority work stops.

    Before: a (1 GPU, 1×) and 2 GPUs of 10× work on A, one free; b (3 GPUs, 1×) and one
    10× GPU on B; two 10× GPUs on C, two free. The cheapest stops by cost per GPU freed
    are a, then b; once both are stopped the gang takes B's three GPUs and one of C's
    two free ones, and never uses A: a must keep running.
    """
    nodes = [node(name, gpus=4) for name in ("A", "B", "C")]
    keep = {"priority": 10.0}
    jobs = [
        running("a", {"A": 1}),
        running("hA", {"A": 2}, **keep),
        running("b", {"B": 3}),
        running("hB", {"B": 1}, **keep),
        running("hC", {"C": 2}, **keep),
        job("gang", gpus=1, replicas=4, priority=3.0),
    ]
    return instance(nodes, jobs)


def stopped_for(plan: Plan, job_id: str) -> dict[str, set[str]]:
    """Victims said to be stopped for ``job_id`` -> the nodes they held."""
    return {
        action.job_id: set(action.from_placement)
        for action in plan.actions
        if action.kind in (ActionKind.preempt, ActionKind.requeue)
        and action.reason.message.startswith(f"stopped for {job_id}")
    }


@pytest.mark.parametrize("policy", ["priority", "shaper"])
def test_victim_off_the_final_placement_keeps_running(policy: str) -> None:
    plan = plan_with(policy, gang_scene())
    assert sum(plan.placement["gang"].values()) == 4
    assert plan.placement["a"] == {"A": 1}
    victims = stopped_for(plan, "gang")
    assert victims == {"b": {"B"}}
    for held in victims.values():
        assert held & set(plan.placement["gang"])
    assert "on B" in plan.actions_for("b")[0].reason.message


def test_default_config_has_the_dwell_and_budget() -> None:
    config = SolverConfig()
    assert config.dwell_s == 600.0 and config.max_actions_per_job_hour == 3
    assert Job(id="j").last_acted_at is None
