"""Solver benchmark: seeded instances, every policy, one table.

    .venv/bin/python bench/solver.py                 # 100, 1,000 and 10,000 GPUs, load 1× and 2×
    .venv/bin/python bench/solver.py --sizes 100 1000 --loads 1
    .venv/bin/python bench/solver.py --exact-only    # only the small section (16, 32, 64 GPUs)
    .venv/bin/python bench/solver.py --sizes --exact-sizes --loads 1 --federated 10 1000
                                                     # a federation group: 10 clusters × 1,000

Federated section (``--federated CLUSTERS GPUS_PER_CLUSTER``): the same kind of instance
dealt over that many clusters and planned as one federation group; each pending job is
submitted to one cluster (most to half of them) and pays its image's transfer when it
starts in another ("away"); running jobs and services stay where they are. With
``--plan-budget SECONDS`` the shaper also plans each instance under that wall-clock budget
for the whole plan (row ``shaper≤Ns``: CP-SAT gets what the greedy and the model leave).

Instances: four GPU models (different memory, precisions, speed), 4- and 8-GPU nodes in
one cluster per 1,000 GPUs (at most four), a fragmented running state (small jobs scattered
over most nodes, elastic services running at their daily peak), and a queue of single-node
block jobs, multi-node gangs and elastic demand worth ``load`` × the cluster's GPUs.

Columns: wall time of ``plan()`` and its CPU time (process time, CP-SAT's worker threads
included: on a shared machine the wall time also counts the waits for a core, the CPU time
does not), priority-weighted allocation (Σ weight × GPUs × speed of
what holds GPUs after the plan, elastic counted up to demand), the objective
(``solver.objective``), CP-SAT's best bound and gap (shaper only: the bound of the placement
problem left after the greedy's migrations and preemptions), the gap to a global LP upper
bound that holds for any legal plan (``solver.relaxation.global_upper_bound``: packing,
gang spreads, disruption costs relaxed, so it is loose), the engine that produced the
plan, and the number of ``validate`` violations (always 0). Not a test: figures vary with
the machine.

Small section (``--exact-sizes``, load 1, seeds ``--exact-seeds``): the same instances at
sizes small enough for ``solver.exact``, a per-node CP-SAT model of the real problem
(every rule ``validate`` checks, the objective term for term). For each policy: its
objective, the exact optimum ("exact": proven optimal and the optimal plan passes
``validate``) or, where CP-SAT stops at its limit, its proven upper bound ("bound"), the
gap to it, and the gap to the LP bound beside it; per instance, how far the LP bound lies
above the optimum.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.instances import LoadedCluster, random_instance  # noqa: E402
from solver.exact import solve_exact  # noqa: E402
from solver.instance import SolverConfig  # noqa: E402
from solver.objective import evaluate  # noqa: E402
from solver.plan import ActionKind  # noqa: E402
from solver.policies import POLICY_NAMES, get_policy  # noqa: E402
from solver.relaxation import global_upper_bound  # noqa: E402
from solver.validate import validate  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="*", default=[100, 1000, 10000])
    parser.add_argument("--loads", type=float, nargs="+", default=[1.0, 2.0])
    parser.add_argument("--policies", nargs="+", default=list(POLICY_NAMES))
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--time-limit", type=float, default=2.0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--exact-sizes", type=int, nargs="*", default=[16, 32, 64])
    parser.add_argument("--exact-seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--exact-time-limit", type=float, default=30.0)
    parser.add_argument("--exact-only", action="store_true", help="skip the large section")
    parser.add_argument(
        "--federated",
        type=int,
        nargs=2,
        metavar=("CLUSTERS", "GPUS_PER_CLUSTER"),
        help="also plan a federation group of CLUSTERS clusters as one instance (e.g. 10 1000)",
    )
    parser.add_argument(
        "--plan-budget",
        type=float,
        metavar="SECONDS",
        help="federated section: also plan each instance with the shaper under this "
        "wall-clock budget for the whole plan (SolverConfig.plan_budget_s), beside it unbudgeted",
    )
    args = parser.parse_args()
    config = SolverConfig(time_limit_s=args.time_limit, num_workers=args.workers, seed=args.seed)
    if not args.exact_only and args.sizes:
        large_section(args, config)
    if args.federated:
        print()
        federated_section(args, config)
    if args.exact_sizes:
        if not args.exact_only:
            print()
        small_section(args, config)


def large_section(args: argparse.Namespace, config: SolverConfig) -> None:
    header = (
        f"{'GPUs':>6} {'load':>4} {'jobs':>6} {'policy':<9} {'wall s':>7} {'cpu s':>7} "
        f"{'alloc':>10} "
        f"{'objective':>11} {'bound':>11} {'gap %':>6} {'LP-UB gap %':>11} {'engine':<9} "
        f"{'status':<10} {'viol':>4}"
    )
    print(header)
    print("-" * len(header))
    for size in args.sizes:
        for load in args.loads:
            built = time.perf_counter()
            instance = random_instance(args.seed, LoadedCluster(gpus=size, load=load), config)
            build_s = time.perf_counter() - built
            allocations: dict[str, float] = {}
            global_bound = global_upper_bound(instance)
            for name in args.policies:
                policy = get_policy(name)
                started = time.perf_counter()
                cpu_started = time.process_time()
                plan = policy.plan(instance)
                wall = time.perf_counter() - started
                cpu = time.process_time() - cpu_started
                terms = evaluate(instance, plan.placement)
                violations = validate(instance, plan)
                allocations[name] = terms.allocation
                stats = plan.stats
                bound = (
                    f"{stats.best_bound:11.1f}" if stats.best_bound is not None else f"{'-':>11}"
                )
                gap = f"{100 * stats.gap:6.2f}" if stats.gap is not None else f"{'-':>6}"
                global_gap = 100 * (global_bound - stats.objective) / global_bound
                print(
                    f"{size:>6} {load:>4g} {len(instance.jobs):>6} {name:<9} {wall:7.3f} "
                    f"{cpu:7.3f} {terms.allocation:10.1f} {stats.objective:11.1f} {bound} {gap} "
                    f"{global_gap:11.2f} {stats.engine:<9} {stats.status.value:<10} "
                    f"{len(violations):>4}",
                    flush=True,
                )
            if "fifo" in allocations and "shaper" in allocations and allocations["fifo"] > 0:
                ratio = allocations["shaper"] / allocations["fifo"]
                print(
                    f"{'':>6} {'':>4} {'':>6} shaper/fifo priority-weighted allocation = "
                    f"{ratio:.2f}x   (instance built in {build_s:.2f} s)",
                    flush=True,
                )


def federated_section(args: argparse.Namespace, config: SolverConfig) -> None:
    """One federation group planned as one instance (``LoadedCluster(federated=True)``): the
    pending jobs may start in any cluster, paying their image's transfer away from home."""
    clusters, per_cluster = args.federated
    header = (
        f"{'federation':>16} {'jobs':>6} {'policy':<9} {'wall s':>7} {'objective':>11} "
        f"{'LP-UB gap %':>11} {'started':>7} {'away':>5} {'engine':<9} {'viol':>4}"
    )
    print(header)
    print("-" * len(header))
    budgeted = (
        None
        if args.plan_budget is None
        else config.model_copy(update={"plan_budget_s": args.plan_budget})
    )
    for load in args.loads:
        group = LoadedCluster(
            gpus=clusters * per_cluster, load=load, clusters=clusters, federated=True
        )
        instance = random_instance(args.seed, group, config)
        global_bound = global_upper_bound(instance)
        cluster_of = {node.name: node.cluster for node in instance.nodes}
        runs = [(name, name, instance) for name in args.policies]
        if budgeted is not None and "shaper" in args.policies:
            # The same instance (same seed) with the budget in its config.
            within = random_instance(args.seed, group, budgeted)
            runs.append((f"shaper≤{args.plan_budget:g}s", "shaper", within))
        for label_name, name, instance in runs:
            started = time.perf_counter()
            plan = get_policy(name).plan(instance)
            wall = time.perf_counter() - started
            violations = validate(instance, plan)
            starts = [a for a in plan.actions if a.kind is ActionKind.start]
            away = sum(
                1
                for a in starts
                if cluster_of[next(iter(a.to_placement))]
                != instance.job_by_id[a.job_id].home_cluster
            )
            gap = 100 * (global_bound - plan.stats.objective) / global_bound
            label = f"{clusters}×{per_cluster} @{load:g}"
            print(
                f"{label:>16} {len(instance.jobs):>6} {label_name:<9} {wall:7.3f} "
                f"{plan.stats.objective:11.1f} {gap:11.2f} {len(starts):>7} {away:>5} "
                f"{plan.stats.engine:<9} {len(violations):>4}",
                flush=True,
            )


def small_section(args: argparse.Namespace, config: SolverConfig) -> None:
    """Each policy against the exact optimum (or proven bound) of the real problem."""
    header = (
        f"{'GPUs':>4} {'seed':>4} {'nodes':>5} {'jobs':>4} {'policy':<9} {'objective':>10} "
        f"{'optimum':>10} {'kind':<5} {'gap %':>7} {'LP-UB gap %':>11} {'viol':>4}"
    )
    print(header)
    print("-" * len(header))
    for size in args.exact_sizes:
        for seed in args.exact_seeds:
            instance = random_instance(seed, LoadedCluster(gpus=size, load=1.0), config)
            global_bound = global_upper_bound(instance)
            plans = {name: get_policy(name).plan(instance) for name in args.policies}
            hint = plans["shaper"].placement if "shaper" in plans else None
            exact = solve_exact(
                instance,
                time_limit_s=args.exact_time_limit,
                num_workers=args.workers,
                seed=args.seed,
                hint=hint,
            )
            # A proven optimum, else the proven bound; never the unproven best plan.
            if exact.exact and exact.objective is not None:
                reference, kind = exact.objective, "exact"
            elif exact.bound is not None:
                reference, kind = exact.bound, "bound"
            else:
                reference, kind = math.inf, "none"
            for name, plan in plans.items():
                objective = plan.stats.objective
                gap = 100 * (reference - objective) / max(1e-9, abs(reference))
                global_gap = 100 * (global_bound - objective) / global_bound
                print(
                    f"{size:>4} {seed:>4} {len(instance.nodes):>5} {len(instance.jobs):>4} "
                    f"{name:<9} {objective:10.1f} {reference:10.1f} {kind:<5} {gap:7.2f} "
                    f"{global_gap:11.2f} {len(validate(instance, plan)):>4}",
                    flush=True,
                )
            looseness = 100 * (global_bound - reference) / max(1e-9, abs(reference))
            print(
                f"{'':>4} {'':>4} {'':>5} {'':>4} LP bound {global_bound:.1f} is {looseness:.1f} % "
                f"above the {kind} figure; exact model {exact.status.value} in "
                f"{exact.wall_time_s:.2f} s, its plan {len(exact.violations)} violations",
                flush=True,
            )


if __name__ == "__main__":
    main()
