from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from pydantic import BaseModel


class GroupBy(StrEnum):
    cluster = "cluster"
    gpu_model = "gpu_model"
    team = "team"


class UtilizationPoint(BaseModel):
    start: datetime
    allocated_gpus: float  # mean GPUs allocated over the bucket
    allocated_share: float  # allocated_gpus / capacity_gpus
    measured_util: float | None  # mean GPU busy fraction from telemetry samples


class UtilizationSeries(BaseModel):
    key: str
    capacity_gpus: int
    points: list[UtilizationPoint]


class UtilizationSummary(BaseModel):
    group_by: GroupBy
    bucket_s: int
    since: datetime
    until: datetime
    series: list[UtilizationSeries]
