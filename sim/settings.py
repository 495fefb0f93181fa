"""Where ``shaper sim`` writes results by default: the same variables, with the same
defaults, as the control plane's (app.core.config), so the dashboard finds them.

Read once per command (sim.cli), not at import. An empty variable counts as unset.

| variable | default |
|---|---|
| ``SHAPER_SIM_RESULTS_DIR`` | ``<SHAPER_DATA_DIR>/sim-results`` |
| ``SHAPER_DATA_DIR`` | ``shaper-data`` |
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class SimSettings(BaseSettings):
    model_config = SettingsConfigDict(
        case_sensitive=True, env_ignore_empty=True, validate_by_name=True
    )

    data_dir: Path = Field(default=Path("shaper-data"), validation_alias="SHAPER_DATA_DIR")
    results_dir: Path | None = Field(default=None, validation_alias="SHAPER_SIM_RESULTS_DIR")

    @property
    def resolved_results_dir(self) -> Path:
        return self.results_dir or self.data_dir / "sim-results"


def default_results_dir() -> Path:
    """``--out-dir``'s default, read when a command runs."""
    return SimSettings().resolved_results_dir
