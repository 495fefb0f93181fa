"""Why the GPUs were idle, per policy: one row per cause (``solver.diagnosis.causes``, in
precedence order), GPU-hours and share of capacity over the window, as a rich table and as
Markdown. Only causes some policy has hours of are shown; the total row is capacity − busy."""

from __future__ import annotations

from collections.abc import Mapping

from sim.diagnosis import idle_metric
from sim.metrics import RunResult
from solver.diagnosis import IdleCause


def idle_rows(results: Mapping[str, RunResult]) -> list[list[str]]:
    """[cause, then per policy "GPU-h (share of capacity)"], the total last."""
    rows = []
    for cause in IdleCause:
        hours = [result.metrics.get(idle_metric(cause)) or 0.0 for result in results.values()]
        if any(hours):
            rows.append(
                [cause.value, *(_cell(h, r) for h, r in zip(hours, results.values(), strict=True))]
            )
    totals = [
        _cell(result.idle_causes.get("idle_gpu_hours", 0.0), result) for result in results.values()
    ]
    rows.append(["idle (total)", *totals])
    return rows


def _cell(gpu_hours: float, result: RunResult) -> str:
    capacity = result.idle_causes.get("capacity_gpu_hours") or 0.0
    share = f" ({100 * gpu_hours / capacity:.1f} %)" if capacity else ""
    return f"{gpu_hours:,.1f}{share}"


def idle_table(results: Mapping[str, RunResult], title: str) -> object:
    from rich.table import Table

    table = Table(title=f"{title}: idle GPU-hours by cause (% of capacity)")
    table.add_column("cause")
    for name in results:
        table.add_column(name, justify="right")
    for row in idle_rows(results):
        table.add_row(*row)
    return table


def idle_markdown(results: Mapping[str, RunResult]) -> str:
    head = ["cause", *results]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in idle_rows(results)]
    return "\n".join(lines)
