"""A connector deployment's configuration (``python -m connectors.runner``): environment
variables, read once by connectors.runner.main and passed down from there.

Each field names its variable (``validation_alias``, matched case-sensitively as
``os.environ`` is), so a bad value's error says which variable to fix. An empty variable
counts as unset. Options of the connector itself (the scheduler's URL, credentials) are
``--set KEY=VALUE`` arguments, not variables.

| variable | default | runner option |
|---|---|---|
| ``SHAPER_CONNECTOR_TOKEN`` | none (required) | ``--token`` |
| ``SHAPER_BROKER_URL`` | none: telemetry only, no action steps | ``--broker`` |
| ``SHAPER_CONNECTOR_STATE_DIR`` | ``./shaper-data/connector-<cluster>`` | ``--state-dir`` |
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

TOKEN_ENV = "SHAPER_CONNECTOR_TOKEN"
BROKER_ENV = "SHAPER_BROKER_URL"
STATE_DIR_ENV = "SHAPER_CONNECTOR_STATE_DIR"


class ConnectorSettings(BaseSettings):
    model_config = SettingsConfigDict(
        case_sensitive=True, env_ignore_empty=True, validate_by_name=True
    )

    token: str | None = Field(default=None, validation_alias=TOKEN_ENV, repr=False)
    # Out of repr(), as the token: it may carry the broker's password (redis://:pass@…).
    broker_url: str | None = Field(default=None, validation_alias=BROKER_ENV, repr=False)
    # The action step journal (connectors.actions.StepJournal); unset: per cluster, below.
    state_dir: Path | None = Field(default=None, validation_alias=STATE_DIR_ENV)

    def state_dir_for(self, cluster: str) -> Path:
        return self.state_dir or Path("shaper-data") / f"connector-{cluster}"
