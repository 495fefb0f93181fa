"""A simulated job as a ``wire.telemetry.SubmitSpec``, and such a spec as a simulated job.

A pending or running block job of a simulated cluster carries ``SubmitSpec(scheduler=sim,
native=…)`` whose ``native`` is :class:`SimNative`: what another simulated cluster needs to
recreate it — its name, team, queue, kind, priority, SLA class, GPUs (and which models),
gang size, whether it checkpoints, and ``work_s``, the run time it needs at full speed
there. A pending job that moves starts over there: the progress a requeued checkpointable
job kept lives in its source cluster, and moving a pending job does not carry a
checkpoint, so ``work_s`` is its whole run time. A running checkpointable job moves with
its checkpoint, and the job submitted from its spec starts with no progress of its own, so
its ``work_s`` is the run time it has left (connectors.sim.cluster ``_submit_spec`` says
why that and not a progress field).

A simulated cluster also takes a spec of another scheduler when it has a portable form:
it cannot run the command, so it simulates one that holds the portable form's GPUs for
:data:`PORTABLE_WORK`.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from connectors.base import ConnectorError
from wire.telemetry import JobKind, JobReport, JobShape, JobState, SchedulerKind, SubmitSpec

# How long a job submitted from a portable form runs here: a simulated cluster cannot run
# its command, and the form says nothing of its run time.
PORTABLE_WORK = timedelta(hours=1)
MAX_WORK_S = 365 * 24 * 3600.0


class SimNative(BaseModel):
    """``SubmitSpec.native`` of a simulated job."""

    model_config = ConfigDict(extra="forbid")

    name: Annotated[str, Field(max_length=255)] = ""
    team: Annotated[str, Field(min_length=1, max_length=128)] = "default"
    queue: Annotated[str, Field(min_length=1, max_length=128)] = "default"
    kind: JobKind = JobKind.training
    priority: Annotated[int, Field(ge=0, le=1_000_000)] = 0
    sla_class: Annotated[str, Field(min_length=1, max_length=64)] = "standard"
    gpus: Annotated[int, Field(ge=1, le=100_000)]
    allowed_gpu_models: list[Annotated[str, Field(max_length=64)]] = Field(default_factory=list)
    gang_size: Annotated[int, Field(ge=1, le=100_000)] = 1
    checkpointable: bool = False
    work_s: Annotated[float, Field(gt=0, le=MAX_WORK_S, allow_inf_nan=False)]


def submit_spec(report: JobReport, work: timedelta) -> SubmitSpec:
    """The spec a simulated job carries in telemetry; ``work``: the run time the job
    submitted from it needs (all of it for a pending job, what is left for a running
    checkpointable one)."""
    native = SimNative(
        name=report.name,
        team=report.team,
        queue=report.queue,
        kind=report.kind,
        priority=report.priority,
        sla_class=report.sla_class,
        gpus=max(1, report.gpus_requested),
        allowed_gpu_models=report.allowed_gpu_models,
        gang_size=report.gang_size,
        checkpointable=report.checkpointable,
        work_s=min(work.total_seconds(), MAX_WORK_S),
    )
    return SubmitSpec(scheduler=SchedulerKind.sim, native=native.model_dump(mode="json"))


def job_from_spec(
    spec: SubmitSpec, *, external_id: str, name: str, cluster: str
) -> tuple[JobReport, timedelta]:
    """The pending job (and the run time it needs) that ``spec`` describes; a spec that a
    simulated cluster cannot read raises a non-retryable :class:`ConnectorError`."""
    what = f"submit {name} to simulated cluster {cluster}"
    if spec.scheduler is SchedulerKind.sim:
        try:
            native = SimNative.model_validate(spec.native)
        except ValidationError as error:
            raise ConnectorError(
                f"{what}: native is not a sim job: {error}", retryable=False
            ) from None
        work = timedelta(seconds=native.work_s)
        fields = native.model_dump(exclude={"work_s", "gpus"})
        gpus = native.gpus
    elif spec.portable is not None and spec.portable.gpus > 0:
        work, fields, gpus = PORTABLE_WORK, {"name": name}, spec.portable.gpus
    else:
        why = (
            "its portable form asks for no GPUs"
            if spec.portable is not None
            else "its spec has no portable form"
        )
        raise ConnectorError(
            f"{what}: a {spec.scheduler.value} job cannot run here: {why}", retryable=False
        )
    report = JobReport(
        external_id=external_id,
        shape=JobShape.block,
        gpus_requested=gpus,
        state=JobState.pending,
        **fields,
    )
    return report, work
