"""Tables and figures of simulation results: a rich table, Markdown, and matplotlib plots
(utilization over time per policy; a GPU × time occupancy chart). Matplotlib runs on the
Agg backend: no display is needed."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sim.metrics import RunResult

if TYPE_CHECKING:
    from sim.sweep import SeedRow, SweepSummary

# (metric key, column title, format). "cens" figures are lower bounds when some job never
# completed (``jct_censored_jobs`` > 0) and print as "≥ x" then.
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("utilization", "util %", "pct"),
    ("weighted_output", "value (prio·GPU-h)", "num"),
    ("jobs_completed", "done", "int"),
    ("jct_mean_h", "JCT mean h", "cens"),
    ("jct_p50_h", "JCT p50 h", "cens"),
    ("jct_p99_h", "JCT p99 h", "cens"),
    ("makespan_h", "makespan h", "cens"),
    ("queue_wait_mean_h", "wait mean h", "cens"),
    ("queue_wait_p99_h", "wait p99 h", "cens"),
    ("queue_wait_max_h", "wait max h", "cens"),
    ("unmet_demand_replica_hours", "unmet demand rep-h", "num"),
    ("sla_violations", "SLA viol. h", "int"),
    ("migrations", "migr.", "int"),
    ("migration_gpu_hours", "migr. GPU-h", "num"),
    ("preemptions", "preempt.", "int"),
    ("checkpoint_gpu_hours", "ckpt GPU-h", "num"),
    ("lost_gpu_hours", "lost GPU-h", "num"),
    ("fragmentation", "frag %", "pct"),
    ("fragmentation_blocked_share", "frag-blocked % of re-plans", "pct"),
    ("actions_per_job_hour", "actions/job-h", "num2"),
    ("jobs_acted_twice_10min", "jobs 2× <10 min", "int"),
)
NO_VALUE = "–"


def fmt(value: float | None, kind: str, *, censored: bool = False) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return NO_VALUE
    if kind == "pct":
        return f"{100 * value:.1f}"
    if kind == "int":
        return f"{value:.0f}"
    if kind == "num2":
        return f"{value:.2f}"
    text = f"{value:.1f}" if abs(value) < 1000 else f"{value:,.0f}"
    return f"≥ {text}" if kind == "cens" and censored else text


def cell(result: RunResult, key: str, kind: str) -> str:
    censored = bool(result.metrics.get("jct_censored_jobs"))
    return fmt(result.metrics.get(key), kind, censored=censored)


def _number(m: Mapping[str, float | None], key: str) -> float:
    value = m.get(key)
    return 0.0 if value is None else float(value)


def best_baseline(results: Mapping[str, RunResult], mine: str = "shaper") -> str | None:
    """The strongest policy other than ``mine``: most value by the horizon, then utilization,
    then the lowest mean completion time."""
    others = [name for name in results if not name.startswith(mine)]  # ablations are mine
    if not others:
        return None
    return max(
        others,
        key=lambda name: strength(
            _number(results[name].metrics, "weighted_output"),
            _number(results[name].metrics, "utilization"),
            results[name].metrics.get("jct_mean_h"),
        ),
    )


def strength(value: float, utilization: float, jct_mean_h: float | None) -> tuple[float, ...]:
    """The order of baselines (the largest is the best): most value, then utilization,
    then the lowest mean completion time (none: last); rounded, so float noise never
    decides. The table's (:func:`best_baseline`) and the bar's (``sim.bar``)."""
    jct = jct_mean_h if jct_mean_h is not None else math.inf
    return (round(value, 6), round(utilization, 6), -jct)


def gains(results: Mapping[str, RunResult], baseline: str = "fifo") -> dict[str, dict[str, float]]:
    """Per policy: utilization points, value gain (%) and mean JCT change (%) over
    ``baseline`` (NaN where the baseline's figure is undefined)."""
    if baseline not in results:
        return {}
    base = results[baseline].metrics
    out = {}
    for name, result in results.items():
        m = result.metrics
        value, base_value = _number(m, "weighted_output"), _number(base, "weighted_output")
        value_gain = 100 * (value / base_value - 1) if base_value else math.inf if value else 0.0
        jct, base_jct = m.get("jct_mean_h"), base.get("jct_mean_h")
        out[name] = {
            "util_points": 100 * (_number(m, "utilization") - _number(base, "utilization")),
            "value_gain_pct": value_gain,
            "jct_change_pct": 100 * (jct / base_jct - 1)
            if jct is not None and base_jct
            else math.nan,
        }
    return out


def _signed_pct(value: float) -> str:
    return NO_VALUE if math.isnan(value) else f"{value:+.1f} %"


def markdown_table(results: Mapping[str, RunResult], baseline: str = "fifo") -> str:
    delta = gains(results, baseline)
    head = ["policy", *(title for _, title, _ in COLUMNS)]
    if delta:
        head += [f"Δutil vs {baseline} pt", f"value vs {baseline}", f"JCT vs {baseline}"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, result in results.items():
        cells = [name, *(cell(result, key, kind) for key, _, kind in COLUMNS)]
        if delta:
            d = delta[name]
            cells += [
                f"{d['util_points']:+.1f}",
                _signed_pct(d["value_gain_pct"]),
                _signed_pct(d["jct_change_pct"]),
            ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def rich_table(results: Mapping[str, RunResult], title: str, baseline: str = "fifo") -> object:
    from rich.table import Table

    delta = gains(results, baseline)
    table = Table(title=title)
    table.add_column("policy")
    for _, heading, _ in COLUMNS:
        table.add_column(heading, justify="right")
    if delta:
        table.add_column(f"Δutil pt vs {baseline}", justify="right")
        table.add_column(f"value vs {baseline}", justify="right")
        table.add_column(f"JCT vs {baseline}", justify="right")
    for name, result in results.items():
        cells = [cell(result, key, kind) for key, _, kind in COLUMNS]
        if delta:
            d = delta[name]
            cells += [
                f"{d['util_points']:+.1f}",
                _signed_pct(d["value_gain_pct"]),
                _signed_pct(d["jct_change_pct"]),
            ]
        table.add_row(name, *cells)
    if results:
        table.caption = run_note(results)
    return table


def run_note(results: Mapping[str, RunResult]) -> str:
    """One line on how long the runs went, so that no reader mistakes a cut-off for a drain."""
    first = next(iter(results.values())).metrics
    horizon = _number(first, "horizon_h")
    capped = [name for name, r in results.items() if r.metrics.get("drain_cap_hit")]
    stopped = [
        name for name, r in results.items() if not r.metrics.get("drained") and name not in capped
    ]
    ends = ", ".join(
        f"{name} {_number(r.metrics, 'run_end_h'):.1f} h" for name, r in results.items()
    )
    note = f"window {horizon:.1f} h (rates, value); completions over the run to drain ({ends})"
    if capped:
        note += f"; not drained by the cap: {', '.join(capped)} (figures marked ≥ are lower bounds)"
    if stopped:
        note += f"; stopped at the horizon: {', '.join(stopped)} (figures marked ≥)"
    return note


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_utilization(results: Mapping[str, RunResult], path: str | Path, title: str) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.4))
    for name, result in results.items():
        series = result.timeseries
        mean = 100 * _number(result.metrics, "utilization")  # always set: never None
        ax.step(
            series["t_h"],
            [100 * u for u in series["utilization"]],
            where="mid",
            label=f"{name} (mean {mean:.1f} %)",
            linewidth=1.4,
        )
    first = next(iter(results.values()), None)
    for event in first.node_events if first else []:
        ax.axvline(event["t_h"], color="grey", linestyle=":", linewidth=1)
        ax.annotate(
            f"{event['node']} {event['kind']}",
            (event["t_h"], 2),
            rotation=90,
            fontsize=7,
            color="grey",
            va="bottom",
            ha="right",
        )
    ax.set_xlabel("simulated time (h)")
    ax.set_ylabel("GPU utilization (%)")
    ax.set_ylim(0, 105)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=4, fontsize=8, frameon=False)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_occupancy(results: Mapping[str, RunResult], path: str | Path, title: str) -> Path:
    """One panel per policy: a row per GPU, a bar per holder, coloured by kind of work."""
    plt = _pyplot()
    palette = {
        "training": "#4C72B0",
        "batch_inference": "#55A868",
        "quantization": "#C44E52",
        "hpc": "#8172B2",
        "service": "#DD8452",
    }
    runs = [(n, r) for n, r in results.items() if r.gpu_rows]
    if not runs:
        raise ValueError("no occupancy recorded (cluster too large or recording off)")
    rows = len(runs[0][1].gpu_rows)
    height = max(2.0, min(4.0, 0.12 * rows + 1.0))
    fig, axes = plt.subplots(len(runs), 1, figsize=(10, height * len(runs)), squeeze=False)
    for ax, (name, result) in zip(axes[:, 0], runs, strict=True):
        index = {row: i for i, row in enumerate(result.gpu_rows)}
        bars: dict[tuple[str, int], list[tuple[float, float]]] = {}
        for seg in result.occupancy:
            key = (seg["kind"], index[seg["row"]])
            bars.setdefault(key, []).append(
                (seg["start"] / 3600, (seg["end"] - seg["start"]) / 3600)
            )
        for (kind, row), spans in bars.items():
            ax.broken_barh(
                spans,
                (row - 0.4, 0.8),
                facecolors=palette.get(kind, "#999999"),
                edgecolor="white",
                linewidth=0.3,
            )
        ax.set_xlim(0, result.horizon / 3600)
        ax.set_ylim(-0.5, len(result.gpu_rows) - 0.5)
        ax.set_ylabel("GPU")
        if len(result.gpu_rows) <= 32:
            ax.set_yticks(range(len(result.gpu_rows)), result.gpu_rows, fontsize=6)
        else:
            ax.set_yticks([])
        util = 100 * _number(result.metrics, "utilization")  # always set: never None
        ax.set_title(f"{name}: utilization {util:.1f} %", fontsize=9)
    axes[-1, 0].set_xlabel("simulated time (h)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in palette.values()]
    fig.legend(
        handles,
        [k.replace("_", " ") for k in palette],
        loc="lower center",
        fontsize=7,
        ncol=len(palette),
        frameon=False,
    )
    fig.suptitle(f"{title}: GPU occupancy")
    fig.tight_layout(rect=(0, 0.04, 1, 0.97))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


SCENARIO_HEAD = (
    "scenario",
    "policy",
    "util %",
    "Δ util vs best (pt)",
    "value",
    "value vs best",
    "done by horizon",
    "JCT mean h",
    "JCT p99 h",
    "JCT vs best",
    "makespan h",
    "wait max h",
    "unmet demand rep-h",
    "SLA viol. h",
    "migr.",
    "preempt.",
    "migr. + ckpt GPU-h",
    "lost GPU-h",
    "actions/job-h",
    "jobs 2× <10 min",
)


def scenario_table(results: Mapping[str, Mapping[str, RunResult]], mine: str = "shaper") -> str:
    """One Markdown table over scenarios × policies (the README's). Per scenario the best
    baseline (:func:`best_baseline`) is marked ★ and every policy's margin is taken over it;
    completion figures are over the run to drain, marked ≥ where some job never finished."""
    lines = ["| " + " | ".join(SCENARIO_HEAD) + " |", "|" + "---|" * len(SCENARIO_HEAD)]
    for scenario, runs in results.items():
        best = best_baseline(runs, mine)
        delta = gains(runs, best) if best else {}
        for index, (policy, result) in enumerate(runs.items()):
            m = result.metrics
            d = delta.get(
                policy, {"util_points": 0.0, "value_gain_pct": 0.0, "jct_change_pct": 0.0}
            )
            name = f"**{policy}**" if policy == mine else policy
            if policy == best:
                name += " ★"
            overhead = _number(m, "migration_gpu_hours") + _number(m, "checkpoint_gpu_hours")
            cells = [
                scenario if index == 0 else "",
                name,
                f"{100 * _number(m, 'utilization'):.1f}",
                f"{d['util_points']:+.1f}",
                f"{_number(m, 'weighted_output'):,.0f}",
                _signed_pct(d["value_gain_pct"]),
                f"{_number(m, 'jobs_completed_in_window'):.0f}/{_number(m, 'jobs_arrived'):.0f}",
                cell(result, "jct_mean_h", "cens"),
                cell(result, "jct_p99_h", "cens"),
                _signed_pct(d["jct_change_pct"]),
                cell(result, "makespan_h", "cens"),
                cell(result, "queue_wait_max_h", "cens"),
                f"{_number(m, 'unmet_demand_replica_hours'):.1f}",
                f"{_number(m, 'sla_violations'):.0f}",
                f"{_number(m, 'migrations'):.0f}",
                f"{_number(m, 'preemptions'):.0f}",
                f"{overhead:.1f}",
                f"{_number(m, 'lost_gpu_hours'):.1f}",
                f"{_number(m, 'actions_per_job_hour'):.2f}",
                f"{_number(m, 'jobs_acted_twice_10min'):.0f}",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    notes = sorted({f"{scenario}: {run_note(runs)}" for scenario, runs in results.items() if runs})
    return "\n".join([*lines, "", *notes])


def sweep_markdown(
    rows: Sequence[SeedRow], summaries: Sequence[SweepSummary], baseline: str = "fifo"
) -> str:
    """Per-seed rows, then the spread of each policy's gain over ``baseline``."""

    def ratio(value: float | None) -> str:
        return "unbounded" if value is None else f"{value:.2f}×"

    def hours(value: float | None) -> str:
        return "–" if value is None else f"{value:.1f}"

    drained = any(r.jct_p99_h is not None for r in rows)
    times = " JCT mean h | JCT p99 h | makespan h | wait max h |" if drained else ""
    lines = [
        f"| seed | policy | util % | Δ util vs {baseline} (pt) | value | value vs {baseline} "
        f"| jobs done |{times}",
        "|" + "---|" * (11 if drained else 7),
    ]
    for r in rows:
        cells = (
            f" {hours(r.jct_mean_h)} | {hours(r.jct_p99_h)} | {hours(r.makespan_h)} "
            f"| {hours(r.wait_max_h)} |"
            if drained
            else ""
        )
        lines.append(
            f"| {r.seed} | {r.policy} | {100 * r.utilization:.1f} | {r.delta_util_pt:+.1f} "
            f"| {r.value:,.0f} | {ratio(r.value_ratio)} | {r.jobs_completed} |{cells}"
        )
    lines += [
        "",
        f"| policy | seeds | Δ util pt mean | median | worst | value × {baseline} mean "
        f"| median | worst | seeds where {baseline} produced nothing |",
        "|" + "---|" * 9,
    ]
    for s in summaries:
        if s.policy == baseline:
            continue
        u, v = s.delta_util_pt, s.value_ratio
        value_cells = f"{v.mean:.2f}× | {v.median:.2f}× | {v.worst:.2f}×" if v else "- | - | -"
        lines.append(
            f"| {s.policy} | {s.seeds} | {u.mean:+.1f} | {u.median:+.1f} | {u.worst:+.1f} "
            f"| {value_cells} | {s.unbounded_ratios} |"
        )
    if drained:
        lines += [
            "",
            f"| policy | seeds | JCT mean h, mean | median | JCT p99 h, mean | median | worst "
            f"| makespan h, mean | worst | p99 no worse than {baseline}'s |",
            "|" + "---|" * 10,
        ]
        for s in summaries:
            m, p, span = s.jct_mean_h, s.jct_p99_h, s.makespan_h
            mean_cells = f"{m.mean:.1f} | {m.median:.1f}" if m else "– | –"
            # Spread.worst is the minimum; for a completion time the worst is the largest.
            p99_cells = f"{p.mean:.1f} | {p.median:.1f} | {p.best:.1f}" if p else "– | – | –"
            span_cells = f"{span.mean:.1f} | {span.best:.1f}" if span else "– | –"
            no_worse = (
                "–"
                if s.policy == baseline or s.p99_no_worse_seeds is None
                else f"{s.p99_no_worse_seeds} of {s.seeds} seeds"
            )
            lines.append(
                f"| {s.policy} | {s.seeds} | {mean_cells} | {p99_cells} | {span_cells} "
                f"| {no_worse} |"
            )
    return "\n".join(lines)
