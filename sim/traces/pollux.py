"""Pollux (OSDI'21) workloads: ``workload-{1..8}.csv``, 160 jobs sampled from Philly each.

Columns → workload model:

* ``name`` → job id; ``time`` (seconds after the start) → ``submit_time``;
* ``application`` → ``kind`` (all ``training``) and the run time, see below;
* ``num_replicas`` → gang size (``gpus``); ``batch_size`` is kept out (no goodput model).

Where the trace is silent: Pollux's simulator derives run time from per-application
throughput models that are not in the CSV. We assume a total amount of work per
application in reference GPU-hours (``APPLICATION_GPU_HOURS``, rough figures for the
model/dataset pairs of the Pollux paper's Table 1) and perfect scaling, so a job's run
time is ``GPU-hours / num_replicas`` (an application not in the table gets
``DEFAULT_GPU_HOURS``). All jobs have priority 1 and may run on any model;
checkpointing comes from :class:`TraceOptions`. Pollux's JCTs (2,751 s mean for Pollux)
are therefore not directly comparable: the work per job is an assumption.

Refused, naming the line: ``num_replicas`` below 1, a ``time`` that is negative, NaN or
infinite, and two jobs of the same ``name``.

Cluster (:data:`CLUSTER`): Pollux's testbed, 64 GPUs in 16 nodes of 4 (OSDI'21, §5), the
cluster its trace-driven simulations also model.
"""

from __future__ import annotations

from pathlib import Path

from sim.traces.cluster import PublishedCluster, choose_cluster
from sim.traces.common import (
    TraceError,
    TraceOptions,
    csv_rows,
    homogeneous_cluster,
    make_workload,
    number,
    refuse_duplicate_ids,
    refuse_no_rows,
    require_header,
    shape_jobs,
    whole,
)
from sim.workload import BlockJob, JobKind, Workload

# Reference GPU-hours to train each application to its target (assumed; see docstring).
APPLICATION_GPU_HOURS: dict[str, float] = {
    "cifar10": 1.5,
    "ncf": 0.5,
    "deepspeech2": 12.0,
    "bert": 8.0,
    "yolov3": 24.0,
    "imagenet": 60.0,
}
DEFAULT_GPU_HOURS = 4.0
COLUMNS = ("name", "time", "application", "num_replicas")
CLUSTER = PublishedCluster(gpus=64, gpus_per_node=4, source="Pollux's testbed (OSDI'21)")


def read_pollux(path: str | Path, options: TraceOptions) -> list[BlockJob]:
    jobs: list[BlockJob] = []
    lines: list[int] = []
    header, rows = csv_rows(path)
    require_header(path, header, COLUMNS, source="a Pollux workload")
    for line, row in rows:
        try:
            gpus = whole(row["num_replicas"], "num_replicas", at_least=1)
            submit = number(row["time"], "time (seconds after the start)", at_least=0)
        except ValueError as exc:
            raise TraceError(f"{path}:{line}: {exc}") from exc
        gpu_hours = APPLICATION_GPU_HOURS.get(row["application"], DEFAULT_GPU_HOURS)
        jobs.append(
            BlockJob(
                id=row["name"] or f"pollux-{len(jobs)}",
                submit_time=submit,
                gpus=gpus,
                work=gpu_hours * 3600.0 / gpus,
                kind=JobKind.training,
                checkpointable=options.checkpointable,
                checkpoint_interval=options.checkpoint_interval_h * 3600.0,
                image_gb=options.image_gb,
                team=row["application"] or "default",
            )
        )
        lines.append(line)
    refuse_no_rows(path, len(jobs))
    refuse_duplicate_ids(path, zip((job.id for job in jobs), lines, strict=True))
    return shape_jobs(jobs, options)


def load_pollux(path: str | Path, options: TraceOptions | None = None) -> Workload:
    options = options or TraceOptions()
    cluster = choose_cluster(options, CLUSTER)
    jobs = read_pollux(path, options)
    models, nodes = homogeneous_cluster(
        gpus=cluster.gpus, gpus_per_node=cluster.gpus_per_node, gpu_model=options.gpu_model
    )
    return make_workload(
        f"pollux:{Path(path).stem}",
        jobs,
        options,
        gpu_models=models,
        nodes=nodes,
        description=f"Pollux workload {path}, {len(jobs)} jobs on {cluster.gpus} GPUs",
    )
