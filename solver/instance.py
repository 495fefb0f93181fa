"""Solver inputs: one immutable snapshot of the clusters, the work and the rules.

Units are explicit and integral wherever the solver counts: GPUs are whole GPUs,
CPU is in milli-CPUs, memory in MiB, times are seconds since the epoch (``now``,
``submit_time``, ``start_time``) and durations are seconds.

A :class:`Job`'s ``shape`` (:class:`JobShape`) makes it either a *block* job (training,
batch inference, HPC: a fixed number of replicas, all placed or none — a gang when it spans
nodes) or an *elastic* service (real-time inference: replicas between ``min_replicas`` and
``max_replicas`` that should follow ``forecast``). A block job that gives ``max_replicas``
is *elastic training* (Pollux-like data-parallel training): it runs on any number of
replicas between ``min_replicas`` and ``max_replicas``, and a checkpointable one may be
resized while it runs (a checkpoint and a restart at the new size); ``replicas`` is the
size it asks for, and a running one holds any whole number of replicas in its range
(``solver.elastic_training`` plans it; every other engine keeps it at the size it holds,
and starts it at ``replicas``). A job is *running* when ``placement`` is non-empty and
*pending* otherwise. ``placement`` maps node name to the number of GPUs the job holds
there; it is always a multiple of ``gpus_per_replica``.

:class:`NodeState` and :class:`JobShape` are the solver's copies of ``wire.telemetry``'s
``NodeState`` (``up`` there is READY here) and ``JobShape``: the solver imports only ortools
and pydantic, so it cannot share them, and ``app.shaping.snapshot`` maps one onto the other
once (``NODE_STATES``, ``JOB_SHAPES``). What a job does (training, inference …: the wire's
``JobKind``) is not the solver's business.

A *fractional* job (``gpu_milli`` < 1000: a GPU-sharing pod, as in the Alibaba traces)
asks for that many thousandths of one GPU: one replica of one GPU, placed ``{node: 1}``
with ``gpu_indices`` naming the GPU it shares; the shares on a GPU add up to at most 1000
and no whole-GPU job names a shared GPU. ``solver.greedy.sharing`` plans them around the
whole-GPU plan.

A *MIG* job (``mig_profile`` set) asks for one GPU instance of that profile (``3g.40gb``)
on a GPU whose model lists it in ``GpuModel.mig_profiles`` (``solver.mig``: the profile
table and NVIDIA's placement geometry): one replica of one GPU, placed ``{node: 1}`` with
``gpu_indices`` naming the GPU and, once running, ``mig_start`` the first memory slice of
its instance. A GPU with instances is held by them and never by a whole-GPU job or shares;
running instances may not overlap and start only where their profile may.
``solver.greedy.mig_placement`` plans pending ones after the rest.

A job whose scheduler cannot be told where it goes (``migratable`` False) is never moved
to another node of its own cluster, whatever ``SolverConfig.migration`` says: one config
serves a federation group whose members' schedulers differ.

Shaper's own recent actions on a job (``last_acted_at``, ``actions_last_hour``) and a saga
in flight (``locked``) *freeze* it for a while (:meth:`Instance.is_frozen`): every policy
leaves a frozen job exactly as it is, so plans over consecutive cycles act as one instead of
undoing each other. ``overdue`` marks a job Shaper left without GPUs (a failed move): it
is placed first whatever its SLA says.

The snapshot is cheap to build: the simulator constructs one per re-plan. Derived look-ups
(``node_by_name``, ``policy_for`` …) are cached on first use.
"""

from __future__ import annotations

import enum
import math
import statistics
from collections.abc import Mapping
from functools import cached_property
from types import MappingProxyType
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field, model_validator

from solver.mig import MEMORY_SLICES, GpuLayout, MigProfile, MigSlice, clash, profile_named

FULL_GPU_MILLI = 1000  # one whole GPU, in thousandths (a fractional job's ``gpu_milli``)
NO_SPEEDS: Mapping[str, float] = MappingProxyType({})  # a job without speeds of its own


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class GpuModel(_Frozen):
    """One GPU model of the catalogue."""

    name: str
    memory_mib: int = Field(ge=0)
    precisions: frozenset[str] = frozenset({"fp32", "fp16"})
    speed: float = Field(default=1.0, gt=0, description="relative throughput, 1.0 = reference")
    mig_profiles: tuple[MigProfile, ...] = Field(
        default=(),
        description="the MIG profiles its GPUs can be partitioned into (solver.mig, e.g. "
        "solver.mig.A100_80GB); empty: not MIG-capable",
    )

    @model_validator(mode="after")
    def _check_mig_profiles(self) -> GpuModel:
        names = [profile.name for profile in self.mig_profiles]
        if len(set(names)) != len(names):
            raise ValueError(f"gpu model {self.name}: mig_profiles names a profile twice: {names}")
        return self

    def mig_profile(self, name: str) -> MigProfile | None:
        """The model's MIG profile called ``name``, or None if it has none of that name."""
        return profile_named(self.mig_profiles, name)


class NodeState(enum.StrEnum):
    up = "up"
    draining = "draining"  # running work stays, nothing new lands here
    down = "down"


class Node(_Frozen):
    """A machine with ``gpus`` GPUs of one model, in one cluster.

    Free capacity is derived from the running jobs' placements; ``free_gpu_indices`` is
    informational (for the dispatcher) and not used by the solver.
    """

    name: str
    cluster: str
    gpu_model: str
    gpus: int = Field(ge=0)
    cpu_milli: int = Field(default=0, ge=0, description="0 = CPU not modelled")
    memory_mib: int = Field(default=0, ge=0, description="0 = memory not modelled")
    labels: dict[str, str] = Field(default_factory=dict)
    taints: frozenset[str] = frozenset()
    state: NodeState = NodeState.up
    free_gpu_indices: tuple[int, ...] | None = None


class JobShape(enum.StrEnum):
    block = "block"
    elastic = "elastic"


class Job(_Frozen):
    """A block job or an elastic service, running (``placement``) or pending."""

    id: str
    team: str = "default"
    shape: JobShape = JobShape.block
    priority: float = Field(default=1.0, gt=0, description="multiplies the team's weight")

    # Size: ``replicas`` × ``gpus_per_replica`` GPUs; CPU and memory per replica.
    gpus_per_replica: int = Field(default=1, ge=1)
    replicas: int = Field(
        default=1,
        ge=0,
        description="block: gang size (elastic training: the size asked); elastic: current",
    )
    cpu_milli_per_replica: int = Field(default=0, ge=0)
    memory_mib_per_replica: int = Field(default=0, ge=0)
    max_nodes: int | None = Field(
        default=None,
        ge=1,
        description="gang spread limit for block jobs at the size they ask (Job.node_limit); "
        "None = unlimited",
    )
    gpu_milli: int = Field(
        default=FULL_GPU_MILLI,
        ge=1,
        le=FULL_GPU_MILLI,
        description="thousandths of a GPU per GPU asked; under 1000: a fractional job "
        "(one replica of one GPU) sharing one GPU with others (solver.greedy.sharing)",
    )
    mig_profile: str | None = Field(
        default=None,
        min_length=1,
        max_length=32,
        description="one MIG GPU instance of this profile (e.g. '3g.40gb') instead of whole "
        "GPUs: one replica of one GPU (solver.greedy.mig_placement)",
    )
    mig_start: int | None = Field(
        default=None,
        ge=0,
        lt=MEMORY_SLICES,
        description="a running MIG job: the first memory slice of its GPU instance (NVML's "
        "placement start) on the GPU gpu_indices names",
    )

    # Compatibility.
    allowed_gpu_models: frozenset[str] | None = None
    gpu_memory_mib: int = Field(default=0, ge=0, description="minimum memory per GPU")
    precision: str | None = None
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: frozenset[str] = frozenset()
    clusters: frozenset[str] | None = None
    home_cluster: str | None = Field(
        default=None,
        description="cluster holding the job's inputs or checkpoint; starting elsewhere "
        "transfers them (MigrationCostModel.remote_start_seconds). None: no home",
    )

    # Lifecycle.
    submit_time: float = 0.0
    start_time: float | None = None
    placement: dict[str, int] = Field(default_factory=dict, description="node -> GPUs held")
    gpu_indices: dict[str, tuple[int, ...]] | None = None
    expected_runtime_s: float | None = Field(default=None, ge=0, description="walltime estimate")
    checkpointable: bool = False
    migratable: bool = Field(
        default=True,
        description="may be moved to another node of its cluster by a migration; False: its "
        "scheduler cannot be told where it goes (Kueue, Ray): it may still be preempted or "
        "requeued, and moved to another cluster its ``clusters`` lists where "
        "config.cross_cluster_migration allows (the target's scheduler places it). A block "
        "job on several nodes moves only whole, by a restart pinned to its new nodes "
        "(config.gang_upgrades); False where its scheduler cannot restart it so. A "
        "service: its replicas may move to other nodes (config.replica_moves); False: its "
        "connector cannot choose which replicas leave a node",
    )
    checkpoint_size_mib: int | None = Field(default=None, ge=0)
    last_checkpoint_time: float | None = None
    preemptible: bool | None = Field(default=None, description="None = the SLA policy decides")
    last_moved_at: float | None = Field(default=None, description="last migration or resize")
    migrations_today: int = Field(default=0, ge=0)
    preemptions_today: int = Field(default=0, ge=0)
    # What Shaper itself did to the job lately (see ``Instance.is_frozen``).
    last_acted_at: float | None = Field(
        default=None,
        description="last time a Shaper action started, moved, preempted or requeued it",
    )
    actions_last_hour: int = Field(default=0, ge=0, description="Shaper actions in the past hour")
    locked: bool = Field(
        default=False, description="a saga is acting on it now: the plan leaves it as it is"
    )
    overdue: bool = Field(
        default=False,
        description="left without GPUs by Shaper (a failed move): placed first whatever its SLA",
    )

    # Elastic services, and elastic training (block jobs that give max_replicas).
    min_replicas: int = Field(default=0, ge=0)
    max_replicas: int | None = Field(default=None, ge=0)
    forecast: tuple[int, ...] = Field(
        default=(), description="replicas needed per future step; forecast[0] = now"
    )
    forecast_step_s: int = Field(default=3600, ge=1)
    # Forecasts come in clock-aligned steps (the hour a cycle runs in is step 0), so a
    # cycle at 11:30 sees the 12:00 step 30 minutes ahead, not a whole step: without the
    # origin the look-ahead counted a job ending at 12:10 as gone before a 12:00 peak
    # (README, "Forecasting": training-heavy's first-day peak hour).
    forecast_origin: float | None = Field(
        default=None,
        description="when step 0 of forecast began (epoch s; the start of the current "
        "step); step k begins forecast_step_s * k after it. None: step 0 begins now",
    )
    max_replica_change: int | None = Field(
        default=None, ge=0, description="most replicas added or removed by one plan"
    )

    @model_validator(mode="after")
    def _check_shape(self) -> Job:
        if self.is_fractional:
            self._check_fractional()
        if self.mig_profile is not None:
            self._check_mig()
        elif self.mig_start is not None:
            raise ValueError(f"job {self.id}: mig_start={self.mig_start} without a mig_profile")
        for node, gpus in self.placement.items():
            if gpus <= 0 or gpus % self.gpus_per_replica:
                raise ValueError(
                    f"job {self.id}: placement on {node} is {gpus} GPUs, "
                    f"not a positive multiple of gpus_per_replica={self.gpus_per_replica}"
                )
        if (
            self.shape is JobShape.block
            and self.placement
            and self.held_gpus != self.total_gpus
            and not self.is_resizable
        ):
            raise ValueError(
                f"job {self.id}: holds {self.held_gpus} GPUs but replicas × gpus_per_replica "
                f"is {self.total_gpus}"
            )
        if self.shape is JobShape.elastic and self.max_replicas is not None:
            if self.max_replicas < self.min_replicas:
                raise ValueError(f"job {self.id}: max_replicas < min_replicas")
        if self.is_resizable:
            self._check_resizable()
        return self

    def _check_resizable(self) -> None:
        where = f"job {self.id}: elastic training (max_replicas={self.max_replicas})"
        if self.is_fractional or self.mig_profile is not None:
            raise ValueError(f"{where} cannot be a share of a GPU or a MIG slice")
        if not 1 <= self.min_replicas <= self.replicas <= (self.max_replicas or 0):
            raise ValueError(
                f"{where} needs 1 <= min_replicas <= replicas <= max_replicas, not "
                f"{self.min_replicas} <= {self.replicas} <= {self.max_replicas}"
            )
        held = self.held_gpus // self.gpus_per_replica
        if self.placement and not self.min_replicas <= held <= (self.max_replicas or 0):
            raise ValueError(
                f"{where} holds {held} replicas, outside {self.min_replicas}..{self.max_replicas}"
            )

    def _check_fractional(self) -> None:
        where = f"job {self.id}: gpu_milli={self.gpu_milli} (a share of one GPU)"
        if self.shape is not JobShape.block:
            raise ValueError(f"{where} needs shape 'block'")
        if self.gpus_per_replica != 1 or self.replicas != 1:
            raise ValueError(
                f"{where} needs gpus_per_replica=1 and replicas=1: a fractional gang across "
                "GPUs is not supported"
            )
        if not self.placement:
            return
        node = next(iter(self.placement))
        indices = (self.gpu_indices or {}).get(node, ())
        if len(indices) != 1 or indices[0] < 0:
            raise ValueError(
                f"{where}: gpu_indices must name the one GPU it shares on {node}, not {indices}"
            )

    def _check_mig(self) -> None:
        where = f"job {self.id}: mig_profile={self.mig_profile!r} (one MIG slice of one GPU)"
        if self.shape is not JobShape.block:
            raise ValueError(f"{where} needs shape 'block'")
        if self.gpus_per_replica != 1 or self.replicas != 1:
            raise ValueError(f"{where} needs gpus_per_replica=1 and replicas=1")
        if self.is_fractional:
            raise ValueError(f"{where} cannot also ask for gpu_milli={self.gpu_milli}")
        if not self.placement:
            if self.mig_start is not None:
                raise ValueError(f"{where}: mig_start is only for a running job's slice")
            return
        node = next(iter(self.placement))
        indices = (self.gpu_indices or {}).get(node, ())
        if len(indices) != 1 or indices[0] < 0:
            raise ValueError(
                f"{where}: gpu_indices must name the one GPU it runs on on {node}, not {indices}"
            )
        if self.mig_start is None:
            raise ValueError(f"{where}: a running MIG job needs mig_start (its first memory slice)")

    @property
    def is_mig(self) -> bool:
        """One MIG GPU instance (``mig_profile``), held or asked for."""
        return self.mig_profile is not None

    @property
    def mig_gpu(self) -> tuple[str, int] | None:
        """The node and GPU index a running MIG job's instance is on; None otherwise."""
        if self.mig_profile is None or not self.placement or self.gpu_indices is None:
            return None
        node = next(iter(self.placement))
        return node, self.gpu_indices[node][0]

    @property
    def is_fractional(self) -> bool:
        """A share of one GPU (``gpu_milli`` < 1000), placed on a GPU index."""
        return self.gpu_milli < FULL_GPU_MILLI

    @property
    def shared_gpu(self) -> tuple[str, int] | None:
        """The node and GPU index a running fractional job shares; None otherwise."""
        if not self.is_fractional or not self.placement or self.gpu_indices is None:
            return None
        node = next(iter(self.placement))
        return node, self.gpu_indices[node][0]

    @property
    def is_running(self) -> bool:
        return bool(self.placement)

    @property
    def is_elastic(self) -> bool:
        return self.shape is JobShape.elastic

    def node_limit(self, replicas: int) -> int | None:
        """``max_nodes`` for the job at ``replicas`` replicas: as given up to the size it
        asks; an elastic training job larger than that may spread over proportionally more
        (``max_nodes`` × replicas / replicas asked, rounded up). None: no limit."""
        if self.max_nodes is None or replicas <= self.replicas or not self.is_resizable:
            return self.max_nodes
        return -(-self.max_nodes * replicas // max(1, self.replicas))

    @property
    def is_resizable(self) -> bool:
        """Elastic training: a block job that runs on min_replicas..max_replicas replicas."""
        return self.max_replicas is not None and self.shape is JobShape.block

    @property
    def total_gpus(self) -> int:
        """GPUs the job needs to run (block) or holds now (elastic)."""
        return self.replicas * self.gpus_per_replica

    @property
    def held_gpus(self) -> int:
        return sum(self.placement.values())

    @property
    def upper_replicas(self) -> int:
        """Elastic: the most replicas the service may have."""
        if self.max_replicas is not None:
            return self.max_replicas
        return max((self.replicas, self.min_replicas, *self.forecast))

    def demand_at(self, step: int) -> int:
        """Forecast replicas at ``step`` (clamped to min/max); current replicas if none."""
        raw = self.forecast[min(step, len(self.forecast) - 1)] if self.forecast else self.replicas
        return max(self.min_replicas, min(self.upper_replicas, raw))

    def seconds_until_step(self, step: int, now: float) -> float:
        """Elastic: seconds from ``now`` until forecast step ``step`` begins."""
        origin = now if self.forecast_origin is None else min(self.forecast_origin, now)
        return max(0.0, origin + step * self.forecast_step_s - now)

    def peak_demand(self, horizon_s: float) -> int:
        """Elastic: most replicas the forecast asks for within ``horizon_s`` from now."""
        steps = max(1, math.ceil(horizon_s / self.forecast_step_s))
        return max(self.demand_at(step) for step in range(steps))


class SlaPolicy(_Frozen):
    """Per team (queue) rules, with Kueue ClusterQueue/cohort semantics for quota.

    ``guaranteed_gpus`` is the nominal quota: work within it is never preempted by other
    teams. ``borrowing_limit`` caps the GPUs used above the guarantee (None = unlimited,
    so total usage is at most guaranteed + borrowing_limit).
    """

    team: str
    priority_weight: float = Field(default=1.0, gt=0)
    guaranteed_gpus: int = Field(default=0, ge=0)
    borrowing_limit: int | None = Field(default=None, ge=0)
    max_queue_wait_s: float | None = Field(default=None, ge=0)
    preemptible: bool = True
    max_migrations_per_day: int | None = Field(default=None, ge=0)
    max_preemptions_per_day: int | None = Field(default=None, ge=0)

    @property
    def quota_cap(self) -> int | None:
        if self.borrowing_limit is None:
            return None
        return self.guaranteed_gpus + self.borrowing_limit


class MigrationCostModel(_Frozen):
    """Lost GPU-time of a migration: checkpoint write + transfer + restore, per GPU held.

    Within a cluster the image goes through shared storage at ``bandwidth_mib_per_s``.
    Between the clusters of a federation group it crosses the sites' link at
    ``inter_cluster_bandwidth_mib_per_s`` with ``inter_cluster_overhead_s`` more (a
    resubmission to another scheduler, a second copy): a pending job started away from its
    ``home_cluster`` pays that one transfer of its image, a running job moved to another
    cluster pays it besides its checkpoint and restore. Where the sites' provider bills the
    data that leaves (cloud egress), ``inter_cluster_egress_gpu_s_per_gib`` prices each GiB
    that crosses in GPU-seconds of work (the price of a GiB over the price of a GPU-hour,
    × 3600): a cost of the whole image, shared out over the job's GPUs.
    """

    bandwidth_mib_per_s: float = Field(default=1000.0, gt=0)
    overhead_s: float = Field(default=30.0, ge=0)
    inter_cluster_bandwidth_mib_per_s: float = Field(default=100.0, gt=0)
    inter_cluster_overhead_s: float = Field(default=120.0, ge=0)
    inter_cluster_egress_gpu_s_per_gib: float = Field(default=0.0, ge=0)
    default_checkpoint_mib: int = Field(default=20_000, ge=0)
    lost_work_cap_s: float = Field(
        default=4 * 3600.0, ge=0, description="cap on work a preemption is charged for"
    )

    def _size(self, job: Job) -> int:
        size = job.checkpoint_size_mib
        return self.default_checkpoint_mib if size is None else size

    def migration_seconds(self, job: Job, *, across: bool = False) -> float:
        """``across``: to another cluster (the image also crosses the sites' link)."""
        seconds = self.overhead_s + 2.0 * self._size(job) / self.bandwidth_mib_per_s
        return seconds + (self.remote_start_seconds(job) if across else 0.0)

    def remote_start_seconds(self, job: Job) -> float:
        """The one transfer of a job's image to a cluster other than its home, per GPU the
        job holds: the time it takes, and its egress priced in GPU-seconds."""
        size = self._size(job)
        transfer = size / self.inter_cluster_bandwidth_mib_per_s
        egress = size / 1024.0 * self.inter_cluster_egress_gpu_s_per_gib / max(job.total_gpus, 1)
        return self.inter_cluster_overhead_s + transfer + egress

    def preemption_lost_seconds(self, job: Job, now: float) -> float:
        """Work lost when ``job`` is stopped now: since its last checkpoint or its start."""
        if job.checkpointable:
            return self.migration_seconds(job) / 2.0
        since = job.last_checkpoint_time if job.last_checkpoint_time is not None else job.start_time
        if since is None:
            return 0.0
        return min(self.lost_work_cap_s, max(0.0, now - since))


class SolverConfig(_Frozen):
    """Engine settings and objective weights (see ``solver.objective`` for the formula)."""

    time_limit_s: float = Field(
        default=2.0,
        gt=0,
        description="the main CP-SAT search's limit (a first solve for overdue jobs comes on top)",
    )
    plan_budget_s: float | None = Field(
        default=None,
        gt=0,
        description="wall-clock budget for a whole plan: CP-SAT searches for what is left "
        "of it after the greedy and the model (never more than time_limit_s), the rounded-LP "
        "warm start is skipped when it would eat the search's time, and the greedy plan is "
        "kept when too little is left to search; None: no budget (ignored when deterministic)",
    )
    num_workers: int = Field(default=2, ge=1)
    seed: int = 0
    relative_gap: float = Field(
        default=0.0005, ge=0, description="stop CP-SAT within this gap of its bound"
    )
    use_cp_sat: bool = True
    deterministic: bool = Field(
        default=False,
        description="limit CP-SAT by deterministic time instead of wall time (same plan "
        "every run whatever the load; time_limit_s is then in deterministic seconds)",
    )
    cp_sat_migration: bool = Field(
        default=True, description="let CP-SAT empty nodes by migration (budget permitting)"
    )
    second_greedy_max_pending: int = Field(
        default=2000,
        ge=0,
        description="up to this many pending jobs, also run the greedy in priority order "
        "and with migration before preemption, and keep the best",
    )

    # Objective weights, in units of "one priority-weighted reference GPU for one hour".
    elastic_unmet_weight: float = Field(default=8.0, ge=0, description="× a unit of batch work")
    fragmentation_weight: float = Field(default=0.05, ge=0, description="per whole free node")
    value_horizon_s: float = Field(
        default=3600.0, gt=0, description="GPU-seconds lost are divided by this"
    )
    overdue_weight: float = Field(default=1000.0, ge=1, description="× for jobs past max wait")
    # The shaper's levers, each switchable so that an ablation can attribute a gain
    # (``shaper sim table --ablations``); the baselines' own settings ignore them.
    migration: bool = Field(
        default=True,
        description="move running checkpointable work: defragmentation, CP-SAT evacuations, "
        "room for a service",
    )
    cross_cluster_migration: bool = Field(
        default=False,
        description="also move a running job to another cluster its ``clusters`` lists (a "
        "federation group's plan: checkpoint, transfer over the group's link, resubmit there; "
        "``solver.federation.federate``), by the greedy passes only and priced "
        "``migration_seconds(across=True)``; with ``migration`` off, the only migrations",
    )
    preemption: bool = Field(
        default=True, description="stop lower-priority work for a job or a service worth more"
    )
    # Off by default: issue 12's measurement (README, "Shortest remaining first").
    shortest_remaining: bool = Field(
        default=False,
        description="a pending job that fits nowhere may stop (requeue) running checkpointable "
        "work of no more weight with at least twice its run time plus the stop's checkpoint "
        "and restore left, once a day at most (preemptive shortest remaining time, "
        "solver.greedy.shortest_remaining); needs preemption",
    )
    replica_moves: bool = Field(
        default=True,
        description="move a service's replicas to other nodes to clear room for a pending "
        "job that fits nowhere else (a replica holds no state to checkpoint: it restarts there); "
        "only services that are ``migratable`` (the control plane: those whose connector can "
        "choose which replicas leave a node, JobReport.replicas_movable)",
    )
    replica_moves_shrink_first: bool = Field(
        default=False,
        description="a service's replicas move as the control plane carries a move out on a "
        "scheduler that places replicas itself: the service shrinks off the nodes it leaves "
        "and grows back once the work it made room for runs "
        "(solver.dependencies.split_replica_moves), so no move may leave it fewer than "
        "max(1, min_replicas) replicas where they are; off: a move is instantaneous (the "
        "simulator, which places replicas itself)",
    )
    lookahead: bool = Field(
        default=True,
        description="keep capacity a service's forecast will need from long jobs that could "
        "not leave in time",
    )
    elastic_resize: bool = Field(
        default=True,
        description="resize services to the demand of now; off: reserve their daily peak, "
        "as the FIFO baseline does",
    )
    job_speeds: bool = Field(
        default=True,
        description="the shaper plans each block job at its own speed on each GPU model "
        "(Instance.speeds): its value there, the order it tries models in, what a move or a stop "
        "costs it; off: every job at its model's speed, as the baselines plan (a scheduler "
        "knows one speed per GPU model)",
    )
    upgrades: bool = Field(
        default=True,
        description="after the queue is placed, a running checkpointable job moves onto free "
        "GPUs faster for it (its own speed, Instance.speeds, else the model's) when the run time "
        "it saves is more than twice the migration's time, the most weighted GPU-time saved "
        "first, within max_migrations_per_cycle (solver.greedy.upgrades); needs migration",
    )
    gang_upgrades: bool = Field(
        default=True,
        description="upgrades move a gang that spans nodes too, whole, onto as many nodes of "
        "one faster model (a restart pinned to them, from the job's own checkpoint); only "
        "jobs whose scheduler can do that (Job.migratable); needs upgrades",
    )
    elastic_training: bool = Field(
        default=True,
        description="elastic training jobs (block jobs with max_replicas): running ones "
        "shrink toward min_replicas before other work is stopped for a job, pending ones "
        "start smaller when their asked size does not fit, running ones grow into GPUs the "
        "plan leaves idle when the time saved pays for the restart (solver.elastic_training; "
        "the shaper's: the other policies run them at the size they ask)",
    )
    elastic_growth: bool = Field(
        default=True,
        description="with elastic_training: elastic training jobs grow into GPUs the plan "
        "leaves idle (off: they run at most at the size they ask)",
    )
    elastic_smaller_starts: bool = Field(
        default=True,
        description="with elastic_training: a pending elastic training job that does not fit "
        "at the size it asks starts smaller (off: it waits for its size)",
    )
    gang_aware_placement: bool = Field(
        default=False,
        description="place service replicas, small jobs and moved jobs on the node that "
        "leaves the free GPUs most usable by the block jobs waiting (solver.gang_fit); "
        "off: best fit",
    )
    # Off by default: issue 12's fractional-GPU measurement (README, the FGD section).
    share_moves_across_nodes: bool = Field(
        default=False,
        description="a pending share of a GPU, or a pending single-node whole-GPU job, that "
        "fits nowhere may move checkpointable, migratable shares off one GPU of a node to "
        "other nodes (the option that grows FGD's fragmentation least, within "
        "max_migrations_per_cycle; solver.greedy.share_moves); needs migration",
    )
    fragmentation_memory: bool = Field(
        default=False,
        description="when the instance gives no typical shapes, the shapes taken from its "
        "jobs carry the least memory a job of each shape asks, so FGD's fragmentation also "
        "counts a node's GPUs fragmented for a shape whose memory it no longer has "
        "(solver.fragmentation; shapes given in typical_shapes count memory when they carry it)",
    )
    # Off by default (a job past its SLA's max queue wait always gets the reservation):
    # measured at 6 h on the built-in scenarios (README, "Starvation") it shortened the
    # longest waits but idled reserved GPUs, costing up to 3.3 utilization points.
    starvation_guard_s: float | None = Field(
        default=None,
        gt=0,
        description="a pending job that has waited this long, or is past its SLA's max queue "
        "wait, and does not fit gets a reservation in the shaper's plan when it is the first "
        "such job in the value order: the GPUs where it fits soonest, as running jobs end, "
        "take no new job that would end after that (EASY backfill for it). None: only jobs "
        "past their SLA's max queue wait",
    )
    # 12 h by default, with shortest_first: measured over seeds 1-10 of the nine scenarios
    # (README, "Shortest first"), shortest first alone shortened mean JCT but lengthened
    # p99 (a long job of one weight kept losing to shorter newcomers); 12 h of aging brings
    # p99 back to about where it was without shortest first. Alone (without shortest first)
    # 2-12 h of aging left the longest waits unchanged.
    aging_s: float | None = Field(
        default=12 * 3600.0,
        gt=0,
        description="a pending job's value gains its own weight once more for every aging_s "
        "it has waited since submission (Slurm's age factor); None turns it off. The hard "
        "bound is the SLA's max_queue_wait_s",
    )

    # On by default: measured over seeds 1-10 of the nine scenarios (README, "Shortest
    # first"), with 12 h of aging it shortens mean JCT by 3-13 % against larger-first at a
    # cost of 0.1-1.0 utilization points.
    shortest_first: bool = Field(
        default=True,
        description="among pending jobs of equal weight (and aging credit), the shaper's "
        "value order starts the one with the least expected run time left first (Smith's "
        "rule: the order that minimises mean completion time on one machine), before "
        "larger gangs; jobs with no expected run time come after those with one. Off: "
        "larger jobs first, which packs more GPUs",
    )

    # Off by default: measured on the nine scenarios and the Pollux workloads (README,
    # "Starvation"), every alpha and cap that won p99 against the best baseline more often
    # lengthened mean JCT (2.5-3.4 % on the scenarios, 4-28 % on Pollux) and lost the lead
    # over it somewhere; alpha = 8 changed little either way.
    queue_head_start: float | None = Field(
        default=None,
        ge=0,
        description="with shortest_first, order the pending jobs of one weight (and aging "
        "credit) by submission time + queue_head_start × expected run time left instead of "
        "by run time alone: a job's place rises one for one with its wait, a shorter one "
        "starts ahead by this multiple of its run time (0: oldest first, the order that "
        "minimises the longest flow time on one machine; large: shortest first). None: "
        "run time alone",
    )
    queue_head_start_cap_s: float | None = Field(
        default=None,
        gt=0,
        description="with queue_head_start, the head start is at most this many seconds: "
        "a job waiting this much longer than another of its weight goes first whatever "
        "their run times. None: no cap",
    )

    # Off while measured (issue 20): shortest first leaves the longest job of a weight for
    # last, where it runs alone past every other job's end (training-heavy's p99 and
    # makespan, 4-8 h behind priority's oldest-first on some seeds).
    critical_first: bool = Field(
        default=False,
        description="among pending jobs of equal weight (and aging credit), one whose "
        "expected run time is at least the cluster's drain time (Instance.drain_time_s: the "
        "GPU-time of the block work running and queued over the GPUs services leave) starts "
        "first, the longest first: every hour it waited would be an hour on the last "
        "completion (LPT's rule for the end of a queue)",
    )

    # Look-ahead for elastic forecasts.
    # On by default (2026-12-06): measured over seeds 1-10 (README, "The look-ahead's
    # clock"), the look-ahead kept 8-GPU gangs that cannot checkpoint waiting for one
    # service's peak after another's in contended-failures (3.5 % of its value).
    lookahead_spares_aged: bool = Field(
        default=True,
        description="the look-ahead keeps no GPUs from a pending job that has waited "
        "aging_s or longer (one with aging credit): a forecast peak must not keep a job "
        "waiting for ever. Off: only jobs past their SLA's max queue wait, or starving "
        "under starvation_guard_s, are spared",
    )
    lookahead_s: float = Field(
        default=4 * 3600.0,
        ge=0,
        description="forecast steps within this horizon reserve GPUs from long immovable jobs",
    )
    scale_down_hold_s: float = Field(
        default=0.0, ge=0, description="keep replicas needed within this window"
    )

    # Disruption budget.
    max_migrations_per_cycle: int = Field(default=16, ge=0)
    migration_cooldown_s: float = Field(
        default=1800.0, ge=0, description="after a migration or resize, no migration for this long"
    )
    max_preemptions_per_cycle: int | None = Field(default=None, ge=0)
    dwell_s: float = Field(
        default=600.0,
        ge=0,
        description="a block job Shaper acted on (started, moved, stopped) is not started, "
        "moved or stopped again for this long (0 = no dwell)",
    )
    max_actions_per_job_hour: int = Field(
        default=3,
        ge=1,
        description="a block job with this many Shaper actions in the past hour is left "
        "as it is until the hour has passed",
    )


class TypicalShape(_Frozen):
    """One shape of the work a cluster expects (FGD's "typical pods"): the fractional
    placement (``solver.greedy.sharing``) keeps free GPU capacity usable by these."""

    cpu_milli: int = Field(default=0, ge=0)
    gpus: int = Field(default=1, ge=0, description="0: a CPU-only shape")
    gpu_milli: int = Field(default=FULL_GPU_MILLI, ge=0, le=FULL_GPU_MILLI)
    gpu_models: frozenset[str] | None = None
    share: float = Field(gt=0, le=1, description="its share of the expected work")
    memory_mib: int = Field(
        default=0,
        ge=0,
        description="the least memory a job of this shape asks: a node with less free "
        "memory has all its free GPU capacity fragmented for the shape; 0: memory not counted "
        "(FGD's own measure)",
    )


class Instance(_Frozen):
    """Everything one planning cycle needs. Immutable; build a new one per cycle."""

    now: float = 0.0
    gpu_models: tuple[GpuModel, ...]
    nodes: tuple[Node, ...]
    jobs: tuple[Job, ...] = ()
    policies: tuple[SlaPolicy, ...] = ()
    migration: MigrationCostModel = MigrationCostModel()
    config: SolverConfig = SolverConfig()
    typical_shapes: tuple[TypicalShape, ...] = Field(
        default=(),
        description="the expected work's shapes, for fractional placement; empty: the "
        "instance's own jobs' shapes (solver.fragmentation.typical_shapes). Given, the "
        "greedy also places single-node whole-GPU jobs by FGD's score for them "
        "(ClusterState.find_single_node) instead of best fit",
    )
    # On the instance, not on Job: one more field grew every Job's __dict__ past a size
    # step (832 → 1,584 bytes), and planning 80,000 jobs took 5 % longer for it.
    speeds: dict[str, dict[str, float]] = Field(
        default_factory=dict,
        description="by block job id, the job's own relative throughput on some GPU models, "
        "in GpuModel.speed's units (Gavel's point: each job type gains differently from a "
        "faster GPU); a model not named runs it at the model's speed, a job not named at "
        "every model's. Planned with where SolverConfig.job_speeds is on",
    )
    shared_free_milli: dict[str, tuple[int, ...]] = Field(
        default_factory=dict,
        description="per node, the milli free on each GPU fractional jobs share: set by "
        "solver.greedy.sharing.split on the whole-GPU part it plans (whose holders show "
        "those GPUs as taken), for the fragmentation score",
    )
    one_replica_per_node: frozenset[str] = Field(
        default=frozenset(),
        description="block jobs (by id) that run at most one replica on a node: a Slurm "
        "multi-node job runs one node's share per node (its GRES per node), so a gang of "
        "such replicas spreads over as many nodes as it has replicas. On the instance, not "
        "on Job, for the reason ``speeds`` is",
    )
    quota_held_outside: dict[str, int] = Field(
        default_factory=dict,
        description="per team, the GPUs its jobs hold outside this instance that count "
        "against its quota (a running share of a GPU or MIG instance counts one): set by "
        "the splits of fractional and MIG jobs (solver.greedy.sharing, "
        "solver.greedy.mig_placement) on the whole-GPU part they plan, whose holders "
        "belong to no team",
    )

    @model_validator(mode="after")
    def _check_references(self) -> Instance:
        models = {m.name for m in self.gpu_models}
        nodes = set()
        for node in self.nodes:
            if node.gpu_model not in models:
                raise ValueError(f"node {node.name}: unknown gpu_model {node.gpu_model!r}")
            if node.name in nodes:
                raise ValueError(f"duplicate node {node.name}")
            nodes.add(node.name)
        ids = set()
        mig = False
        for job in self.jobs:
            if job.id in ids:
                raise ValueError(f"duplicate job {job.id}")
            ids.add(job.id)
            mig = mig or job.mig_profile is not None
            for node_name in job.placement:
                if node_name not in nodes:
                    raise ValueError(f"job {job.id}: placed on unknown node {node_name}")
        if any(job.is_fractional for job in self.jobs):
            self._check_shares()
        if mig:
            self._check_mig_slices()
        if self.speeds:
            self._check_speeds()
        return self

    def _check_speeds(self) -> None:
        for job_id, speeds in self.speeds.items():
            job = self.job_by_id.get(job_id)
            if job is None:
                raise ValueError(f"speeds: no job {job_id}")
            if job.is_elastic:
                # A service's replicas serve at their model's speed (solver.objective).
                raise ValueError(f"speeds: {job_id} is a service; speeds are for block jobs")
            slow = sorted(model for model, speed in speeds.items() if not speed > 0)
            if slow:
                raise ValueError(f"speeds: {job_id}'s must be positive (not on {slow})")
            unknown = sorted(set(speeds) - set(self.model_by_name))
            if unknown:
                raise ValueError(f"speeds: {job_id} names unknown GPU models {unknown}")

    def _check_mig_slices(self) -> None:
        """Running MIG jobs hold instances of their GPU model's profiles, at starts the
        profile allows, without overlapping; no whole-GPU job or share names their GPU."""
        models = {model.name: model for model in self.gpu_models}
        nodes = {node.name: node for node in self.nodes}
        layouts: dict[tuple[str, int], list[MigSlice]] = {}
        for job in self.jobs:
            where = job.mig_gpu
            if where is None or job.mig_profile is None or job.mig_start is None:
                continue
            node = nodes[where[0]]
            if where[1] >= node.gpus:
                raise ValueError(
                    f"job {job.id}: gpu_indices names GPU {where[1]} of {node.name}, "
                    f"which has {node.gpus} GPUs"
                )
            model = models[node.gpu_model]
            profile = model.mig_profile(job.mig_profile)
            if profile is None:
                offered = ", ".join(p.name for p in model.mig_profiles) or "none"
                raise ValueError(
                    f"job {job.id}: mig_profile {job.mig_profile!r} is not a MIG profile of "
                    f"{model.name} (node {node.name}; its profiles: {offered})"
                )
            if job.mig_start not in profile.starts:
                raise ValueError(
                    f"job {job.id}: mig_start={job.mig_start} is not a start of "
                    f"{profile.name} (it may start at memory slice {list(profile.starts)})"
                )
            held = layouts.setdefault(where, [])
            new = MigSlice(job.id, profile, job.mig_start)
            why = clash(held, new)
            if why is not None:
                raise ValueError(
                    f"job {job.id}: its {new.describe()} on GPU {where[1]} of {node.name} {why}"
                )
            held.append(new)
        for job in self.jobs:
            if job.is_mig or not job.gpu_indices:
                continue
            for node_name, indices in job.gpu_indices.items():
                for index in indices:
                    if (node_name, index) in layouts:
                        owners = ", ".join(s.owner for s in layouts[node_name, index])
                        raise ValueError(
                            f"job {job.id}: gpu_indices names GPU {index} of {node_name}, "
                            f"which MIG slices partition (jobs {owners})"
                        )

    def mig_layouts(self) -> dict[tuple[str, int], GpuLayout]:
        """The GPUs running MIG jobs partition, by (node, GPU index), with their slices."""
        layouts: dict[tuple[str, int], GpuLayout] = {}
        for job in self.jobs:
            where = job.mig_gpu
            if where is None or job.mig_profile is None or job.mig_start is None:
                continue
            model = self.model_by_name[self.node_by_name[where[0]].gpu_model]
            profile = model.mig_profile(job.mig_profile)
            if profile is None:
                continue  # refused by validation; only a model_copy can bring it here
            layout = layouts.setdefault(where, GpuLayout(model.mig_profiles))
            layout.add(MigSlice(job.id, profile, job.mig_start))
        return layouts

    def _check_shares(self) -> None:
        """Running fractional jobs share GPUs that exist, within one GPU's capacity, and
        no GPU a whole-GPU job names (``gpu_indices``) is also shared."""
        sizes = {node.name: node.gpus for node in self.nodes}
        shared: dict[tuple[str, int], int] = {}
        for job in self.jobs:
            where = job.shared_gpu
            if where is None:
                continue
            if where[1] >= sizes[where[0]]:
                raise ValueError(
                    f"job {job.id}: gpu_indices names GPU {where[1]} of {where[0]}, "
                    f"which has {sizes[where[0]]} GPUs"
                )
            shared[where] = shared.get(where, 0) + job.gpu_milli
            if shared[where] > FULL_GPU_MILLI:
                raise ValueError(
                    f"job {job.id}: gpu_milli on GPU {where[1]} of {where[0]} adds up to "
                    f"{shared[where]}, over one GPU ({FULL_GPU_MILLI})"
                )
        for job in self.jobs:
            if job.is_fractional or not job.gpu_indices:
                continue
            for node_name, indices in job.gpu_indices.items():
                for index in indices:
                    if (node_name, index) in shared:
                        raise ValueError(
                            f"job {job.id}: gpu_indices names GPU {index} of {node_name}, "
                            "which fractional jobs share"
                        )

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy with ``update`` applied; the derived look-ups are rebuilt on first use.

        As in pydantic, ``update`` is not validated: build a new ``Instance`` from
        untrusted data.
        """
        copied = super().model_copy(update=update, deep=deep)
        for name in _DERIVED:
            copied.__dict__.pop(name, None)
        return copied

    @cached_property
    def node_by_name(self) -> dict[str, Node]:
        return {node.name: node for node in self.nodes}

    @cached_property
    def model_by_name(self) -> dict[str, GpuModel]:
        return {model.name: model for model in self.gpu_models}

    @cached_property
    def job_by_id(self) -> dict[str, Job]:
        return {job.id: job for job in self.jobs}

    @cached_property
    def policy_by_team(self) -> dict[str, SlaPolicy]:
        return {policy.team: policy for policy in self.policies}

    @cached_property
    def _default_policies(self) -> dict[str, SlaPolicy]:
        return {}

    def policy_for(self, job: Job) -> SlaPolicy:
        """The job's team policy, or the defaults for a team without one."""
        policy = self.policy_by_team.get(job.team)
        if policy is None:
            policy = self._default_policies.setdefault(job.team, SlaPolicy(team=job.team))
        return policy

    def weight(self, job: Job) -> float:
        """Priority weight of a job: its team's weight × its own priority."""
        return self.policy_for(job).priority_weight * job.priority

    def speed(self, node: Node) -> float:
        return self.model_by_name[node.gpu_model].speed

    def job_speed(self, job: Job, gpu_model: str) -> float:
        """How fast ``job`` runs on ``gpu_model``: its own speed there (``speeds``) where
        ``config.job_speeds`` is on, else the model's."""
        speed = self.own_speeds(job).get(gpu_model)
        return speed if speed is not None else self.model_by_name[gpu_model].speed

    def own_speeds(self, job: Job) -> Mapping[str, float]:
        """The speeds the plan takes from ``job`` itself (empty: its models' speeds)."""
        if not self.speeds or not self.config.job_speeds:
            return NO_SPEEDS
        return self.speeds.get(job.id, NO_SPEEDS)

    def transfer_per_gpu(self, job: Job) -> float:
        """What starting ``job`` away from its home cluster costs per GPU, in the
        objective's units at weight 1: the transfer of its image over the value horizon."""
        return self.migration.remote_start_seconds(job) / self.config.value_horizon_s

    def is_preemptible(self, job: Job) -> bool:
        if job.preemptible is not None:
            return job.preemptible
        return self.policy_for(job).preemptible

    @cached_property
    def overdue_ids(self) -> frozenset[str]:
        """Pending jobs waiting longer than their SLA's max queue wait, or marked overdue."""
        return frozenset(job.id for job in self.jobs if self._waited_too_long(job))

    def is_overdue(self, job: Job) -> bool:
        """A pending job waiting longer than its SLA's max queue wait, or one marked
        ``overdue`` (Shaper left it without GPUs): either is placed first."""
        if self.job_by_id.get(job.id) is job:
            return job.id in self.overdue_ids
        return self._waited_too_long(job)

    def is_starving(self, job: Job) -> bool:
        """A pending job the shaper's plan must make room for (``starvation_guard_s``)."""
        if job.is_running or job.is_elastic:
            return False
        if self.is_overdue(job):
            return True
        guard = self.config.starvation_guard_s
        return guard is not None and self.now - job.submit_time >= guard

    @cached_property
    def drain_time_s(self) -> float:
        """Seconds the block work running and queued would take on the GPUs the services
        leave free on average, packed perfectly at reference speed: the GPU-seconds of
        expected run time left over those GPUs (``config.critical_first``). The services
        take their mean forecast demand (within their replica bounds), a share its part of
        a GPU; the GPUs are those of every node not down, all clusters of the instance
        pooled, draining nodes included. Jobs with no estimate, MIG slices, and running
        jobs past their estimate are left out: each of these choices can only make it
        shorter, so it never overstates the drain. inf when services would hold every GPU."""
        capacity = float(sum(node.gpus for node in self.nodes if node.state is not NodeState.down))
        work = 0.0
        for job in self.jobs:
            if job.is_elastic:
                capacity -= self._mean_demand(job) * job.gpus_per_replica
            elif job.expected_runtime_s is not None and not job.is_mig:
                share = job.gpu_milli / FULL_GPU_MILLI if job.is_fractional else job.total_gpus
                left = (self.time_left(job) or 0.0) if job.is_running else job.expected_runtime_s
                work += share * left
        return work / capacity if capacity > 0 else math.inf

    def time_left(self, job: Job) -> float | None:
        """A running job's expected run time left: its estimate counts from its start (the
        look-ahead and backfill read it so too). None without an estimate or a start, or
        past its estimate: nothing then says when it ends."""
        if job.expected_runtime_s is None or job.start_time is None:
            return None
        left = job.start_time + job.expected_runtime_s - self.now
        return left if left > 0 else None

    @staticmethod
    def _mean_demand(job: Job) -> float:
        """A service's mean forecast replicas, within its bounds (its replicas now without a
        forecast): a drain spans its peaks and troughs, and at a peak the estimate would
        leap."""
        if not job.forecast:
            return float(job.replicas)
        upper = job.max_replicas if job.max_replicas is not None else math.inf
        return statistics.fmean(min(max(step, job.min_replicas), upper) for step in job.forecast)

    def is_critical(self, job: Job) -> bool:
        """A pending block job that would end last even if started now: its expected run
        time is at least :attr:`drain_time_s` (``config.critical_first``)."""
        return (
            not job.is_running
            and not job.is_elastic
            and job.expected_runtime_s is not None
            and job.expected_runtime_s >= self.drain_time_s
        )

    def boost(self, job: Job) -> float:
        """The factor on a job's value: ``overdue_weight`` past its SLA's max queue wait, else
        its aging credit when pending (whole steps of ``aging_s`` waited, so that jobs that
        waited alike stay interchangeable), else 1. Only the shaper's value order and its
        model use it; preemption compares the plain weights."""
        if self.is_overdue(job):
            return self.config.overdue_weight
        aging = self.config.aging_s
        if aging is None or job.is_running:
            return 1.0
        steps = math.floor(max(0.0, self.now - job.submit_time) / aging)
        return float(min(1 + steps, self.config.overdue_weight))

    def _waited_too_long(self, job: Job) -> bool:
        if job.is_running:
            return False
        if job.overdue:
            return True
        max_wait = self.policy_for(job).max_queue_wait_s
        return max_wait is not None and self.now - job.submit_time > max_wait

    @cached_property
    def frozen_ids(self) -> frozenset[str]:
        """Jobs no plan may touch now (see :meth:`is_frozen`)."""
        return frozenset(job.id for job in self.jobs if self.frozen_because(job) is not None)

    def is_frozen(self, job: Job) -> bool:
        """Whether the plan must leave ``job`` exactly as it is: a running job keeps its
        placement (no move, resize, preemption or requeue), a pending one stays pending.

        A job is frozen while a saga acts on it (``locked``; services too, at their current
        replicas). A block job is also frozen for ``config.dwell_s`` after Shaper last acted
        on it, and while its Shaper actions in the past hour reach
        ``config.max_actions_per_job_hour`` — unless it is pending and overdue: a job past
        its max queue wait, or one Shaper left without GPUs, must be placed.
        """
        if self.job_by_id.get(job.id) is job:
            return job.id in self.frozen_ids
        return self.frozen_because(job) is not None

    def frozen_because(self, job: Job) -> str | None:
        """Why ``job`` is frozen (the pending reason's message), or None if it is not."""
        if job.locked:
            return "an action is in flight on it"
        if job.is_elastic or self.is_overdue(job):
            return None
        config = self.config
        if job.last_acted_at is not None:
            since = self.now - job.last_acted_at
            if since < config.dwell_s:
                return f"Shaper acted on it {since:.0f} s ago; dwell time {config.dwell_s:.0f} s"
        if job.actions_last_hour >= config.max_actions_per_job_hour:
            return (
                f"move budget spent: {job.actions_last_hour} Shaper actions in the past hour "
                f"(at most {config.max_actions_per_job_hour})"
            )
        return None


_DERIVED = tuple(
    name for name, value in vars(Instance).items() if isinstance(value, cached_property)
)
