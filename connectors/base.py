"""The contract between connectors and the control plane.

Two halves:

* **Wire schemas** — what a connector pushes to ``POST /api/v1/clusters/{cluster}/telemetry``:
  a full :class:`TelemetrySnapshot` or a :class:`TelemetryDelta`, each carrying the
  connector's session id and a sequence number. The telemetry contract below says what the
  control plane answers.
* **The Connector protocol** — a tiny required surface (:class:`Connector`: read the
  scheduler's current state) plus optional capability protocols for scheduler-level actions.
  Connectors return these types, never SDK objects.

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

from collections.abc import Callable, Iterable
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal, Protocol, runtime_checkable

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, model_validator

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]{0,254}$"
ShortText = Annotated[str, Field(min_length=1, max_length=255)]

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
    labels: dict[str, Annotated[str, Field(max_length=255)]] = Field(default_factory=dict)
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
    allocations: list[AllocationReport] = Field(default_factory=list)

    @model_validator(mode="after")
    def _replica_range(self) -> JobReport:
        if self.min_replicas > self.max_replicas and self.shape is JobShape.elastic:
            raise ValueError("min_replicas must not exceed max_replicas")
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


@runtime_checkable
class Connector(Protocol):
    """The one required capability: read the scheduler's current state."""

    kind: SchedulerKind
    cluster: str

    def read_state(self) -> ClusterState: ...


@runtime_checkable
class SupportsRequeue(Protocol):
    """``hold=True``: the job stays held in the queue until released (a plan's start)."""

    def requeue(
        self,
        external_id: str,
        *,
        nodes: list[str] | None = None,
        exclude: list[str] | None = None,
        hold: bool = False,
    ) -> None: ...


@runtime_checkable
class SupportsHold(Protocol):
    def hold(self, external_id: str) -> None: ...
    def release(self, external_id: str) -> None: ...


@runtime_checkable
class SupportsSuspend(Protocol):
    def suspend(self, external_id: str) -> None: ...
    def resume(self, external_id: str) -> None: ...


@runtime_checkable
class SupportsCancel(Protocol):
    def cancel(self, external_id: str) -> None: ...


@runtime_checkable
class SupportsResize(Protocol):
    def resize(self, external_id: str, *, replicas: int) -> None: ...


@runtime_checkable
class SupportsReservation(Protocol):
    """Hold GPUs for one job: as they come free, the scheduler gives them to nobody else.

    ``reserve`` replaces the job's earlier reservation; it lapses after ``ttl_s``, when the
    job starts on those nodes (consumed) or on ``unreserve``. Idempotent. ``counts_on``:
    the jobs whose GPUs there the plan frees for it (the job itself included); when the
    GPUs cannot come free because other jobs hold them, it raises a non-retryable
    ConnectorError naming them — the plan was made on a view that is out of date.
    """

    def reserve(
        self,
        external_id: str,
        *,
        gpus: dict[str, int],
        ttl_s: float,
        counts_on: list[str] | None = None,
    ) -> None: ...
    def unreserve(self, external_id: str) -> None: ...


@runtime_checkable
class SupportsUpkeep(Protocol):
    """Periodic housekeeping of what the connector itself holds in its scheduler (Slurm:
    reservations whose job now runs or has gone). The connector deployment calls it every
    few seconds; it returns one line per thing it tidied, for the log."""

    def upkeep(self) -> list[str]: ...


@runtime_checkable
class SupportsStart(Protocol):
    """Start a pending, held or suspended job now, on ``nodes`` when given (a plan's)."""

    def start(self, external_id: str, *, nodes: list[str] | None = None) -> None: ...


@runtime_checkable
class SupportsNodeCount(Protocol):
    """Change how many nodes a job gets (Slurm: pending jobs; running ones only shrink)."""

    def update_node_count(self, external_id: str, *, nodes: int) -> None: ...


class ConnectorError(Exception):
    """A scheduler could not be read or changed. ``retryable`` says whether trying again helps."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


# -- saga steps: what the control plane sends to executors and what they answer ----------
#
# The control plane sends a StepRequest as the one keyword argument ``step`` of the Celery
# task ``shaper.<agent|connector>.<step>`` on the executor's queue (``agent.<cluster>.<node>``
# or ``connector.<cluster>``); the executor answers with a StepReport as the keyword
# argument ``report`` of ``reply_task`` on ``reply_queue``, with its own API token. The
# control plane (app/actions/saga.py) builds and reads the same dicts without importing
# this module's executors; tests/actions checks that both sides agree.


class Outcome(StrEnum):
    executed = "executed"
    duplicate = "duplicate"  # answered from the journal: the step ran before
    refused = "refused"  # stale generation or not runnable here: nothing was touched


class StepRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    action_id: int
    key: str = Field(min_length=1, max_length=200)
    # A plain string here: an executor refuses a step it does not know instead of dropping it.
    step: str
    phase: str = "forward"
    workload_id: str | None = Field(default=None, max_length=255)
    generation: int = Field(default=0, ge=0)
    args: dict[str, Any] = Field(default_factory=dict)
    reply_task: str = "app.actions.tasks.report"
    reply_queue: str = "control"

    def answer(self, *, executor: str, ok: bool, **fields: Any) -> StepReport:
        """This step's report from ``executor`` (its action, key and generation)."""
        return StepReport(
            action_id=self.action_id,
            key=self.key,
            ok=ok,
            executor=executor,
            generation=self.generation,
            **fields,
        )


class StepReport(BaseModel):
    action_id: int
    key: str
    ok: bool
    outcome: Outcome = Outcome.executed
    result: dict[str, Any] = Field(default_factory=dict)
    error: str | None = None
    retryable: bool = False
    # Who answered: "agent.<cluster>.<node>" or "connector.<cluster>".
    executor: str = ""
    generation: int = 0

    @classmethod
    def replayed(cls, remembered: dict[str, Any]) -> StepReport:
        """A journalled answer sent again for a step that ran before."""
        return cls.model_validate({**remembered, "outcome": Outcome.duplicate})


# -- executors as Celery workers -----------------------------------------------------------
#
# Node agents and connectors serve their queue the same way: one task per step name, late
# acknowledgement (a step lost with its worker is delivered again; the executor's journal
# makes a second run harmless), one step at a time in a solo pool, and the answer sent to
# the step's reply queue with the executor's own token. Celery is imported here only when
# a worker is built, so the wire schemas above stay cheap to import.

# Publishing the answer retries for about a minute (a broker restart); after that the
# control plane times the step out and sends it again, and the journal answers.
REPLY_RETRY = {"max_retries": 30, "interval_start": 0.5, "interval_step": 0.5, "interval_max": 3}


def make_executor_app(
    *,
    name: str,
    broker: str,
    queue: str,
    task_names: Iterable[str],
    handle: Callable[[dict[str, Any]], StepReport | None],
    token: str,
    redirect_stdouts: bool = True,
) -> Any:
    """A Celery app whose tasks ``task_names`` run ``handle(step)`` and report its answer
    (None: nothing can be answered) with ``token``."""
    import logging

    from celery import Celery

    log = logging.getLogger(__name__)
    app = Celery(name, broker=broker, set_as_current=False)
    app.conf.update(
        task_default_queue=queue,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_ignore_result=True,
        worker_prefetch_multiplier=1,
        worker_hijack_root_logger=False,
        worker_redirect_stdouts=redirect_stdouts,
        broker_connection_retry_on_startup=True,
        broker_connection_max_retries=None,
        timezone="UTC",
    )

    def run_step(step: dict[str, Any]) -> None:
        report = handle(step)
        if report is None:
            return
        try:
            app.send_task(
                str(step.get("reply_task") or "app.actions.tasks.report"),
                kwargs={"report": report.model_dump(mode="json"), "token": token},
                queue=str(step.get("reply_queue") or "control"),
                retry=True,
                retry_policy=REPLY_RETRY,
            )
        except Exception:  # the control plane resends the step; the journal answers it
            log.exception("could not report %s to the control plane", report.key)

    for task_name in task_names:
        app.task(name=task_name)(run_step)
    return app


def run_executor_worker(app: Any, *, queue: str, loglevel: str = "INFO") -> None:
    """Serve ``queue`` in this thread, one step at a time, until SIGTERM/SIGINT."""
    app.worker_main(
        [
            "worker",
            "-Q",
            queue,
            "-n",
            f"{queue}@%h",
            "--pool",
            "solo",
            "--without-heartbeat",
            "--without-gossip",
            "--without-mingle",
            "-l",
            loglevel,
        ]
    )
