"""CP-SAT solver parameters, set here and nowhere else, and its statuses as plans report them.

Three searches run CP-SAT; each gets its solver from one function here so that limits,
workers, seed and determinism are set one way:

* ``placement_solver``: the shaper's main search over the aggregated model
  (``solver.solve``): ``config.time_limit_s`` as wall time, or as deterministic time with
  interleaved search when ``config.deterministic`` (same plan on every run whatever the
  load), and ``config.relative_gap`` as the gap at which it may stop;
* ``first_solve_solver``: the short lexicographic first solve of the overdue pass
  (``solver.overdue_pass``), with its own limit, in the same time mode;
* ``exact_solver``: the per-node exact model of the benchmarks (``solver.exact``), always
  wall time.
"""

from __future__ import annotations

from ortools.sat.python import cp_model

from solver.instance import SolverConfig
from solver.plan import SolveStatus

CP_SAT_STATUS = {  # CP-SAT's status codes as the plan reports them
    cp_model.OPTIMAL: SolveStatus.optimal,
    cp_model.FEASIBLE: SolveStatus.feasible,
    cp_model.INFEASIBLE: SolveStatus.infeasible,
    cp_model.MODEL_INVALID: SolveStatus.model_invalid,
    cp_model.UNKNOWN: SolveStatus.unknown,
}


def _solver(
    *,
    time_limit_s: float,
    deterministic: bool,
    num_workers: int,
    seed: int,
    interleave: bool = False,
    relative_gap: float | None = None,
) -> cp_model.CpSolver:
    solver = cp_model.CpSolver()
    params = solver.parameters
    if deterministic:
        params.max_deterministic_time = time_limit_s
        if interleave:
            params.interleave_search = True
    else:
        params.max_time_in_seconds = time_limit_s
    params.num_workers = num_workers
    params.random_seed = seed
    if relative_gap is not None:
        params.relative_gap_limit = relative_gap
    return solver


def placement_solver(config: SolverConfig, time_limit_s: float | None = None) -> cp_model.CpSolver:
    """time_limit_s: less than the config's, when a plan budget leaves less."""
    return _solver(
        time_limit_s=config.time_limit_s if time_limit_s is None else time_limit_s,
        deterministic=config.deterministic,
        num_workers=config.num_workers,
        seed=config.seed,
        interleave=True,
        relative_gap=config.relative_gap,
    )


def first_solve_solver(config: SolverConfig, time_limit_s: float) -> cp_model.CpSolver:
    return _solver(
        time_limit_s=time_limit_s,
        deterministic=config.deterministic,
        num_workers=config.num_workers,
        seed=config.seed,
    )


def exact_solver(*, time_limit_s: float, num_workers: int, seed: int) -> cp_model.CpSolver:
    return _solver(
        time_limit_s=time_limit_s, deterministic=False, num_workers=num_workers, seed=seed
    )
