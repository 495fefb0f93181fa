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
| ``SHAPER_AGENT_API_TOKEN`` | none (required) | ``api``: the Bearer token its callers send |
| ``SHAPER_AGENT_API_TLS_CERT``, ``…_KEY`` | none (plain HTTP) | ``api``: serve HTTPS |
| ``SHAPER_KUBELET_URL`` | ``https://127.0.0.1:10250`` | ``api``: this node's kubelet |
| ``SHAPER_KUBELET_SERVER_NAME`` | the node's name | ``api``: the name its certificate has |
| ``SHAPER_KUBELET_CA`` | the system's CAs | ``api``: CA of the kubelet's serving certificate |
| ``SHAPER_KUBELET_CLIENT_CERT``, ``…_KEY`` | none | ``api``: client allowed ``nodes/checkpoint`` |
| ``SHAPER_KUBELET_INSECURE`` | ``false`` | ``api``: skip the kubelet's certificate (tests) |
| ``SHAPER_CTR`` | PATH's ``ctr`` | ``api``: containerd's client, to import images |
| ``SHAPER_CONTAINERD_ADDRESS`` | ``/run/containerd/containerd.sock`` | ``api`` |
| ``SHAPER_CHECKPOINT_IMAGE_REPOSITORY`` | ``localhost/shaper/checkpoint`` | ``api`` |
| ``SHAPER_KUBELET_TOKEN_FILE`` | none | ``api``: a bearer token file, not a certificate |
| ``SHAPER_CHECKPOINT_IMAGE_TTL_S`` | ``86400`` | ``api``, ``gc-checkpoints`` (agent.image_gc) |
| ``SHAPER_CHECKPOINT_IMAGE_GC_INTERVAL_S`` | ``600`` | ``api``: between sweeps; 0: none |

The TTL: an unused checkpoint image that no restored pod ever used is removed this long
after its checkpoint; 0: no checkpoint image is ever removed.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

DEFAULT_STATE_DIR = Path("/var/lib/shaper/agent")
TOKEN_ENV = "SHAPER_AGENT_TOKEN"


class AgentSettings(BaseSettings):
    model_config = SettingsConfigDict(
        case_sensitive=True, env_ignore_empty=True, validate_by_name=True
    )

    state_dir: Path = Field(default=DEFAULT_STATE_DIR, validation_alias="SHAPER_AGENT_STATE_DIR")
    # Out of repr(), as the tokens: it may carry the broker's password (redis://:pass@…).
    broker_url: str | None = Field(default=None, validation_alias="SHAPER_BROKER_URL", repr=False)
    # The criu binary; unset: agent.backends.criu.find_criu looks on PATH and in
    # /usr/local/sbin.
    criu: str | None = Field(default=None, validation_alias="SHAPER_CRIU")
    token: str | None = Field(default=None, validation_alias=TOKEN_ENV, repr=False)
    # Inside a Slurm job: the id the control plane knows the job by.
    slurm_job_id: str | None = Field(default=None, validation_alias="SLURM_JOB_ID")

    # The node agent's HTTP API (agent.api): kubelet checkpoints as images (agent.kubelet).
    api_token: str | None = Field(
        default=None, validation_alias="SHAPER_AGENT_API_TOKEN", repr=False
    )
    api_tls_cert: Path | None = Field(default=None, validation_alias="SHAPER_AGENT_API_TLS_CERT")
    api_tls_key: Path | None = Field(default=None, validation_alias="SHAPER_AGENT_API_TLS_KEY")
    kubelet_url: str = Field(
        default="https://127.0.0.1:10250", validation_alias="SHAPER_KUBELET_URL"
    )
    kubelet_server_name: str | None = Field(
        default=None, validation_alias="SHAPER_KUBELET_SERVER_NAME"
    )
    kubelet_ca: Path | None = Field(default=None, validation_alias="SHAPER_KUBELET_CA")
    kubelet_client_cert: Path | None = Field(
        default=None, validation_alias="SHAPER_KUBELET_CLIENT_CERT"
    )
    kubelet_client_key: Path | None = Field(
        default=None, validation_alias="SHAPER_KUBELET_CLIENT_KEY"
    )
    # Tests only: the kubelet's serving certificate is not checked (a self-signed one).
    kubelet_insecure: bool = Field(default=False, validation_alias="SHAPER_KUBELET_INSECURE")
    ctr: str = Field(default="ctr", validation_alias="SHAPER_CTR")
    containerd_address: str = Field(
        default="/run/containerd/containerd.sock", validation_alias="SHAPER_CONTAINERD_ADDRESS"
    )
    kubelet_token_file: Path | None = Field(
        default=None, validation_alias="SHAPER_KUBELET_TOKEN_FILE"
    )
    # Garbage collection of the checkpoint images (agent.image_gc).
    checkpoint_image_ttl_s: float = Field(
        default=24 * 3600.0, ge=0, validation_alias="SHAPER_CHECKPOINT_IMAGE_TTL_S"
    )
    checkpoint_image_gc_interval_s: float = Field(
        default=600.0, ge=0, validation_alias="SHAPER_CHECKPOINT_IMAGE_GC_INTERVAL_S"
    )
    checkpoint_image_repository: str = Field(
        default="localhost/shaper/checkpoint",
        validation_alias="SHAPER_CHECKPOINT_IMAGE_REPOSITORY",
        pattern=r"^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*$",
    )

    @model_validator(mode="after")
    def _pairs(self) -> AgentSettings:
        for cert, key, cert_var, key_var in (
            (
                self.kubelet_client_cert,
                self.kubelet_client_key,
                "SHAPER_KUBELET_CLIENT_CERT",
                "SHAPER_KUBELET_CLIENT_KEY",
            ),
            (
                self.api_tls_cert,
                self.api_tls_key,
                "SHAPER_AGENT_API_TLS_CERT",
                "SHAPER_AGENT_API_TLS_KEY",
            ),
        ):
            if (cert is None) != (key is None):
                raise ValueError(f"{cert_var} and {key_var} go together: set both or neither")
        if self.kubelet_token_file is not None and self.kubelet_client_cert is not None:
            raise ValueError(
                "SHAPER_KUBELET_TOKEN_FILE and SHAPER_KUBELET_CLIENT_CERT: set one, not both"
            )
        if self.kubelet_insecure and self.kubelet_ca is not None:
            raise ValueError("SHAPER_KUBELET_INSECURE and SHAPER_KUBELET_CA: set one, not both")
        return self

    def token_in(self, variable: str) -> str | None:
        """This node's token from `variable` (``--token-env``): SHAPER_AGENT_TOKEN unless
        the command names another variable."""
        if variable == TOKEN_ENV:
            return self.token
        return os.environ.get(variable) or None
