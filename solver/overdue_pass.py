"""The overdue pass of ``solver.solve``: as many jobs past their max queue wait placed as any
solution can place, decided lexicographically before the main search.

A first CP-SAT solve of the built model (same variables and constraints) maximises the
number of overdue jobs placed; the model then requires at least that many
(``solver.constraints.overdue``) and gets its own objective back. The first solve's
solution satisfies every constraint, so the requirement never makes the model infeasible,
and competing overdue jobs (more than the free capacity holds) ask only for as many as fit
together; which of them go is left to the main objective (the ``overdue_weight`` boost,
weight, speed). If the first solve stops at its time limit, its best count is still one
some solution reaches, so the requirement stays satisfiable; it is then a lower bound on
what could be placed, not the maximum.

It runs before the hints are added (the first solve starts cold) and before the LP
rounding reads the constraints (so the hint respects the requirement).
"""

from __future__ import annotations

from ortools.sat.python import cp_model

from solver.constraints import overdue
from solver.cp_sat import first_solve_solver
from solver.model import PlacementModel

# The first solve's own limit: this share of config.time_limit_s, at most FIRST_SOLVE_MAX_S.
# It runs before the main search, which still gets the whole time_limit_s.
FIRST_SOLVE_SHARE = 0.25
FIRST_SOLVE_MAX_S = 1.0


def require_overdue(model: PlacementModel) -> int:
    """Require the most overdue jobs a first solve can place; returns that count.

    Call on a built model (``PlacementModel.build()``), before hints are added.
    """
    variables = overdue.overdue_options(model)
    if not variables:
        return 0
    config = model.config
    model.model.maximize(sum(variables))
    limit = min(config.time_limit_s * FIRST_SOLVE_SHARE, FIRST_SOLVE_MAX_S)
    solver = first_solve_solver(config, limit)
    status = solver.solve(model.model)
    required = 0
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        required = round(solver.objective_value)
        overdue.require(model, required, proven=status == cp_model.OPTIMAL)
    model.maximize()  # the main objective back
    return required
