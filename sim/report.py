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

# (metric key, column title, format)
COLUMNS: tuple[tuple[str, str, str], ...] = (
    ("utilization", "util %", "pct"),
    ("weighted_output", "value (prio·GPU-h)", "num"),
    ("jobs_completed", "done", "int"),
    ("jct_mean_h", "JCT mean h", "num"),
    ("jct_p50_h", "JCT p50 h", "num"),
    ("jct_p99_h", "JCT p99 h", "num"),
    ("queue_wait_mean_h", "wait mean h", "num"),
    ("unmet_demand_replica_hours", "unmet demand rep-h", "num"),
    ("sla_violations", "SLA viol. h", "int"),
    ("migrations", "migr.", "int"),
    ("migration_gpu_hours", "migr. GPU-h", "num"),
    ("preemptions", "preempt.", "int"),
    ("lost_gpu_hours", "lost GPU-h", "num"),
    ("fragmentation", "frag %", "pct"),
    ("actions_per_job_hour", "actions/job-h", "num2"),
    ("jobs_acted_twice_10min", "jobs 2× <10 min", "int"),
)


def fmt(value: float, kind: str) -> str:
    if kind == "pct":
        return f"{100 * value:.1f}"
    if kind == "int":
        return f"{value:.0f}"
    if kind == "num2":
        return f"{value:.2f}"
    return f"{value:.1f}" if abs(value) < 1000 else f"{value:,.0f}"


def gains(results: Mapping[str, RunResult], baseline: str = "fifo") -> dict[str, dict[str, float]]:
    """Per policy: utilization points and value gain (%) over ``baseline``."""
    if baseline not in results:
        return {}
    base = results[baseline].metrics
    out = {}
    for name, result in results.items():
        m = result.metrics
        value_gain = (
            100 * (m["weighted_output"] / base["weighted_output"] - 1)
            if base["weighted_output"]
            else math.inf
            if m["weighted_output"]
            else 0.0
        )
        out[name] = {
            "util_points": 100 * (m["utilization"] - base["utilization"]),
            "value_gain_pct": value_gain,
        }
    return out


def markdown_table(results: Mapping[str, RunResult], baseline: str = "fifo") -> str:
    delta = gains(results, baseline)
    head = ["policy", *(title for _, title, _ in COLUMNS)]
    if delta:
        head += [f"Δutil vs {baseline} pt", f"value vs {baseline}"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for name, result in results.items():
        cells = [name, *(fmt(result.metrics[key], kind) for key, _, kind in COLUMNS)]
        if delta:
            d = delta[name]
            cells += [f"{d['util_points']:+.1f}", f"{d['value_gain_pct']:+.1f} %"]
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
    for name, result in results.items():
        cells = [fmt(result.metrics[key], kind) for key, _, kind in COLUMNS]
        if delta:
            d = delta[name]
            cells += [f"{d['util_points']:+.1f}", f"{d['value_gain_pct']:+.1f} %"]
        table.add_row(name, *cells)
    return table


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
        mean = 100 * result.metrics["utilization"]
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
        ax.set_title(f"{name}: utilization {100 * result.metrics['utilization']:.1f} %", fontsize=9)
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


def scenario_table(results: Mapping[str, Mapping[str, RunResult]], baseline: str = "fifo") -> str:
    """One Markdown table over scenarios × policies (the README's results table)."""
    head = (
        "| scenario | policy | util % | Δ util vs fifo (pt) | value | value vs fifo | jobs done "
        "| JCT mean h | unmet demand rep-h | SLA viol. h | migrations | preemptions "
        "| lost GPU-h | actions/job-h | jobs acted 2× <10 min |"
    )
    lines = [head, "|" + "---|" * 15]
    for scenario, runs in results.items():
        delta = gains(runs, baseline)
        for index, (policy, result) in enumerate(runs.items()):
            m = result.metrics
            d = delta.get(policy, {"util_points": 0.0, "value_gain_pct": 0.0})
            name = f"**{policy}**" if policy == "shaper" else policy
            cells = [
                scenario if index == 0 else "",
                name,
                f"{100 * m['utilization']:.1f}",
                f"{d['util_points']:+.1f}",
                f"{m['weighted_output']:,.0f}",
                f"{d['value_gain_pct']:+.1f} %",
                f"{m['jobs_completed']:.0f}/{m['jobs_arrived']:.0f}",
                f"{m['jct_mean_h']:.1f}",
                f"{m['unmet_demand_replica_hours']:.1f}",
                f"{m['sla_violations']:.0f}",
                f"{m['migrations']:.0f}",
                f"{m['preemptions']:.0f}",
                f"{m['lost_gpu_hours']:.1f}",
                f"{m['actions_per_job_hour']:.2f}",
                f"{m['jobs_acted_twice_10min']:.0f}",
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def sweep_markdown(
    rows: Sequence[SeedRow], summaries: Sequence[SweepSummary], baseline: str = "fifo"
) -> str:
    """Per-seed rows, then the spread of each policy's gain over ``baseline``."""

    def ratio(value: float | None) -> str:
        return "unbounded" if value is None else f"{value:.2f}×"

    lines = [
        f"| seed | policy | util % | Δ util vs {baseline} (pt) | value | value vs {baseline} "
        "| jobs done |",
        "|" + "---|" * 7,
    ]
    for r in rows:
        lines.append(
            f"| {r.seed} | {r.policy} | {100 * r.utilization:.1f} | {r.delta_util_pt:+.1f} "
            f"| {r.value:,.0f} | {ratio(r.value_ratio)} | {r.jobs_completed} |"
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
    return "\n".join(lines)
