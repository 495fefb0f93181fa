"""``shaper diagnose``'s terminal report: GPU-hours and share per cause, then the same by
GPU model and by team (one column per cause that has any hours)."""

from __future__ import annotations

from collections import defaultdict

from rich.console import Console
from rich.table import Table

from app.diagnosis.models import GroupCauseHours, IdleDiagnosis
from solver.diagnosis import IdleCause

NO_TEAM = "(none)"  # a cause that belongs to no one team: down nodes, no demand, …


def print_diagnosis(diagnosis: IdleDiagnosis, console: Console) -> None:
    idle = diagnosis.idle_gpu_hours
    capacity = diagnosis.capacity_gpu_hours
    console.print(
        f"{diagnosis.cluster}: {diagnosis.since:%Y-%m-%d %H:%M} → {diagnosis.until:%Y-%m-%d %H:%M}"
        f" UTC · capacity {capacity:,.1f} GPU-h · busy {diagnosis.busy_gpu_hours:,.1f} · "
        f"idle {idle:,.1f} ({_pct(idle, capacity)} of capacity)",
        markup=False,
    )
    causes = Table(title="Idle GPU-hours by cause (precedence order)")
    causes.add_column("cause")
    causes.add_column("GPU-h", justify="right")
    causes.add_column("% of idle", justify="right")
    causes.add_column("% of capacity", justify="right")
    for row in diagnosis.causes:
        causes.add_row(
            row.cause.value,
            f"{row.gpu_hours:,.1f}",
            _pct(row.gpu_hours, idle),
            _pct(row.gpu_hours, capacity),
        )
    console.print(causes)
    seen = [c.cause for c in diagnosis.causes if c.gpu_hours > 0]
    if seen:
        console.print(_grid("By GPU model (GPU-h)", "GPU model", diagnosis.by_gpu_model, seen))
        console.print(_grid("By team (GPU-h)", "team", diagnosis.by_team, seen))


def _grid(title: str, label: str, cells: list[GroupCauseHours], causes: list[IdleCause]) -> Table:
    hours: defaultdict[str, dict[IdleCause, float]] = defaultdict(dict)
    for cell in cells:
        hours[cell.key or NO_TEAM][cell.cause] = cell.gpu_hours
    table = Table(title=title)
    table.add_column(label)
    for cause in causes:
        table.add_column(cause.value, justify="right")
    table.add_column("total", justify="right")
    for key in sorted(hours):
        row = hours[key]
        table.add_row(
            key, *(f"{row.get(cause, 0.0):,.1f}" for cause in causes), f"{sum(row.values()):,.1f}"
        )
    return table


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f} %" if whole > 0 else "–"
