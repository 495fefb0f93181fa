"""Telemetry on the wire: what a connector or node agent pushes and what the control plane answers.

A connector pushes to ``POST /api/v1/clusters/{cluster}/telemetry`` a full
:class:`TelemetrySnapshot` or a :class:`TelemetryDelta`, each carrying the connector's
session id and a sequence number, and gets a :class:`TelemetryAck`; a node agent pushes
:class:`NodeSamples` about its own node. The enums here (scheduler, node and job states,
job kinds and shapes, metrics) are the words both sides use, so they live here too. A
job's ``kind`` is what it does (training, inference …); its ``shape`` is how it holds GPUs
(a block or an elastic service). The solver, which imports only ortools and pydantic, has
its own ``NodeState`` and ``JobShape``; ``app.shaping.snapshot`` maps these onto them, once.
Connectors return these types, never SDK objects; the service stores them (app/telemetry).

Units are explicit in the field names: memory in MiB (nodes) or GiB (GPU models), CPU in
cores, times as timezone-aware datetimes.

Telemetry contract (the control plane's side is app/telemetry):

* **Sessions.** ``connector_session`` is a random id per connector process. A cluster has
  one live session at a time. A snapshot from a session the cluster has never seen makes it
  the live one (the control plane records since when) and supersedes the one before. Any
  push from a superseded session answers **409** ``stale_session``: another connector owns
  the cluster now, and this one should stop, not resync — a resync would only be refused
  again. A delta from a session that has no accepted snapshot answers 409
  ``snapshot_required``.
* **Sequence.** ``seq`` is a 64-bit integer, 0 … 2^63 - 1 (above: 422 on ``seq``); it only
  grows within a session. A snapshot may jump ahead (epoch milliseconds are fine); a delta
  must be exactly the last accepted ``seq`` + 1, else 409 ``snapshot_required`` with the
  ``expected_seq``.
* **Replays.** A push whose ``(session, seq)`` was accepted before is acknowledged with
  ``duplicate: true`` and written once — if its content is the same (a digest of the
  accepted push is kept for the live session's last :data:`REPLAY_WINDOW` pushes). The
  same ``(session, seq)`` with other content is 409 ``replay_mismatch``. A ``seq`` below the
  live session's last accepted one that was never accepted (or is older than that window,
  so cannot be told apart) is 409 ``out_of_order``. Either way, send a fresh snapshot with
  a higher ``seq``.
* **Physics.** Nothing impossible is stored: a push that is not a possible state of a
  cluster (more GPUs held than a node has, one GPU held by two jobs, GPUs held on a
  ``down`` node or by a job that is not running/suspended or beyond what it requested,
  times out of order or outside [2000-01-01, now + 1 day], utilizations outside [0, 1],
  numbers that are not finite) is refused whole with 422 naming the field; the bounds are
  in app/telemetry/physics.py.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, model_validator

from wire.residency import Residency

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,254}$"

# ``seq`` is stored as a signed 64-bit integer (PostgreSQL ``bigint``).
MAX_SEQ = 2**63 - 1
# How many accepted pushes of the live session the control plane can tell replays of.
REPLAY_WINDOW = 64
# Bounds that keep every reported number storable (PostgreSQL ``integer`` columns) and
# far above any real machine: 64 TiB of node memory, 4 TiB of memory on one GPU.
MAX_NODE_MEMORY_MIB = 64 * 1024 * 1024
MAX_GPU_MEMORY_GIB = 4096
MAX_REPLICAS = 100_000
MAX_RESTARTS = 1_000_000
MAX_TIME_LIMIT_S = 100 * 366 * 86_400.0  # a century: longer is "none"
MAX_SUBMIT_SPEC = 64 * 1024  # characters of a SubmitSpec as JSON (as jobs.submit_spec stores it)
# A job's own speed on a GPU model, on the catalogue's scale (GpuModel.relative_speed: the
# reference GPU, A100, is 1.0); the catalogue allows the same range.
MAX_JOB_SPEED = 100.0
MIN_JOB_SPEED = 0.01  # 1/100 of the reference: slower is a typo, not a GPU
MAX_JOB_SPEEDS = 64  # models a job names a speed on
# A job's speeds, model -> speed: JobReport.speeds and the SLA policy's speed profiles.
JobSpeeds = dict[
    Annotated[str, Field(min_length=1, max_length=64)],
    Annotated[float, Field(ge=MIN_JOB_SPEED, le=MAX_JOB_SPEED, allow_inf_nan=False)],
]


# The kinds of scheduler a cluster can be registered as; each has a connector
# (connectors/<kind>/, registered at import in connectors/registry.py). A comment, not a
# docstring: pydantic would publish a docstring in the OpenAPI schema.
class SchedulerKind(StrEnum):
    slurm = "slurm"
    kubernetes = "kubernetes"
    kueue = "kueue"
    armada = "armada"
    ray = "ray"
    sim = "sim"


class NodeState(StrEnum):
    up = "up"
    draining = "draining"
    down = "down"


class JobKind(StrEnum):
    training = "training"
    batch_inference = "batch_inference"
    quantization = "quantization"
    realtime_inference = "realtime_inference"
    hpc = "hpc"
    other = "other"


class JobShape(StrEnum):
    block = "block"
    elastic = "elastic"


class JobState(StrEnum):
    pending = "pending"
    running = "running"
    suspended = "suspended"
    finished = "finished"
    failed = "failed"
    cancelled = "cancelled"


TERMINAL_JOB_STATES = frozenset({JobState.finished, JobState.failed, JobState.cancelled})


class Metric(StrEnum):
    gpu_util = "gpu_util"  # 0..1, measured busy fraction of one GPU (or node average)
    gpu_mem_used_gib = "gpu_mem_used_gib"
    demand_replicas = "demand_replicas"  # replicas an elastic service needs right now
    cpu_util = "cpu_util"  # 0..1, node CPU busy fraction (node agents)
    mem_used_mib = "mem_used_mib"  # node memory in use (node agents)


class _Wire(BaseModel):
    # Unknown fields are refused so a typo in a connector fails loudly instead of
    # silently dropping data.
    model_config = ConfigDict(extra="forbid", frozen=True)


class NodeReport(_Wire):
    name: Annotated[str, Field(pattern=NAME_PATTERN)]
    gpu_model: Annotated[str, Field(max_length=64)] | None = None
    gpu_count: Annotated[int, Field(ge=0, le=1024)] = 0
    cpu_cores: Annotated[int, Field(ge=0, le=1_000_000)] = 0
    memory_mib: Annotated[int, Field(ge=0, le=MAX_NODE_MEMORY_MIB)] = 0
    # Kubernetes' own bounds on a label (a key's prefix ≤ 253, its name ≤ 63, a value
    # ≤ 63; values up to 255 are kept for other schedulers' node features), and at most
    # 256 of them: node feature discovery sets ~100 on a GPU node.
    labels: dict[
        Annotated[str, Field(min_length=1, max_length=317)],
        Annotated[str, Field(max_length=255)],
    ] = Field(default_factory=dict, max_length=256)
    state: NodeState = NodeState.up

    @model_validator(mode="after")
    def _gpus_need_a_model(self) -> NodeReport:
        if self.gpu_count > 0 and self.gpu_model is None:
            raise ValueError("gpu_model is required when gpu_count > 0")
        return self


class AllocationReport(_Wire):
    """GPUs a job holds on one node. Schedulers that know device indices (Slurm) give
    ``gpu_indices``; those that only count (Kubernetes) give ``gpu_count``."""

    node: Annotated[str, Field(pattern=NAME_PATTERN)]
    gpu_indices: list[Annotated[int, Field(ge=0, le=1023)]] = Field(default_factory=list)
    gpu_count: Annotated[int, Field(ge=0, le=1024)] | None = None

    @model_validator(mode="after")
    def _count_matches_indices(self) -> AllocationReport:
        if self.gpu_indices and self.gpu_count is not None:
            if self.gpu_count != len(self.gpu_indices):
                raise ValueError("gpu_count must equal the number of gpu_indices")
        if len(set(self.gpu_indices)) != len(self.gpu_indices):
            raise ValueError("gpu_indices must not repeat")
        return self

    @property
    def gpus(self) -> int:
        return self.gpu_count if self.gpu_count is not None else len(self.gpu_indices)


class PortableSpec(_Wire):
    """A job any scheduler can run: a container image or an environment, a command, the
    resources it needs."""

    image: Annotated[str, Field(max_length=512)] | None = None
    command: list[Annotated[str, Field(max_length=4096)]] = Field(
        default_factory=list, max_length=256
    )
    env: dict[Annotated[str, Field(max_length=256)], Annotated[str, Field(max_length=4096)]] = (
        Field(default_factory=dict, max_length=256)
    )
    gpus: Annotated[int, Field(ge=0, le=100_000)] = 0
    cpus: Annotated[float, Field(ge=0, le=100_000, allow_inf_nan=False)] = 0
    memory_mib: Annotated[int, Field(ge=0, le=MAX_NODE_MEMORY_MIB)] = 0


class SubmitSpec(_Wire):
    """How to submit a pending or running job again in another cluster of its federation
    group (a running one's move checkpoints it at the source and submits it there held and
    pinned to the node its image is staged on: connectors.base.SupportsSubmit).

    ``native`` is the job in its own scheduler's words, enough for a connector of the same
    kind to submit an equivalent job (Slurm: ``{"script": the batch script, "options":
    {sbatch option: value}, "workdir": path, "user": its owner}``; Kubernetes and Kueue:
    ``{"job": the batch/v1 Job, cleaned of what only its cluster means}``; each connector's
    module docstring says what it puts there). A connector of another kind cannot read
    it: a job moves across scheduler families only when it also declares a ``portable``
    form, and the plan says when it cannot move. At most 64 Ki characters as JSON, so that
    telemetry stays small: a connector leaves out (and logs) a spec above that rather than
    have its push refused.
    """

    scheduler: SchedulerKind
    native: dict[str, Any] = Field(default_factory=dict)
    portable: PortableSpec | None = None

    @model_validator(mode="after")
    def _bounded(self) -> SubmitSpec:
        # Measured as stored (jobs.submit_spec is this JSON text), characters not bytes.
        size = len(self.model_dump_json())
        if size > MAX_SUBMIT_SPEC:
            raise ValueError(f"the spec is {size} characters as JSON, above {MAX_SUBMIT_SPEC}")
        return self


class JobReport(_Wire):
    external_id: Annotated[str, Field(pattern=NAME_PATTERN)]
    name: Annotated[str, Field(max_length=255)] = ""
    team: Annotated[str, Field(max_length=128)] = "default"
    queue: Annotated[str, Field(max_length=128)] = "default"
    kind: JobKind = JobKind.other
    shape: JobShape = JobShape.block
    priority: Annotated[int, Field(ge=0, le=1_000_000)] = 0
    sla_class: Annotated[str, Field(max_length=64)] = "standard"
    gpus_requested: Annotated[int, Field(ge=0, le=100_000)] = 0
    allowed_gpu_models: list[Annotated[str, Field(max_length=64)]] = Field(default_factory=list)
    min_gpu_memory_gib: Annotated[
        float, Field(ge=0, le=MAX_GPU_MEMORY_GIB, allow_inf_nan=False)
    ] = 0
    required_precision: Annotated[str, Field(max_length=16)] | None = None
    # The only nodes a pending job may start on (Slurm's ReqNodeList): a job requeued with
    # its checkpoint is pinned to the node that holds its image. Empty: any node.
    required_nodes: list[Annotated[str, Field(pattern=NAME_PATTERN)]] = Field(
        default_factory=list, max_length=1024
    )
    gang_size: Annotated[int, Field(ge=1, le=10_000)] = 1
    checkpointable: bool = False
    # An elastic service: its replica range and the replicas it has. A block job with
    # max_replicas > 0 is elastic training: it runs as min_replicas..max_replicas gangs of
    # gpus_requested / gang_size GPUs each (Slurm: nodes), asking for ``replicas``.
    min_replicas: Annotated[int, Field(ge=0, le=MAX_REPLICAS)] = 0
    max_replicas: Annotated[int, Field(ge=0, le=MAX_REPLICAS)] = 0
    replicas: Annotated[int, Field(ge=0, le=MAX_REPLICAS)] = 0
    submit_time: AwareDatetime | None = None
    start_time: AwareDatetime | None = None
    end_time: AwareDatetime | None = None
    state: JobState = JobState.pending
    # Why the scheduler holds the job where it is (Slurm's Reason, Kueue's condition).
    reason: Annotated[str, Field(max_length=255)] = ""
    restart_count: Annotated[int, Field(ge=0, le=MAX_RESTARTS)] = 0
    # How long after it starts the scheduler ends the job (Slurm's TimeLimit, a Job's
    # activeDeadlineSeconds); None: no limit, or the scheduler does not say. The most it
    # can run, not what it will (limits are padded): app/shaping/snapshot.py caps run-time
    # predictions with it and, before the cluster has history to predict from, takes it
    # as the job's run time, as Slurm's backfill does.
    time_limit_s: Annotated[float, Field(gt=0, le=MAX_TIME_LIMIT_S, allow_inf_nan=False)] | None = (
        None
    )
    # An elastic service whose connector can choose which of its replicas leave a node
    # when it shrinks (connectors.base.SupportsReplicaMoves: a Kubernetes Deployment with
    # the connector's pod placement on, the simulated clusters). The plan may then move
    # its replicas off a node to make room there (app/shaping/snapshot.py); False: it only
    # grows and shrinks where its scheduler chooses.
    replicas_movable: bool = False
    # A block job's own speed on GPU models, where it gains from a faster GPU more or less
    # than the catalogue's speeds say (Gavel measured a ResNet-18 at 0.08 of its V100 speed
    # on a K80, an LM at 0.23): catalogue model name -> speed on the catalogue's scale
    # (reference GPU = 1.0). Empty: it runs at its models' speeds. The plan counts its
    # value, the model it tries first and what a move or a stop costs it at these speeds,
    # and moves it onto GPUs faster for it as they free up (solver: Instance.speeds).
    # Connectors read it from what the job's owner wrote (wire.speeds: a word
    # ``shaper.io/speeds=…`` of a Slurm comment, a ``shaper.io/speeds`` annotation, …).
    speeds: JobSpeeds = Field(
        default_factory=dict,
        max_length=MAX_JOB_SPEEDS,
        # Left out when empty: a connector of this version then sends a job without speeds
        # as the ones before it did, which a control plane from before the field accepts.
        exclude_if=lambda speeds: not speeds,
    )
    allocations: list[AllocationReport] = Field(default_factory=list)
    # How to submit it elsewhere (pending and running jobs of clusters in a federation
    # group; None: the connector cannot say, or the job is suspended or ending, and it stays
    # where it was submitted).
    submit: SubmitSpec | None = None
    # The clusters of its federation group it may run in, by their labels and names
    # (wire.residency: what each connector reads it from); None: any its team may use.
    residency: Residency | None = None

    @model_validator(mode="after")
    def _replica_range(self) -> JobReport:
        if self.min_replicas > self.max_replicas and self.shape is JobShape.elastic:
            raise ValueError("min_replicas must not exceed max_replicas")
        if self.max_replicas and self.shape is JobShape.block:
            if not 1 <= self.min_replicas <= self.max_replicas:
                raise ValueError(
                    "elastic training (a block job with max_replicas) needs "
                    "1 <= min_replicas <= max_replicas"
                )
        if self.speeds and self.shape is JobShape.elastic:
            raise ValueError("speeds are for block jobs: a service's replicas serve demand")
        return self


class SampleReport(_Wire):
    at: AwareDatetime
    metric: Metric
    # Finite: JSON ``Infinity`` and overflowing literals (1e309) are refused here; each
    # metric's own bound is checked with the node it is about (app/telemetry/physics.py).
    value: Annotated[float, Field(ge=0, allow_inf_nan=False)]
    node: Annotated[str, Field(pattern=NAME_PATTERN)] | None = None
    gpu_index: Annotated[int, Field(ge=0, le=1023)] | None = None
    job: Annotated[str, Field(pattern=NAME_PATTERN)] | None = None

    @model_validator(mode="after")
    def _has_subject(self) -> SampleReport:
        if self.metric is Metric.demand_replicas and self.job is None:
            raise ValueError("demand_replicas samples need a job")
        if self.metric is not Metric.demand_replicas and self.node is None:
            raise ValueError(f"{self.metric.value} samples need a node")
        return self


class NodeSamples(BaseModel):
    """What a node agent pushes about its own node; every sample names that node."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    samples: list[SampleReport] = Field(min_length=1, max_length=10_000)


class _Push(_Wire):
    connector_session: Annotated[str, Field(min_length=1, max_length=64)]
    seq: Annotated[int, Field(ge=0, le=MAX_SEQ)]
    sent_at: AwareDatetime | None = None
    samples: list[SampleReport] = Field(default_factory=list)


class TelemetrySnapshot(_Push):
    """The whole state of a cluster: anything absent has vanished."""

    kind: Literal["snapshot"] = "snapshot"
    nodes: list[NodeReport] = Field(default_factory=list)
    jobs: list[JobReport] = Field(default_factory=list)

    @classmethod
    def of(cls, state: ClusterState, *, connector_session: str, seq: int) -> TelemetrySnapshot:
        """The snapshot of what a connector read, samples included, sent when observed."""
        return cls(
            connector_session=connector_session,
            seq=seq,
            sent_at=state.observed_at,
            nodes=state.nodes,
            jobs=state.jobs,
            samples=state.samples,
        )


class TelemetryDelta(_Push):
    """Changes since the previous accepted push of the same session (``seq`` = its + 1).
    A job listed here replaces the stored one whole, its allocations included."""

    kind: Literal["delta"] = "delta"
    nodes: list[NodeReport] = Field(default_factory=list)
    jobs: list[JobReport] = Field(default_factory=list)
    removed_nodes: list[Annotated[str, Field(pattern=NAME_PATTERN)]] = Field(default_factory=list)
    removed_jobs: list[Annotated[str, Field(pattern=NAME_PATTERN)]] = Field(default_factory=list)


TelemetryPush = Annotated[TelemetrySnapshot | TelemetryDelta, Field(discriminator="kind")]


class TelemetryAck(BaseModel):
    cluster: str
    seq: int
    duplicate: bool = False
    nodes_written: int = 0
    jobs_written: int = 0
    jobs_finished: int = 0
    allocations_written: int = 0
    samples_written: int = 0


class ClusterState(BaseModel):
    """What a connector reads from its scheduler at one moment."""

    observed_at: datetime
    nodes: list[NodeReport]
    jobs: list[JobReport]
    samples: list[SampleReport] = Field(default_factory=list)
