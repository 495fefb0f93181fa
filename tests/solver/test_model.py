"""Aggregation: pools, job classes, the packing condition."""

from __future__ import annotations

from solver.compat import Compatibility
from solver.constraints.capacity import maxfill
from solver.model import PlacementModel, build_classes, build_pools
from solver.state import ClusterState

from .builders import instance, job, node, plan_with, running


def test_maxfill() -> None:
    assert maxfill(8, [4, 2]) == 8
    assert maxfill(6, [4]) == 4
    assert maxfill(7, [4, 2]) == 6
    assert maxfill(3, [4]) == 0


def test_identical_nodes_share_a_pool_with_levels() -> None:
    nodes = [node(f"n{i}") for i in range(6)] + [node("h", model="h100")]
    jobs = [running("r1", {"n0": 4}), running("r2", {"n1": 4}), running("r3", {"n2": 8})]
    state = ClusterState(instance(nodes, jobs))
    pools = {pool.speed: pool for pool in build_pools(state)}
    assert pools[1.0].levels == {4: 2, 8: 3}
    assert pools[1.0].whole_nodes == 3 and pools[1.0].partial_gpus == 8
    assert pools[2.0].levels == {8: 1}


def _model_size(count: int) -> int:
    nodes = [node(f"n{i}") for i in range(4)]
    jobs = [job(f"p{i}", 2) for i in range(count)]
    inst = instance(nodes, jobs)
    compat = Compatibility(inst)
    state = ClusterState(inst, compat)
    classes = build_classes(inst, compat, list(inst.jobs), {j.id: () for j in inst.jobs})
    model = PlacementModel(inst, build_pools(state), classes, [], {})
    model.build()
    return len(model.options)


def test_model_size_does_not_grow_with_identical_jobs() -> None:
    assert _model_size(10) == _model_size(500) == 1


def test_packing_condition_refuses_what_no_node_holds() -> None:
    # Four free GPUs on each of two nodes: 8 free, but an 8-GPU job fits on neither.
    inst = instance(
        [node("a"), node("b")], [running("r1", {"a": 4}), running("r2", {"b": 4}), job("p", 8)]
    )
    plan = plan_with("shaper", inst)
    assert "p" not in plan.placement
    assert plan.stats.best_bound is not None
    assert plan.stats.best_bound < plan.stats.objective + 8


def test_rounded_lp_hint_is_feasible_and_below_the_lp_bound() -> None:
    from solver.relaxation import lp_rounded, objective_of

    nodes = [node(f"n{i}") for i in range(3)]
    jobs = [job(f"a{i}", 3, priority=2.0) for i in range(5)]
    jobs += [job(f"b{i}", 2, priority=1.5) for i in range(5)]
    inst = instance(nodes, jobs)
    compat = Compatibility(inst)
    state = ClusterState(inst, compat)
    classes = build_classes(inst, compat, list(inst.jobs), {j.id: () for j in inst.jobs})
    model = PlacementModel(inst, build_pools(state), classes, [], {})
    model.build()
    rounded = lp_rounded(model)
    assert rounded is not None
    values, lp_bound = rounded
    assert all(0 <= values[o.var.index] <= o.upper for o in model.options)
    assert objective_of(model, values) <= lp_bound
    # 24 free GPUs: the top-up fills them (five 3-GPU jobs and four 2-GPU jobs fit 23).
    placed = sum(values[o.var.index] * o.chunk_gpus for o in model.options)
    assert placed >= 21


def test_cp_sat_empties_a_node_by_migration_to_fit_a_gang() -> None:
    from ortools.sat.python import cp_model

    from solver.greedy import GreedyEngine
    from solver.model_inputs import evacuations as _evacuations
    from solver.solve import GREEDY

    jobs = [
        running("r0", {"n0": 4}, checkpointable=True),
        running("r1", {"n1": 4}, checkpointable=True),
        job("g", 8),
    ]
    inst = instance([node("n0"), node("n1")], jobs)
    engine = GreedyEngine(inst, GREEDY)
    pools = build_pools(engine.state)
    evacuations = _evacuations(engine, pools, budget=1)
    assert [len(e.nodes) for e in evacuations] == [2]  # one kind: 4 of 8 used by a movable job
    classes = build_classes(inst, engine.compat, [inst.job_by_id["g"]], {"g": ()})
    model = PlacementModel(
        inst, pools, classes, [], {}, evacuations=evacuations, migration_budget=1
    )
    model.build()
    solver = cp_model.CpSolver()
    solver.parameters.num_workers = 1
    assert solver.solve(model.model) == cp_model.OPTIMAL
    (kind,) = evacuations
    assert kind.var is not None and solver.value(kind.var) == 1
    assert sum(solver.value(o.var) for o in model.options) == 1
    # Without budget the gang cannot be placed.
    none = PlacementModel(
        inst, build_pools(engine.state), classes, [], {}, evacuations=[], migration_budget=0
    )
    none.build()
    assert solver.solve(none.model) == cp_model.OPTIMAL
    assert sum(solver.value(o.var) for o in none.options) == 0
