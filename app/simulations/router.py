from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Request

from app.api.deps import scoped
from app.core.config import Settings, get_settings
from app.simulations import service
from app.simulations.models import SimulationResult, SimulationSummary

router = APIRouter(prefix="/simulations", tags=["simulations"])


def _settings(request: Request) -> Settings:
    # create_app(settings) keeps the settings it was built with; default otherwise.
    return getattr(request.app.state, "settings", None) or get_settings()


SettingsDep = Annotated[Settings, Depends(_settings)]


@router.get("", **scoped("viewer"))
def list_simulations(settings: SettingsDep) -> list[SimulationSummary]:
    """Results written by `shaper sim run|compare|table` into SHAPER_SIM_RESULTS_DIR."""
    return service.list_results(directory=settings.resolved_sim_results_dir)


@router.get("/{name}", **scoped("viewer"))
def get_simulation(settings: SettingsDep, name: str) -> SimulationResult:
    return service.get_result(directory=settings.resolved_sim_results_dir, name=name)
