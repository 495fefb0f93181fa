"""Gavel (OSDI'20) trace files: ``scheduler/traces/**/*.trace`` of stanford-futuredata/gavel.

Format (Gavel's ``scheduler/utils.py``, ``parse_trace``): no header, one job per line, ten
tab-separated fields (:data:`FIELDS`)::

    job type, command, working directory, num-steps argument, needs data dir (0/1),
    total steps, scale factor, priority weight, SLO, arrival time (s)

Files written before Gavel added the working directory have nine fields, without the
third; both are read.

Fields → workload model:

* job type (``ResNet-50 (batch size 64)``) → its throughputs
  (:mod:`sim.traces.gavel_throughputs`), and ``team`` = the model family (``ResNet-50``);
* the job type's throughput on each model over its V100 throughput → ``speeds``, the job's
  own speed on each model (ResNet-18 with batch size 256 runs at 0.08 on a K80, LM with
  batch size 5 at 0.23), so that its progress on each GPU comes from its own type;
* total steps ÷ the job type's V100 throughput → ``work``, the run time at reference speed:
  the V100 is the reference because Gavel's own generator turns a run time into steps with
  the V100 throughput (``reference_worker_type='v100'``);
* scale factor → ``gpus`` (one GPU per worker); priority weight → ``priority``; arrival
  time → ``submit_time``;
* a GPU model on which the job type's throughput is 0 (it does not fit) is left out of the
  job's allowed models;
* command, working directory, num-steps argument and needs-data-dir say how Gavel launches
  the job, and the SLO (-1 = none) has no counterpart here: they are not used.

Where the workload model differs from Gavel's:

* heterogeneity: Gavel's point is that each job type gains differently from a faster GPU.
  The simulation runs each job at its own type's speed (``BlockJob.speeds``), and the
  adapter hands those speeds to the solver (``Job.speeds``): ``shaper`` plans with them
  (``SolverConfig.job_speeds``), the baselines with one speed per GPU model, each model's
  ``GpuModel.speed``: the geometric mean, over the job types, of its throughput over the
  V100's (P100 ≈ 0.58, K80 ≈ 0.22).
* multi-GPU jobs: the table has one-GPU throughputs; a job of scale factor s without its
  own row is taken to run s times faster than on one GPU (linear scaling). Gavel measured
  less (e.g. about 0.65 of linear for Transformer on 8 K80s), so such jobs run shorter here
  than in Gavel, by that efficiency.
* an unknown job type has no throughput, hence no run time: it is an error that lists the
  known types. So is an arrival time that is negative, NaN or infinite, total steps that
  are not a positive finite number, a negative or NaN priority weight, and a file with no
  job line. Every job is ``training``; checkpointing comes from :class:`TraceOptions`.

Cluster (:data:`CLUSTER`): Gavel's simulated cluster, 36 V100 + 36 P100 + 36 K80 (its
EXPERIMENTS.md, Figures 8-10, ``-c 36:36:36``), one GPU per server (its sweep scripts'
default ``--num_gpus_per_server 1:1:1``). ``TraceOptions.gpus`` is split evenly over the
three models (what is left over to V100 first, then P100); ``gpus_per_node`` groups each
model's GPUs in nodes of that size. GPU memory per the data sheets: V100 and P100 16 GB,
K80 12 GB (one of its two dies).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sim.traces.cluster import ClusterChoice, PublishedCluster, choose_cluster
from sim.traces.common import (
    TraceError,
    TraceOptions,
    make_workload,
    node_sizes,
    number,
    read_text,
    refuse_no_rows,
    shape_jobs,
)
from sim.traces.gavel_throughputs import MODELS, STEPS_PER_SECOND
from sim.workload import BlockJob, GpuModel, JobKind, Node, Workload

FIELDS = (
    "job type",
    "command",
    "working directory",
    "num-steps argument",
    "needs data dir",
    "total steps",
    "scale factor",
    "priority weight",
    "SLO",
    "arrival time",
)
OLD_FIELDS = tuple(field for field in FIELDS if field != "working directory")
CLUSTER = PublishedCluster(
    gpus=108,
    gpus_per_node=1,
    source="Gavel's simulated cluster (OSDI'20)",
)
MEMORY_GB = {"V100": 16, "P100": 16, "K80": 12}


def _speed(column: int) -> float:
    ratios = [row[column] / row[0] for row in STEPS_PER_SECOND.values() if row[column] > 0]
    return math.exp(sum(math.log(r) for r in ratios) / len(ratios))


SPEED = {model: _speed(column) for column, model in enumerate(MODELS)}


@dataclass(frozen=True, slots=True)
class GavelLine:
    job_type: str
    total_steps: float
    scale_factor: int
    priority_weight: float
    arrival_time: float


def parse_line(line: str) -> GavelLine:
    """One trace line; ``ValueError`` says which field is wrong."""
    values = line.rstrip("\r\n").split("\t")
    names: tuple[str, ...]
    if len(values) == len(FIELDS):
        names = FIELDS
    elif len(values) == len(OLD_FIELDS):
        names = OLD_FIELDS
    else:
        raise ValueError(
            f"{len(values)} tab-separated fields, not {len(FIELDS)} ({', '.join(FIELDS)})"
        )
    record = dict(zip(names, values, strict=True))
    try:
        needs_data_dir = int(record["needs data dir"])
        parsed = GavelLine(
            job_type=record["job type"],
            total_steps=float(record["total steps"]),
            scale_factor=int(record["scale factor"]),
            priority_weight=float(record["priority weight"]),
            arrival_time=float(record["arrival time"]),
        )
        float(record["SLO"])
    except ValueError as exc:
        raise ValueError(f"a number field is not a number ({exc})") from exc
    if needs_data_dir not in (0, 1) or parsed.scale_factor < 1 or parsed.total_steps < 0:
        raise ValueError(
            "needs data dir must be 0 or 1, scale factor at least 1, total steps not negative"
        )
    return parsed


def looks_like_gavel(line: str) -> bool:
    """Whether a file's first line is a Gavel job line (the format has no header)."""
    try:
        parse_line(line)
    except ValueError:
        return False
    return True


def steps_per_second(job_type: str, scale_factor: int) -> tuple[float, ...]:
    """Throughput of the whole job on each model of :data:`MODELS` (see the docstring)."""
    exact = STEPS_PER_SECOND.get((job_type, scale_factor))
    if exact is not None:
        return exact
    one = STEPS_PER_SECOND.get((job_type, 1))
    if one is None:
        known = sorted({name for name, _ in STEPS_PER_SECOND})
        raise KeyError(f"job type {job_type!r} has no throughput; known types: {known}")
    return tuple(scale_factor * value for value in one)


def check_values(parsed: GavelLine) -> None:
    """Refuse the numbers :func:`parse_line` reads but does not bound (it also recognises a
    Gavel file, so a bad value should name its line rather than hide the format)."""
    number(parsed.arrival_time, "arrival time (seconds)", at_least=0)
    number(parsed.total_steps, "total steps", above=0)
    number(parsed.priority_weight, "priority weight", at_least=0)


def read_gavel(path: str | Path, options: TraceOptions) -> list[BlockJob]:
    jobs: list[BlockJob] = []
    for index, line in enumerate(read_text(path).split("\n")):
        if not line.strip():
            continue
        try:
            parsed = parse_line(line)
            check_values(parsed)
            throughputs = steps_per_second(parsed.job_type, parsed.scale_factor)
        except (ValueError, KeyError) as exc:
            raise TraceError(f"{path}:{index + 1}: {exc.args[0]}") from exc
        fits = tuple(m for m, value in zip(MODELS, throughputs, strict=True) if value > 0)
        speeds = tuple(
            (model, value / throughputs[0])
            for model, value in zip(MODELS, throughputs, strict=True)
            if value > 0
        )
        jobs.append(
            BlockJob(
                id=f"gavel-{len(jobs)}",
                submit_time=parsed.arrival_time,
                gpus=parsed.scale_factor,
                work=parsed.total_steps / throughputs[0],
                priority=parsed.priority_weight,
                kind=JobKind.training,
                gpu_models=() if len(fits) == len(MODELS) else fits,
                checkpointable=options.checkpointable,
                checkpoint_interval=options.checkpoint_interval_h * 3600.0,
                image_gb=options.image_gb,
                team=parsed.job_type.split(" (")[0],
                speeds=speeds,
            )
        )
    refuse_no_rows(path, len(jobs), why="the file has no job line")
    return shape_jobs(jobs, options)


def gavel_cluster(cluster: ClusterChoice) -> tuple[dict[str, GpuModel], list[Node]]:
    """``cluster.gpus`` split evenly over the three models, in nodes of one model each."""
    share, rest = divmod(cluster.gpus, len(MODELS))
    nodes: list[Node] = []
    for position, model in enumerate(MODELS):
        count = share + (1 if position < rest else 0)
        sizes: Sequence[int] = (
            node_sizes(gpus=count, gpus_per_node=cluster.gpus_per_node) if count else ()
        )
        nodes += [
            Node(name=f"{model.lower()}-{index:03d}", gpu_model=model, gpus=size)
            for index, size in enumerate(sizes)
        ]
    models = {
        model: GpuModel(name=model, memory_gb=MEMORY_GB[model], speed=SPEED[model])
        for model in MODELS
    }
    return models, nodes


def load_gavel(path: str | Path, options: TraceOptions | None = None) -> Workload:
    options = options or TraceOptions()
    cluster = choose_cluster(options, CLUSTER)
    jobs = read_gavel(path, options)
    models, nodes = gavel_cluster(cluster)
    return make_workload(
        f"gavel:{Path(path).stem}",
        jobs,
        options,
        gpu_models=models,
        nodes=nodes,
        description=f"Gavel trace {path}, {len(jobs)} jobs on {cluster.gpus} GPUs",
    )
