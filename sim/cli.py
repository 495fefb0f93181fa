"""``shaper sim``: run a scenario under one policy, compare policies, replay a trace.

Mounted by ``app.cli`` as ``shaper sim``; usable on its own with
``python -m sim.cli``. Results are JSON (for the dashboard); figures are PNG or SVG.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from sim import federation as federation_runs
from sim.ablation_table import ablation_markdown
from sim.adapter import ForecastMode, RuntimeMode, split_policy_name
from sim.fgd import ALL_POLICIES as INFLATION_POLICIES
from sim.fgd import KNOWN_POLICIES as INFLATION_CHOICES
from sim.fgd import (
    MOVABLE,
    TIE_BREAKS,
    InflationResult,
    SeedSpread,
    compare_to_baselines,
    run_inflation,
    spread_over_seeds,
)
from sim.fgd import POLICIES as PLACEMENTS
from sim.fgd.report import (
    result_rows,
    results_markdown,
    results_table,
    seed_spread_json,
    seed_spread_markdown,
)
from sim.fgd.through_solver import CPU_ONLY_TURNS
from sim.fgd.through_solver import DEFAULT_BATCH as DEFAULT_SOLVER_BATCH
from sim.idle_report import idle_markdown, idle_table
from sim.metrics import RunResult
from sim.report import (
    best_baseline,
    markdown_table,
    plot_occupancy,
    plot_utilization,
    rich_table,
    scenario_table,
    sweep_markdown,
)
from sim.run import (
    POLICIES,
    compare,
    progress_bar,
    run_ablations,
    run_policy,
    write_results,
)
from sim.scenario import ScenarioError, builtin_scenarios, federation_scenarios, load_scenario
from sim.settings import default_results_dir
from sim.sweep import parse_seeds, parse_solver_overrides, summarize_sweep, sweep, sweep_json
from sim.traces import (
    ALIBABA_NODE_LIST,
    KINDS,
    Elasticity,
    TraceError,
    TraceInput,
    TraceOptions,
    alibaba_node_list,
    open_trace,
)
from sim.workload import Workload

sim_app = typer.Typer(
    help="Trace-driven simulation of the shaping policies.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,  # as the root CLI's (app/cli.py)
)
# Wide enough for the whole table when the output is not a terminal (CI logs, pipes).
console = Console(width=None if sys.stdout.isatty() else 220)

PolicyOpt = Annotated[
    str, typer.Option("--policy", "-p", help="fifo | backfill | priority | shaper")
]
SeedOpt = Annotated[int | None, typer.Option("--seed", help="overrides the scenario's seed")]
OutOpt = Annotated[Path | None, typer.Option("--out", "-o", help="write results as JSON here")]
FormatOpt = Annotated[str, typer.Option("--format", help="figure format: png | svg")]
# Where the dashboard reads results by default (the server's SHAPER_SIM_RESULTS_DIR, or
# <SHAPER_DATA_DIR>/sim-results): the same environment gives the same place. Read when a
# command runs (sim.settings), not when this module is imported.
OutDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--out-dir",
        help="JSON and figures go here. Default: $SHAPER_SIM_RESULTS_DIR, else "
        "$SHAPER_DATA_DIR/sim-results (shaper-data/sim-results)",
        show_default=False,
    ),
]
ProgressOpt = Annotated[bool, typer.Option("--progress/--no-progress", help="progress bar")]
DrainOpt = Annotated[
    bool,
    typer.Option(
        "--drain/--no-drain",
        help="after the horizon, run on with no new arrivals until every job is done "
        "(completion times over all jobs) or stop at the horizon (unfinished jobs censored)",
    ),
]
WhyIdleOpt = Annotated[
    bool,
    typer.Option(
        "--why-idle/--no-why-idle",
        help="also print idle GPU-hours by cause (no demand, fragmentation, reservation, …)",
    ),
]
DrainCapOpt = Annotated[
    float | None,
    typer.Option(help="stop draining at this many hours (default: 4 × the horizon, ≥ +24 h)"),
]


def _drain_cap(hours: float | None) -> float | None:
    if hours is not None and hours <= 0:
        raise typer.BadParameter("must be > 0 hours", param_hint="--drain-cap-h")
    return None if hours is None else hours * 3600.0


def _check_policy(policy: str) -> None:
    base, _ = split_policy_name(policy)
    if base not in POLICIES:
        raise typer.BadParameter(
            f"unknown policy {policy!r}; one of {', '.join(POLICIES)}, each also as "
            "federated-NAME (plan all the scenario's clusters as one group)"
        )


def _load(scenario: str, seed: int | None) -> Workload:
    try:
        return load_scenario(scenario, seed=seed)
    except ScenarioError as exc:
        raise typer.BadParameter(str(exc), param_hint="SCENARIO") from exc


def _print_run(result: RunResult, why_idle: bool = False) -> None:
    title = f"{result.scenario} · {result.policy}"
    console.print(rich_table({result.policy: result}, title))
    if why_idle:
        console.print(idle_table({result.policy: result}, title))


def _figures(results: dict[str, RunResult], out_dir: Path, name: str, fmt: str) -> list[Path]:
    if fmt not in ("png", "svg"):
        raise typer.BadParameter("--format must be png or svg")
    paths = [plot_utilization(results, out_dir / f"{name}-utilization.{fmt}", name)]
    if any(r.gpu_rows for r in results.values()):
        paths.append(plot_occupancy(results, out_dir / f"{name}-occupancy.{fmt}", name))
    return paths


@sim_app.command("list")
def list_scenarios() -> None:
    """List the built-in scenarios."""
    for name in builtin_scenarios():
        console.print(name)


@sim_app.command("run")
def run(
    scenario: Annotated[str, typer.Argument(help="built-in scenario name or YAML path")],
    policy: PolicyOpt = "shaper",
    seed: SeedOpt = None,
    out: OutOpt = None,
    plot: Annotated[Path | None, typer.Option(help="write the figures into this folder")] = None,
    fmt: FormatOpt = "png",
    progress: ProgressOpt = False,
    drain: DrainOpt = True,
    drain_cap_h: DrainCapOpt = None,
    why_idle: WhyIdleOpt = False,
    forecast: Annotated[
        str,
        typer.Option(
            help="services' demand forecast: perfect (the curve) | model (the control "
            "plane's: ETS quantile) | peak (the week's highest hour at every step)"
        ),
    ] = ForecastMode.perfect,
    runtime: Annotated[
        str,
        typer.Option(
            help="block jobs' run time as the policy sees it: exact (the trace's) | "
            "predicted (from the jobs done before) | none"
        ),
    ] = RuntimeMode.exact,
) -> None:
    """Simulate SCENARIO under one policy and print its metrics."""
    _check_policy(policy)
    for value, allowed, hint in (
        (forecast, ForecastMode, "--forecast"),
        (runtime, RuntimeMode, "--runtime"),
    ):
        if value not in set(allowed):
            raise typer.BadParameter(
                f"unknown value {value!r}; one of {', '.join(allowed)}", param_hint=hint
            )
    cap = _drain_cap(drain_cap_h)
    workload = _load(scenario, seed)
    started = time.perf_counter()
    result = run_policy(
        workload,
        policy,
        show_progress=progress,
        drain=drain,
        drain_cap=cap,
        forecast=forecast,
        runtime=runtime,
    )
    _print_run(result, why_idle)
    m = result.metrics
    console.print(
        f"services: unmet demand {m['unmet_demand_replica_hours']:.2f} replica-h, "
        f"held {m['service_gpu_hours']:.1f} GPU-h ({forecast} forecast)"
    )
    console.print(f"wall time {time.perf_counter() - started:.2f} s")
    if out is not None:
        console.print(f"results: {write_results(result, out)}")
    if plot is not None:
        for path in _figures({policy: result}, plot, f"{workload.name}-{policy}", fmt):
            console.print(f"figure: {path}")


@sim_app.command("compare")
def compare_cmd(
    scenario: Annotated[str, typer.Argument(help="built-in scenario name or YAML path")],
    policies: Annotated[str, typer.Option(help="comma-separated")] = ",".join(POLICIES),
    seed: SeedOpt = None,
    out_dir: OutDirOpt = None,
    fmt: FormatOpt = "png",
    markdown: Annotated[bool, typer.Option(help="also print a Markdown table")] = False,
    progress: ProgressOpt = False,
    drain: DrainOpt = True,
    drain_cap_h: DrainCapOpt = None,
    why_idle: WhyIdleOpt = False,
) -> None:
    """Simulate SCENARIO under several policies; print a table, write JSON and figures.
    Margins are over the best baseline (the strongest policy other than shaper)."""
    out_dir = out_dir or default_results_dir()
    names = [p.strip() for p in policies.split(",") if p.strip()]
    for name in names:
        _check_policy(name)
    cap = _drain_cap(drain_cap_h)
    workload = _load(scenario, seed)
    results = compare(workload, names, show_progress=progress, drain=drain, drain_cap=cap)
    best = best_baseline(results) or names[0]
    console.print(rich_table(results, f"{workload.name} (seed {workload.seed})", best))
    if why_idle:
        console.print(idle_table(results, workload.name))
    if markdown:
        console.print(markdown_table(results, best), markup=False, soft_wrap=True)
        if why_idle:
            console.print(idle_markdown(results), markup=False, soft_wrap=True)
    console.print(f"results: {write_results(results, out_dir / f'{workload.name}.json')}")
    for path in _figures(results, out_dir, workload.name, fmt):
        console.print(f"figure: {path}")


@sim_app.command("table")
def table(
    scenarios: Annotated[str, typer.Option(help="comma-separated; default: all built-in")] = "",
    policies: Annotated[str, typer.Option(help="comma-separated")] = ",".join(POLICIES),
    out_dir: OutDirOpt = None,
    fmt: FormatOpt = "png",
    drain: DrainOpt = True,
    drain_cap_h: DrainCapOpt = None,
    progress: ProgressOpt = True,
    ablations: Annotated[
        bool,
        typer.Option(help="also run shaper with each lever off (migration, preemption, …)"),
    ] = False,
) -> None:
    """Compare every scenario and print one Markdown table (the README's): per scenario the
    best baseline is marked ★ and the margins are over it. With ``--ablations``, a second
    table: what each lever off changes against full shaper (``sim.ablation_table``)."""
    out_dir = out_dir or default_results_dir()
    names = [p.strip() for p in policies.split(",") if p.strip()]
    for name in names:
        _check_policy(name)
    cap = _drain_cap(drain_cap_h)
    chosen = [s.strip() for s in scenarios.split(",") if s.strip()] or builtin_scenarios()
    for scenario in chosen:
        _load(scenario, None)  # a bad name fails before the first run
    results = {}
    for scenario in chosen:
        workload = _load(scenario, None)
        results[workload.name] = compare(
            workload, names, drain=drain, drain_cap=cap, show_progress=progress
        )
        if ablations:
            results[workload.name] |= run_ablations(
                workload, drain=drain, drain_cap=cap, show_progress=progress
            )
        write_results(results[workload.name], out_dir / f"{workload.name}.json")
        _figures(results[workload.name], out_dir, workload.name, fmt)
    console.print(scenario_table(results), markup=False, soft_wrap=True)
    if ablations:
        console.print("")
        console.print(ablation_markdown(results), markup=False, soft_wrap=True)


def _seeds_and_overrides(
    seeds: str, solver: list[str] | None
) -> tuple[list[int], dict[str, object]]:
    """``--seeds`` and ``--solver`` parsed, each error naming its option."""
    try:
        chosen = parse_seeds(seeds)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--seeds") from exc
    try:
        overrides = parse_solver_overrides(solver or [])
    except ValueError as exc:  # pydantic's ValidationError included
        raise typer.BadParameter(str(exc), param_hint="--solver") from exc
    return chosen, overrides


@sim_app.command("sweep")
def sweep_cmd(
    scenario: Annotated[str, typer.Argument(help="built-in scenario name or YAML path")],
    seeds: Annotated[str, typer.Option(help="e.g. 1-20 or 3,5,8")] = "1-20",
    policies: Annotated[str, typer.Option(help="comma-separated")] = "shaper",
    baseline: Annotated[str, typer.Option(help="gains are measured against it")] = "fifo",
    solver: Annotated[
        list[str] | None,
        typer.Option(
            metavar="KEY=VALUE",
            help="SolverConfig override, repeatable (e.g. gang_aware_placement=true)",
        ),
    ] = None,
    drain: Annotated[
        bool,
        typer.Option(
            "--drain/--no-drain",
            help="run every seed until its queue drains and compare completion times "
            "(mean and p99 JCT, longest wait) too; slower",
        ),
    ] = False,
    out: OutOpt = None,
    progress: ProgressOpt = True,
    ray_address: Annotated[
        str | None,
        typer.Option(
            "--ray",
            metavar="ADDRESS",
            help="run each seed as a task on this existing Ray cluster (host:port of its "
            "GCS, or ray://host:10001); same rows as a local run",
        ),
    ] = None,
) -> None:
    """Run SCENARIO over many seeds: each policy's gain over the baseline, seed by seed."""
    names = [p.strip() for p in policies.split(",") if p.strip()]
    for name in (baseline, *names):
        _check_policy(name)
    chosen, overrides = _seeds_and_overrides(seeds, solver)
    _load(scenario, chosen[0])  # a bad scenario fails before the first run
    where = f" on Ray at {ray_address}" if ray_address else ""
    label = f"{scenario} over {len(chosen)} seeds{where}"
    with progress_bar(progress, label, unit="of the seeds") as callback:
        done = iter(range(1, len(chosen) + 1))
        options: dict[str, Any] = {
            "baseline": baseline,
            "on_seed": (lambda _seed: callback(next(done), len(chosen))) if callback else None,
            "solver_config": overrides,
            "drain": drain,
        }
        if ray_address:
            from sim.ray_sweep import RayUnavailable, sweep_on_ray

            try:
                rows = sweep_on_ray(ray_address, scenario, chosen, names, **options)
            except RayUnavailable as exc:
                raise typer.BadParameter(str(exc), param_hint="--ray") from exc
        else:
            rows = sweep(scenario, chosen, names, **options)
    console.print(sweep_markdown(rows, summarize_sweep(rows, baseline), baseline), markup=False)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(sweep_json(scenario, baseline, rows), indent=1))
        console.print(f"results: {out}")


@sim_app.command("bar")
def bar_cmd(
    scenarios: Annotated[str, typer.Option(help="comma-separated; default: all built-in")] = "",
    seeds: Annotated[str, typer.Option(help="e.g. 1-10 or 3,5,8")] = "1-10",
    solver: Annotated[
        list[str] | None,
        typer.Option(metavar="KEY=VALUE", help="SolverConfig override for shaper, repeatable"),
    ] = None,
    workers: Annotated[
        int, typer.Option(min=1, help="processes running seeds at once (same figures)")
    ] = 1,
    out: OutOpt = None,
    progress: ProgressOpt = True,
) -> None:
    """Issue 12's bar and issue 20's p99, scenario by scenario: every scenario on every
    seed under fifo, backfill, priority and shaper, run to drain; one Markdown table of
    shaper's margins over the best baseline (the means over the seeds), whether the bar is
    cleared (and on how many seeds), and p99 against the lowest baseline's."""
    from sim.bar import bar_json, bar_markdown, run_bar

    chosen_seeds, overrides = _seeds_and_overrides(seeds, solver)
    chosen = [s.strip() for s in scenarios.split(",") if s.strip()] or builtin_scenarios()
    for scenario in chosen:
        _load(scenario, chosen_seeds[0])  # a bad name fails before the first run
    runs_total = len(chosen) * len(chosen_seeds)
    label = f"{len(chosen)} scenarios × {len(chosen_seeds)} seeds"
    with progress_bar(progress, label, unit="of the runs") as bar:
        rows, runs = run_bar(
            chosen, chosen_seeds, solver_config=overrides, workers=workers, on_done=bar
        )
    console.print(bar_markdown(rows), markup=False, soft_wrap=True)
    console.print(
        f"{runs_total} scenario-seeds × 4 policies, run to drain; means over seeds "
        f"{seeds}; the bar: ≥ +5 utilization points, ≥ +15 % value or ≥ 20 % lower mean "
        "JCT at equal or better utilization, and none of the three more than 1 % worse",
        markup=False,
    )
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(bar_json(rows, runs), indent=1))
        console.print(f"results: {out}")


# The option to fix for each kind of trace error (``replay``; ``inflation`` names PODS).
TRACE_HINTS = {
    TraceInput.trace: "TRACE",
    TraceInput.nodes: "--nodes",
    TraceInput.kind: "--kind",
    TraceInput.cluster: "--gpus / --gpus-per-node",
    TraceInput.options: "the trace's options (the message names it)",
}


@sim_app.command("replay")
def replay(
    trace: Annotated[
        Path, typer.Argument(help="trace file (Philly, Pollux, Gavel, Alibaba pods, CSV/JSON)")
    ],
    kind: Annotated[str, typer.Option(help=" | ".join(KINDS))] = "auto",
    policies: Annotated[str, typer.Option(help="comma-separated")] = "fifo,shaper",
    nodes: Annotated[
        Path | None,
        typer.Option(help=f"Alibaba node list (default: {ALIBABA_NODE_LIST} next to TRACE)"),
    ] = None,
    gpus: Annotated[
        int | None,
        typer.Option(min=1, help="GPUs of a trace without nodes (default: its source's setup)"),
    ] = None,
    gpus_per_node: Annotated[
        int | None,
        typer.Option(min=1, help="GPUs per node (default: as the trace's source published)"),
    ] = None,
    window_start_h: Annotated[float, typer.Option()] = 0.0,
    window_end_h: Annotated[float | None, typer.Option()] = None,
    subsample: Annotated[float, typer.Option(help="keep each job with this probability")] = 1.0,
    max_jobs: Annotated[int | None, typer.Option()] = None,
    solver: Annotated[
        list[str] | None,
        typer.Option(
            metavar="KEY=VALUE",
            help="SolverConfig override for shaper, repeatable (e.g. aging_s=none)",
        ),
    ] = None,
    load_scale: Annotated[float, typer.Option(help="arrival-rate multiplier")] = 1.0,
    duration_scale: Annotated[float, typer.Option()] = 1.0,
    horizon_h: Annotated[float | None, typer.Option()] = None,
    replan_min: Annotated[float, typer.Option(help="re-plan cadence, minutes")] = 30.0,
    events: Annotated[
        bool, typer.Option("--events/--cadence-only", help="also re-plan on every event")
    ] = False,
    seed: Annotated[int, typer.Option()] = 0,
    elastic: Annotated[
        str | None,
        typer.Option(
            metavar="LOW,HIGH,SCALING",
            help="make every checkpointable job elastic training: LOW..HIGH × its size in "
            "GPUs, throughput ∝ GPUs**SCALING (e.g. 0.5,2,0.8); the baselines run it at its size",
        ),
    ] = None,
    out_dir: OutDirOpt = None,
    fmt: FormatOpt = "png",
    progress: ProgressOpt = True,
    drain: DrainOpt = True,
    drain_cap_h: DrainCapOpt = None,
    why_idle: WhyIdleOpt = False,
) -> None:
    """Replay a trace file under several policies; margins are over the best baseline."""
    out_dir = out_dir or default_results_dir()
    names = [p.strip() for p in policies.split(",") if p.strip()]
    for name in names:
        _check_policy(name)
    cap = _drain_cap(drain_cap_h)
    if not trace.exists():
        raise typer.BadParameter(f"{trace}: no such file", param_hint="TRACE")
    try:
        overrides = parse_solver_overrides(solver or [])
    except ValueError as exc:  # pydantic's ValidationError included
        raise typer.BadParameter(str(exc), param_hint="--solver") from exc
    try:
        elasticity = None if elastic is None else Elasticity.parse(elastic)
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--elastic") from exc
    options = TraceOptions(
        window_start_h=window_start_h,
        window_end_h=window_end_h,
        subsample=subsample,
        max_jobs=max_jobs,
        load_scale=load_scale,
        duration_scale=duration_scale,
        horizon_h=horizon_h,
        gpus=gpus,
        gpus_per_node=gpus_per_node,
        seed=seed,
        replan_interval_min=replan_min,
        elastic=elasticity,
    )
    try:
        loaded = open_trace(trace, kind=kind, options=options, nodes_path=nodes)
    except TraceError as exc:
        raise typer.BadParameter(str(exc), param_hint=TRACE_HINTS[exc.about]) from exc
    except (OSError, ValueError) as exc:
        raise typer.BadParameter(str(exc), param_hint="TRACE") from exc
    workload = loaded.workload
    if overrides:
        workload = replace(workload, solver_config={**workload.solver_config, **overrides})
    console.print(
        f"{workload.name}: {len(workload.jobs)} jobs, {workload.total_gpus} GPUs, "
        f"{workload.horizon / 3600:.1f} h",
        markup=False,
    )
    # Printed with the results so that they are never read against another cluster.
    console.print(f"cluster: {loaded.cluster}", markup=False, soft_wrap=True)
    if workload.description:  # says how many jobs too large for the cluster were left out
        console.print(f"trace: {workload.description}", markup=False, soft_wrap=True)
    started = time.perf_counter()
    results = compare(
        workload,
        names,
        show_progress=progress,
        replan_on_events=events,
        validate_plans=False,
        drain=drain,
        drain_cap=cap,
    )
    console.print(rich_table(results, workload.name, best_baseline(results) or names[0]))
    if why_idle:
        console.print(idle_table(results, workload.name))
    console.print(f"wall time {time.perf_counter() - started:.1f} s")
    stem = trace.stem
    console.print(f"results: {write_results(results, out_dir / f'{stem}.json')}")
    for path in _figures(results, out_dir, stem, fmt):
        console.print(f"figure: {path}")


def _print_seed_spread(spreads: list[SeedSpread], seeds: list[int], out: Path | None) -> None:
    """The Markdown table of ``shaper sim inflation --seeds``, and its JSON in ``out``."""
    console.print(seed_spread_markdown(spreads, seeds), markup=False, soft_wrap=True)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(seed_spread_json(spreads, seeds))
        console.print(f"results: {out}")


@sim_app.command("inflation")
def inflation(
    pods: Annotated[
        Path,
        typer.Argument(help="Alibaba pod list (openb_pod_list_*.csv, or the resource columns)"),
    ],
    nodes: Annotated[
        Path | None,
        typer.Option(help=f"node list (default: {ALIBABA_NODE_LIST} next to PODS)"),
    ] = None,
    policies: Annotated[str, typer.Option(help="comma-separated")] = ",".join(INFLATION_POLICIES),
    target: Annotated[float, typer.Option(help="stop when requests reach this × capacity")] = 1.3,
    seed: Annotated[int, typer.Option()] = 42,
    seeds: Annotated[
        str | None, typer.Option(help="several seeds (e.g. 42-51): medians per policy")
    ] = None,
    max_pods: Annotated[int | None, typer.Option()] = None,
    movable: Annotated[str, typer.Option(help="pods shaper may move: be | all")] = "be",
    placement: Annotated[
        str, typer.Option(help="the shaper policies' placement: fgd | best-fit | …")
    ] = "fgd",
    tie_break: Annotated[
        str, typer.Option(help="ties between nodes: name (the reference's) | random")
    ] = "name",
    solver_batch: Annotated[
        int, typer.Option(help="shaper-solver (not run by default): arriving pods per solve")
    ] = DEFAULT_SOLVER_BATCH,
    solver_moves_across: Annotated[
        bool,
        typer.Option(
            help="shaper-solver: a pod that fits nowhere may move shares to other nodes "
            "(SolverConfig.share_moves_across_nodes)"
        ),
    ] = False,
    solver_cpu_only: Annotated[
        str,
        typer.Option(
            help="shaper-solver: when CPU-only pods (no solver job) are placed: arrival (as "
            "they come, before their batch's earlier GPU pods), in-order (each closes its "
            "batch: every pod in arrival order), last (after their batch's plan)"
        ),
    ] = "in-order",
    solver_memory: Annotated[
        bool,
        typer.Option(
            help="shaper-solver: FGD's fragmentation also counts memory (each typical shape "
            "carries the least memory its pods ask; TypicalShape.memory_mib)"
        ),
    ] = False,
    out: OutOpt = None,
    markdown: Annotated[bool, typer.Option(help="also print a Markdown table")] = False,
    progress: ProgressOpt = True,
) -> None:
    """The FGD workload-inflation experiment: unallocated GPUs per placement policy."""
    names = [p.strip() for p in policies.split(",") if p.strip()]
    unknown = [p for p in names if p not in INFLATION_CHOICES]
    if unknown:
        raise typer.BadParameter(f"unknown {unknown}; one of {', '.join(INFLATION_CHOICES)}")
    if solver_batch < 1:
        raise typer.BadParameter("at least 1", param_hint="--solver-batch")
    if solver_cpu_only not in CPU_ONLY_TURNS:
        raise typer.BadParameter(
            f"one of {', '.join(CPU_ONLY_TURNS)}", param_hint="--solver-cpu-only"
        )
    if not pods.is_file():
        raise typer.BadParameter(f"{pods}: no such file", param_hint="PODS")
    try:
        node_list = alibaba_node_list(pods, nodes)
    except TraceError as exc:
        raise typer.BadParameter(str(exc), param_hint="--nodes") from exc
    if movable not in MOVABLE:
        raise typer.BadParameter("be or all", param_hint="--movable")
    if tie_break not in TIE_BREAKS:
        raise typer.BadParameter("name or random", param_hint="--tie-break")
    if placement not in PLACEMENTS:
        raise typer.BadParameter(f"unknown placement {placement!r}", param_hint="--placement")
    try:
        chosen = parse_seeds(seeds) if seeds else [seed]
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--seeds") from exc

    def run_all(one_seed: int) -> list[InflationResult]:
        results = []
        for name in names:
            label = f"inflation · {name} · seed {one_seed}"
            with progress_bar(progress, label, unit="of the target load") as callback:
                results.append(
                    run_inflation(
                        node_list,
                        pods,
                        name,
                        target=target,
                        seed=one_seed,
                        max_pods=max_pods,
                        movable=movable,
                        placement=placement,
                        tie_break=tie_break,
                        progress=(lambda done: callback(done, 1.0)) if callback else None,
                        solver_batch=solver_batch,
                        solver_moves_across=solver_moves_across,
                        solver_cpu_only=solver_cpu_only,
                        solver_memory=solver_memory,
                    )
                )
        return results

    try:
        if seeds:
            _print_seed_spread(spread_over_seeds([run_all(s) for s in chosen]), chosen, out)
            return
        results = run_all(seed)
    except TraceError as exc:
        hint = "--nodes" if exc.about is TraceInput.nodes else "PODS"
        raise typer.BadParameter(str(exc), param_hint=hint) from exc
    # Per policy: the largest cut against the best baseline at the same arrival ratio.
    best = compare_to_baselines(results)
    rows = result_rows(results, best)
    console.print(results_table(rows, target=target, seed=seed))
    if markdown:
        console.print(results_markdown(rows), markup=False, soft_wrap=True)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps([r.to_json() for r in results], indent=1))
        console.print(f"results: {out}")


@sim_app.command("federation")
def federation_cmd(
    scenarios: Annotated[
        str, typer.Option(help="comma-separated; default: all built-in multi-cluster ones")
    ] = "",
    policies: Annotated[str, typer.Option(help="comma-separated")] = ",".join(
        federation_runs.POLICIES
    ),
    seed: SeedOpt = None,
    out_dir: OutDirOpt = None,
    drain_cap_h: DrainCapOpt = None,
    progress: ProgressOpt = True,
    egress_gpu_s_per_gib: Annotated[
        float | None,
        typer.Option(
            help="price each GiB of image that crosses between clusters, in GPU-seconds "
            "($/GiB ÷ $/GPU-hour × 3600: $0.09 at $2.50 = 130); default: the scenario's "
            "transfer.inter_cluster_egress_gpu_s_per_gib (0 in the built-in ones)"
        ),
    ] = None,
) -> None:
    """Multi-cluster scenarios planned per cluster (fifo, priority, shaper: each cluster
    alone) and as one federation group (federated-priority, federated-shaper): one
    Markdown table, then what federation gains per scenario. Runs until queues drain."""
    out_dir = out_dir or default_results_dir()
    names = [p.strip() for p in policies.split(",") if p.strip()]
    for name in names:
        _check_policy(name)
    cap = _drain_cap(drain_cap_h)
    if egress_gpu_s_per_gib is not None and not egress_gpu_s_per_gib >= 0:  # NaN too
        raise typer.BadParameter(
            f"must be >= 0 GPU-seconds a GiB, got {egress_gpu_s_per_gib}",
            param_hint="--egress-gpu-s-per-gib",
        )
    chosen = [s.strip() for s in scenarios.split(",") if s.strip()] or federation_scenarios()
    workloads = [_load(scenario, seed) for scenario in chosen]  # bad names fail first
    results = {}
    for workload in workloads:
        if len(workload.clusters) < 2:
            raise typer.BadParameter(
                f"{workload.name} has one cluster; federation needs two or more",
                param_hint="--scenarios",
            )
        suffix = ""
        if egress_gpu_s_per_gib is not None:
            workload = federation_runs.with_egress(workload, egress_gpu_s_per_gib)
            suffix = f"-egress{egress_gpu_s_per_gib:g}"
        results[workload.name] = compare(workload, names, drain_cap=cap, show_progress=progress)
        write_results(results[workload.name], out_dir / f"{workload.name}{suffix}.json")
    if egress_gpu_s_per_gib is not None:
        console.print(f"egress: {egress_gpu_s_per_gib:g} GPU-seconds a GiB that crosses")
    console.print(federation_runs.federation_table(results, names), markup=False, soft_wrap=True)


if __name__ == "__main__":
    sim_app()
