"""The node agent's configuration: environment variables, read once by the command that
starts the agent (agent.cli) and passed down from there.

Each field names its variable (``validation_alias``, matched case-sensitively as
``os.environ`` is), so a bad value's error says which variable to fix. An empty variable
counts as unset.

| variable | default | used by |
|---|---|---|
| ``SHAPER_AGENT_STATE_DIR`` | ``/var/lib/shaper/agent`` | every command (``--state-dir``) |
| ``SHAPER_BROKER_URL`` | none (required) | ``shaper agent worker`` (``--broker``) |
| ``SHAPER_CRIU`` | PATH's criu, then ``/usr/local/sbin/criu`` | ``worker``, ``exec --wait`` |
| ``SHAPER_AGENT_TOKEN`` | none (required) | ``worker``, ``telemetry`` (``--token-env``) |
| ``SLURM_JOB_ID`` | none | ``exec`` (``--id``), set by Slurm inside a job |
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_STATE_DIR = Path("/var/lib/shaper/agent")
TOKEN_ENV = "SHAPER_AGENT_TOKEN"


class AgentSettings(BaseSettings):
    model_config = SettingsConfigDict(
        case_sensitive=True, env_ignore_empty=True, validate_by_name=True
    )

    state_dir: Path = Field(default=DEFAULT_STATE_DIR, validation_alias="SHAPER_AGENT_STATE_DIR")
    broker_url: str | None = Field(default=None, validation_alias="SHAPER_BROKER_URL")
    # The criu binary; unset: agent.backends.criu.find_criu looks on PATH and in
    # /usr/local/sbin.
    criu: str | None = Field(default=None, validation_alias="SHAPER_CRIU")
    token: str | None = Field(default=None, validation_alias=TOKEN_ENV, repr=False)
    # Inside a Slurm job: the id the control plane knows the job by.
    slurm_job_id: str | None = Field(default=None, validation_alias="SLURM_JOB_ID")

    def token_in(self, variable: str) -> str | None:
        """This node's token from `variable` (``--token-env``): SHAPER_AGENT_TOKEN unless
        the command names another variable."""
        if variable == TOKEN_ENV:
            return self.token
        return os.environ.get(variable) or None
