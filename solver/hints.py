"""Phase 5 of ``solver.solve``: a complete warm start for the CP-SAT search, the better of
the greedy's starts and scale-ups (undone by ``GreedyEngine.rebase``) and the rounded LP
relaxation (``solver.relaxation``), scored by the model's own objective."""

from __future__ import annotations

from solver.constraints.fragmentation import whole_nodes_needed
from solver.greedy import Rebase
from solver.model import JobClass, Option, PlacementModel
from solver.relaxation import lp_rounded, objective_of


def add_best_hint(model: PlacementModel, rebase: Rebase, *, with_lp: bool = True) -> str:
    """Hint the model with the better warm start; returns where it came from.

    with_lp: also round the LP relaxation (False under a tight plan budget: on 10,000 jobs
    it takes as long as building the model)."""
    hint = greedy_hint(model, rebase.starts, rebase.scale_ups)
    source = "greedy"
    rounded = lp_rounded(model) if with_lp else None
    if rounded is not None and objective_of(model, rounded[0]) > objective_of(model, hint):
        hint, source = rounded[0], "rounded LP"
    _add_hints(model, hint)
    return source


def _option_for(
    model: PlacementModel, pool_of_node: dict[int, int], job_class: JobClass, held: dict[int, int]
) -> Option | None:
    pools = {pool_of_node.get(node) for node in held}
    if len(pools) != 1:
        return None
    pool = pools.pop()
    for option in model.options_by_class.get(job_class.index, []):
        if option.pool.index == pool:
            return option
    return None


def greedy_hint(
    model: PlacementModel,
    greedy_starts: dict[str, dict[int, int]],
    greedy_scale_ups: dict[str, dict[int, int]],
) -> list[int]:
    """The greedy's starts and scale-ups as values of every model variable."""
    pool_of_node = {node: pool.index for pool in model.pools for node in pool.nodes}
    values = [0] * len(model.model.proto.variables)
    for job_class in model.classes:
        if job_class.elastic:
            job = job_class.jobs[0]
            for node, gpus in greedy_scale_ups.get(job.id, {}).items():
                option = _option_for(model, pool_of_node, job_class, {node: gpus})
                if option is not None:
                    values[option.var.index] += gpus // job.gpus_per_replica
            continue
        for job in job_class.jobs:
            held = greedy_starts.get(job.id)
            if held:
                option = _option_for(model, pool_of_node, job_class, held)
                if option is not None:
                    values[option.var.index] += 1
    for option in model.options:
        values[option.var.index] = min(values[option.var.index], option.upper)
    for pool in model.pools:
        used = model.whole_nodes_used.get(pool.index)
        if used is not None:
            values[used.index] = whole_nodes_needed(model, pool, lambda v: values[v.index])
    return values


def _add_hints(model: PlacementModel, values: list[int]) -> None:
    for option in model.options:
        model.model.add_hint(option.var, values[option.var.index])
    for used in model.whole_nodes_used.values():
        model.model.add_hint(used, values[used.index])
    for evacuation in model.evacuations:
        if evacuation.var is not None:
            model.model.add_hint(evacuation.var, values[evacuation.var.index])
