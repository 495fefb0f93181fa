from __future__ import annotations

from enum import StrEnum

from pydantic import field_validator
from sqlmodel import Field, SQLModel

from app.core.types import NoNulStr, json_column
from wire.telemetry import MAX_JOB_SPEED, MIN_JOB_SPEED


class Precision(StrEnum):
    fp64 = "fp64"
    fp32 = "fp32"
    tf32 = "tf32"
    bf16 = "bf16"
    fp16 = "fp16"
    fp8 = "fp8"
    int8 = "int8"
    int4 = "int4"


class GpuModelBase(SQLModel):
    name: str = Field(
        min_length=1, max_length=64, schema_extra={"pattern": r"^[A-Za-z0-9][A-Za-z0-9._-]*$"}
    )
    vendor: NoNulStr = Field(default="nvidia", max_length=32)
    memory_gib: float = Field(gt=0, le=4096)
    # The bounds a job's own speed has (wire.telemetry): a speed of 1e-320 would scale a
    # job's speeds to 0 (app.shaping.snapshot.within_catalogue), which no plan can use.
    relative_speed: float = Field(default=1.0, ge=MIN_JOB_SPEED, le=MAX_JOB_SPEED)


class GpuModelCreate(GpuModelBase):
    precisions: list[Precision]

    @field_validator("precisions")
    @classmethod
    def _unique(cls, value: list[Precision]) -> list[Precision]:
        if not value:
            raise ValueError("at least one precision is required")
        return sorted(set(value), key=list(Precision).index)


class GpuModelPublic(GpuModelBase):
    id: int
    precisions: list[str]


class GpuModel(GpuModelBase, table=True):
    __tablename__ = "gpu_models"

    id: int | None = Field(default=None, primary_key=True)
    name: str = Field(max_length=64, unique=True)
    precisions: list[str] = json_column(list)
