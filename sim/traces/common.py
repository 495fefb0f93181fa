"""What every trace loader shares: the options to window, scale and subsample a trace, the
error a loader raises and the check of a CSV header, the homogeneous cluster of a trace
without nodes, and the step from a list of jobs to a :class:`Workload`."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from pathlib import Path

import numpy as np

from sim.workload import BlockJob, GpuModel, Node, Service, Transfer, Workload

HOUR = 3600.0


class TraceInput(StrEnum):
    """Which input a :class:`TraceError` is about, so that a front end can point at the
    argument to fix (the CLI maps each to its option)."""

    trace = "trace"
    nodes = "nodes"
    kind = "kind"
    cluster = "cluster"


class TraceError(ValueError):
    """A trace the loaders cannot use, with what was wrong and where (file, line, column)."""

    def __init__(self, message: str, *, about: TraceInput = TraceInput.trace) -> None:
        super().__init__(message)
        self.about = about


def require_header(
    path: str | Path, fieldnames: Sequence[str] | None, columns: Sequence[str], *, source: str = ""
) -> None:
    """Refuse a CSV whose header lacks any of ``columns``, naming the missing ones (sorted)
    and the ones found; ``source`` (e.g. ``"a Philly trace"``) says what the file is not."""
    found = list(fieldnames or ())
    missing = set(columns) - set(found)
    if missing:
        not_source = f"not {source}, " if source else ""
        raise TraceError(f"{path}: {not_source}missing columns {sorted(missing)} (found {found})")


@dataclass(frozen=True, slots=True)
class Elasticity:
    """Elastic training for a replay (``TraceOptions.elastic``): every checkpointable job
    may run on ``low`` × its size (at least 1 GPU) to ``high`` × its size GPUs, at
    ``(GPUs / size) ** scaling`` times its speed on its own size (``BlockJob``). The size
    the trace gives stays the size it asks: what the baselines run it at."""

    low: float = 0.5
    high: float = 2.0
    scaling: float = 0.8

    def __post_init__(self) -> None:
        if not 0 < self.low <= 1 <= self.high:
            raise ValueError(f"elastic: need 0 < low <= 1 <= high, not {self.low}, {self.high}")
        if not 0 < self.scaling <= 1:
            raise ValueError(f"elastic: scaling must be in (0, 1], not {self.scaling}")

    @classmethod
    def parse(cls, text: str) -> Elasticity:
        """``"LOW,HIGH,SCALING"``, e.g. ``"0.5,2,0.8"``."""
        parts = [p.strip() for p in text.split(",")]
        if len(parts) != 3:
            raise ValueError(f"elastic: expected LOW,HIGH,SCALING (e.g. 0.5,2,0.8), not {text!r}")
        try:
            low, high, scaling = (float(p) for p in parts)
        except ValueError:
            raise ValueError(f"elastic: LOW,HIGH,SCALING must be numbers, not {text!r}") from None
        return cls(low, high, scaling)

    def apply(self, job: BlockJob) -> BlockJob:
        if not job.checkpointable:
            return job
        return replace(
            job,
            min_gpus=max(1, math.floor(job.gpus * self.low)),
            max_gpus=max(job.gpus, math.ceil(job.gpus * self.high)),
            scaling=self.scaling,
        )


@dataclass(frozen=True, slots=True)
class TraceOptions:
    """How to cut and shape a trace before replaying it.

    * ``window_start_h`` / ``window_end_h``: keep jobs submitted in this window (hours from
      the first submission of the trace); times are re-based to the window's start.
    * ``subsample``: keep each job with this probability (seeded).
    * ``max_jobs``: keep at most this many jobs (the earliest, after subsampling).
    * ``load_scale``: divide inter-arrival times by this (2.0 = twice the arrival rate).
    * ``duration_scale``: multiply every job's run time by this.
    * ``horizon_h``: simulated horizon; default = the last arrival (the arrival window).
    * ``gpus`` / ``gpus_per_node``: the size of the cluster to replay on, for traces without
      a node list (Philly, Pollux, Gavel, our own CSV without nodes); ``None`` = the
      source's published setup (see :mod:`sim.traces.cluster`). ``gpu_model``: the model of
      a homogeneous cluster (Gavel brings its own three models).
    * ``checkpointable`` / ``checkpoint_interval_h`` / ``image_gb``: what the trace does not
      say about checkpointing: by default every job can be checkpointed (Shaper's agent
      checkpoints transparently) with a 20 GB image.
    * ``elastic``: make every checkpointable job elastic training (:class:`Elasticity`);
      None: the jobs are as rigid as the trace says.
    """

    window_start_h: float = 0.0
    window_end_h: float | None = None
    subsample: float = 1.0
    max_jobs: int | None = None
    load_scale: float = 1.0
    duration_scale: float = 1.0
    horizon_h: float | None = None
    gpus: int | None = None
    gpus_per_node: int | None = None
    gpu_model: str = "V100"
    checkpointable: bool = True
    checkpoint_interval_h: float = 0.0
    image_gb: float = 20.0
    seed: int = 0
    replan_interval_min: float = 30.0
    services: tuple[Service, ...] = field(default_factory=tuple)
    elastic: Elasticity | None = None

    def with_(self, **changes: object) -> TraceOptions:
        return replace(self, **changes)  # type: ignore[arg-type]


def node_sizes(*, gpus: int, gpus_per_node: int) -> list[int]:
    """``gpus`` GPUs in nodes of ``gpus_per_node``; the last node holds what is left."""
    full, rest = divmod(gpus, gpus_per_node)
    return [gpus_per_node] * full + ([rest] if rest else [])


def homogeneous_cluster(
    *, gpus: int, gpus_per_node: int, gpu_model: str
) -> tuple[dict[str, GpuModel], list[Node]]:
    nodes = [
        Node(name=f"node-{index:04d}", gpu_model=gpu_model, gpus=size)
        for index, size in enumerate(node_sizes(gpus=gpus, gpus_per_node=gpus_per_node))
    ]
    return {gpu_model: GpuModel(name=gpu_model)}, nodes


def shape_jobs(jobs: list[BlockJob], options: TraceOptions) -> list[BlockJob]:
    """Window, subsample, rescale, re-base submit times to 0, and make jobs elastic
    (``options.elastic``)."""
    if not jobs:
        return []
    jobs = sorted(jobs, key=lambda j: (j.submit_time, j.id))
    origin = jobs[0].submit_time
    start = origin + options.window_start_h * HOUR
    end = None if options.window_end_h is None else origin + options.window_end_h * HOUR
    kept = [j for j in jobs if j.submit_time >= start and (end is None or j.submit_time < end)]
    if options.subsample < 1.0:
        rng = np.random.default_rng(options.seed)
        keep = rng.random(len(kept)) < options.subsample
        kept = [j for j, k in zip(kept, keep, strict=True) if k]
    if options.max_jobs is not None:
        kept = kept[: options.max_jobs]
    if not kept:
        return []
    base = kept[0].submit_time
    shaped = [
        replace(
            job,
            submit_time=(job.submit_time - base) / options.load_scale,
            work=max(1.0, job.work * options.duration_scale),
        )
        for job in kept
    ]
    elastic = options.elastic
    return shaped if elastic is None else [elastic.apply(job) for job in shaped]


def make_workload(
    name: str,
    jobs: list[BlockJob],
    options: TraceOptions,
    *,
    gpu_models: dict[str, GpuModel],
    nodes: list[Node],
    description: str = "",
) -> Workload:
    total = sum(n.gpus for n in nodes)
    # A job larger than the whole cluster could never run; it is left out (and counted).
    fitting = [j for j in jobs if j.gpus <= total]
    if len(fitting) < len(jobs):
        description += f" ({len(jobs) - len(fitting)} jobs larger than the cluster left out)"
    horizon = options.horizon_h * HOUR if options.horizon_h is not None else None
    if horizon is None:
        horizon = max((j.submit_time for j in fitting), default=0.0) or HOUR
    return Workload(
        name=name,
        gpu_models=gpu_models,
        nodes=nodes,
        jobs=fitting,
        services=list(options.services),
        horizon=horizon,
        transfer=Transfer(),
        replan_interval=options.replan_interval_min * 60.0,
        description=description,
        seed=options.seed,
    )
