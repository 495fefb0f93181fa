"""Gang-aware placement (``SolverConfig.gang_aware_placement``, ``solver.gang_fit``): a
small placement takes the node whose leftover free GPUs the waiting gangs can still use;
off, it is best fit."""

from __future__ import annotations

from solver.gang_fit import GangFit
from solver.greedy import GreedyEngine, GreedyOptions, Order
from solver.greedy_variants import greedy_options
from solver.instance import Instance
from solver.policies import get_policy
from solver.state import ClusterState
from solver.validate import validate

from .builders import FAST, instance, job, node, plan_with, running


def _two_holes() -> Instance:
    # Node a has 2 free GPUs, b has 3. The 1-GPU job goes first (priority); two 2-GPU
    # gangs wait behind it. Best fit puts it on a, leaving 1 + 3: one gang waits. Placed
    # on b it leaves 2 + 2: both gangs start.
    return instance(
        [node("a"), node("b")],
        [
            running("r", {"a": 6}),
            running("q", {"b": 5}),
            job("small", 1, priority=10.0),
            job("pair", 2),
            job("pair2", 2),
        ],
    )


def _greedy_placement(inst: Instance, gang_aware: bool) -> dict[str, dict[str, int]]:
    options = GreedyOptions(order=Order.PRIORITY, gang_aware=gang_aware)
    return GreedyEngine(inst, options).run().target()


def test_a_small_job_leaves_the_hole_a_waiting_gang_can_use() -> None:
    inst = _two_holes()
    placed = _greedy_placement(inst, gang_aware=True)
    assert placed["small"] == {"b": 1}
    assert {"pair", "pair2"} <= set(placed)


def test_off_a_small_job_takes_the_tightest_node() -> None:
    placed = _greedy_placement(_two_holes(), gang_aware=False)
    assert placed["small"] == {"a": 1}
    assert len({"pair", "pair2"} & set(placed)) == 1


def test_the_switch_reaches_the_shapers_greedy_and_plans_stay_valid() -> None:
    assert not greedy_options(FAST).gang_aware
    on = FAST.model_copy(update={"gang_aware_placement": True})
    assert greedy_options(on).gang_aware
    inst = _two_holes().model_copy(update={"config": on})
    plan = get_policy("shaper").plan(inst)
    assert not validate(inst, plan)
    assert {"small", "pair", "pair2"} <= set(plan.placement)


def test_waste_follows_the_queue_and_leaves_out_the_job_placed() -> None:
    inst = _two_holes()
    state = ClusterState(inst)
    fit = GangFit(inst, state.compat)
    state.gang_fit = fit
    small, pair, pair2 = (inst.job_by_id[j] for j in ("small", "pair", "pair2"))
    a, b = state.node_index["a"], state.node_index["b"]
    # One GPU left on a fits neither waiting gang: waste +1; two left on b fit both.
    assert fit.waste_increase(small, a, 2, 1) > 0
    assert fit.waste_increase(small, b, 3, 1) <= 0
    # Once both gangs are placed nothing waits but the job itself: every node scores 0.
    state.place(pair, {a: 2})
    state.place(pair2, {b: 2})
    assert fit.waste_increase(small, b, 1, 1) == 0
    # Undoing a placement makes the gang wait again.
    state.evict(pair)
    assert fit.waste_increase(small, a, 2, 1) > 0


def test_a_gang_spans_nodes_that_differ_only_in_labels_no_job_selects_on() -> None:
    """Kubernetes and Ray give every node a label of its own (its hostname, its node id):
    those must not split the nodes into groups of one, or no gang could ever start."""
    nodes = [
        node("w1", gpus=4, labels={"kubernetes.io/hostname": "w1", "zone": "a"}),
        node("w2", gpus=4, labels={"kubernetes.io/hostname": "w2", "zone": "a"}),
        node("w3", gpus=4, labels={"kubernetes.io/hostname": "w3", "zone": "b"}),
    ]
    gang = job("gang", 4, replicas=2, max_nodes=2)
    for policy in ("priority", "shaper"):
        plan = plan_with(policy, instance(nodes, [gang]))
        assert sum(plan.placement["gang"].values()) == 8, policy
    # A label a job selects on still tells nodes apart: zone a has two nodes, zone b one.
    in_b = job("in-b", 4, replicas=2, max_nodes=2, node_selector={"zone": "b"})
    in_a = job("in-a", 4, replicas=2, max_nodes=2, node_selector={"zone": "a"})
    plan = plan_with("shaper", instance(nodes, [in_b, in_a]))
    assert "in-b" not in plan.placement
    assert sorted(plan.placement["in-a"]) == ["w1", "w2"]
