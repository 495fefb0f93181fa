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
        # No more than the team's jobs with an option could start: the work the greedy
        # pass started again may have no option here (none fits, or it was started
        # otherwise), and a row no plan can meet would make the whole model infeasible
        # (CP-SAT's search lost, the greedy plan kept). Per class: its jobs (an elastic
        # class's replicas: one replica a job), no more than its options' bounds allow;
        # and no more than the team's own quota room.
        uppers: dict[int, int] = {}
        for o in options:
            uppers[o.job_class.index] = uppers.get(o.job_class.index, 0) + o.upper
        classes = {o.job_class.index: o.job_class for o in options}
        reachable = sum(min(c.size, uppers[index]) * c.total_gpus for index, c in classes.items())
        quota = model.team_room.get(team)
        floor = min(minimum, reachable, reachable if quota is None else max(0, quota))
        if floor > 0:
            model.model.add(
                sum(o.nodes * o.chunk_gpus * o.var for o in options) >= floor
            ).with_name(f"guarantee_{team}")
    return []
