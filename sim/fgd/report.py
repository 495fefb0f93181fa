"""The tables of ``shaper sim inflation``: one run per policy, or medians over seeds.

Kept out of the CLI so that the figures a table shows are built, and can be read, in one
place; the CLI only prints them and writes the JSON.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict

from rich.table import Table

from sim.fgd.results import InflationResult, SeedSpread

COLUMNS = (
    "policy",
    "unallocated GPUs",
    "vs best baseline",
    "largest cut on curve (at)",
    "unalloc. at 100 %",
    "frag. share of idle",
    "GPUs in use",
    "pods failed",
    "migrations",
    "preempted",
)


def result_rows(
    results: Sequence[InflationResult], best: InflationResult | None
) -> list[tuple[str, ...]]:
    """One row of :data:`COLUMNS` per result; ``best``: the best baseline (by
    :func:`~sim.fgd.results.compare_to_baselines`, which also sets the largest cuts)."""
    rows: list[tuple[str, ...]] = []
    for r in results:
        versus = (
            f"{100 * (r.unallocated_gpus / best.unallocated_gpus - 1):+.1f} %"
            if best and best.unallocated_gpus
            else "-"
        )
        rows.append(
            (
                r.policy,
                f"{r.unallocated_gpus:.1f} of {r.capacity_gpus:.0f}",
                versus,
                f"{100 * r.best_reduction:+.1f} % ({100 * r.best_reduction_at:.0f} %)"
                if r.best_reduction is not None and r.best_reduction_at is not None
                else "-",
                f"{at_100:.1f}" if (at_100 := r.unallocated_at(1.0)) is not None else "-",
                f"{100 * r.fragmented_share:.1f} %",
                f"{r.whole_gpus_allocated}",
                f"{r.pods_failed} of {r.pods_arrived}",
                f"{r.migrations}",
                f"{r.preempted}",
            )
        )
    return rows


def results_table(rows: Sequence[tuple[str, ...]], *, target: float, seed: int) -> Table:
    table = Table(title=f"workload inflation to {target:.0%} of GPU capacity (seed {seed})")
    for column in COLUMNS:
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(*row)
    return table


def results_markdown(rows: Sequence[tuple[str, ...]]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |"]
    lines.append("|" + "---|" * len(COLUMNS))
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def seed_spread_markdown(spreads: Sequence[SeedSpread], seeds: Sequence[int]) -> str:
    """The Markdown table of ``shaper sim inflation --seeds``."""
    lines = [
        f"seeds {', '.join(map(str, seeds))}: median over them",
        "",
        "| policy | unallocated GPUs, median | min-max | vs best baseline, median "
        "| preempted, median | migrations, median |",
        "|" + "---|" * 6,
    ]
    for sp in spreads:
        cut = (
            f"{-100 * sp.median_reduction + 0.0:+.1f} %" if sp.median_reduction is not None else "-"
        )
        lines.append(
            f"| {sp.policy} | {sp.median_unallocated:.1f} | {sp.min_unallocated:.1f}-"
            f"{sp.max_unallocated:.1f} | {cut} | {sp.median_preempted:.0f} "
            f"| {sp.median_migrations:.0f} |"
        )
    return "\n".join(lines)


def seed_spread_json(spreads: Sequence[SeedSpread], seeds: Sequence[int]) -> str:
    return json.dumps({"seeds": list(seeds), "policies": [asdict(x) for x in spreads]})
