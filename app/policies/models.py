from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

import sqlalchemy as sa
from pydantic import BaseModel, ConfigDict, StringConstraints, model_validator
from pydantic import Field as PydanticField
from sqlmodel import Field, SQLModel

from app.clusters.models import CLUSTER_NAME_PATTERN, Labels
from app.core.types import (
    INT32_MAX,
    MAX_TEAMS,
    AwareDatetime,
    GpuCount,
    NoNulStr,
    Replicas,
    Seconds,
    json_column,
    required_utc_column,
)
from wire.telemetry import MAX_JOB_SPEEDS, JobKind, JobSpeeds

MAX_MIGRATIONS_PER_DAY = 10_000
ClusterName = Annotated[str, StringConstraints(pattern=CLUSTER_NAME_PATTERN, max_length=63)]


class TeamPolicy(BaseModel):
    """Per team/queue terms, with Kueue ClusterQueue/cohort semantics for quota."""

    model_config = ConfigDict(extra="forbid")

    team: NoNulStr = Field(min_length=1, max_length=128)
    priority_weight: float = Field(default=1.0, gt=0, le=1000)
    guaranteed_gpus: GpuCount = 0
    borrowing_limit_gpus: GpuCount | None = None
    max_queue_wait_s: Seconds | None = None
    preemptible: bool = True
    max_migrations_per_day: int = Field(default=4, ge=0, le=MAX_MIGRATIONS_PER_DAY)
    deadline: AwareDatetime | None = None
    # The clusters of its federation group the team's pending jobs may be moved to (data
    # residency, a site's agreement); None: any member; [] none. Its own cluster always.
    allowed_clusters: list[ClusterName] | None = Field(default=None, max_length=MAX_TEAMS)
    # And only to those whose labels include every key=value here ({"region": "eu"}: data
    # that may not leave the region); None: no such rule. Both rules must let a job go.
    cluster_selector: Labels | None = None


class ServicePolicy(BaseModel):
    model_config = ConfigDict(extra="forbid")

    service: NoNulStr = Field(min_length=1, max_length=255)
    min_replicas: Replicas = 1
    demand_target: float = Field(default=1.0, gt=0, le=1.0)


MAX_SPEED_PROFILES = 256


class SpeedProfile(BaseModel):
    """How fast the block jobs it matches run on GPU models, as the site measured it (a
    job type's throughput per model, as Gavel profiles it): catalogue model name → speed
    on the catalogue's scale (the A100 is 1.0). A job matches when every condition given
    holds; the first profile that matches a job applies to it, unless the job's owner
    wrote speeds of its own (wire.speeds). Models not named run at the catalogue's speed.
    Written by whoever may edit the policy, so taken as written (a job's own speeds are
    capped at the catalogue's: app.shaping.snapshot.within_catalogue)."""

    model_config = ConfigDict(extra="forbid")

    kind: JobKind | None = None
    team: NoNulStr | None = Field(default=None, min_length=1, max_length=128)
    queue: NoNulStr | None = Field(default=None, min_length=1, max_length=128)
    speeds: JobSpeeds = Field(min_length=1, max_length=MAX_JOB_SPEEDS)

    def matches(self, *, kind: str, team: str, queue: str) -> bool:
        return (
            (self.kind is None or self.kind == kind)
            and (self.team is None or self.team == team)
            and (self.queue is None or self.queue == queue)
        )


class SlaPolicySpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    teams: list[TeamPolicy] = Field(default_factory=list, max_length=MAX_TEAMS)
    services: list[ServicePolicy] = Field(default_factory=list, max_length=MAX_TEAMS)
    # Left out of the stored spec when empty: policies written before the field, their
    # YAML exports and what the Kueue import makes stay as they were.
    speed_profiles: list[SpeedProfile] = PydanticField(
        default_factory=list, max_length=MAX_SPEED_PROFILES, exclude_if=lambda v: not v
    )

    @model_validator(mode="after")
    def _unique_names(self) -> SlaPolicySpec:
        for label, names in (
            ("teams", [t.team for t in self.teams]),
            ("services", [s.service for s in self.services]),
        ):
            seen: set[str] = set()
            for index, name in enumerate(names):
                if name in seen:
                    raise ValueError(f"{label}[{index}]: {name!r} appears twice")
                seen.add(name)
        return self


class SlaPolicyCreate(SQLModel):
    name: str = Field(
        min_length=1, max_length=64, schema_extra={"pattern": r"^[a-z0-9][a-z0-9-]*$"}
    )
    spec: SlaPolicySpec
    comment: NoNulStr = Field(default="", max_length=1024)


class SlaPolicyUpdate(SQLModel):
    spec: SlaPolicySpec
    comment: NoNulStr = Field(default="", max_length=1024)


class SlaPolicyRollback(SQLModel):
    version: int = Field(ge=1, le=INT32_MAX)
    comment: NoNulStr = Field(default="", max_length=1024)


class SlaPolicyImportPreview(SQLModel):
    """What importing a document would do, written nowhere: its spec as stored (defaults
    filled in) beside the current version's, and whether they differ."""

    name: str
    current_version: int
    current_spec: dict[str, Any]
    spec: dict[str, Any]
    changed: bool


class SlaPolicyPublic(SQLModel):
    id: int
    name: str
    version: int
    spec: dict[str, Any]
    comment: str
    deleted: bool = False
    created_at: datetime
    created_by: str


class SlaPolicy(SQLModel, table=True):
    """Versioned: an edit writes a new row with version + 1; old versions stay readable.

    A delete is a version too (``deleted``, the last spec kept): the policy stops applying
    and leaves the list, its history stays readable, and creating the name again continues
    its numbering."""

    __tablename__ = "sla_policies"
    __table_args__ = (sa.UniqueConstraint("name", "version", name="uq_sla_policies_name_version"),)

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(max_length=64, index=True)
    version: int
    spec: dict[str, Any] = json_column(dict)
    comment: str = Field(default="", max_length=1024)
    deleted: bool = Field(default=False, sa_column_kwargs={"server_default": sa.false()})
    created_at: datetime = required_utc_column()
    created_by: str = Field(max_length=128)


def spec_field(loc: list[int | str]) -> str:
    """The API's name for a field of a policy's spec from pydantic's error location
    (``spec.teams[1].guaranteed_gpus``), as ``app.main`` names a JSON body's fields."""
    path = "spec"
    for part in loc:
        path += f"[{part}]" if isinstance(part, int) else f".{part}"
    return path
