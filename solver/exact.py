"""Exact optimum (or a proven upper bound) of the real placement problem, for small instances.

The shaper's CP-SAT model aggregates nodes into pools, so its bound holds for a restricted
problem; ``solver.relaxation.global_upper_bound`` holds for every legal plan but relaxes
packing and disruption rules. This module states the problem node by node, on instances of at most
``MAX_NODES`` nodes and ``MAX_JOBS`` jobs, and maximises exactly
``solver.objective.evaluate`` over the plans ``solver.validate`` accepts.

Variables: ``replicas_{job}_{node}`` (replicas a job holds on a node after the plan, GPUs =
replicas × ``gpus_per_replica``); per block job ``placed``, and per running block job
exactly one of ``keep`` (same placement), ``moved`` and ``stopped``; per elastic service its
replicas served per GPU speed, its unmet demand and its growth; per ready node ``free``.

Constraints, each the model form of a ``solver.validate`` rule (numbers as there):

1. replicas are whole by construction;
2. capacity: GPUs, and CPU and memory where the node models them, at most
   ``max(capacity, what the snapshot already holds there)``;
3. compatibility (``solver.compat.node_accepts``, ready nodes only) bounds the replicas a
   job may *gain* on a node; on any other node it keeps at most what it holds;
4. gangs: a block job holds all its replicas or none; a started or moved one within one
   cluster and on at most ``max_nodes`` nodes (a kept placement is exempt, as in validate);
5. movement: ``moved`` only for a checkpointable, ``migratable`` job out of its cooldown
   and under its SLA's migrations per day, within its cluster; at most
   ``max_migrations_per_cycle`` moves;
6. stopping: ``stopped`` only for a preemptible job under its preemptions per day; at most
   ``max_preemptions_per_cycle`` stops; per team, GPUs stopped at most the GPUs it held
   above its guarantee plus the GPUs it starts or grows (validate's guarantee rule);
7. elastic: replicas within ``[min(min_replicas, current), max(upper_replicas, current)]``
   and within ``max_replica_change`` of current;
8. quota: a team's GPUs after the plan at most ``max(quota cap, GPUs before)``;
10. max queue wait, as validate checks it: a pending overdue block job that stays pending
    has, on every ready compatible node, less free GPU, CPU or memory than it needs, or
    its team's quota has no room for it;
11. dwell: frozen jobs (``Instance.is_frozen``) keep their placement; a frozen pending job
    is not started.

The objective is ``evaluate``'s, term for term: block value weight × boost × GPUs × speed;
an elastic service's served replicas (at most its demand, the fastest ones, which the
maximisation picks) minus ``elastic_unmet_weight`` per unmet replica; minus the migration
and lost-work costs of moved and stopped jobs; plus ``fragmentation_weight`` per ready node
left empty. Coefficients are scaled by ``SCALE`` and rounded; the bound returned adds the
largest error that rounding can make, so it stays an upper bound in objective units.

Left out of the model: only rule 9 (actions, reasons, GPU indices), which
``solver.actions.build_plan`` derives from any target placement. So the model admits
exactly the target placements ``validate`` accepts, each at its ``evaluate`` objective
(the tests check both directions on random instances: every policy's plan, pinned, is
admitted at no less than its objective; the optimal plan passes ``validate``). Its
solution is turned into a plan and validated: an OPTIMAL status with a plan that passes
is the exact optimum of the real problem; otherwise the bound is a valid upper bound and
the objective a lower one. Not modelled, because ``validate`` does not enforce them: the
engines' own restraint (preempt only for work worth more, the ``config.migration`` and
``preemption`` levers, look-ahead and starvation reservations) and the full form of the
overdue rule ("placed if *some* legal plan places it", which the engines approximate); the
optimum is over what ``validate`` accepts.

Cost: one integer variable per (job, node) pair where the job may hold replicas. The
benchmark's 64-GPU instances (9–12 nodes, 51–71 jobs) solve to optimality in under a
second on two workers; of the 100-GPU ones (14–16 nodes, 78–89 jobs), the two with more
than 80 jobs were not proven optimal within 30 s: hence the limits.
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

from ortools.sat.python import cp_model

from solver.actions import build_plan
from solver.compat import node_accepts
from solver.cp_sat import CP_SAT_STATUS, exact_solver
from solver.instance import Instance, Job, NodeState
from solver.objective import elastic_demand, evaluate
from solver.plan import Plan, SolveStats, SolveStatus
from solver.validate import Violation, validate

MAX_NODES = 16
MAX_JOBS = 80
# Objective units per integer unit: fine enough that rounding moves the bound by far less
# than one GPU-hour, small enough that overdue boosts stay well inside int64.
SCALE = 10_000

Placement = Mapping[str, Mapping[str, int]]


@dataclass(frozen=True)
class ExactResult:
    """What the exact model proved.

    ``objective`` is ``evaluate`` of the best plan found (None when none was found);
    ``bound`` is an upper bound on the objective of every legal plan (None when CP-SAT
    proved none exists or gave no bound); ``exact`` says that ``objective`` is the optimum
    of the real problem: CP-SAT proved optimality and the plan passed ``validate``.
    """

    status: SolveStatus
    objective: float | None
    bound: float | None
    exact: bool
    plan: Plan | None
    violations: tuple[Violation, ...]
    wall_time_s: float

    @property
    def gap(self) -> float | None:
        """Relative distance from the best plan found to the bound."""
        if self.objective is None or self.bound is None:
            return None
        return (self.bound - self.objective) / max(1e-9, abs(self.bound))


def check_size(instance: Instance) -> None:
    """Refuse instances too large for a per-node model."""
    if len(instance.nodes) > MAX_NODES or len(instance.jobs) > MAX_JOBS:
        raise ValueError(
            f"exact model: {len(instance.nodes)} nodes and {len(instance.jobs)} jobs; "
            f"it takes at most {MAX_NODES} nodes and {MAX_JOBS} jobs"
        )
    if instance.one_replica_per_node:
        raise ValueError(
            "exact model: jobs that run one replica per node (one_replica_per_node) are not "
            "modelled yet"
        )
    resizable = sorted(job.id for job in instance.jobs if job.is_resizable)
    if resizable:
        raise ValueError(
            f"exact model: elastic training jobs (max_replicas) are not modelled yet: "
            f"{', '.join(resizable[:5])}"
        )


def _upper(var: cp_model.IntVar) -> int:
    # The proto's repeated field does not take negative indices.
    domain = var.proto.domain
    return int(domain[len(domain) - 1])


class ExactModel:
    """The per-node CP-SAT model of one instance (see the module docstring)."""

    def __init__(self, instance: Instance) -> None:
        check_size(instance)
        self.instance = instance
        self.model = cp_model.CpModel()
        # (coefficient in objective units, variable, its upper bound) for the rounding error.
        self.terms: list[tuple[float, cp_model.IntVar, int]] = []
        self.replicas: dict[str, dict[str, cp_model.IntVar]] = {}
        self.placed: dict[str, cp_model.IntVar] = {}
        self.keep: dict[str, cp_model.IntVar] = {}
        self.moved: dict[str, cp_model.IntVar] = {}
        self.stopped: dict[str, cp_model.IntVar] = {}
        self.free: dict[str, cp_model.IntVar] = {}
        self._gpus_before: dict[str, int] = defaultdict(int)
        self._cpu_before: dict[str, int] = defaultdict(int)
        self._mem_before: dict[str, int] = defaultdict(int)
        for job in instance.jobs:
            for node_name, gpus in job.placement.items():
                replicas = gpus // job.gpus_per_replica
                self._gpus_before[node_name] += gpus
                self._cpu_before[node_name] += replicas * job.cpu_milli_per_replica
                self._mem_before[node_name] += replicas * job.memory_mib_per_replica
        # Linear pieces per team for the guarantee and quota rows.
        self._team_after: dict[str, list[cp_model.LinearExprT]] = defaultdict(list)
        self._team_started: dict[str, list[cp_model.LinearExprT]] = defaultdict(list)
        self._team_stopped: dict[str, list[cp_model.LinearExprT]] = defaultdict(list)
        for job in instance.jobs:
            self._replica_variables(job)
            if job.is_elastic:
                self._elastic(job)
            else:
                self._block(job)
        self._capacity_and_fragmentation()
        self._budgets()
        self._teams()
        self._overdue()
        self.model.maximize(sum(round(c * SCALE) * var for c, var, _ in self.terms))

    # -- variables -------------------------------------------------------------------------

    def _replica_variables(self, job: Job) -> None:
        instance = self.instance
        per_replica = job.gpus_per_replica
        if job.is_elastic:
            most = max(job.upper_replicas, job.held_gpus // per_replica)
        else:
            most = job.replicas
        frozen = instance.is_frozen(job)
        variables: dict[str, cp_model.IntVar] = {}
        for node in instance.nodes:
            held = job.placement.get(node.name, 0) // per_replica
            may_gain = node.state is NodeState.up and node_accepts(instance, node, job)
            if frozen:
                low = high = held
            elif may_gain:
                room = max(node.gpus, self._gpus_before[node.name]) // per_replica
                low, high = 0, min(most, room)
            else:
                low, high = 0, held
            if high > 0:
                variables[node.name] = self.model.new_int_var(
                    low, high, f"replicas_{job.id}_{node.name}"
                )
        self.replicas[job.id] = variables

    def _total(self, job: Job) -> cp_model.LinearExprT:
        return sum(self.replicas[job.id].values(), cp_model.LinearExpr.constant(0))

    # -- jobs --------------------------------------------------------------------------------

    def _block(self, job: Job) -> None:
        instance, model = self.instance, self.model
        config = instance.config
        variables = self.replicas[job.id]
        per_replica = job.gpus_per_replica
        placed = model.new_bool_var(f"placed_{job.id}")
        self.placed[job.id] = placed
        model.add(self._total(job) == job.replicas * placed)
        weight = instance.weight(job)
        value = weight * instance.boost(job) * per_replica
        for node_name, var in variables.items():
            speed = instance.job_speed(job, instance.node_by_name[node_name].gpu_model)
            self.terms.append((value * speed, var, _upper(var)))
        self._away(job)
        gpus_after = per_replica * self._total(job)
        self._team_after[job.team].append(gpus_after)
        frozen = instance.is_frozen(job)
        if not job.is_running:
            if frozen:
                model.add(placed == 0)
            self._team_started[job.team].append(gpus_after)
            self._gang(job, new=placed)
            return
        policy = instance.policy_for(job)
        # A running job moves only within its cluster (validate rule 5).
        here = instance.node_by_name[next(iter(job.placement))].cluster
        for node_name, var in variables.items():
            if instance.node_by_name[node_name].cluster != here:
                model.add(var == 0)
        keep = model.new_bool_var(f"keep_{job.id}")
        moved = model.new_bool_var(f"moved_{job.id}")
        stopped = model.new_bool_var(f"stopped_{job.id}")
        self.keep[job.id], self.moved[job.id], self.stopped[job.id] = keep, moved, stopped
        model.add(keep + moved + stopped == 1)
        model.add(placed == keep + moved)
        for node_name, var in variables.items():
            model.add(var == job.placement.get(node_name, 0) // per_replica).only_enforce_if(keep)
        if frozen:
            model.add(keep == 1)
        cooling = (
            job.last_moved_at is not None
            and instance.now - job.last_moved_at < config.migration_cooldown_s
        )
        migrations = policy.max_migrations_per_day
        if (
            not job.checkpointable
            or not job.migratable  # it moves only within its cluster here (validate rule 5)
            or cooling
            or (migrations is not None and job.migrations_today >= migrations)
        ):
            model.add(moved == 0)
        preemptions = policy.max_preemptions_per_day
        if not instance.is_preemptible(job) or (
            preemptions is not None and job.preemptions_today >= preemptions
        ):
            model.add(stopped == 0)
        horizon = config.value_horizon_s
        move_cost = weight * job.held_gpus * instance.migration.migration_seconds(job) / horizon
        lost = instance.migration.preemption_lost_seconds(job, instance.now)
        self.terms.append((-move_cost, moved, 1))
        self.terms.append((-weight * job.held_gpus * lost / horizon, stopped, 1))
        self._team_stopped[job.team].append(job.held_gpus * stopped)
        self._gang(job, new=moved)

    def _away(self, job: Job) -> None:
        """The transfer a block job pays in a cluster other than where its image is (its
        ``home_cluster`` while pending, its current cluster while running), per replica
        there: a gang sits in one cluster, so the sum is the whole transfer or nothing."""
        node_by_name = self.instance.node_by_name
        if job.is_running:
            here: str | None = node_by_name[next(iter(job.placement))].cluster
        else:
            here = job.home_cluster
        if here is None:
            return
        weight = self.instance.weight(job)
        gpus = job.held_gpus if job.is_running else job.total_gpus
        per_replica_cost = weight * gpus * self.instance.transfer_per_gpu(job) / job.replicas
        for node_name, var in self.replicas[job.id].items():
            if node_by_name[node_name].cluster != here:
                self.terms.append((-per_replica_cost, var, _upper(var)))

    def _gang(self, job: Job, *, new: cp_model.IntVar) -> None:
        """A started or moved block job: one cluster, at most ``max_nodes`` nodes."""
        variables = self.replicas[job.id]
        node_by_name = self.instance.node_by_name
        clusters = sorted({node_by_name[name].cluster for name in variables})
        max_nodes = job.max_nodes if job.max_nodes is not None else len(variables)
        spread_binds = len(variables) > max_nodes
        if len(variables) <= 1 or (len(clusters) <= 1 and not spread_binds):
            return
        model = self.model
        uses: dict[str, cp_model.IntVar] = {}
        for node_name, var in variables.items():
            use = model.new_bool_var(f"uses_{job.id}_{node_name}")
            model.add(var <= _upper(var) * use)
            uses[node_name] = use
        if spread_binds:
            model.add(sum(uses.values()) <= max_nodes).only_enforce_if(new)
        if len(clusters) > 1:
            in_cluster = {
                cluster: model.new_bool_var(f"cluster_{job.id}_{cluster}") for cluster in clusters
            }
            for node_name, use in uses.items():
                model.add_implication(use, in_cluster[node_by_name[node_name].cluster])
            model.add(sum(in_cluster.values()) <= 1).only_enforce_if(new)

    def _elastic(self, job: Job) -> None:
        instance, model = self.instance, self.model
        config = instance.config
        variables = self.replicas[job.id]
        per_replica = job.gpus_per_replica
        current = job.held_gpus // per_replica
        total = self._total(job)
        low = min(job.min_replicas, current)
        high = max(job.upper_replicas, current)
        if job.max_replica_change is not None:
            low = max(low, current - job.max_replica_change)
            high = min(high, current + job.max_replica_change)
        model.add_linear_constraint(total, low, high)
        weight = instance.weight(job)
        demand = elastic_demand(job)
        # Served replicas per GPU speed: the maximisation serves the fastest first, as
        # evaluate counts them.
        by_speed: dict[float, list[cp_model.IntVar]] = defaultdict(list)
        for node_name, var in variables.items():
            by_speed[instance.speed(instance.node_by_name[node_name])].append(var)
        served_vars = []
        for index, (speed, held) in enumerate(sorted(by_speed.items(), reverse=True)):
            served = model.new_int_var(0, demand, f"served_{job.id}_{index}")
            model.add(served <= sum(held))
            served_vars.append(served)
            self.terms.append((weight * per_replica * speed, served, demand))
        if served_vars:
            model.add(sum(served_vars) <= demand)
        unmet = model.new_int_var(0, demand, f"unmet_{job.id}")
        model.add(unmet >= demand - total)
        self.terms.append((-config.elastic_unmet_weight * weight * per_replica, unmet, demand))
        gpus_after = per_replica * total
        most = per_replica * max(high, 0)
        growth = model.new_int_var(0, max(0, most - job.held_gpus), f"growth_{job.id}")
        model.add_max_equality(growth, [0, gpus_after - job.held_gpus])
        self._team_after[job.team].append(gpus_after)
        self._team_started[job.team].append(growth)

    # -- shared rows -------------------------------------------------------------------------

    def _node_usage(self) -> tuple[dict[str, list[cp_model.LinearExprT]], ...]:
        gpus: dict[str, list[cp_model.LinearExprT]] = defaultdict(list)
        cpu: dict[str, list[cp_model.LinearExprT]] = defaultdict(list)
        mem: dict[str, list[cp_model.LinearExprT]] = defaultdict(list)
        for job in self.instance.jobs:
            for node_name, var in self.replicas[job.id].items():
                gpus[node_name].append(job.gpus_per_replica * var)
                cpu[node_name].append(job.cpu_milli_per_replica * var)
                mem[node_name].append(job.memory_mib_per_replica * var)
        return gpus, cpu, mem

    def _capacity_and_fragmentation(self) -> None:
        model = self.model
        weight = self.instance.config.fragmentation_weight
        self._gpus_used, self._cpu_used, self._mem_used = self._node_usage()
        for node in self.instance.nodes:
            name = node.name
            gpus = self._gpus_used[name]
            if gpus:
                model.add(sum(gpus) <= max(node.gpus, self._gpus_before[name]))
            if node.cpu_milli and gpus:
                model.add(sum(self._cpu_used[name]) <= max(node.cpu_milli, self._cpu_before[name]))
            if node.memory_mib and gpus:
                model.add(sum(self._mem_used[name]) <= max(node.memory_mib, self._mem_before[name]))
            if node.state is NodeState.up and node.gpus > 0:
                free = model.new_bool_var(f"free_{name}")
                if gpus:
                    model.add(sum(gpus) == 0).only_enforce_if(free)
                else:
                    model.add(free == 1)  # nothing may land here: it stays free
                self.free[name] = free
                self.terms.append((weight, free, 1))

    def _budgets(self) -> None:
        config = self.instance.config
        if self.moved:
            self.model.add(sum(self.moved.values()) <= config.max_migrations_per_cycle)
        cap = config.max_preemptions_per_cycle
        if cap is not None and self.stopped:
            self.model.add(sum(self.stopped.values()) <= cap)

    def _teams(self) -> None:
        instance = self.instance
        held_before: dict[str, int] = defaultdict(int)
        for job in instance.jobs:
            held_before[job.team] += job.held_gpus
        outside = instance.quota_held_outside  # shares and MIG instances planned around
        for team, gpus in outside.items():
            held_before[team] += gpus
        for team in sorted(held_before):
            policy = instance.policy_by_team.get(team)
            guaranteed = policy.guaranteed_gpus if policy is not None else 0
            stopped = self._team_stopped[team]
            if stopped:
                reclaimable = max(0, held_before[team] - guaranteed)
                self.model.add(sum(stopped) <= reclaimable + sum(self._team_started[team]))
            cap = policy.quota_cap if policy is not None else None
            if cap is not None:
                after = sum(self._team_after[team]) + outside.get(team, 0)
                self.model.add(after <= max(cap, held_before[team]))

    def _overdue(self) -> None:
        """Rule 10: an overdue pending job left pending fits on no ready compatible node."""
        instance, model = self.instance, self.model
        full: dict[tuple[str, str, int], cp_model.IntVar] = {}

        def short_of(
            kind: str, node_name: str, used: cp_model.LinearExprT, room: int
        ) -> cp_model.IntVar:
            # True only if ``used`` leaves less than the job needs: ``used > room``.
            key = (kind, node_name, room)
            if key not in full:
                literal = model.new_bool_var(f"full_{kind}_{node_name}_{room}")
                model.add(used >= room + 1).only_enforce_if(literal)
                full[key] = literal
            return full[key]

        for job in instance.jobs:
            if job.is_elastic or job.is_running or not instance.is_overdue(job):
                continue
            if instance.is_frozen(job):
                continue
            excuses = [self.placed[job.id]]
            cap = instance.policy_for(job).quota_cap
            if cap is not None:
                no_room = model.new_bool_var(f"quota_full_{job.id}")
                outside = instance.quota_held_outside.get(job.team, 0)
                team_after = sum(self._team_after[job.team]) + outside
                model.add(team_after + job.total_gpus >= cap + 1).only_enforce_if(no_room)
                excuses.append(no_room)
            cpu = job.replicas * job.cpu_milli_per_replica
            mem = job.replicas * job.memory_mib_per_replica
            for node in instance.nodes:
                if node.state is not NodeState.up or not node_accepts(instance, node, job):
                    continue
                needs = [(node.gpus, job.total_gpus, "gpu", self._gpus_used[node.name])]
                if node.cpu_milli:
                    needs.append((node.cpu_milli, cpu, "cpu", self._cpu_used[node.name]))
                if node.memory_mib:
                    needs.append((node.memory_mib, mem, "mem", self._mem_used[node.name]))
                if any(size < need for size, need, _, _ in needs):
                    continue  # never fits, whatever the plan leaves free
                reasons = [
                    short_of(kind, node.name, sum(used), size - need)
                    for size, need, kind, used in needs
                    if used
                ]
                model.add_bool_or([*excuses, *reasons])

    # -- hints and pins ----------------------------------------------------------------------

    def add_hint(self, placement: Placement) -> None:
        """Warm start from a target placement (a policy's plan)."""
        for job in self.instance.jobs:
            target = placement.get(job.id, {})
            for node_name, var in self.replicas[job.id].items():
                self.model.add_hint(var, target.get(node_name, 0) // job.gpus_per_replica)
            if job.id in self.placed:
                self.model.add_hint(self.placed[job.id], bool(target))
            if job.id in self.keep:
                same = dict(target) == job.placement
                self.model.add_hint(self.keep[job.id], same)
                self.model.add_hint(self.moved[job.id], bool(target) and not same)
                self.model.add_hint(self.stopped[job.id], not target)

    def pin(self, placement: Placement) -> None:
        """Fix every job to ``placement``: the model is then feasible iff it admits it."""
        for job in self.instance.jobs:
            target = placement.get(job.id, {})
            variables = self.replicas[job.id]
            for node_name, var in variables.items():
                self.model.add(var == target.get(node_name, 0) // job.gpus_per_replica)
            if any(node_name not in variables and gpus for node_name, gpus in target.items()):
                impossible = self.model.new_int_var(0, 0, f"unplaceable_{job.id}")
                self.model.add(impossible == 1)

    # -- solve and extract -------------------------------------------------------------------

    def rounding_slack(self) -> float:
        """Most the scaled, rounded objective can fall short of the real one."""
        return sum(abs(c - round(c * SCALE) / SCALE) * high for c, _, high in self.terms)

    def target(self, solver: cp_model.CpSolver) -> dict[str, dict[str, int]]:
        result: dict[str, dict[str, int]] = {}
        for job in self.instance.jobs:
            held = {
                node_name: solver.value(var) * job.gpus_per_replica
                for node_name, var in self.replicas[job.id].items()
                if solver.value(var) > 0
            }
            if held:
                result[job.id] = held
        return result


def solve_exact(
    instance: Instance,
    *,
    time_limit_s: float = 10.0,
    num_workers: int = 2,
    seed: int = 0,
    hint: Placement | None = None,
    pin: Placement | None = None,
) -> ExactResult:
    """Maximise ``evaluate`` over the legal plans of a small instance (``ValueError`` if
    it has more than ``MAX_NODES`` nodes or ``MAX_JOBS`` jobs).

    ``hint`` warm-starts the search from a plan's placement; ``pin`` fixes the placement
    (the model then only checks that it admits it, and its objective for it).
    """
    started = time.perf_counter()
    exact = ExactModel(instance)
    if hint is not None:
        exact.add_hint(hint)
    if pin is not None:
        exact.pin(pin)
    solver = exact_solver(time_limit_s=time_limit_s, num_workers=num_workers, seed=seed)
    code = solver.solve(exact.model)
    status = CP_SAT_STATUS.get(code, SolveStatus.unknown)
    bound: float | None = None
    if status in (SolveStatus.optimal, SolveStatus.feasible, SolveStatus.unknown):
        raw = solver.best_objective_bound
        if math.isfinite(raw):
            bound = raw / SCALE + exact.rounding_slack()
    if status not in (SolveStatus.optimal, SolveStatus.feasible):
        return ExactResult(
            status=status,
            objective=None,
            bound=bound,
            exact=False,
            plan=None,
            violations=(),
            wall_time_s=time.perf_counter() - started,
        )
    target = exact.target(solver)
    terms = evaluate(instance, target)
    plan = build_plan(
        instance,
        policy="exact",
        target=target,
        decisions={},
        pending={},
        stats=SolveStats(status=status, engine="cp-sat-exact", best_bound=bound),
        terms=terms,
    )
    violations = tuple(validate(instance, plan))
    return ExactResult(
        status=status,
        objective=terms.objective,
        bound=None if bound is None else max(bound, terms.objective),
        exact=status is SolveStatus.optimal and not violations,
        plan=plan,
        violations=violations,
        wall_time_s=time.perf_counter() - started,
    )
