from __future__ import annotations

from fastapi import APIRouter, Depends, Request, status

from app.api.deps import ClockDep, SettingsDep, scoped
from app.core.errors import Invalid
from app.simulations import runs, service
from app.simulations.models import (
    SimulationResult,
    SimulationSummary,
    WhatIfCreate,
    WhatIfOptions,
    WhatIfRun,
)
from solver.policies import POLICY_NAMES

router = APIRouter(prefix="/simulations", tags=["simulations"])


@router.get("", **scoped("viewer"))
def list_simulations(settings: SettingsDep) -> list[SimulationSummary]:
    """Results written by `shaper sim run|compare|table|replay` into SHAPER_SIM_RESULTS_DIR,
    and by the what-if runs started here."""
    return service.list_results(directory=settings.resolved_sim_results_dir)


def _no_upload(request: Request) -> None:
    # Checked before the body is read as JSON, so that an upload gets this answer rather
    # than a JSON parse error.
    if request.headers.get("content-type", "").startswith("multipart/"):
        raise Invalid(
            "uploading a trace is not supported yet: replay it with `shaper sim replay "
            "TRACE` on a machine that writes into SHAPER_SIM_RESULTS_DIR and it is listed here",
            field="trace",
        )


_operator = scoped("operator")


@router.post(
    "",
    status_code=status.HTTP_202_ACCEPTED,
    dependencies=[*_operator["dependencies"], Depends(_no_upload)],
    openapi_extra=_operator["openapi_extra"],
)
def start_simulation(settings: SettingsDep, clock: ClockDep, run_in: WhatIfCreate) -> WhatIfRun:
    """Simulate a built-in scenario under some policies in the background, as `shaper sim
    compare` does; poll GET /simulations/runs/{id}. When done, its result is listed here."""
    return runs.start_run(
        directory=settings.resolved_sim_results_dir, run_in=run_in, now=clock.now()
    )


@router.get("/options", **scoped("viewer"))
def simulation_options() -> WhatIfOptions:
    """What POST /simulations accepts: the built-in scenarios and the policies."""
    return WhatIfOptions(scenarios=runs.known_scenarios(), policies=list(POLICY_NAMES))


@router.get("/runs", **scoped("viewer"))
def list_simulation_runs(settings: SettingsDep, clock: ClockDep) -> list[WhatIfRun]:
    """The 20 latest what-if runs, newest first."""
    return runs.list_runs(directory=settings.resolved_sim_results_dir, now=clock.now())


@router.get("/runs/{run_id}", **scoped("viewer"))
def get_simulation_run(settings: SettingsDep, clock: ClockDep, run_id: str) -> WhatIfRun:
    return runs.get_run(directory=settings.resolved_sim_results_dir, run_id=run_id, now=clock.now())


@router.get("/{name}", **scoped("viewer"))
def get_simulation(settings: SettingsDep, name: str) -> SimulationResult:
    return service.get_result(directory=settings.resolved_sim_results_dir, name=name)
