"""The simulator's workload model: GPU models, nodes, block jobs and elastic services.

Everything here is plain data in simulated seconds, independent of the solver's types;
``sim.adapter`` translates a running simulation into a ``solver.Instance``.

Units:

* time: seconds from the start of the simulation (``t = 0``);
* work of a block job: seconds of run time on its full gang of ``gpus`` GPUs of the
  reference speed (``speed = 1.0``); on a model with ``speed = s`` it runs ``s`` times
  faster, unless the job names its own speed on that model (``BlockJob.speeds``: jobs gain
  differently from a faster GPU, as Gavel measured per job type);
* elastic training (``BlockJob.max_gpus`` set, Pollux-like): the job runs on any number
  ``g`` of GPUs from ``min_gpus`` to ``max_gpus``, at ``(g / gpus) ** scaling`` times the
  speed it has on ``gpus`` (``scaling`` 1: linear; 0.8: twice the GPUs run 1.74× as
  fast), and a checkpointable one may be resized while it runs (a checkpoint and a
  restart, priced as a migration); ``gpus`` is the size it asks for and the size its
  ``work`` is measured on;
* GPU fractions (Alibaba): ``gpu_milli`` per GPU, 1000 = a whole GPU.
"""

from __future__ import annotations

import math
import random
import zlib
from dataclasses import dataclass, field
from enum import StrEnum
from functools import lru_cache
from typing import Any


# What a block job does, in the words of ``wire.telemetry.JobKind`` (the block-job ones: a
# real-time service is a ``Service`` here). The simulator imports only the solver, so it
# keeps this copy of those values; nothing maps between the two.
class JobKind(StrEnum):
    training = "training"
    batch_inference = "batch_inference"
    quantization = "quantization"
    hpc = "hpc"


@dataclass(frozen=True, slots=True)
class GpuModel:
    name: str
    memory_gb: int = 80
    speed: float = 1.0
    fp8: bool = False


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    gpu_model: str
    gpus: int
    cluster: str = "default"
    cpu_milli: int = 0
    memory_mib: int = 0


@dataclass(frozen=True, slots=True)
class BlockJob:
    """A job that holds a gang of GPUs until it is done: a fixed one, or for elastic
    training (``max_gpus`` set) one of ``min_gpus``..``max_gpus`` GPUs that may change
    while it runs."""

    id: str
    submit_time: float
    gpus: int
    work: float
    priority: float = 1.0
    kind: JobKind = JobKind.training
    gpu_models: tuple[str, ...] = ()
    checkpointable: bool = False
    checkpoint_interval: float = 0.0
    image_gb: float = 10.0
    team: str = "default"
    preemptible: bool = True
    gpu_milli: int = 1000
    cpu_milli: int = 0
    memory_mib: int = 0
    # This job's own speed on some GPU models, as (model, speed) pairs in the units of
    # ``GpuModel.speed``; a model not listed runs it at the model's speed. Empty for traces
    # that carry no per-job speeds.
    speeds: tuple[tuple[str, float], ...] = ()
    # The cluster it is submitted to, where its inputs are (None: a one-cluster workload).
    # A planner that federates clusters may start it in another one, after sending its
    # image there (``Transfer.remote_seconds``).
    cluster: str | None = None
    # Its data residency: a federating planner starts it only in clusters whose labels
    # (``Workload.cluster_labels``) include every (key, value) here and, unless None, that
    # ``allowed_clusters`` names; the cluster it is submitted to always may keep it.
    cluster_selector: tuple[tuple[str, str], ...] = ()
    allowed_clusters: tuple[str, ...] | None = None
    # Elastic training: it runs on any GPU count in [min_gpus, max_gpus] (min_gpus None:
    # ``gpus``), at speed × (count / gpus) ** scaling. Rigid (the default) when max_gpus is
    # None; ``scaling`` matters only for elastic jobs.
    min_gpus: int | None = None
    max_gpus: int | None = None
    scaling: float = 1.0

    def __post_init__(self) -> None:
        if not 0 < self.scaling <= 1:  # NaN too
            raise ValueError(f"job {self.id}: scaling must be in (0, 1], got {self.scaling!r}")
        if self.max_gpus is None:
            if self.min_gpus is not None:
                raise ValueError(
                    f"job {self.id}: min_gpus={self.min_gpus} without max_gpus (an elastic "
                    f"job gives max_gpus; max_gpus={self.gpus} only shrinks)"
                )
            return
        low = self.gpus if self.min_gpus is None else self.min_gpus
        if not 1 <= low <= self.gpus <= self.max_gpus:
            raise ValueError(
                f"job {self.id}: elastic training needs 1 <= min_gpus <= gpus <= max_gpus, "
                f"not {low} <= {self.gpus} <= {self.max_gpus}"
            )

    @property
    def elastic(self) -> bool:
        """Elastic training: runs on any GPU count from ``min_size`` to ``max_size``."""
        return self.max_gpus is not None

    @property
    def min_size(self) -> int:
        """The fewest GPUs it may run on (``gpus`` for a rigid job)."""
        if self.max_gpus is None or self.min_gpus is None:
            return self.gpus
        return self.min_gpus

    @property
    def max_size(self) -> int:
        """The most GPUs it may run on (``gpus`` for a rigid job)."""
        return self.gpus if self.max_gpus is None else self.max_gpus

    def size_factor(self, gpus: int) -> float:
        """How much faster it runs on ``gpus`` GPUs than on the ``gpus`` it asks for (1 for
        a rigid job)."""
        if self.max_gpus is None or gpus == self.gpus:
            return 1.0
        return float((gpus / self.gpus) ** self.scaling)

    def can_run_on(self, gpu_model: str) -> bool:
        return not self.gpu_models or gpu_model in self.gpu_models

    def speed_on(self, model: GpuModel) -> float:
        """How fast this job runs on ``model``: its own speed there, else the model's."""
        for name, speed in self.speeds:
            if name == model.name:
                return speed
        return model.speed


@dataclass(frozen=True, slots=True)
class Service:
    """An elastic real-time service: replicas follow an hourly demand curve.

    ``hourly_demand`` holds the replicas needed to serve demand at each hour of the day on
    the reference model (speed 1.0); a replica on a faster model serves ``speed`` times
    more. The SLA is demand served: an hour in which served < ``sla_target`` × demand is a
    violation.

    ``demand_noise`` (0 = none) makes each hour's demand the curve's × (1 + noise · z), with
    z a standard normal drawn from the service id, ``noise_seed`` and the hour: real demand
    only follows its daily cycle roughly, and a forecaster is only tested by what it cannot
    read off the curve (``bench.forecast``). Reproducible: the same seed, the same demand.
    """

    id: str
    hourly_demand: tuple[float, ...]
    gpus_per_replica: int = 1
    min_replicas: int = 0
    max_replicas: int = 64
    priority: float = 5.0
    gpu_models: tuple[str, ...] = ()
    sla_target: float = 1.0
    start_time: float = 0.0
    team: str = "inference"
    demand_noise: float = 0.0
    noise_seed: int = 0
    # The cluster whose users it serves: its replicas stay there (None: any cluster).
    cluster: str | None = None

    def demand_at(self, t: float) -> float:
        if t < self.start_time:
            return 0.0
        return self.curve_at(t)

    def curve_at(self, t: float) -> float:
        """The demand of the hour ``t`` falls in, whether the service runs then or not (the
        history a forecaster gets of a service that ran before the simulation starts)."""
        hour = math.floor(t / 3600)
        base = float(self.hourly_demand[hour % len(self.hourly_demand)])
        if not self.demand_noise:
            return base
        return max(0.0, base * (1.0 + self.demand_noise * _normal(self.id, self.noise_seed, hour)))

    @property
    def peak_replicas(self) -> int:
        return min(self.max_replicas, max(self.min_replicas, math.ceil(max(self.hourly_demand))))

    def can_run_on(self, gpu_model: str) -> bool:
        return not self.gpu_models or gpu_model in self.gpu_models


@lru_cache(maxsize=65536)
def _normal(service: str, seed: int, hour: int) -> float:
    # crc32, not hash(): str hashes change from one process to the next.
    return random.Random(zlib.crc32(f"{service}:{seed}:{hour}".encode())).gauss(0.0, 1.0)


def service_from_record(record: dict[str, Any]) -> Service:
    """A service from a YAML or JSON mapping (``start_h`` in hours; models a list or
    ``A|B``)."""
    models = record.get("gpu_models") or ()
    if isinstance(models, str):
        models = [m for m in models.split("|") if m]
    return Service(
        id=str(record["id"]),
        hourly_demand=tuple(float(x) for x in record["hourly_demand"]),
        gpus_per_replica=int(record.get("gpus_per_replica", 1)),
        min_replicas=int(record.get("min_replicas", 0)),
        max_replicas=int(record.get("max_replicas", 64)),
        priority=float(record.get("priority", 5.0)),
        gpu_models=tuple(str(m) for m in models),
        sla_target=float(record.get("sla_target", 1.0)),
        start_time=float(record.get("start_h", 0.0)) * 3600.0,
        team=str(record.get("team", "inference")),
        demand_noise=float(record.get("demand_noise", 0.0)),
        noise_seed=int(record.get("noise_seed", 0)),
        cluster=str(record["cluster"]) if record.get("cluster") is not None else None,
    )


@dataclass(frozen=True, slots=True)
class NodeEvent:
    """A node failure (``fail``), return to service (``recover``) or drain (``drain``)."""

    time: float
    node: str
    kind: str


@dataclass(frozen=True, slots=True)
class Transfer:
    """What checkpoint, transfer and restore cost, in seconds.

    The image goes through shared storage: the checkpoint writes it at
    ``bandwidth_mib_per_s`` and the restore reads it back at the same rate, each with half
    of a fixed ``overhead_s`` (quiesce, process tree, CUDA context). A migration pays both;
    this is the same model the solver uses to price a move
    (``solver.instance.MigrationCostModel``), so the solver's estimate and the simulated
    cost agree.

    Between clusters the image crosses the sites' link once more, at
    ``inter_cluster_bandwidth_mib_per_s`` after ``inter_cluster_overhead_s`` (submitting to
    another scheduler): a job started in a cluster other than where its image is, and a
    migration to another cluster, pay ``remote_seconds`` on top.

    Where the sites' provider bills the data that leaves (cloud egress),
    ``inter_cluster_egress_gpu_s_per_gib`` prices each GiB of the image that crosses in
    GPU-seconds of work, the solver's ``MigrationCostModel`` setting of that name: the price
    of a GiB over the price of a GPU-hour, × 3600 ($0.09 a GiB at $2.50 a GPU-hour: 130).
    It costs money, not time: the planner weighs it, the run reports it
    (``egress_gpu_hours``) beside the GiB that crossed; no GPU waits for it. 0: no egress.
    """

    bandwidth_mib_per_s: float = 1000.0
    overhead_s: float = 30.0
    inter_cluster_bandwidth_mib_per_s: float = 100.0
    inter_cluster_overhead_s: float = 120.0
    inter_cluster_egress_gpu_s_per_gib: float = 0.0

    def __post_init__(self) -> None:
        egress = self.inter_cluster_egress_gpu_s_per_gib
        if not egress >= 0:  # NaN too
            raise ValueError(
                f"transfer.inter_cluster_egress_gpu_s_per_gib must be >= 0 GPU-seconds a GiB, "
                f"got {egress!r}"
            )

    def egress_gpu_seconds(self, gib: float) -> float:
        """What ``gib`` of data leaving a site costs, in GPU-seconds."""
        return gib * self.inter_cluster_egress_gpu_s_per_gib

    def checkpoint_seconds(self, image_gb: float) -> float:
        return self.overhead_s / 2 + image_gb * 1024 / self.bandwidth_mib_per_s

    def restore_seconds(self, image_gb: float) -> float:
        return self.overhead_s / 2 + image_gb * 1024 / self.bandwidth_mib_per_s

    def migration_seconds(self, image_gb: float) -> float:
        return self.checkpoint_seconds(image_gb) + self.restore_seconds(image_gb)

    def remote_seconds(self, image_gb: float) -> float:
        return (
            self.inter_cluster_overhead_s + image_gb * 1024 / self.inter_cluster_bandwidth_mib_per_s
        )


@dataclass(slots=True)
class Workload:
    """A complete simulation input: cluster, work, events, horizon."""

    name: str
    gpu_models: dict[str, GpuModel]
    nodes: list[Node]
    jobs: list[BlockJob]
    services: list[Service] = field(default_factory=list)
    node_events: list[NodeEvent] = field(default_factory=list)
    horizon: float = 24 * 3600.0
    transfer: Transfer = field(default_factory=Transfer)
    replan_interval: float = 1800.0
    description: str = ""
    seed: int = 0
    sla_policies: dict[str, dict[str, object]] = field(default_factory=dict)
    solver_config: dict[str, object] = field(default_factory=dict)
    # Where each cluster is ({"east": {"region": "us"}}), for jobs' ``cluster_selector``.
    cluster_labels: dict[str, dict[str, str]] = field(default_factory=dict)

    @property
    def total_gpus(self) -> int:
        return sum(node.gpus for node in self.nodes)

    @property
    def clusters(self) -> list[str]:
        return sorted({node.cluster for node in self.nodes})

    def team_weight(self, team: str) -> float:
        """The team's SLA priority weight (1 without a policy): a job's value weight is
        this × its own priority."""
        policy = self.sla_policies.get(team, {})
        return float(policy.get("priority_weight", 1.0))  # type: ignore[arg-type]

    def validate(self) -> None:
        names = {node.name for node in self.nodes}
        if len(names) != len(self.nodes):
            raise ValueError(f"workload {self.name}: duplicate node names")
        for node in self.nodes:
            if node.gpu_model not in self.gpu_models:
                raise ValueError(f"node {node.name}: unknown GPU model {node.gpu_model!r}")
        ids = [job.id for job in self.jobs] + [svc.id for svc in self.services]
        if len(set(ids)) != len(ids):
            raise ValueError(f"workload {self.name}: duplicate job or service ids")
        clusters = set(self.clusters)
        homes = [(job.id, job.cluster) for job in self.jobs]
        homes += [(svc.id, svc.cluster) for svc in self.services]
        homes += [(f"cluster_labels of {name}", name) for name in self.cluster_labels]
        homes += [(job.id, name) for job in self.jobs for name in job.allowed_clusters or ()]
        for item, home in homes:
            if home is not None and home not in clusters:
                raise ValueError(
                    f"{item}: cluster {home!r} has no nodes (clusters: "
                    f"{', '.join(sorted(clusters))})"
                )
        for job in self.jobs:
            if job.gpus <= 0 or job.work <= 0:
                raise ValueError(f"job {job.id}: gpus and work must be positive")
            unknown = set(job.gpu_models) - set(self.gpu_models)
            if unknown:
                raise ValueError(f"job {job.id}: unknown GPU models {sorted(unknown)}")
            unknown = {name for name, _ in job.speeds} - set(self.gpu_models)
            if unknown:
                raise ValueError(f"job {job.id}: speeds on unknown GPU models {sorted(unknown)}")
            if any(speed <= 0 for _, speed in job.speeds):
                raise ValueError(f"job {job.id}: speeds must be positive")
        for event in self.node_events:
            if event.node not in names:
                raise ValueError(f"node event at {event.time}: unknown node {event.node!r}")
            if event.kind not in ("fail", "recover", "drain"):
                raise ValueError(f"node event at {event.time}: unknown kind {event.kind!r}")
