"""Each job's own speed on each GPU model (``Instance.speeds``, ``SolverConfig.job_speeds``):
what the objective counts, where the shaper starts a job, what a move costs it, and the
pass built on it, upgrades onto GPUs faster for a job (``SolverConfig.upgrades``). Models
here: h100 (speed 2.0) and a100 (1.0)."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from solver.compat import Compatibility
from solver.instance import Instance, SolverConfig
from solver.model import build_classes
from solver.objective import Evaluator
from solver.plan import ActionKind, ReasonCode

from .builders import FAST, instance, job, node, plan_with, running, service

HOUR = 3600.0
UPGRADES = FAST  # on by default
NO_UPGRADES = FAST.model_copy(update={"upgrades": False})
NO_SPEEDS = FAST.model_copy(update={"job_speeds": False})


def test_speeds_are_for_block_jobs_of_the_instance_and_positive() -> None:
    nodes = [node("a")]
    with pytest.raises(ValidationError, match="speeds: chat is a service"):
        instance(nodes, [service("chat", (1,))], speeds={"chat": {"a100": 1.0}})
    with pytest.raises(
        ValidationError, match=r"speeds: j's must be positive \(not on \['a100'\]\)"
    ):
        instance(nodes, [job("j")], speeds={"j": {"a100": 0.0, "h100": 1.0}})
    with pytest.raises(ValidationError, match="speeds: no job gone"):
        instance(nodes, [job("j")], speeds={"gone": {"a100": 1.0}})
    with pytest.raises(ValidationError, match=r"speeds: j names unknown GPU models \['a10'\]"):
        instance(nodes, [job("j")], speeds={"j": {"a10": 1.0}})


def test_a_job_runs_at_its_own_speed_where_it_states_one() -> None:
    nodes = [node("h", model="h100"), node("a")]
    inst = instance(nodes, [job("j"), job("k")], speeds={"j": {"h100": 3.0}})
    j, k = inst.job_by_id["j"], inst.job_by_id["k"]
    assert inst.job_speed(j, "h100") == 3.0
    assert inst.job_speed(j, "a100") == 1.0  # not stated: the model's
    assert inst.job_speed(k, "h100") == 2.0 and not inst.own_speeds(k)  # none of its own
    off = instance(nodes, [job("j")], config=NO_SPEEDS, speeds={"j": {"h100": 3.0}})
    assert off.job_speed(off.job_by_id["j"], "h100") == 2.0 and not off.own_speeds(j)


def test_the_objective_counts_a_job_at_its_own_speed() -> None:
    jobs = [job("own", gpus=2), job("model", gpus=2)]
    inst = instance([node("h", model="h100")], jobs, speeds={"own": {"h100": 0.5}})
    terms = Evaluator(inst).evaluate({"own": {"h": 2}, "model": {"h": 2}})
    assert terms.allocation == pytest.approx(2 * 0.5 + 2 * 2.0)


def test_the_shaper_starts_a_job_on_the_model_fastest_for_it_the_baselines_by_model() -> None:
    # On an A100 it runs at 1.5, on an H100 at 1.2: the shaper starts it on the A100.
    jobs = [job("j", expected_runtime_s=HOUR)]
    speeds = {"j": {"h100": 1.2, "a100": 1.5}}
    inst = instance([node("h", model="h100"), node("a")], jobs, speeds=speeds)
    assert plan_with("shaper", inst).placement["j"] == {"a": 1}
    assert plan_with("priority", inst).placement["j"] == {"h": 1}
    off = instance([node("h", model="h100"), node("a")], jobs, config=NO_SPEEDS, speeds=speeds)
    assert plan_with("shaper", off).placement["j"] == {"h": 1}


def test_jobs_of_different_speeds_are_different_classes_of_the_model() -> None:
    jobs = [job("x"), job("y"), job("z")]
    speeds = {"x": {"h100": 1.0}, "y": {"h100": 1.0}}
    inst = instance([node("h", model="h100")], jobs, speeds=speeds)
    classes = build_classes(inst, Compatibility(inst), list(inst.jobs), {j.id: () for j in jobs})
    by_job = {j.id: c for c in classes for j in c.jobs}
    assert by_job["x"] is by_job["y"] and by_job["x"] is not by_job["z"]
    assert by_job["x"].speeds == {"h100": 1.0} and by_job["z"].speeds == {}


def _gang_waits_for_the_h100(resident_speeds: dict[str, float]) -> dict[str, dict[str, int]]:
    # G (a gang of 4 allowed only on H100s) fits on h once R leaves it; R may go to a.
    jobs = [
        running("R", {"h": 1}, checkpointable=True, expected_runtime_s=50 * HOUR),
        running("K", {"a": 3}, preemptible=False),
        job("G", 4, allowed_gpu_models=frozenset({"h100"}), expected_runtime_s=HOUR),
    ]
    nodes = [node("h", gpus=4, model="h100"), node("a", gpus=4)]
    inst = instance(nodes, jobs, speeds={"R": resident_speeds})
    return plan_with("shaper", inst).placement


def test_no_job_is_moved_onto_gpus_slow_for_it_for_a_start_worth_less() -> None:
    # On the A100 R would run at 0.1 of its H100 speed for 49 h: hundreds of GPU-hours
    # longer, for a gang that starts an hour sooner.
    assert _gang_waits_for_the_h100({"h100": 2.0, "a100": 0.2}).get("G", {}) == {}
    # As fast on either for R: emptying h only rearranges what is held.
    placement = _gang_waits_for_the_h100({"h100": 2.0, "a100": 2.0})
    assert placement["G"] == {"h": 4} and placement["R"] == {"a": 1}


def _stuck_on_the_a100(
    speeds: dict[str, float] | None = None, config: SolverConfig = UPGRADES, **kw: Any
) -> Instance:
    jobs = [running("R", {"a": 1}, checkpointable=True, **kw)]
    nodes = [node("h", gpus=1, model="h100"), node("a", gpus=1)]
    return instance(nodes, jobs, config=config, speeds={"R": speeds} if speeds else {})


def test_a_running_job_moves_onto_a_free_gpu_faster_for_it() -> None:
    plan = plan_with("shaper", _stuck_on_the_a100(expected_runtime_s=10 * HOUR))
    assert plan.placement["R"] == {"h": 1}
    (action,) = plan.actions
    assert action.kind is ActionKind.migrate and action.reason.code is ReasonCode.faster_gpus
    assert "runs at 2.00 instead of 1.00" in action.reason.message
    # Off, or for the baselines, it stays.
    off = _stuck_on_the_a100(expected_runtime_s=10 * HOUR, config=NO_UPGRADES)
    assert plan_with("shaper", off).placement["R"] == {"a": 1}
    baseline = _stuck_on_the_a100(expected_runtime_s=10 * HOUR)
    assert plan_with("priority", baseline).placement["R"] == {"a": 1}


def test_no_upgrade_that_saves_less_than_twice_the_move_or_says_nothing_of_its_end() -> None:
    # 2 h left at speed 1 (started 1 h ago): 1 h saved on the H100, against a move of an
    # hour's checkpoint each way.
    small = _stuck_on_the_a100(expected_runtime_s=3 * HOUR, checkpoint_size_mib=3_600_000)
    assert plan_with("shaper", small).placement["R"] == {"a": 1}
    unknown = _stuck_on_the_a100()  # no run-time estimate
    assert plan_with("shaper", unknown).placement["R"] == {"a": 1}
    # Faster for the job by the model, slower by its own speed: no move either.
    slower = _stuck_on_the_a100(speeds={"h100": 0.9}, expected_runtime_s=10 * HOUR)
    assert plan_with("shaper", slower).placement["R"] == {"a": 1}


def _gang_on_the_a100s(config: SolverConfig = UPGRADES, **kw: Any) -> Instance:
    """G, 2 replicas of 4 GPUs, runs on two A100 nodes; two H100 nodes are free."""
    gang = running(
        "G",
        {"a1": 4, "a2": 4},
        gpus=4,
        checkpointable=True,
        expected_runtime_s=20 * HOUR,
        **kw,
    )
    nodes = [
        node("h1", gpus=4, model="h100"),
        node("h2", gpus=4, model="h100"),
        node("a1", gpus=4),
        node("a2", gpus=4),
    ]
    return instance(nodes, [gang], config=config)


def test_a_gang_spanning_nodes_moves_whole_onto_faster_nodes() -> None:
    plan = plan_with("shaper", _gang_on_the_a100s())
    assert plan.placement["G"] == {"h1": 4, "h2": 4}
    (action,) = plan.actions
    assert action.kind is ActionKind.migrate and action.reason.code is ReasonCode.faster_gpus
    assert action.from_placement == {"a1": 4, "a2": 4}
    assert "moved to h1,h2, where it runs at 2.00 instead of 1.00" in action.reason.message
    # Off (gang upgrades, or upgrades), for a job its scheduler cannot restart pinned, or
    # for the baselines, it stays.
    no_gangs = FAST.model_copy(update={"gang_upgrades": False})
    for stays in (
        _gang_on_the_a100s(no_gangs),
        _gang_on_the_a100s(NO_UPGRADES),
        _gang_on_the_a100s(migratable=False),
    ):
        assert plan_with("shaper", stays).placement["G"] == {"a1": 4, "a2": 4}
    assert plan_with("priority", _gang_on_the_a100s()).placement["G"] == {"a1": 4, "a2": 4}


def test_a_gang_moves_only_whole_and_within_its_node_limit() -> None:
    # Only one H100 node free: no half of the gang moves.
    half = _gang_on_the_a100s()
    busy = running("B", {"h2": 4}, preemptible=False)
    plan = plan_with("shaper", instance(list(half.nodes), [*half.jobs, busy]))
    assert plan.placement["G"] == {"a1": 4, "a2": 4}
    assert not plan.actions
    # Four 2-GPU H100 nodes could hold it, but not on its two nodes at most.
    nodes = [node(f"h{i}", gpus=2, model="h100") for i in range(4)]
    nodes += [node("a1", gpus=4), node("a2", gpus=4)]
    spread = _gang_on_the_a100s(max_nodes=2)
    plan = plan_with("shaper", instance(nodes, list(spread.jobs)))
    assert plan.placement["G"] == {"a1": 4, "a2": 4}


def test_an_elastic_training_gang_is_left_to_its_resizes() -> None:
    elastic = _gang_on_the_a100s(min_replicas=1, max_replicas=2)
    assert plan_with("shaper", elastic).placement["G"] == {"a1": 4, "a2": 4}


def test_a_pending_job_takes_the_free_gpu_before_any_upgrade() -> None:
    stuck = _stuck_on_the_a100(expected_runtime_s=10 * HOUR)
    waiting = job("P", priority=0.1, expected_runtime_s=HOUR)
    plan = plan_with("shaper", instance(list(stuck.nodes), [*stuck.jobs, waiting]))
    assert plan.placement["P"] == {"h": 1} and plan.placement["R"] == {"a": 1}


def test_the_queue_gets_the_gpus_an_upgrade_leaves() -> None:
    # P may run on A100s only and is worth too little to move R for (defragmentation's
    # trade); R leaves the A100 for the free H100 on its own account, and P starts on the
    # A100 in the same plan instead of a cycle later (greedy only: CP-SAT is not needed).
    jobs = [
        running(
            "R", {"a": 1}, checkpointable=True, preemptible=False, expected_runtime_s=10 * HOUR
        ),
        running("K", {"a": 1}, preemptible=False),  # so that a is never emptied whole
        job(
            "P",
            priority=0.001,
            allowed_gpu_models=frozenset({"a100"}),
            expected_runtime_s=HOUR,
        ),
    ]
    nodes = [node("h", gpus=1, model="h100"), node("a", gpus=2)]
    greedy = FAST.model_copy(update={"use_cp_sat": False})
    plan = plan_with("shaper", instance(nodes, jobs, config=greedy))
    assert plan.placement["R"] == {"h": 1} and plan.placement["P"] == {"a": 1}
    assert "P" not in plan.pending


def test_a_job_fast_on_the_gpus_is_not_refused_for_a_slow_one_of_its_shape() -> None:
    # A and B differ only in their speed on the H100 (and A is first, being shorter):
    # stopping V is not worth it for A (0.1 a GPU), it is for B (4.0). A failed attempt
    # must not stand for B's.
    jobs = [
        running("V", {"h": 1}, expected_runtime_s=50 * HOUR),
        job("A", priority=2.0, allowed_gpu_models=frozenset({"h100"}), expected_runtime_s=HOUR),
        job("B", priority=2.0, allowed_gpu_models=frozenset({"h100"}), expected_runtime_s=2 * HOUR),
    ]
    speeds = {"A": {"h100": 0.1}, "B": {"h100": 4.0}}
    plan = plan_with("shaper", instance([node("h", gpus=1, model="h100")], jobs, speeds=speeds))
    assert plan.placement.get("B") == {"h": 1} and "A" in plan.pending


def test_splitting_or_federating_clusters_keeps_each_jobs_speeds() -> None:
    from solver.federation import federate, split_by_cluster

    nodes = [node("e", model="h100", cluster="east"), node("w", cluster="west")]
    jobs = [job("j", clusters=frozenset({"east"})), job("k", clusters=frozenset({"west"}))]
    whole = instance(nodes, jobs, speeds={"j": {"h100": 0.5}})
    east, west = split_by_cluster(whole)
    assert east.speeds == {"j": {"h100": 0.5}} and west.speeds == {}
    group = federate(
        {"east": east, "west": west}, movable={}, migration=whole.migration, config=whole.config
    )
    assert group.speeds == {"j": {"h100": 0.5}}
