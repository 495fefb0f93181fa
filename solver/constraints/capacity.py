"""Per pool (node group): the chunks placed must pack into its nodes' free GPUs.

For every chunk size s used in the pool, the GPUs of chunks of size ≥ s are at most
``Σ_levels nodes × maxfill(free, sizes ≥ s)``, where maxfill is the most a node with that
many free GPUs can hold of those sizes, and their count is at most ``Σ nodes × ⌊free/s⌋``.
Both are necessary for any packing; for a divisible chain of sizes (powers of two) they
are close to sufficient, and the realisation step drops what does not fit. CPU and memory
are bounded by pool totals where they can bind. Emptied nodes (``migration``) move from
their free level to the whole level, and their residents are added as items.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ortools.sat.python import cp_model

if TYPE_CHECKING:
    from solver.model import PlacementModel


def maxfill(capacity: int, sizes: list[int]) -> int:
    """Largest total ≤ capacity reachable as a sum of the given sizes (with repetition)."""
    reachable = [False] * (capacity + 1)
    reachable[0] = True
    for total in range(1, capacity + 1):
        reachable[total] = any(s <= total and reachable[total - s] for s in sizes)
    return max(t for t in range(capacity + 1) if reachable[t])


def build(model: PlacementModel) -> list[tuple[int, cp_model.IntVar]]:
    for pool in model.pools:
        options = model.options_by_pool.get(pool.index, [])
        evacuations = [
            (e, e.var) for e in model.evacuations_by_pool.get(pool.index, []) if e.var is not None
        ]
        if not options and not evacuations:
            continue
        sizes = sorted(
            {o.chunk_gpus for o in options} | {r[0] for e, _ in evacuations for r in e.residents},
            reverse=True,
        )
        for threshold in sizes:
            allowed = [s for s in sizes if s >= threshold]
            placed = [o.nodes * o.chunk_gpus * o.var for o in options if o.chunk_gpus >= threshold]
            count: list[cp_model.LinearExprT] = [
                o.nodes * o.var for o in options if o.chunk_gpus >= threshold
            ]
            room = sum(n * maxfill(free, allowed) for free, n in pool.levels.items())
            nodes_able = sum(n * (free // threshold) for free, n in pool.levels.items())
            for e, var in evacuations:
                # Emptying a node: its residents become items here, the node a whole one.
                moved = sum(r[0] for r in e.residents if r[0] >= threshold)
                moved_count = sum(1 for r in e.residents if r[0] >= threshold)
                gained = maxfill(e.node_gpus, allowed) - maxfill(e.free_gpus, allowed)
                gained_nodes = e.node_gpus // threshold - e.free_gpus // threshold
                placed.append((moved - gained) * var)
                count.append((moved_count - gained_nodes) * var)
            model.model.add(sum(placed) <= room).with_name(f"capacity_g{pool.group}_s{threshold}")
            # Each chunk needs its own node with that much free.
            model.model.add(sum(count) <= nodes_able).with_name(
                f"chunks_g{pool.group}_s{threshold}"
            )
        # Residents move within the group, so migration leaves CPU and memory totals as is.
        if pool.free_cpu is not None and options:
            model.model.add(
                sum(
                    o.nodes * o.chunk_replicas * o.job_class.cpu_per_replica * o.var
                    for o in options
                )
                <= pool.free_cpu
            ).with_name(f"cpu_g{pool.group}")
        if pool.free_mem is not None and options:
            model.model.add(
                sum(
                    o.nodes * o.chunk_replicas * o.job_class.mem_per_replica * o.var
                    for o in options
                )
                <= pool.free_mem
            ).with_name(f"memory_g{pool.group}")
    return []
