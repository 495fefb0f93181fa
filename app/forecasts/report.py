"""``shaper forecast-accuracy``'s terminal report: one table of services' next-hour
forecasts, one of their forecasts by lead time, one of clusters' run-time predictions,
each model beside its naive baseline."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from app.forecasts.models import ForecastAccuracy


def print_accuracy(summary: ForecastAccuracy, console: Console) -> None:
    console.print(
        f"forecast accuracy: {summary.since:%Y-%m-%d %H:%M} → {summary.until:%Y-%m-%d %H:%M} UTC"
        f" ({summary.window_h} h)",
        markup=False,
    )
    services = Table(title="Services: next-hour demand forecasts (replicas)")
    for name, justify in (
        ("cluster", "left"),
        ("service", "left"),
        ("hours", "right"),
        ("MAE", "right"),
        ("naive MAE", "right"),
        ("skill", "right"),
        ("bias", "right"),
        ("coverage", "right"),
        ("target", "right"),
        ("methods", "left"),
    ):
        services.add_column(name, justify=justify)  # type: ignore[arg-type]
    for s in summary.services:
        services.add_row(
            s.cluster,
            s.service,
            str(s.hours_scored),
            f"{s.mae_replicas:.2f}",
            f"{s.naive_mae_replicas:.2f}",
            _pct(s.skill),
            f"{s.bias_replicas:+.2f}",
            _pct(s.coverage),
            _pct(s.target_quantile),
            ", ".join(f"{m} {n}" for m, n in sorted(s.methods.items())),
        )
    console.print(services if summary.services else "no service forecast scored in the window")
    if summary.by_lead:
        console.print(_by_lead(summary))
    durations = Table(title="Block jobs: run-time predictions (jobs that finished)")
    for name in ("cluster", "jobs", "MAE h", "naive MAE h", "bias h", "median |%|", "naive |%|"):
        durations.add_column(name, justify="left" if name == "cluster" else "right")
    durations.add_column("median pred/actual", justify="right")
    for d in summary.durations:
        durations.add_row(
            d.cluster,
            str(d.jobs_scored),
            f"{d.mae_hours:.2f}",
            f"{d.naive_mae_hours:.2f}",
            f"{d.bias_hours:+.2f}",
            _pct(d.median_abs_pct_error),
            _pct(d.naive_median_abs_pct_error),
            f"{d.median_ratio:.2f}" if d.median_ratio is not None else "–",
        )
    console.print(durations if summary.durations else "no run-time prediction scored in the window")


def _by_lead(summary: ForecastAccuracy) -> Table:
    leads = Table(title="Services: demand forecasts by lead time (replicas)")
    for name in ("cluster", "service", "lead h", "hours", "MAE", "naive MAE", "skill"):
        leads.add_column(name, justify="left" if name in ("cluster", "service") else "right")
    leads.add_column("coverage", justify="right")
    for lead in summary.by_lead:
        leads.add_row(
            lead.cluster,
            lead.service or "(all)",
            str(lead.lead_h),
            str(lead.hours_scored),
            f"{lead.mae_replicas:.2f}",
            f"{lead.naive_mae_replicas:.2f}",
            _pct(lead.skill),
            _pct(lead.coverage),
        )
    return leads


def _pct(fraction: float | None) -> str:
    return f"{100 * fraction:.1f} %" if fraction is not None else "–"
