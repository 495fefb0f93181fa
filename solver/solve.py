"""The shaper engine: greedy first, then CP-SAT on the aggregated model, best legal plan wins.

Phases, one module each:

1. Greedy (``solver.greedy_variants``: value order, with resize, look-ahead,
   defragmentation by migration and preemption; on queues up to
   ``config.second_greedy_max_pending`` also in priority order and with migration before
   preemption, keeping the best). Legal by construction; its plan is the fallback and a
   hint.
   *Saturation*: when a greedy plan leaves nothing waiting that any plan could place,
   meets every service's demand (and look-ahead target), and runs every job it starts or
   grows on the fastest GPU model that job accepts, its priority-weighted allocation (the
   first two lines of the objective, overdue boost included) is the most any plan can
   hold: nothing is left to place, and nothing placed can be worth more. The search then
   stops there: no further greedy variant when that plan also disrupts nothing, and no
   CP-SAT (whose base state keeps the greedy's disruptions anyway). What CP-SAT could
   still gain is only ``fragmentation_weight`` per whole free node, mostly by migrating
   running work to empty nodes although no waiting job needs the room — churn whose value
   is a guess about future arrivals, which the next cycle serves when they come. The plan
   is the greedy's (``stats.engine == "greedy"``) and ``stats.note`` says why.
2. Base state (``GreedyEngine.rebase``): the greedy state with its disruptive decisions
   kept (resizes down, migrations, preemptions) and its new starts and scale-ups undone —
   but for the jobs and services those migrations and preemptions made room for, which
   keep the room (so that "stopped for X" stays true whichever plan wins). CP-SAT
   re-decides *what starts where* on that base, and may empty further nodes by migrating
   their checkpointable residents within what is left of the migration budget; it never
   preempts. Frozen jobs (``Instance.is_frozen``) get no variable: a pending one is not
   started, a running one never counts as movable, so its placement is fixed.
3. Model (``solver.model_inputs``, ``solver.model``): pools × job classes.
4. Overdue pass (``solver.overdue_pass``): a first, short solve of the built model finds
   how many jobs past their max queue wait can be placed (at most a quarter of the limit
   and 1 s), and the model then requires that many.
5. Warm start (``solver.hints``) with a complete hint: the better of the greedy starts
   and the rounded LP relaxation (``solver.relaxation``).
6. Search: ``config.time_limit_s`` bounds the CP-SAT search (wall time, or deterministic
   time when ``config.deterministic``); the greedy pass, model building, realisation and
   the overdue pass come on top (about a second at 10,000 GPUs). Every parameter is set
   in ``solver.cp_sat``.
7. Every CP-SAT status is handled: OPTIMAL/FEASIBLE are realised node by node
   (``solver.extraction``: empty the chosen nodes, first-fit decreasing per group), then
   the engine fills what did not fit (``GreedyEngine.fill``), and the plan is validated;
   INFEASIBLE, MODEL_INVALID and UNKNOWN fall back to the greedy plan with a note. So
   would a realised plan that broke a promise of the greedy's
   (``GreedyEngine.broken_promise``: left the room a greedy move or stop made for a job
   to others — a safety net, since step 2 pins those jobs — or started on GPUs reserved
   for a starving job).
8. The realised plan and the greedy plan are scored with ``solver.objective.evaluate``;
   the better one is returned, and ``stats.engine``/``stats.note`` say which and why.
   ``best_bound`` is the CP-SAT bound of step 2's problem (given the greedy's disruption
   decisions) in objective units; it is an upper bound of that problem, not of every plan
   (``solver.relaxation.global_upper_bound`` is one for every plan, and much looser).
"""

from __future__ import annotations

import gc
import time
from collections.abc import Iterator
from contextlib import contextmanager

from ortools.sat.python import cp_model

from solver.actions import build_plan
from solver.cp_sat import CP_SAT_STATUS, placement_solver
from solver.elastic_training import plan_with_elastic_training
from solver.extraction import realise
from solver.greedy import sort_key
from solver.greedy.sharing import plan_with_shares
from solver.greedy_variants import GREEDY, best_greedy, greedy_options
from solver.hints import add_best_hint
from solver.instance import Instance, SolverConfig
from solver.model_inputs import placement_model
from solver.objective import SCALE
from solver.overdue_pass import require_overdue
from solver.plan import Plan, ReasonCode, SolveStats, SolveStatus
from solver.validate import Violation, validate

SATURATED_NOTE = (
    "CP-SAT skipped: the greedy plan places every placeable job and meets every service's "
    "demand on the fastest GPUs they accept, so no plan holds more allocation"
)


def solve(instance: Instance, *, policy: str = "shaper") -> Plan:
    with _collector_paused():
        # Fractional jobs (if any) are placed around the plan of the whole GPUs, and elastic
        # training jobs are shrunk, started smaller or grown around the plan of the rest
        # (not grown while shares or MIG slices wait: they are placed after it).
        parts_waiting = any(
            (job.is_fractional or job.is_mig) and not job.placement for job in instance.jobs
        )
        return plan_with_shares(
            instance,
            lambda whole: plan_with_elastic_training(
                whole, lambda rest: _solve(rest, policy=policy), grow=not parts_waiting
            ),
        )


@contextmanager
def _collector_paused() -> Iterator[None]:
    """Python's cycle collector off while a plan is computed (if it was on). A solve makes
    millions of short-lived containers, and each full collection they trigger walks every
    object the instance holds: at 100,000 GPUs and 80,000 jobs about a second of a
    ten-second plan. What a solve drops is freed by reference counting; any cycle it
    leaves is collected once the collector is back on. Only the call that turned it off
    turns it back on (a solve started while it was off leaves it off)."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _solve(instance: Instance, *, policy: str) -> Plan:
    started_at = time.perf_counter()
    config = instance.config
    # 1. Greedy.
    best = best_greedy(instance)
    engine = best.engine
    # The CP-SAT pass goes on in the greedy's engine and rewrites its reasons: keep the
    # greedy's own, so that a greedy plan never says where CP-SAT would have put a job.
    greedy_decisions = dict(best.result.decisions)
    greedy_pending = dict(best.result.pending)

    def greedy_plan(stats: SolveStats) -> Plan:
        return build_plan(
            instance,
            policy=policy,
            target=best.target,
            decisions=dict(greedy_decisions),
            pending=dict(greedy_pending),
            stats=stats,
            terms=best.terms,
        )

    if not config.use_cp_sat:
        plan = greedy_plan(SolveStats(status=SolveStatus.heuristic, engine="greedy"))
        return _finish(plan, started_at, note="CP-SAT disabled in the config")
    if best.saturated:
        plan = greedy_plan(SolveStats(status=SolveStatus.heuristic, engine="greedy"))
        return _finish(plan, started_at, note=SATURATED_NOTE)

    budget = _Budget(config, started_at)
    if budget.spent():
        plan = greedy_plan(SolveStats(status=SolveStatus.heuristic, engine="greedy"))
        return _finish(plan, started_at, note=budget.note("the greedy"))

    # 2. Base state.
    rebase = engine.rebase()
    evaluator = best.evaluator  # scores the base and CP-SAT's plan (step 8)
    base_terms = evaluator.evaluate(engine.result.target())
    # 3. Model.
    keys = sort_key(instance, GREEDY.order)
    queue = sorted(
        (j for j in instance.jobs if not j.is_elastic and not j.is_running),
        key=lambda j: keys[j.id],
    )
    model = placement_model(engine, queue, rebase.missing, greedy_pending)
    model.build()
    # 4. Overdue pass (before the hints: its first solve starts cold).
    require_overdue(model)
    # 5. Warm start.
    hint_source = add_best_hint(model, rebase, with_lp=budget.allows_lp_hint())
    # 6. Search.
    if budget.spent():
        plan = greedy_plan(SolveStats(status=SolveStatus.heuristic, engine="greedy"))
        return _finish(plan, started_at, note=budget.note("the greedy and the model"))
    solver = placement_solver(config, budget.search_s())
    status = solver.solve(model.model)
    solve_status = CP_SAT_STATUS.get(status, SolveStatus.unknown)
    if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return _finish(
            greedy_plan(SolveStats(status=SolveStatus.heuristic, engine="greedy")),
            started_at,
            note=f"CP-SAT returned {solver.status_name(status)}; greedy plan kept",
        )

    # 7. Extraction, fill, checks.
    bound = base_terms.objective + solver.best_objective_bound / SCALE
    realise(model, solver, engine)
    engine.fill(queue, rebase.missing)
    cp_target = engine.result.target()
    cp_terms = evaluator.evaluate(cp_target)
    violations: list[Violation] = []
    broken = engine.broken_promise(cp_target)
    # 8. The better plan.
    if broken is None and cp_terms.objective > best.terms.objective + 1e-6:
        decisions = {
            job_id: reason
            for job_id, reason in greedy_decisions.items()
            if reason.code in (ReasonCode.preempted_by_higher_priority, ReasonCode.defragmentation)
        }
        decisions.update(engine.result.decisions)
        plan = build_plan(
            instance,
            policy=policy,
            target=cp_target,
            decisions=decisions,
            pending=dict(engine.result.pending),
            stats=SolveStats(status=solve_status, engine="cp-sat", best_bound=bound),
            terms=cp_terms,
        )
        # Legal by construction; checked anyway, since a wrong plan must never leave here.
        violations = validate(instance, plan)
        if not violations:
            note = f"CP-SAT {solver.status_name(status)}, hint from the {hint_source}"
            return _finish(plan, started_at, note=note)
    plan = greedy_plan(SolveStats(status=solve_status, engine="greedy", best_bound=bound))
    note = f"CP-SAT ({solver.status_name(status)}) found nothing better than the greedy plan"
    if violations:
        note = f"CP-SAT plan failed validation ({violations[0]}); greedy plan kept"
    elif broken is not None:
        note = f"CP-SAT plan did not use the room made for it ({broken}); greedy plan kept"
    return _finish(plan, started_at, note=note)


class _Budget:
    """What is left of ``config.plan_budget_s`` (none: no limit but the config's own).

    The search gets what is left after a margin for what follows it (extraction, fill,
    checks: a sixth of the time spent so far, at least 0.2 s), at most ``time_limit_s``;
    under ``MIN_SEARCH_S`` it is not worth starting. The rounded-LP warm start runs only
    when what is left covers a full search plus as long again as the phases before it took
    (the LP costs about as much as building the model)."""

    MIN_SEARCH_S = 0.5

    def __init__(self, config: SolverConfig, started_at: float) -> None:
        self.config = config
        self.started_at = started_at
        self.limit = None if config.deterministic else config.plan_budget_s

    def _elapsed(self) -> float:
        return time.perf_counter() - self.started_at

    def search_s(self) -> float | None:
        if self.limit is None:
            return None
        margin = max(0.2, self._elapsed() / 6)
        return min(self.config.time_limit_s, self.limit - self._elapsed() - margin)

    def spent(self) -> bool:
        left = self.search_s()
        return left is not None and left < self.MIN_SEARCH_S

    def allows_lp_hint(self) -> bool:
        if self.limit is None:
            return True
        return self.limit - self._elapsed() >= self.config.time_limit_s + self._elapsed()

    def note(self, what: str) -> str:
        return (
            f"CP-SAT skipped: {what} took {self._elapsed():.2f} s of the "
            f"{self.limit:g} s plan budget; greedy plan kept"
        )


def _finish(plan: Plan, started_at: float, *, note: str) -> Plan:
    plan.stats.wall_time_s = time.perf_counter() - started_at
    plan.stats.note = note
    return plan


__all__ = ["CP_SAT_STATUS", "GREEDY", "SATURATED_NOTE", "greedy_options", "solve"]
