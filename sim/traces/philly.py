"""Microsoft Philly (2017), as packaged with the Pollux artifact: ``philly.csv``.

Columns → workload model:

* ``timestamp`` (``YYYY-mm-dd HH:MM:SS``, submission) → ``submit_time`` (seconds after the
  first submission kept);
* ``duration`` (seconds of run time) → ``work`` at reference speed: the trace records one
  run on Philly's GPUs, which are the reference model of the replay cluster;
* ``num_gpus`` → gang size (``gpus``);
* ``cluster`` (virtual cluster id) → ``team``;
* ``gpu_time`` = duration × num_gpus: used only as a consistency check.

Where the trace is silent: every job is ``training`` with priority 1 (Philly has no
priorities; use ``priority_by_team`` to give virtual clusters weights); checkpointability,
checkpoint interval and image size come from :class:`TraceOptions` (default: checkpointable,
20 GB — Shaper checkpoints transparently); jobs may run on any GPU model.

Cluster (:data:`CLUSTER`): the CSV names none, and no replay setup for it was published
with it, so the default is Shaper's own: 64 GPUs in nodes of 8, the size of Philly's
servers (its job log places jobs on ``gpu0``-``gpu7`` of a machine). Philly itself had
thousands of GPUs: replay the whole trace with ``--gpus`` in the thousands.
"""

from __future__ import annotations

import csv
from datetime import UTC, datetime
from pathlib import Path

from sim.traces.cluster import PublishedCluster, choose_cluster
from sim.traces.common import (
    TraceError,
    TraceOptions,
    homogeneous_cluster,
    make_workload,
    require_header,
    shape_jobs,
)
from sim.workload import BlockJob, JobKind, Workload

COLUMNS = ("timestamp", "duration", "num_gpus", "gpu_time", "cluster")
CLUSTER = PublishedCluster(
    gpus=64, gpus_per_node=8, source="Shaper's default for Philly, in nodes of 8 GPUs as Philly's"
)


def read_philly(
    path: str | Path,
    options: TraceOptions,
    *,
    priority_by_team: dict[str, float] | None = None,
) -> list[BlockJob]:
    priority_by_team = priority_by_team or {}
    jobs: list[BlockJob] = []
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        require_header(path, reader.fieldnames, COLUMNS, source="a Philly trace")
        for line, row in enumerate(reader, start=2):
            try:
                submit = datetime.fromisoformat(row["timestamp"]).replace(tzinfo=UTC).timestamp()
                duration = float(row["duration"])
                gpus = int(row["num_gpus"])
            except ValueError as exc:
                raise TraceError(f"{path}:{line}: {exc}") from exc
            if gpus <= 0 or duration <= 0:
                continue
            team = row["cluster"] or "default"
            jobs.append(
                BlockJob(
                    id=f"philly-{line - 2}",
                    submit_time=submit,
                    gpus=gpus,
                    work=duration,
                    priority=priority_by_team.get(team, 1.0),
                    kind=JobKind.training,
                    checkpointable=options.checkpointable,
                    checkpoint_interval=options.checkpoint_interval_h * 3600.0,
                    image_gb=options.image_gb,
                    team=team,
                )
            )
    return shape_jobs(jobs, options)


def load_philly(path: str | Path, options: TraceOptions | None = None) -> Workload:
    options = options or TraceOptions()
    cluster = choose_cluster(options, CLUSTER)
    jobs = read_philly(path, options)
    models, nodes = homogeneous_cluster(
        gpus=cluster.gpus, gpus_per_node=cluster.gpus_per_node, gpu_model=options.gpu_model
    )
    return make_workload(
        f"philly:{Path(path).name}",
        jobs,
        options,
        gpu_models=models,
        nodes=nodes,
        description=f"Philly trace {path}, {len(jobs)} jobs on {cluster.gpus} GPUs",
    )
