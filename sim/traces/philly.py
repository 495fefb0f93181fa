"""Microsoft Philly (2017), as packaged with the Pollux artifact: ``philly.csv``.

Columns → workload model:

* ``timestamp`` (``YYYY-mm-dd HH:MM:SS``, submission) → ``submit_time`` (seconds after the
  first submission kept);
* ``duration`` (seconds of run time) → ``work`` at reference speed: the trace records one
  run on Philly's GPUs, which are the reference model of the replay cluster;
* ``num_gpus`` → gang size (``gpus``);
* ``cluster`` (virtual cluster id) → ``team``;
* ``gpu_time`` = duration × num_gpus: used only as a consistency check.

Rows with 0 GPUs or 0 s of run time (jobs that never ran) are left out; a negative, NaN or
infinite number, or a timestamp that is not ``YYYY-mm-dd HH:MM:SS`` (an offset such as
``+05:00`` is honoured; without one the time is UTC), is an error naming the line.

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

from datetime import UTC, datetime
from pathlib import Path

from sim.traces.cluster import PublishedCluster, choose_cluster
from sim.traces.common import (
    TraceError,
    TraceOptions,
    csv_rows,
    homogeneous_cluster,
    make_workload,
    number,
    refuse_no_rows,
    require_header,
    shape_jobs,
    whole,
)
from sim.workload import BlockJob, JobKind, Workload

COLUMNS = ("timestamp", "duration", "num_gpus", "gpu_time", "cluster")
CLUSTER = PublishedCluster(
    gpus=64, gpus_per_node=8, source="Shaper's default for Philly, in nodes of 8 GPUs as Philly's"
)


def submit_seconds(text: str) -> float:
    """A Philly timestamp as seconds since the epoch (UTC unless it names an offset)."""
    try:
        when = datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"timestamp must be YYYY-mm-dd HH:MM:SS, not {text!r}") from None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


def read_philly(
    path: str | Path,
    options: TraceOptions,
    *,
    priority_by_team: dict[str, float] | None = None,
) -> list[BlockJob]:
    priority_by_team = priority_by_team or {}
    jobs: list[BlockJob] = []
    header, rows = csv_rows(path)
    require_header(path, header, COLUMNS, source="a Philly trace")
    count = 0
    for line, row in rows:
        count += 1
        try:
            submit = submit_seconds(row["timestamp"])
            duration = number(row["duration"], "duration (seconds)", at_least=0)
            gpus = whole(row["num_gpus"], "num_gpus")
        except ValueError as exc:
            raise TraceError(f"{path}:{line}: {exc}") from exc
        if gpus == 0 or duration == 0:
            continue
        team = row["cluster"] or "default"
        jobs.append(
            BlockJob(
                id=f"philly-{count - 1}",
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
    refuse_no_rows(path, count)
    if not jobs:
        raise TraceError(f"{path}: none of its {count} rows ran: each has 0 GPUs or 0 s")
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
