from __future__ import annotations

from fastapi import APIRouter

from app.api.deps import SettingsDep, scoped
from app.simulations import service
from app.simulations.models import SimulationResult, SimulationSummary

router = APIRouter(prefix="/simulations", tags=["simulations"])


@router.get("", **scoped("viewer"))
def list_simulations(settings: SettingsDep) -> list[SimulationSummary]:
    """Results written by `shaper sim run|compare|table|replay` into SHAPER_SIM_RESULTS_DIR."""
    return service.list_results(directory=settings.resolved_sim_results_dir)


@router.get("/{name}", **scoped("viewer"))
def get_simulation(settings: SettingsDep, name: str) -> SimulationResult:
    return service.get_result(directory=settings.resolved_sim_results_dir, name=name)
