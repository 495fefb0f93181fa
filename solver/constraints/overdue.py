"""Max queue wait as a hard rule: place as many overdue jobs as any solution can.

"Can be placed" is decided by the model itself, lexicographically: before the main
search, a first CP-SAT solve of the same model (same variables and constraints) maximises
the number of overdue jobs placed; the main model then requires at least that many.
The first solve's solution satisfies every constraint, so the requirement never makes
the model infeasible, and competing overdue jobs (more than the free capacity holds) ask
only for as many as fit together; which of them go is left to the main objective (the
``overdue_weight`` boost, weight, speed). If the first solve stops at its time limit, its
best count is still one some solution reaches, so the requirement stays satisfiable; it
is then a lower bound on what could be placed, not the maximum.

The model aggregates node-level packing (see ``solver.model``), so the count is about
pools, not nodes: a job the realisation cannot pack is retried by the greedy fill, and
``solver.validate`` (rule 10) rejects a final plan that leaves an overdue job pending on
free GPUs it fits.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ortools.sat.python import cp_model

if TYPE_CHECKING:
    from solver.model import PlacementModel

# The first solve's own limit: this share of config.time_limit_s, at most FIRST_SOLVE_MAX_S.
# It runs before the main search, which still gets the whole time_limit_s.
FIRST_SOLVE_SHARE = 0.25
FIRST_SOLVE_MAX_S = 1.0


def overdue_options(model: PlacementModel) -> list[cp_model.IntVar]:
    return [o.var for o in model.options if o.job_class.overdue and not o.job_class.elastic]


def build(model: PlacementModel) -> int:
    """Require the most overdue jobs a first solve can place; returns that count.

    Call with every other constraint in place and before the objective is set (it sets
    its own, which the caller then replaces).
    """
    variables = overdue_options(model)
    if not variables:
        return 0
    config = model.config
    placed = sum(variables)
    model.model.maximize(placed)
    solver = cp_model.CpSolver()
    params = solver.parameters
    limit = min(config.time_limit_s * FIRST_SOLVE_SHARE, FIRST_SOLVE_MAX_S)
    if config.deterministic:
        params.max_deterministic_time = limit
    else:
        params.max_time_in_seconds = limit
    params.num_workers = config.num_workers
    params.random_seed = config.seed
    status = solver.solve(model.model)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return 0
    required = round(solver.objective_value)
    if required > 0:
        model.model.add(placed >= required).with_name("overdue_placed")
    model.overdue_required = required
    model.overdue_proven = status == cp_model.OPTIMAL
    return required
