"""Keep whole nodes free for large gangs: each whole free node used costs
``fragmentation_weight``. GPUs placed beyond the free GPUs of partly used nodes open whole
nodes, at least (excess / largest node size) of them — a lower bound, so the model's
bound stays an upper bound of the real objective."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ortools.sat.python import cp_model

from solver.objective import SCALE

if TYPE_CHECKING:
    from solver.model import PlacementModel, Pool


def whole_nodes_needed(
    model: PlacementModel, pool: Pool, value: Callable[[cp_model.IntVar], int]
) -> int:
    """Fewest whole nodes a solution (given by ``value``) opens in the pool."""
    placed = sum(
        o.nodes * o.chunk_gpus * value(o.var) for o in model.options_by_pool.get(pool.index, [])
    )
    emptied = 0
    for e in model.evacuations_by_pool.get(pool.index, []):
        if e.var is not None:
            count = value(e.var)
            emptied += count
            placed += count * e.free_gpus  # residents leave partial room, gain a whole node
    excess = max(0, placed - pool.partial_gpus)
    return min(pool.whole_nodes + emptied, -(-excess // max(1, pool.max_node_gpus)))


def build(model: PlacementModel) -> list[tuple[int, cp_model.IntVar]]:
    weight = round(model.config.fragmentation_weight * SCALE)
    terms: list[tuple[int, cp_model.IntVar]] = []
    if weight <= 0:
        return terms
    for pool in model.pools:
        options = model.options_by_pool.get(pool.index, [])
        evacuations = [
            (e, e.var) for e in model.evacuations_by_pool.get(pool.index, []) if e.var is not None
        ]
        if not options or not (pool.whole_nodes or evacuations):
            continue
        most = pool.whole_nodes + sum(len(e.nodes) for e, _ in evacuations)
        used = model.model.new_int_var(0, most, f"whole_nodes_used_g{pool.group}")
        # GPUs beyond what partly used nodes can take must open whole nodes; an emptied
        # node's free GPUs leave the partial room and the node joins the whole ones.
        model.model.add(
            used * max(1, pool.max_node_gpus)
            >= sum(o.nodes * o.chunk_gpus * o.var for o in options)
            + sum(e.free_gpus * var for e, var in evacuations)
            - pool.partial_gpus
        ).with_name(f"fragmentation_g{pool.group}")
        model.whole_nodes_used[pool.index] = used
        terms.append((-weight, used))
        terms.extend((weight, var) for _, var in evacuations)
    return terms
