"""Team quota (Kueue nominal quota + borrowing limit): GPUs a team starts fit its room.

Guarantee: where the greedy pass stopped a team's work beyond its borrowed GPUs (to start
the team's own higher-priority work), the team must start at least that many GPUs again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ortools.sat.python import cp_model

if TYPE_CHECKING:
    from solver.model import PlacementModel


def build(model: PlacementModel) -> list[tuple[int, cp_model.IntVar]]:
    for team, room in sorted(model.team_room.items()):
        options = [o for o in model.options if o.job_class.team == team]
        if options:
            model.model.add(
                sum(o.nodes * o.chunk_gpus * o.var for o in options) <= max(0, room)
            ).with_name(f"quota_{team}")
    for team, minimum in sorted(model.team_min_start.items()):
        options = [o for o in model.options if o.job_class.team == team]
        model.model.add(sum(o.nodes * o.chunk_gpus * o.var for o in options) >= minimum).with_name(
            f"guarantee_{team}"
        )
    return []
