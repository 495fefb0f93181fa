"""What the shaper keeps instead of recomputing, checked against recomputing it: the
defragmentation's per-group node index (``RoleIndex``), the objective's per-instance
tables (``Evaluator``), and the cycle collector a solve pauses."""

from __future__ import annotations

import gc

import pytest

from bench.instances import LoadedCluster, random_instance
from solver import solve as solve_module
from solver.greedy import GreedyEngine
from solver.greedy.defragmentation import Role, RoleIndex
from solver.greedy_variants import greedy_options
from solver.instance import Instance
from solver.objective import Evaluator, evaluate
from solver.solve import solve

from .builders import FAST


def _instance(seed: int, load: float = 1.5) -> Instance:
    return random_instance(seed, LoadedCluster(gpus=200, load=load), FAST)


def _scanned(index: RoleIndex) -> tuple[list[set[int]], list[set[int]]]:
    """The index's two sets per group, found by scanning every node."""
    state = index.state
    all_with_role: list[set[int]] = [set() for _ in index.all_with_role]
    with_replicas: list[set[int]] = [set() for _ in index.with_replicas]
    for node, residents in enumerate(state.jobs_on_node):
        group = index.group_of_node[node]
        kinds = [index.role.get(r) for r in residents]
        if kinds and None not in kinds:
            all_with_role[group].add(node)
        if Role.RELOCATABLE in kinds:
            with_replicas[group].add(node)
    return all_with_role, with_replicas


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_the_role_index_is_what_a_scan_of_every_node_finds(seed: int) -> None:
    inst = _instance(seed)
    engine = GreedyEngine(inst, greedy_options(inst.config))
    index = engine._defragmentation.index
    index.refresh()
    assert (index.all_with_role, index.with_replicas) == _scanned(index)
    assert any(index.all_with_role), "the instance should have nodes that can be emptied"
    # A whole greedy pass: starts, moves, preemptions, resizes and their rollbacks.
    engine.run()
    index.refresh()
    assert (index.all_with_role, index.with_replicas) == _scanned(index)
    # Changes undone after the last refresh count too.
    state = engine.state
    mark = state.mark()
    for job in inst.jobs[:20]:
        state.evict(job)
    state.rollback(mark)
    for job in inst.jobs[20:40]:
        state.evict(job)
    index.refresh()
    assert (index.all_with_role, index.with_replicas) == _scanned(index)


@pytest.mark.parametrize("seed", [1, 2])
def test_the_evaluator_scores_every_placement_as_evaluate_does(seed: int) -> None:
    inst = _instance(seed, load=2.0)
    evaluator = Evaluator(inst)
    current = {job.id: dict(job.placement) for job in inst.jobs if job.placement}
    planned = solve(inst).placement
    for placement in (current, planned, {}):
        assert evaluator.evaluate(placement) == evaluate(inst, placement)


def test_a_solve_pauses_the_collector_and_leaves_it_as_it_was(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    inst = _instance(1)
    seen: list[bool] = []
    best_greedy = solve_module.best_greedy

    def watched(instance: Instance) -> object:
        seen.append(gc.isenabled())
        return best_greedy(instance)

    monkeypatch.setattr(solve_module, "best_greedy", watched)
    was_enabled = gc.isenabled()
    try:
        gc.enable()
        solve(inst)
        assert gc.isenabled()
        gc.disable()
        solve(inst)
        assert not gc.isenabled()
    finally:
        if was_enabled:
            gc.enable()
    assert seen == [False, False]
