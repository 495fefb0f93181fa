"""Per-cluster settings of the Slurm connector: how to reach Slurm and how to map its jobs.

Mapping, in order (later steps override the fields they set):

1. ``SlurmMapping`` defaults (``default_kind``, ``default_priority``, ``default_sla_class``);
2. every matching :class:`MappingRule`, in list order — a rule matches when all the
   conditions it names (``qos``, ``partition``, ``account``, ``user``, ``name_prefix``) hold;
3. the job's own convention, when ``honor_job_tags`` is on: a ``shaper:`` tag in the
   ``--comment`` (or, when the comment has none, in the job name), e.g.
   ``shaper:kind=training,sla=gold,priority=50,checkpointable=true``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from wire.telemetry import JobKind

# Slurm 22.05's openapi plugins, and the data_parser versions of Slurm 23.11-24.11
# (connectors.slurm.versions reads the latter as the former).
SUPPORTED_API_VERSIONS = ("v0.0.36", "v0.0.37", "v0.0.38", "v0.0.40", "v0.0.41", "v0.0.42")
ApiVersion = Literal["v0.0.36", "v0.0.37", "v0.0.38", "v0.0.40", "v0.0.41", "v0.0.42"]

# Node features that name a GPU model, for clusters whose GRES carry no type ("gpu:4").
DEFAULT_GPU_MODEL_FEATURES = (
    "a10",
    "a100",
    "a30",
    "a40",
    "b200",
    "gh200",
    "h100",
    "h200",
    "l4",
    "l40",
    "l40s",
    "mi210",
    "mi250",
    "mi250x",
    "mi300x",
    "p100",
    "rtx6000",
    "t4",
    "v100",
)


class _Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class MappingRule(_Settings):
    """Conditions (all that are set must match) → the Shaper fields this rule sets."""

    qos: str | None = None
    partition: str | None = None
    account: str | None = None
    user: str | None = None
    name_prefix: str | None = None

    kind: JobKind | None = None
    priority: Annotated[int, Field(ge=0, le=1_000_000)] | None = None
    sla_class: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    checkpointable: bool | None = None

    @model_validator(mode="after")
    def _has_condition_and_effect(self) -> MappingRule:
        conditions = (self.qos, self.partition, self.account, self.user, self.name_prefix)
        if all(value is None for value in conditions):
            raise ValueError("a mapping rule needs at least one condition")
        effects = (self.kind, self.priority, self.sla_class, self.checkpointable)
        if all(value is None for value in effects):
            raise ValueError("a mapping rule must set kind, priority, sla_class or checkpointable")
        return self


class SlurmMapping(_Settings):
    default_kind: JobKind = JobKind.hpc
    default_priority: Annotated[int, Field(ge=0, le=1_000_000)] = 0
    default_sla_class: Annotated[str, Field(min_length=1, max_length=64)] = "standard"
    rules: list[MappingRule] = Field(default_factory=list)
    honor_job_tags: bool = True
    # "account" falls back to the user when the job has no account.
    team_from: Literal["account", "user"] = "account"
    gpu_model_features: tuple[str, ...] = DEFAULT_GPU_MODEL_FEATURES
    # Slurm GRES type or feature → Shaper's GPU model name, e.g. {"h100": "H100-80GB"}.
    gpu_model_aliases: dict[str, str] = Field(default_factory=dict)
    # Model for GPUs whose GRES has no type and whose node has no GPU-model feature.
    default_gpu_model: Annotated[str, Field(min_length=1, max_length=64)] = "gpu"


class SlurmConnectorConfig(_Settings):
    """How to reach one cluster's Slurm.

    With ``rest_url`` set the connector reads slurmrestd with JWT auth (``rest_api_version``:
    v0.0.38 for Slurm 22.05, v0.0.42 for 24.11); otherwise it runs ``squeue --json`` and,
    for nodes, ``sinfo --json`` (22.05) or ``scontrol show nodes --json`` (23.02 and later).
    Actions always use ``scontrol``/``scancel``: Slurm 22.05's REST API has no requeue,
    suspend or resume.
    """

    cluster: Annotated[str, Field(min_length=1, max_length=128)]
    rest_url: str | None = None
    rest_api_version: ApiVersion = "v0.0.38"
    rest_user: Annotated[str, Field(min_length=1)] = "root"
    # Token sources, first that is set: rest_token, rest_token_file (read on every request,
    # so an external refresher works), else minted with `scontrol token` and renewed.
    rest_token: SecretStr | None = None
    rest_token_file: Path | None = None
    rest_token_lifespan_s: Annotated[int, Field(ge=60)] = 3600
    # Environment for the Slurm CLI (e.g. SLURM_CONF) and where its binaries are.
    slurm_conf: Path | None = None
    bin_dir: Path | None = None
    timeout_s: Annotated[float, Field(gt=0)] = 20.0
    mapping: SlurmMapping = Field(default_factory=SlurmMapping)
    # Reservations that hold a plan's nodes for one job are named <prefix><job id>; the
    # connector tidies only those (connectors/slurm/reservations.py).
    reservation_prefix: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.-]{1,32}$")] = "shaper-"
    # Federated moves (connectors.slurm.submission): pending and running jobs carry how to
    # submit them elsewhere. Their batch scripts are read with one `scontrol write
    # batch_script` each, at most this many per read (pending jobs first, the rest on later
    # reads), and cached per job while it can move.
    submit_specs: bool = True
    submit_scripts_per_read: Annotated[int, Field(ge=1, le=10_000)] = 50
    # Where a job submitted from another scheduler's portable form runs (and writes its
    # slurm-<id>.out): the portable form names no directory.
    portable_workdir: Path = Path("/tmp")
    # Who such a job runs as: the portable form names no user, and a connector running as
    # root refuses to run another scheduler's job as root (None: refuse them there).
    portable_user: Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$")] | None = None
