"""Simulation results on disk (``shaper sim run/compare/table/replay`` JSON) for the dashboard.

The control plane does not run simulations: it reads what ``shaper sim`` wrote into
``Settings.sim_results_dir``. A file that is not a compare or run result (sweeps and the
inflation experiment have other shapes), cannot be parsed or is too big is left out of
the list and answered with a clear error when asked for by name.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from app.core.errors import Invalid, NotFound
from app.simulations.models import PolicyRun, SimulationResult, SimulationSummary

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
# Results with per-GPU occupancy of a 256-GPU run stay well under this.
MAX_BYTES = 64 * 1024 * 1024
# Result files sort their keys; show the policies from the baseline up, as the CLI does.
POLICY_ORDER = ("fifo", "backfill", "priority", "shaper")


def _runs(payload: Any) -> dict[str, dict[str, Any]] | None:
    """The policy → run mapping of a compare file (``{"runs": …}``) or a single run."""
    if not isinstance(payload, dict):
        return None
    if isinstance(payload.get("runs"), dict):
        runs = payload["runs"]
    elif "policy" in payload and "metrics" in payload:
        runs = {str(payload["policy"]): payload}
    else:
        return None
    ok = all(
        isinstance(run, dict) and isinstance(run.get("metrics"), dict) for run in runs.values()
    )
    if not runs or not ok:
        return None
    rank = {name: i for i, name in enumerate(POLICY_ORDER)}
    return {k: runs[k] for k in sorted(runs, key=lambda k: (rank.get(k, len(rank)), k))}


def _policy_run(run: dict[str, Any]) -> PolicyRun:
    series = run.get("timeseries") or {}
    if not isinstance(series, dict):
        raise TypeError("timeseries is not an object")
    return PolicyRun(
        metrics={
            k: v
            for k, v in run["metrics"].items()
            if v is None or (isinstance(v, int | float) and not isinstance(v, bool))
        },
        t_h=list(series.get("t_h") or []),
        utilization=list(series.get("utilization") or []),
    )


def _load(path: Path, name: str) -> SimulationResult:
    """Parse and check one file whole, so the list shows only what can be opened."""
    stat = path.stat()
    if stat.st_size > MAX_BYTES:
        raise Invalid(f"{path.name} is {stat.st_size} bytes, over {MAX_BYTES}", field="name")
    try:
        payload = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise Invalid(f"{path.name} is not readable JSON: {exc}", field="name") from exc
    runs = _runs(payload)
    if runs is None:
        raise Invalid(
            f"{path.name} is not a `shaper sim run` or `shaper sim compare` result",
            field="name",
        )
    first = next(iter(runs.values()))
    seed = first.get("seed")
    try:
        return SimulationResult(
            name=name,
            scenario=str(first.get("scenario") or name),
            seed=seed if isinstance(seed, int) else None,
            policies=list(runs),
            modified_at=datetime.fromtimestamp(stat.st_mtime, UTC),
            runs={policy: _policy_run(run) for policy, run in runs.items()},
        )
    except (ValidationError, TypeError, AttributeError) as exc:
        raise Invalid(f"{path.name} has a malformed run: {exc}", field="name") from exc


# Parsed files by path, kept while their size and mtime do not change: listing reads each
# file once, not on every request.
_cache: dict[Path, tuple[tuple[int, int], SimulationResult | Invalid]] = {}


def _cached(path: Path, name: str) -> SimulationResult:
    stat = path.stat()
    key = (stat.st_mtime_ns, stat.st_size)
    hit = _cache.get(path)
    if hit is None or hit[0] != key:
        try:
            hit = (key, _load(path, name))
        except Invalid as exc:
            hit = (key, exc)
        _cache[path] = hit
    if isinstance(hit[1], Invalid):
        raise hit[1]
    return hit[1]


def list_results(*, directory: Path) -> list[SimulationSummary]:
    """Every readable result in ``directory``, newest first; others are skipped."""
    if not directory.is_dir():
        return []
    found = []
    paths = [p for p in directory.glob("*.json") if NAME.match(p.stem)]
    for path in paths:
        try:
            result = _cached(path, path.stem)
        except (Invalid, OSError):
            continue
        found.append(SimulationSummary(**result.model_dump(exclude={"runs"})))
    for gone in [p for p in _cache if p.parent == directory and p not in paths]:
        _cache.pop(gone, None)
    return sorted(found, key=lambda s: (s.modified_at, s.name), reverse=True)


def get_result(*, directory: Path, name: str) -> SimulationResult:
    if not NAME.match(name):
        raise Invalid("a result name is letters, digits, '.', '_' or '-'", field="name")
    path = directory / f"{name}.json"
    if not path.is_file():
        raise NotFound(f"no simulation result {name!r}", resource="simulation", resource_id=name)
    return _cached(path, name)
