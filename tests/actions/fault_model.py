"""A world for crash-point tests: the real saga on a real database, the real node agent and
the real connector step executor, one simulated process table, and a broker the test drives.

What is real:

* the control plane's saga (``app.actions.saga.advance`` / ``record_report``) on a real
  PostgreSQL or SQLite database, each call in its own session as a Celery task runs it;
* the node agent (``agent.steps.StepExecutor``: fencing tokens, the step journal, every
  step's idempotency, the image store and resume pointers on disk) and the batch-job side
  of a scheduler-owned job (``agent.foreground.start_or_resume``);
* the connector's step executor (``connectors.actions.ConnectorStepExecutor``: journal,
  generations, the mapping of steps onto scheduler capabilities).

What is simulated:

* processes: :class:`ProcessTable` stands for every node's process table. A workload's
  "process" is an entry with a PID above any real PID (``FAKE_PID_BASE``);
  ``agent.procs.is_same_process`` answers for those PIDs from the table, so the agent's
  own liveness checks see it. :class:`ModelBackend` is a checkpoint backend over it, with
  the rules of the real ones: only a running workload is checkpointed, the process is gone
  when checkpoint returns, a dump whose agent died before recording it is recovered only
  if its log says it finished (CRIU's dump.log), a restore verifies the image's checksums
  (real files) and refuses to start a second copy on the node.
* the scheduler: :class:`ModelScheduler` (start, requeue with pin and hold, release,
  resize, reservations, and a read of its jobs). On a scheduler-owned cluster a start runs
  the job's batch step on the node, i.e. ``start_or_resume`` against that node's agent
  state; stopping a batch step kills what still runs there, as ``agent exec`` does.
* the broker (:meth:`World.run`): a FIFO of messages with ``acks_late`` semantics. A
  worker that dies mid-message has it redelivered, or loses it (a broker restarted
  without persistence); a message may also be duplicated or held back until the saga has
  ended; an agent may be cut off from the broker for some sweeps (its messages wait for
  it, as in Redis). The periodic sweep is ``saga.advance`` after the clock has moved past
  every step timeout.
* a worker's death: a :class:`Crash` raised at the chosen point. It is a BaseException,
  so no ``except Exception`` in the code under test can swallow it, and everything the
  dead worker held only in memory is dropped: its session is rolled back, its executor
  object is thrown away and built again from its state directory. (A database server
  restarted inside a control task's transaction is real: tests/actions/
  test_database_faults.py.)

Only faults that fire are counted (``World.fired``): a crash point a delivery never
reaches (a step answered from the journal has no "after the effect") injects nothing.
"""

from __future__ import annotations

import itertools
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import OperationalError
from sqlmodel import Session, col, select

from agent import foreground, procs, resume
from agent.backends.base import (
    CheckpointImage,
    RestoreFailed,
    checkpoint_lost,
    fresh_image_dir,
    require_gone,
    require_running,
    seal_image,
    verify_image,
)
from agent.steps import StepExecutor
from agent.workload import RunningWorkload, WorkloadSpec, WorkloadState, WorkloadStore
from app.actions import saga
from app.actions.models import TERMINAL_ACTION_STATES, Action, ActionKind, ActionState
from app.clusters.models import Cluster, ShapingMode
from app.core.clock import FrozenClock
from app.core.security import Principal
from app.gpu_models.models import GpuModel
from app.jobs.models import Allocation, Job
from app.nodes.models import Node
from connectors.actions import ConnectorStepExecutor
from connectors.base import ConnectorError
from wire.queues import agent_queue, connector_queue, executor_scope, is_agent_queue
from wire.steps import StepReport
from wire.telemetry import AllocationReport, JobReport, JobState, SchedulerKind

FAKE_PID_BASE = 1 << 30  # above Linux's PID_MAX_LIMIT (2^22): never a real process
NODES = ("a", "b")
# Past every step timeout (checkpoint and transfer: 600 s): the sweep resends or gives up.
SWEEP_GAP = timedelta(seconds=700)
MAX_SWEEPS = 40
START_WAIT_S = 0.05  # how long the agent's confirm waits for a scheduler start (real seconds)


class Crash(BaseException):
    """The worker dies here."""


# -- processes --------------------------------------------------------------------------


@dataclass
class Copy:
    node: str
    workload_id: str
    resumed_from: str | None


class ProcessTable:
    """Every node's processes. ``twice`` names workloads that ever had two live copies."""

    def __init__(self) -> None:
        self.copies: dict[int, Copy] = {}
        self._by_workload: dict[str, dict[int, Copy]] = {}
        self._pids = itertools.count(FAKE_PID_BASE)
        self.twice: set[str] = set()

    def spawn(self, node: str, workload_id: str, resumed_from: str | None) -> int:
        if self.nodes_of(workload_id):
            self.twice.add(workload_id)
        pid = next(self._pids)
        self.copies[pid] = Copy(node, workload_id, resumed_from)
        self._by_workload.setdefault(workload_id, {})[pid] = self.copies[pid]
        return pid

    def kill(self, pid: int | None) -> None:
        copy = self.copies.pop(pid, None) if pid is not None else None
        if copy is not None:
            del self._by_workload[copy.workload_id][pid]  # type: ignore[arg-type]

    def alive(self, pid: int) -> bool:
        return pid in self.copies

    def of(self, workload_id: str) -> dict[int, Copy]:
        """The workload's live copies by PID."""
        return dict(self._by_workload.get(workload_id, {}))

    def nodes_of(self, workload_id: str) -> list[str]:
        return sorted(c.node for c in self._by_workload.get(workload_id, {}).values())


PROCESSES = ProcessTable()
_real_is_same_process = procs.is_same_process


def is_same_process(pid: int, started: int | None) -> bool:
    """``agent.procs.is_same_process`` that knows the simulated processes."""
    if pid >= FAKE_PID_BASE:
        return PROCESSES.alive(pid)
    return _real_is_same_process(pid, started)


def _record(store: WorkloadStore, spec: WorkloadSpec, node: str, resumed_from: str | None) -> Any:
    pid = PROCESSES.spawn(node, spec.id, resumed_from)
    workload = RunningWorkload(
        spec=spec,
        backend=ModelBackend.name,
        pid=pid,
        pid_started=0,
        started_at=datetime.now().astimezone(),
        resumed_from=resumed_from,
    )
    store.save(workload)
    return workload


def job_spec(store: WorkloadStore, workload_id: str) -> WorkloadSpec:
    return WorkloadSpec(
        id=workload_id,
        command=["model-job"],
        env={},
        cwd="/",
        log_path=str(store.workload_dir(workload_id) / "output.log"),
    )


DUMP_LOG = "dump.log"  # logs are not part of an image's manifest
DUMP_DONE = "dump finished"


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


class ModelBackend:
    """A checkpoint backend over the process table, with the real backends' rules."""

    name = "model"

    def __init__(self, store: WorkloadStore, node: str, torn: Callable[[], None]) -> None:
        self.store = store
        self.node = node
        self._torn = torn  # raises Crash when the test kills the agent mid-step

    def checkpoint(self, workload: RunningWorkload, image_dir: Path) -> CheckpointImage:
        pid = require_running(workload)
        image_dir = fresh_image_dir(workload, image_dir)
        (image_dir / "memory").write_text(f"state of {workload.id}")
        PROCESSES.kill(pid)  # a dump stops the process, as CRIU and the signal backend do
        # Then it says the dump finished, as CRIU's dump.log does once the tree is gone.
        (image_dir / DUMP_LOG).write_text(DUMP_DONE)
        # Torn here, the agent dies in the longest window a real agent has: the image's
        # checksum (seconds for a large CRIU image), before the workload is recorded
        # CHECKPOINTED (tests/agent/test_interrupted_checkpoint.py tears it after that too).
        self._torn()
        return self._seal(workload, image_dir)

    def recover_checkpoint(self, workload: RunningWorkload, image_dir: Path) -> CheckpointImage:
        require_gone(workload)
        if DUMP_DONE not in _read(image_dir / DUMP_LOG):
            raise checkpoint_lost(workload, image_dir, "the dump did not finish")
        return self._seal(workload, Path(image_dir).resolve())

    def _seal(self, workload: RunningWorkload, image_dir: Path) -> CheckpointImage:
        image = seal_image(
            backend=self.name,
            workload=workload,
            image_dir=image_dir,
            started=0.0,
            phases={},
            clock=lambda: 0.0,
            created_at=datetime.now().astimezone(),
        )
        workload.state = WorkloadState.checkpointed
        self.store.save(workload)
        return image

    def restore(
        self, image: CheckpointImage, *, image_dir: str | Path | None = None
    ) -> RunningWorkload:
        where = Path(image_dir or image.image_dir).resolve()
        verify_image(image, where)
        if self.node in PROCESSES.nodes_of(image.workload.id):
            raise RestoreFailed(f"workload {image.workload.id} already runs on {self.node}")
        restored: RunningWorkload = _record(self.store, image.workload, self.node, str(where))
        self._torn()
        return restored

    def release(self, workload: RunningWorkload, *, timeout: float = 10.0) -> None:
        PROCESSES.kill(workload.pid)
        workload.state = WorkloadState.released
        self.store.save(workload)
        self._torn()


# -- faults -----------------------------------------------------------------------------

# Where a worker dies while it handles one message.
EXECUTOR_POINTS = (
    "before_effect",  # it took the message and died before doing anything
    "torn",  # mid-step: the backend's effect is done, the agent's record of it is not
    "after_effect",  # the step's effect is done; its answer not journalled
    "after_journal",  # answered and journalled; the reply was never sent
)
CONTROL_POINTS = (
    "before_commit",  # the transaction dies with the worker
    "after_commit",  # committed; the messages it decided were never sent
)
# What happens to the message after its worker died: redelivered (acks_late) or lost (a
# broker restarted without persistence; the sweep finds the step unanswered).
FATES = ("redelivered", "lost")
# Message-level faults, no worker dies.
DELIVERY_FAULTS = ("duplicated", "delayed")


@dataclass(frozen=True)
class Fault:
    point: str
    fate: str = "redelivered"

    def __str__(self) -> str:
        return self.point if self.point in DELIVERY_FAULTS else f"{self.point}/{self.fate}"


def executor_faults() -> list[Fault]:
    # Mid-step and after the effect, a lost message is recovered as after any other
    # death (the sweep resends; the step runs again over what the first run left): only
    # the redelivery is run there, to keep the suite within CI's time.
    fated = ("before_effect", "after_journal")
    return [
        Fault(p, f) if p in fated else Fault(p)
        for p in EXECUTOR_POINTS
        for f in (FATES if p in fated else FATES[:1])
    ] + [Fault(d) for d in DELIVERY_FAULTS]


def control_faults() -> list[Fault]:
    return [Fault(p, f) for p in CONTROL_POINTS for f in FATES] + [
        Fault(d) for d in DELIVERY_FAULTS
    ]


def fault_for(choice: Fault | int, envelope_kind: str) -> Fault:
    """A fault, or a random schedule's number that picks one that fits the delivery."""
    if isinstance(choice, Fault):
        return choice
    menu = executor_faults() if envelope_kind == "step" else control_faults()
    return menu[choice % len(menu)]


# Tallies over the session, printed by tests/actions/conftest.py's terminal summary.
TALLY: Counter[str] = Counter()
# Runs whose saga compensated where the fault-free run succeeded (the job safe, the move
# not made), with the fault that caused it.
DEGRADED: list[str] = []


# -- the scheduler ----------------------------------------------------------------------


@dataclass
class SchedulerJob:
    state: JobState  # pending (and maybe held), running, failed
    held: bool = False
    node: str | None = None  # where its batch step runs (owned) or it was started
    required_nodes: list[str] = field(default_factory=list)
    replicas: int = 1
    restarts_from_scratch: int = 0


class ModelScheduler:
    """A scheduler that does what it is asked at once (start, requeue, hold/release,
    resize, reservations) and reports its jobs."""

    kind = "model"

    def __init__(self, world: World) -> None:
        self.world = world
        self.jobs: dict[str, SchedulerJob] = {}
        self.reservations: dict[str, dict[str, int]] = {}

    def read_state(self) -> Any:
        reports = []
        for job_id, job in self.jobs.items():
            running = self._runs(job_id, job)
            where = [job.node] if running and job.node else []
            reports.append(
                JobReport(
                    external_id=job_id,
                    state=JobState.running if running else job.state,
                    reason="held" if job.held and not running else "",
                    allocations=[AllocationReport(node=n, gpu_count=1) for n in where],
                )
            )
        return _State(reports)

    def _runs(self, job_id: str, job: SchedulerJob) -> bool:
        if self.world.owned:
            return job.node is not None  # its batch step runs (the process may be away)
        return bool(PROCESSES.nodes_of(job_id))

    def _job(self, job_id: str) -> SchedulerJob:
        job = self.jobs.get(job_id)
        if job is None:
            raise ConnectorError(f"no job {job_id}", retryable=False)
        return job

    def _stop(self, job_id: str, job: SchedulerJob) -> None:
        """End what runs of the job: its batch step (``agent exec`` kills a workload that
        still runs there), or, on a cluster the agents move, its process."""
        if self.world.owned and job.node is not None:
            store = self.world.stores[job.node]
            try:
                record = store.load(job_id)
            except KeyError:
                record = None
            if record is not None and record.state is WorkloadState.running:
                PROCESSES.kill(record.pid)
                record.state = WorkloadState.released
                store.save(record)
        elif not self.world.owned:
            for pid in PROCESSES.of(job_id):
                PROCESSES.kill(pid)
        job.node = None

    def _schedule(self, job_id: str, job: SchedulerJob, nodes: list[str] | None) -> None:
        node = (nodes or job.required_nodes or [NODES[0]])[0]
        job.state, job.node = JobState.running, node
        if self.world.owned:
            try:
                foreground.start_or_resume(
                    store=self.world.stores[node],
                    command=["model-job"],
                    backend=ModelBackend.name,
                    workload_id=job_id,
                )
            except (resume.StaleResume, RestoreFailed) as error:
                job.state, job.node = JobState.failed, None  # the batch step exits
                job.required_nodes = [str(error)]
        elif not PROCESSES.nodes_of(job_id):
            _record(self.world.stores[node], job_spec(self.world.stores[node], job_id), node, None)

    def requeue(
        self,
        external_id: str,
        *,
        nodes: list[str] | None = None,
        exclude: list[str] | None = None,
        hold: bool = False,
    ) -> None:
        job = self._job(external_id)
        self._stop(external_id, job)
        job.required_nodes = list(nodes or [])
        job.state, job.held = JobState.pending, hold
        if not hold:
            self._schedule(external_id, job, None)

    def start(self, external_id: str, *, nodes: list[str] | None = None) -> None:
        job = self._job(external_id)
        if job.state is not JobState.running:
            job.held = False
            self._schedule(external_id, job, nodes)

    def hold(self, external_id: str) -> None:
        self._job(external_id).held = True

    def release(self, external_id: str) -> None:
        job = self._job(external_id)
        if job.state is JobState.pending and job.held:
            job.held = False
            self._schedule(external_id, job, None)

    def resize(self, external_id: str, *, replicas: int) -> None:
        self._job(external_id).replicas = replicas

    def reserve(
        self,
        external_id: str,
        *,
        gpus: dict[str, int],
        ttl_s: float,
        counts_on: list[str] | None = None,
    ) -> None:
        self.reservations[external_id] = dict(gpus)

    def unreserve(self, external_id: str) -> None:
        self.reservations.pop(external_id, None)


@dataclass
class _State:
    jobs: list[JobReport]


# -- executors under test ---------------------------------------------------------------


class Agent(StepExecutor):
    """The real node agent; its backend is the model one and the test may kill it."""

    def __init__(self, world: World, node: str) -> None:
        super().__init__(
            store=world.stores[node], cluster=world.name, node=node, confirm_grace_s=0.0
        )
        self.world = world
        self.node = node

    def _backend(self, name: str) -> Any:
        return ModelBackend(self.store, self.node, lambda: self.world.fire("torn", self.name))

    def _report(self, request: Any, *, ok: bool, **fields: Any) -> StepReport:
        report = super()._report(request, ok=ok, **fields)
        self.world.fire("after_effect", self.name)
        return report

    def _reap_unrecorded(self, workload_id: str) -> list[int]:
        # It scans /proc for copies a dead agent started but never recorded; the model's
        # processes are not in /proc and are recorded in the same call that starts them.
        return []


class Connector(ConnectorStepExecutor):
    def __init__(self, world: World) -> None:
        super().__init__(world.scheduler, cluster=world.name, state_dir=world.root / "connector")
        self.world = world

    def _report(self, request: Any, *, ok: bool, **fields: Any) -> StepReport:
        report = super()._report(request, ok=ok, **fields)
        self.world.fire("after_effect", self.name)
        return report


# -- the world and its broker -----------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    """One saga: its kind, the cluster's scheduler, the job, and a step that fails for good
    (to drive compensation)."""

    name: str
    kind: ActionKind
    scheduler: SchedulerKind = SchedulerKind.sim
    checkpointable: bool = True
    job: str = "running"  # running on a | pending | held
    fails: str | None = None  # "<step>@<node or connector>" failing non-retryably
    # Where the job runs when the saga ends: succeeded / compensated (None: nowhere).
    runs_after: str | None = "b"
    runs_after_compensation: str | None = "a"


@dataclass
class Envelope:
    kind: str  # advance | step | report
    queue: str  # the executor's queue (a step's, or the one that sent a report)
    payload: dict[str, Any]

    def label(self) -> str:
        if self.kind == "advance":
            return "advance"
        step = self.payload["key"].rsplit(":", 2)[-2:] if self.kind == "report" else None
        if step is not None:
            return f"report {':'.join(step)} from {self.queue}"
        return f"{self.payload['phase']}:{self.payload['step']}@{self.queue}"


class World:
    """One scenario's cluster, job, action, executors and broker."""

    _ids = itertools.count()

    def __init__(
        self,
        engine: Engine,
        state_root: Path,
        scenario: Scenario,
        faults: dict[int, Fault | int],
        *,
        now: datetime,
        restart_database: Callable[[], None] | None = None,
        partition: tuple[str, int] | None = None,
    ) -> None:
        """partition: (node, sweeps): the node's agent is cut off from the broker from
        the first message to it until that many sweeps have passed; its messages wait in
        the broker meanwhile, as they do in Redis, and it gets them all on its return."""
        self.engine = engine
        self.partition = partition
        self.cut_off: list[Envelope] = []
        self.restart_database = restart_database
        self.scenario = scenario
        self.faults = faults
        self.name = f"f{next(self._ids)}-{scenario.name}"[:60]
        self.job_id = f"{self.name}-job"
        self.root = state_root / self.name
        self.owned = scenario.scheduler is not SchedulerKind.sim
        self.clock = FrozenClock(now)
        self.stores = {n: WorkloadStore(self.root / n) for n in NODES}
        self.scheduler = ModelScheduler(self)
        self.agents: dict[str, Agent] = {}
        self.connector: Connector | None = None
        self.queue: deque[Envelope] = deque()
        self.late: list[Envelope] = []
        self.trace: list[str] = []
        self.delivered = 0
        self.armed: Fault | None = None
        self.label = ""
        # The faults that fired: (point, the delivery it hit).
        self.fired: list[tuple[str, str]] = []
        self.action_id = self._populate()

    # -- setup --------------------------------------------------------------------------

    def _populate(self) -> int:
        scenario, now = self.scenario, self.clock.now()
        job_state = JobState.running if scenario.job == "running" else JobState.pending
        self.scheduler.jobs[self.job_id] = SchedulerJob(
            state=job_state, held=scenario.job == "held"
        )
        if scenario.job == "running":
            store = self.stores["a"]
            if self.owned:
                self.scheduler._schedule(self.job_id, self.scheduler.jobs[self.job_id], ["a"])
            else:
                _record(store, job_spec(store, self.job_id), "a", None)
                self.scheduler.jobs[self.job_id].state = JobState.running
                self.scheduler.jobs[self.job_id].node = "a"
        with Session(self.engine) as session:
            gpu = session.exec(select(GpuModel).where(GpuModel.name == "H100")).one()
            cluster = Cluster(
                name=self.name,
                scheduler=scenario.scheduler,
                mode=ShapingMode.enforce,
                created_at=now,
            )
            session.add(cluster)
            session.flush()
            nodes = {}
            for name in NODES:
                node = Node(
                    cluster_id=cluster.id,  # type: ignore[arg-type]
                    name=name,
                    gpu_model_id=gpu.id,
                    gpu_count=8,
                    cpu_cores=64,
                    memory_mib=512_000,
                    updated_at=now,
                )
                session.add(node)
                nodes[name] = node
            session.flush()
            job = Job(
                cluster_id=cluster.id,  # type: ignore[arg-type]
                external_id=self.job_id,
                name=self.job_id,
                gpus_requested=1,
                checkpointable=scenario.checkpointable,
                state=job_state,
                submit_time=now,
                start_time=now if job_state is JobState.running else None,
                updated_at=now,
            )
            session.add(job)
            session.flush()
            if job_state is JobState.running:
                session.add(
                    Allocation(
                        job_id=job.id,  # type: ignore[arg-type]
                        node_id=nodes["a"].id,  # type: ignore[arg-type]
                        gpu_indices=[0],
                        gpu_count=1,
                        started_at=now,
                    )
                )
            target = {"b": 1} if scenario.kind in (ActionKind.start, ActionKind.reserve) else {}
            action = Action(
                cluster_id=cluster.id,  # type: ignore[arg-type]
                job_id=job.id,
                kind=scenario.kind,
                state=ActionState.approved,
                idempotency_key=self.name,
                source_node="a" if job_state is JobState.running else None,
                target_node="b",
                target_placement=target,
                target_replicas=3 if scenario.kind is ActionKind.resize else None,
                created_at=now,
                updated_at=now,
                decided_by="test",
                decided_at=now,
            )
            session.add(action)
            session.commit()
            return action.id  # type: ignore[return-value]

    # -- executors ----------------------------------------------------------------------

    def agent(self, queue: str) -> Agent:
        node = queue.rsplit(".", 1)[1]
        if node not in self.agents:
            self.agents[node] = Agent(self, node)
        return self.agents[node]

    def executor(self, queue: str) -> Agent | Connector:
        if is_agent_queue(queue):
            return self.agent(queue)
        if self.connector is None:
            self.connector = Connector(self)
        return self.connector

    def kill(self, queue: str) -> None:
        """The executor dies: only what it wrote to its state directory survives."""
        if is_agent_queue(queue):
            self.agents.pop(queue.rsplit(".", 1)[1], None)
        else:
            self.connector = None

    def fire(self, point: str, queue: str) -> None:
        """Called at each crash point of an executor: die if the test says so here."""
        if self.armed is not None and self.armed.point == point:
            self.armed = None
            self._injected(point)
            raise Crash(f"{point} in {queue}")

    @property
    def injected(self) -> int:
        return len(self.fired)

    def _injected(self, point: str) -> None:
        self.fired.append((point, self.label))

    # -- the broker ---------------------------------------------------------------------

    def publish(self, outgoing: list[saga.Outgoing]) -> None:
        for message in outgoing:
            if message.task == saga.ADVANCE_TASK:
                self.queue.append(Envelope("advance", "control", dict(message.kwargs)))
            else:
                self.queue.append(Envelope("step", message.queue, message.kwargs["step"]))

    def run(self) -> None:
        """Approve (kick), deliver until nothing is left, sweep, until the saga ends; then
        deliver what was held back (late duplicates) and sweep once more."""
        self.publish([saga.kick(self.action_id)])
        for _sweep in range(MAX_SWEEPS):
            while self.queue:
                envelope = self.queue.popleft()
                if self._cut(envelope):
                    self.cut_off.append(envelope)
                    continue
                choice = self.faults.get(self.delivered)
                fault = None if choice is None else fault_for(choice, envelope.kind)
                self.delivered += 1
                self.trace.append(envelope.label())
                self.deliver(envelope, fault)
            if self.state() in TERMINAL_ACTION_STATES and not self.cut_off:
                break
            self._heal_after_a_sweep()
            self.clock.advance(SWEEP_GAP.total_seconds())
            self.publish(self._control(lambda s: self._advance(s), None) or [])
        for envelope in self.late:
            self.deliver(envelope, None)
        self.late = []
        self.clock.advance(SWEEP_GAP.total_seconds())
        self.publish(self._control(lambda s: self._advance(s), None) or [])
        while self.queue:
            self.deliver(self.queue.popleft(), None)

    def _cut(self, envelope: Envelope) -> bool:
        if self.partition is None or envelope.kind != "step":
            return False
        node, sweeps = self.partition
        return sweeps > 0 and envelope.queue == agent_queue(self.name, node)

    def _heal_after_a_sweep(self) -> None:
        if self.partition is None or not self.cut_off:
            return
        node, sweeps = self.partition
        if sweeps == 1:
            self._injected("partition")
            self.queue.extend(self.cut_off)  # in the order the broker got them
            self.cut_off = []
        self.partition = (node, sweeps - 1)

    def deliver(self, envelope: Envelope, fault: Fault | None) -> None:
        self.label = envelope.label()
        if fault is not None and fault.point in DELIVERY_FAULTS:
            self._injected(fault.point)
            if fault.point == "duplicated":
                self.queue.append(envelope)
            else:
                self.late.append(envelope)
            fault = None
        if envelope.kind == "step":
            self._deliver_step(envelope, fault)
        else:
            self._deliver_control(envelope, fault)

    def _after_death(self, envelope: Envelope, fault: Fault) -> None:
        if fault.fate == "redelivered":
            self.queue.append(envelope)

    def _deliver_step(self, envelope: Envelope, fault: Fault | None) -> None:
        if fault is not None and fault.point == "before_effect":
            self._injected(fault.point)
            self.kill(envelope.queue)
            self._after_death(envelope, fault)
            return
        failed = self._fails_for_good(envelope)
        if failed is not None:
            self.queue.append(Envelope("report", envelope.queue, failed.model_dump(mode="json")))
            return
        self.armed = fault
        try:
            report = self.executor(envelope.queue).handle(envelope.payload)
        except Crash:
            self.kill(envelope.queue)
            assert fault is not None
            self._after_death(envelope, fault)
            return
        finally:
            self.armed = None  # a point this step never reached: no fault injected
        if report is None:
            return
        if fault is not None and fault.point == "after_journal":
            self._injected(fault.point)
            self.kill(envelope.queue)
            self._after_death(envelope, fault)
            return
        self.queue.append(Envelope("report", envelope.queue, report.model_dump(mode="json")))

    def _fails_for_good(self, envelope: Envelope) -> StepReport | None:
        """The scenario's forward step that fails for good (a full disk, a node gone): its
        executor answers a non-retryable failure and does nothing. A failing confirm
        means the restored workload died: it is gone first."""
        if self.scenario.fails is None or envelope.payload["phase"] != "forward":
            return None
        step, where = self.scenario.fails.split("@")
        at = connector_queue(self.name) if where == "connector" else agent_queue(self.name, where)
        if envelope.payload["step"] != step or envelope.queue != at:
            return None
        if step == "confirm":
            for pid, copy in PROCESSES.of(self.job_id).items():
                if copy.node == where:
                    PROCESSES.kill(pid)
        return StepReport(
            action_id=envelope.payload["action_id"],
            key=envelope.payload["key"],
            ok=False,
            error=f"{step} failed for good",
            executor=envelope.queue,
            generation=envelope.payload["generation"],
        )

    def _deliver_control(self, envelope: Envelope, fault: Fault | None) -> None:
        if envelope.kind == "advance":
            outgoing = self._control(self._advance, fault)
        else:
            reporter = Principal(
                token_id=0,
                name=envelope.queue,
                scopes=frozenset({executor_scope(envelope.queue)}),
            )
            report = StepReport.model_validate(envelope.payload)
            outgoing = self._control(
                lambda s: saga.record_report(
                    session=s,
                    report=report,
                    now=self.clock.now(),
                    reporter=reporter,
                    start_wait_s=START_WAIT_S,
                ),
                fault,
            )
        if outgoing is None:
            self._after_death(envelope, fault or Fault("database_error"))
            return
        self.publish(outgoing)

    def _advance(self, session: Session) -> list[saga.Outgoing]:
        return saga.advance(
            session=session,
            action_id=self.action_id,
            now=self.clock.now(),
            start_wait_s=START_WAIT_S,
        )

    def _control(
        self, work: Callable[[Session], list[saga.Outgoing]], fault: Fault | None
    ) -> list[saga.Outgoing] | None:
        """One control task in its own session; None when its worker died."""
        point = fault.point if fault is not None else None
        session: Session
        if point == "before_commit":
            session = _DyingSession(self.engine, expire_on_commit=False)
        elif point == "database_restarted":
            assert self.restart_database is not None
            session = _RestartingSession(self.engine, expire_on_commit=False)
            session.restart = self.restart_database
        else:
            session = Session(self.engine, expire_on_commit=False)
        with session:
            try:
                outgoing = work(session)
            except Crash:
                self._injected("before_commit")
                return None
            except OperationalError:
                # Celery retries the task (autoretry_for OperationalError, acks_late).
                if point == "database_restarted":
                    self._injected(point)
                return None
        if point == "after_commit":
            self._injected(point)
            return None
        return outgoing

    # -- what happened ------------------------------------------------------------------

    def state(self) -> ActionState:
        with Session(self.engine) as session:
            action = session.get(Action, self.action_id)
            assert action is not None
            return ActionState(action.state)

    def action(self) -> Action:
        with Session(self.engine, expire_on_commit=False) as session:
            action = session.get(Action, self.action_id)
            assert action is not None
            return action

    def db_nodes(self) -> list[str]:
        """Nodes where the control plane's record says the job holds GPUs."""
        with Session(self.engine) as session:
            job = session.exec(select(Job).where(Job.external_id == self.job_id)).one()
            return sorted(
                session.exec(
                    select(Node.name)
                    .join(Allocation, col(Allocation.node_id) == Node.id)
                    .where(Allocation.job_id == job.id, col(Allocation.released_at).is_(None))
                )
            )

    def db_job_state(self) -> str:
        with Session(self.engine) as session:
            job = session.exec(select(Job).where(Job.external_id == self.job_id)).one()
            return str(job.state)

    def resumable(self) -> bool:
        """A job that runs nowhere can still go on: from a checkpoint the agents keep (and,
        on a scheduler-owned cluster, a resume pointer where the scheduler will start it),
        or, not checkpointable, from its scheduler's queue."""
        job = self.scheduler.jobs[self.job_id]
        if job.state is JobState.failed:
            return False
        if not self.scenario.checkpointable:
            return job.state is JobState.pending
        if self.owned:
            node = (job.required_nodes or ["a"])[0]
            if node not in self.stores:
                return False
            pointer = resume.read(self.stores[node].images_dir, self.job_id)
            return pointer is not None and _intact(pointer.image, Path(pointer.image_dir))
        records = sorted((self.stores["a"].images_dir / self.job_id).glob("g*/image.json"))
        return bool(records) and _intact(
            CheckpointImage.model_validate_json(records[-1].read_text()),
            records[-1].parent / "image",
        )


def _intact(image: CheckpointImage, image_dir: Path) -> bool:
    try:
        verify_image(image, image_dir)
    except RestoreFailed:
        return False
    return True


class _DyingSession(Session):
    """A control worker killed inside its transaction: the commit never happens."""

    def commit(self) -> None:
        raise Crash("control worker died before its commit")


class _RestartingSession(Session):
    """A control task whose database server restarts inside its transaction: its writes
    reach the server (flushed), then the server goes down and comes back before the
    commit."""

    restart: Callable[[], None]

    def commit(self) -> None:
        self.flush()
        self.restart()
        super().commit()


def patch_processes(monkeypatch: Any) -> None:
    """Point the agent's process checks and starts at the process table."""

    def start_workload(*, store: WorkloadStore, workload_id: str, **_: Any) -> Any:
        return _record(store, job_spec(store, workload_id), store.state_dir.name, None)

    def create_backend(name: str, *, store: WorkloadStore, **_: Any) -> Any:
        assert name == ModelBackend.name, name
        return ModelBackend(store, store.state_dir.name, lambda: None)

    monkeypatch.setattr(procs, "is_same_process", is_same_process)
    monkeypatch.setattr(foreground, "start_workload", start_workload)
    monkeypatch.setattr(foreground, "create_backend", create_backend)
