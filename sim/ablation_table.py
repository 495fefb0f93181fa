"""The README's ablation table: ``shaper`` with one lever off, against full ``shaper``
(``shaper sim table --ablations`` prints it after the scenario table).

One row per scenario, one column per lever of :data:`sim.run.ABLATIONS`. The first column
gives full ``shaper``'s own figures; each other cell what turning that lever off changes:
utilization points, value %, mean JCT %, and beside the mean the tail and the end (issue
20: p99 JCT and makespan, in hours), then services' unmet demand where it moved. A cell
whose figures all round to no change says so rather than printing a row of zeros.
"""

from __future__ import annotations

from collections.abc import Mapping

from sim.metrics import RunResult
from sim.run import ABLATIONS

MINE = "shaper"
_PREFIX = f"{MINE}, "


def _figure(result: RunResult, key: str) -> float | None:
    value = result.metrics.get(key)
    return None if value is None else float(value)


def _hours(value: float | None) -> str:
    return "–" if value is None else f"{value:.1f}"


def _delta(mine: RunResult, off: RunResult, key: str) -> float | None:
    """``off``'s figure less ``mine``'s; None when either run has none (no job completed)."""
    a, b = _figure(mine, key), _figure(off, key)
    return None if a is None or b is None else b - a


def _ratio_pct(mine: RunResult, off: RunResult, key: str) -> float | None:
    """``off``'s figure against ``mine``'s, in % (None when undefined)."""
    a, b = _figure(mine, key), _figure(off, key)
    return None if a is None or b is None or a == 0 else 100 * (b / a - 1)


def _signed(value: float | None, digits: int, unit: str) -> str:
    # Rounded first, so that a change that rounds to nothing reads +0.0, not -0.0.
    return "–" if value is None else f"{round(value, digits) + 0.0:+.{digits}f}{unit}"


def ablation_cell(mine: RunResult, off: RunResult) -> str:
    """What one lever off changes against full ``shaper`` (see the module docstring)."""
    util = _delta(mine, off, "utilization")
    figures = [
        (None if util is None else 100 * util, 1, " pt", ""),
        (_ratio_pct(mine, off, "weighted_output"), 1, " %", ""),
        (_ratio_pct(mine, off, "jct_mean_h"), 0, " %", "JCT "),
        (_delta(mine, off, "jct_p99_h"), 1, " h", "p99 "),
        (_delta(mine, off, "makespan_h"), 1, " h", "makespan "),
    ]
    unmet = _delta(mine, off, "unmet_demand_replica_hours")
    moved = [v for v, digits, _, _ in figures if v is not None and round(v, digits) != 0]
    unmet_moved = unmet is not None and round(unmet, 1) != 0
    if not moved and not unmet_moved:
        return "no change"
    parts = [f"{label}{_signed(v, digits, unit)}" for v, digits, unit, label in figures]
    if unmet_moved:
        parts.append(f"unmet {_signed(unmet, 1, ' rep-h')}")
    return ", ".join(parts)


def ablation_markdown(results: Mapping[str, Mapping[str, RunResult]]) -> str:
    """Scenario → policy → run (with :func:`sim.run.run_ablations`' rows) → the table.
    Scenarios without a ``shaper`` run are left out; a lever not run shows "–"."""
    levers = [label.removeprefix(_PREFIX) for label in ABLATIONS]
    head = ["scenario", f"{MINE} util % / value / JCT mean h / p99 h / makespan h", *levers]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for scenario, runs in results.items():
        mine = runs.get(MINE)
        if mine is None:
            continue
        own = " / ".join(
            [
                f"{100 * (_figure(mine, 'utilization') or 0.0):.1f}",
                f"{_figure(mine, 'weighted_output') or 0.0:,.0f}",
                _hours(_figure(mine, "jct_mean_h")),
                _hours(_figure(mine, "jct_p99_h")),
                _hours(_figure(mine, "makespan_h")),
            ]
        )
        cells = [ablation_cell(mine, runs[label]) if label in runs else "–" for label in ABLATIONS]
        lines.append("| " + " | ".join([scenario, own, *cells]) + " |")
    return "\n".join(lines)
