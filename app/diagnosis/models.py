from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel

from solver.diagnosis import IdleCause


class CauseHours(BaseModel):
    cause: IdleCause
    gpu_hours: float
    share_of_idle: float  # 0..1


class GroupCauseHours(BaseModel):
    key: str | None  # the GPU model or team; None: the cause belongs to no one team
    cause: IdleCause
    gpu_hours: float


class BucketCauseHours(BaseModel):
    start: datetime
    cause: IdleCause
    gpu_hours: float


class IdleDiagnosis(BaseModel):
    """Why the cluster's GPUs were idle over the window: every idle GPU-hour has one
    cause (``solver.diagnosis.causes``, in precedence order), so ``causes`` add up to
    ``idle_gpu_hours`` = ``capacity_gpu_hours`` − ``busy_gpu_hours``."""

    cluster: str
    since: datetime
    until: datetime
    bucket_s: int
    busy_threshold: float
    capacity_gpu_hours: float
    busy_gpu_hours: float
    idle_gpu_hours: float
    causes: list[CauseHours]
    by_gpu_model: list[GroupCauseHours]
    by_team: list[GroupCauseHours]
    by_bucket: list[BucketCauseHours]
