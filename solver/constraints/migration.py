"""Migration: empty some partly used nodes by moving their checkpointable residents.

One integer per kind of evacuable node (see :class:`solver.model.Evacuation`): how many
of them to empty. Each costs its residents' lost GPU-time (the cheapest node of the kind,
so the bound stays an upper bound); all of them together stay within what is left of the
per-cycle migration budget. ``capacity`` turns an emptied node into a whole free node and
adds its residents as items to place in the same group.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ortools.sat.python import cp_model

from solver.objective import SCALE

if TYPE_CHECKING:
    from solver.model import PlacementModel


def build(model: PlacementModel) -> list[tuple[int, cp_model.IntVar]]:
    terms: list[tuple[int, cp_model.IntVar]] = []
    budget = model.migration_budget
    usable = [e for e in model.evacuations if 0 < e.moves <= budget]
    for evacuation in usable:
        upper = min(len(evacuation.nodes), budget // evacuation.moves)
        evacuation.var = model.model.new_int_var(
            0, upper, f"evacuate_g{evacuation.pool.group}_e{evacuation.index}"
        )
        terms.append((-round(min(evacuation.costs) * SCALE), evacuation.var))
    if usable:
        model.model.add(
            sum(e.moves * e.var for e in usable if e.var is not None) <= budget
        ).with_name("migration_budget")
    return terms
