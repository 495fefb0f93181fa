"""A simulated cluster that lives in (its own) time: the ``sim`` connector kind.

Jobs arrive from a seeded generator; a native scheduler starts them the way schedulers
that never revisit a placement do — strictly first come, first served, first fit, so one
job that does not fit blocks the queue behind it and the cluster fragments. Running jobs
make progress and finish. Elastic services follow a diurnal demand through their own
autoscaler unless Shaper resizes them.

Shaper sees the cluster through :meth:`SimCluster.read_state`, like any connector, and
acts on it through the scheduler-level capabilities here (requeue — pinned or not, held
or not —, start on given nodes, hold/release, suspend/resume, cancel, resize, reserve, and
submit: a federated move's arrival from another cluster, connectors.sim.submission, which
withdraw undoes and check_arrival confirms, connectors.arrival; refuse stands for a
scheduler that rejects a job after it took it; drain_node/undrain_node: a node that takes
no new work) and
through the simulated node agents
(connectors.sim.agents: checkpoint, transfer, stage, restore, confirm, release). Time is passed
in (``advance_to``), so the same cluster runs 24 h of history in a second or follows the
wall clock in ``shaper demo``. Thread-safe: telemetry and actions come from different
threads.

**Reservations**, as a scheduler that honours a plan keeps them: GPUs reserved for a job
on a node are given to nobody else as they come free; the job consumes them when it
starts there, and they lapse after their time to live or on ``unreserve``. A checkpoint
taken by a node agent holds the job's own GPUs on its node for it (a migration's way
home) until the agent releases the job there or restores it.
"""

from __future__ import annotations

import logging
import math
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, overload

from connectors.arrival import check_reported, ran
from connectors.base import ConnectorError
from connectors.sim.submission import job_from_spec, submit_spec
from wire.telemetry import (
    AllocationReport,
    ClusterState,
    JobKind,
    JobReport,
    JobShape,
    JobState,
    Metric,
    NodeReport,
    NodeState,
    SampleReport,
    SchedulerKind,
    SubmitSpec,
)

logger = logging.getLogger(__name__)

# Finished jobs stay visible this long (schedulers keep them a while: Slurm's MinJobAge).
KEEP_FINISHED = timedelta(hours=2)
# Work an elastic training job loses to a resize: the restart from its last checkpoint.
RESIZE_LOSS = timedelta(minutes=2)
# How long a checkpointed job's GPUs on its node stay held for it at most.
KEEP_SOURCE = timedelta(minutes=30)
# The states of a job that has not ended: what cancel and withdraw stop.
_LIVE = (JobState.pending, JobState.running, JobState.suspended)


@dataclass(frozen=True)
class ServiceSpec:
    name: str
    peak_replicas: int
    gpus_per_replica: int


@dataclass(frozen=True)
class SiteSpec:
    """What a simulated cluster is made of and what arrives at it."""

    name: str
    nodes: tuple[tuple[str, str, int], ...]  # (name, GPU model, GPUs)
    teams: tuple[str, ...]
    kinds: tuple[JobKind, ...]
    services: tuple[ServiceSpec, ...] = ()
    arrivals_per_hour: float = 6.0
    job_gpus: tuple[int, ...] = (1, 1, 2, 4, 8, 8, 16)
    minutes: tuple[int, int] = (30, 360)  # a job's run time at full speed, uniform
    checkpointable_share: float = 0.6
    # Of the checkpointable training jobs of 2 GPUs or more, the share that are elastic
    # training jobs (wire.telemetry.JobReport with max_replicas): 1-GPU replicas, from
    # half to twice the GPUs they ask, run at a speed in proportion to the GPUs they hold.
    # Drawn from a random stream of their own, so the arrivals are the same either way.
    elastic_share: float = 0.0
    # False: a scheduler that cannot hold GPUs for a job (reserve is accepted and has no
    # effect, and a checkpoint leaves the job's GPUs to whoever comes next).
    honours_reservations: bool = True


@dataclass
class SimJob:
    report: JobReport
    work: timedelta  # run time it needs in all
    done: timedelta = timedelta(0)
    placement: dict[str, list[int]] = field(default_factory=dict)
    pinned: list[str] | None = None  # requeued onto these nodes
    excluded: list[str] = field(default_factory=list)
    held: bool = False
    started_by_shaper: bool = False  # a `start` step: place it now, ahead of FIFO
    resized: bool = False  # a service Shaper has resized: its autoscaler stands down
    # The federated move it arrived by (SimCluster.submit of a SubmitSpec): a resent
    # submit finds it by this name instead of submitting it twice.
    move_name: str | None = None
    spec: SubmitSpec | None = None  # how to submit it pending elsewhere, made once
    # Who cancelled it at the end of a move (SupportsMovedCancel): that step's key.
    moved_by: str | None = None
    asked: int = 0  # an elastic training job's GPUs asked (its speed is held / asked)
    planned: dict[str, int] | None = None  # a sized start: exactly these GPUs per node

    @property
    def id(self) -> str:
        return self.report.external_id

    @property
    def state(self) -> JobState:
        return self.report.state


def diurnal(peak: int, at: datetime) -> int:
    """Demand peaking at 14:00 UTC, about a third of the peak at night."""
    phase = math.cos((at.hour + at.minute / 60 - 14) / 24 * 2 * math.pi)
    return max(1, round(peak * (0.65 + 0.35 * phase)))


class SimCluster:
    kind = SchedulerKind.sim

    def __init__(
        self, spec: SiteSpec, *, start: datetime, seed: int = 7, clock: Callable[[], datetime]
    ) -> None:
        """clock: the time read_state() reports and actions happen at (advance_to first)."""
        self.spec = spec
        self.cluster = spec.name
        self.now = start
        self._clock = clock
        self._rng = random.Random(seed)
        self._elastic_rng = random.Random(seed + 1)  # which jobs are elastic training
        self._lock = threading.RLock()
        self._size = {name: gpus for name, _, gpus in spec.nodes}
        self._models = {name: model for name, model, _ in spec.nodes}
        self.jobs: dict[str, SimJob] = {}
        # job -> node -> GPUs held for it, and when that lapses
        self.reservations: dict[str, dict[str, int]] = {}
        self._reserved_until: dict[str, datetime] = {}
        # Nodes an operator drained (drain_node): nothing new is placed there.
        self._drained: set[str] = set()
        self._counter = 0
        self._moved_in = 0  # jobs that arrived by a federated move: <cluster>-in<n>
        self._next_arrival = self._draw_arrival(start)
        for service in spec.services:
            self._add_service(service)
        self._schedule()

    # -- time ------------------------------------------------------------------------------

    def advance_to(self, at: datetime) -> None:
        """Run the cluster up to ``at``: progress, completions, arrivals, autoscaling, FIFO."""
        with self._lock:
            if at <= self.now:
                return
            elapsed = at - self.now
            for job in self.jobs.values():
                if job.state is JobState.running and job.report.shape is JobShape.block:
                    rate = self._rate(job)
                    job.done += elapsed * rate
                    if job.done >= job.work:
                        self._finish(job, at - (job.done - job.work) / rate)
            self.now = at
            self._lapse_reservations()
            self._arrive()
            self._autoscale()
            self._schedule()
            self._forget_finished()

    @staticmethod
    def _rate(job: SimJob) -> float:
        """Work done per second run: 1, or an elastic training job's GPUs held / asked."""
        if not job.asked:
            return 1.0
        return max(1, sum(len(i) for i in job.placement.values())) / job.asked

    def _draw_arrival(self, after: datetime) -> datetime | None:
        """The next arrival of a Poisson process at ``arrivals_per_hour`` (None: none)."""
        rate = self.spec.arrivals_per_hour
        if rate <= 0:
            return None
        return after + timedelta(hours=self._rng.expovariate(rate))

    def _arrive(self) -> None:
        """Jobs arriving up to now, each at its own time: the same arrivals however often
        the cluster is advanced (telemetry reads and actions advance it at will)."""
        while self._next_arrival is not None and self._next_arrival <= self.now:
            at = self._next_arrival
            self._counter += 1
            team = self._rng.choice(self.spec.teams)
            gpus = self._rng.choice(self.spec.job_gpus)
            job_id = f"{self.cluster}-{self._counter}"
            report = JobReport(
                external_id=job_id,
                name=f"{team}-{self._counter}",
                team=team,
                queue=team,
                kind=self._rng.choice(self.spec.kinds),
                priority=self._rng.choice([10, 50, 100]),
                gpus_requested=gpus,
                gang_size=max(1, math.ceil(gpus / max(self._size.values()))),
                checkpointable=self._rng.random() < self.spec.checkpointable_share,
                submit_time=at,
                state=JobState.pending,
            )
            minutes = self._rng.randint(*self.spec.minutes)
            job = SimJob(report=report, work=timedelta(minutes=minutes))
            elastic = self._elastic_rng.random() < self.spec.elastic_share
            if elastic and report.checkpointable and report.kind is JobKind.training and gpus > 1:
                job.asked = gpus
                job.report = report.model_copy(
                    update={
                        "gang_size": gpus,  # 1-GPU replicas
                        "min_replicas": max(1, gpus // 2),
                        "max_replicas": 2 * gpus,
                        "replicas": gpus,
                    }
                )
            self.jobs[job_id] = job
            self._next_arrival = self._draw_arrival(at)

    def _add_service(self, service: ServiceSpec) -> None:
        report = JobReport(
            external_id=service.name,
            name=service.name,
            team="serving",
            queue="serving",
            kind=JobKind.realtime_inference,
            shape=JobShape.elastic,
            priority=200,
            sla_class="realtime",
            gpus_requested=service.gpus_per_replica,
            min_replicas=1,
            max_replicas=service.peak_replicas,
            replicas=diurnal(service.peak_replicas, self.now),
            submit_time=self.now,
            start_time=self.now,
            state=JobState.running,
            replicas_movable=True,  # resize_off takes replicas off the nodes it names
        )
        self.jobs[service.name] = SimJob(report=report, work=timedelta.max)
        self._place_service(self.jobs[service.name])

    def _autoscale(self) -> None:
        for service in self.spec.services:
            job = self.jobs[service.name]
            if not job.resized:
                self._set_replicas(job, diurnal(service.peak_replicas, self.now))

    # -- placement -------------------------------------------------------------------------

    def free(self) -> dict[str, list[int]]:
        with self._lock:
            free = {name: list(range(gpus)) for name, gpus in self._size.items()}
            for job in self.jobs.values():
                for node, indices in job.placement.items():
                    free[node] = [i for i in free[node] if i not in indices]
            return free

    def _usable(self, free: dict[str, list[int]], job_id: str | None) -> dict[str, list[int]]:
        """The free GPUs ``job_id`` may take: less what is reserved for other jobs."""
        others: dict[str, int] = {}
        for owner, held in self.reservations.items():
            if owner == job_id:
                continue
            for node, gpus in held.items():
                others[node] = others.get(node, 0) + gpus
        if not others:
            return free
        return {
            node: indices[: max(0, len(indices) - others.get(node, 0))]
            for node, indices in free.items()
        }

    def _consume_reservation(self, job_id: str, placement: dict[str, list[int]]) -> None:
        held = self.reservations.get(job_id)
        if held is None:
            return
        for node, indices in placement.items():
            left = held.get(node, 0) - len(indices)
            if left > 0:
                held[node] = left
            else:
                held.pop(node, None)
        if not held:
            self.reservations.pop(job_id, None)
            self._reserved_until.pop(job_id, None)

    def _lapse_reservations(self) -> None:
        for job_id, until in list(self._reserved_until.items()):
            job = self.jobs.get(job_id)
            ended = job is None or job.state in (JobState.finished, JobState.cancelled)
            if until <= self.now or ended:
                self.reservations.pop(job_id, None)
                self._reserved_until.pop(job_id, None)

    def _fit(
        self,
        gpus: int,
        free: dict[str, list[int]],
        nodes: list[str] | None,
        excluded: list[str],
        job_id: str | None = None,
    ) -> dict[str, list[int]]:
        """First fit on one node, else whole nodes for a gang, or, for a gang pinned to
        ``nodes`` (a plan's move puts it there), the free GPUs of each of them in turn; {}
        when it does not fit. Reservations for other jobs than ``job_id`` are left alone."""
        free = self._usable(free, job_id)
        allowed = [
            n
            for n in (nodes or list(free))
            if n in free and n not in excluded and n not in self._drained
        ]
        for node in allowed:
            if len(free[node]) >= gpus:
                return {node: free[node][:gpus]}
        if nodes:
            spread: dict[str, list[int]] = {}
            left = gpus
            for node in allowed:
                taken = free[node][:left]
                if taken:
                    spread[node] = taken
                    left -= len(taken)
            return spread if left <= 0 else {}
        placement: dict[str, list[int]] = {}
        for node in allowed:
            if gpus <= 0:
                break
            if len(free[node]) == self._size[node]:
                take = min(gpus, self._size[node])
                placement[node] = free[node][:take]
                gpus -= take
        return placement if gpus <= 0 else {}

    def _fit_exactly(
        self, gpus: dict[str, int], free: dict[str, list[int]], job_id: str
    ) -> dict[str, list[int]]:
        """``gpus`` GPUs on each of its nodes (a plan's sized start), or {} while some node
        has not that many free (reservations for other jobs left alone)."""
        usable = self._usable(free, job_id)
        placement: dict[str, list[int]] = {}
        for node, count in gpus.items():
            here = usable.get(node, [])
            if node in self._drained or len(here) < count:
                return {}
            placement[node] = here[:count]
        return placement

    def _start(self, job: SimJob, placement: dict[str, list[int]]) -> None:
        self._consume_reservation(job.id, placement)
        job.placement = placement
        job.pinned, job.started_by_shaper, job.planned = None, False, None
        job.report = job.report.model_copy(
            update={"state": JobState.running, "start_time": self.now, "reason": ""}
        )

    def _schedule(self) -> None:
        """First Shaper's explicit starts, then strict FIFO: the first job that does not fit
        blocks the rest (no backfill), as a scheduler that never revisits placement does."""
        free = self.free()
        pending = sorted(
            (j for j in self.jobs.values() if j.state is JobState.pending and not j.held),
            key=lambda j: (not j.started_by_shaper, j.report.submit_time or self.now, j.id),
        )
        blocked = False
        for job in pending:
            if blocked and not job.started_by_shaper:
                job.report = job.report.model_copy(update={"reason": "Priority"})
                continue
            if job.planned is not None:
                placement = self._fit_exactly(job.planned, free, job.id)
            else:
                placement = self._fit(
                    job.report.gpus_requested, free, job.pinned, job.excluded, job.id
                )
            if not placement:
                reason = "ReqNodeNotAvail" if job.pinned else "Resources"
                job.report = job.report.model_copy(update={"reason": reason})
                blocked = blocked or not job.started_by_shaper
                continue
            for node, indices in placement.items():
                free[node] = [i for i in free[node] if i not in indices]
            self._start(job, placement)

    def _place_service(self, job: SimJob) -> None:
        """The service at its ``replicas``: a shrink drops replicas from its last nodes, a
        growth keeps those running where they are and places the new ones where they fit
        (as a ReplicaSet does: running pods never move)."""
        per_replica = job.report.gpus_requested
        placement = {node: list(indices) for node, indices in sorted(job.placement.items())}
        # In GPUs: a replica larger than a node holds whole nodes (``_fit``).
        excess = sum(map(len, placement.values())) - job.report.replicas * per_replica
        for node in reversed(list(placement)):
            dropped = max(0, min(excess, len(placement[node])))
            placement[node] = placement[node][: len(placement[node]) - dropped]
            excess -= dropped
        placement = {node: indices for node, indices in placement.items() if indices}
        free = self.free()
        for node, indices in job.placement.items():
            free[node] = sorted(set(free[node]) | set(indices))
        for node, indices in placement.items():
            free[node] = [i for i in free[node] if i not in indices]
        for _ in range(job.report.replicas - sum(map(len, placement.values())) // per_replica):
            got = self._fit(job.report.gpus_requested, free, None, [], job.id)
            if not got:
                break
            for node, indices in got.items():
                placement.setdefault(node, []).extend(indices)
                free[node] = [i for i in free[node] if i not in indices]
        job.placement = placement

    def _set_replicas(self, job: SimJob, replicas: int) -> None:
        if replicas != job.report.replicas:
            job.report = job.report.model_copy(update={"replicas": replicas})
            self._place_service(job)

    def _finish(self, job: SimJob, at: datetime) -> None:
        self._vacate(job, state=JobState.finished, end_time=at)

    @staticmethod
    def _vacate(job: SimJob, **update: Any) -> None:
        """The job leaves its GPUs; its report takes ``update`` (state, reason, …)."""
        job.placement = {}
        job.report = job.report.model_copy(update=update)

    def _forget_finished(self) -> None:
        for job_id, job in list(self.jobs.items()):
            end = job.report.end_time
            if job.state in (JobState.finished, JobState.cancelled) and end is not None:
                if self.now - end > KEEP_FINISHED:
                    del self.jobs[job_id]

    # -- the connector: reads --------------------------------------------------------------

    def read_state(self) -> ClusterState:
        with self._lock:
            self.advance_to(self._clock())
            free = self.free()
            nodes = [
                NodeReport(
                    name=name,
                    gpu_model=model,
                    gpu_count=gpus,
                    cpu_cores=gpus * 16,
                    memory_mib=gpus * 128 * 1024,
                    labels={"rack": f"r{i // 4}", "sim": "true"},
                    state=NodeState.draining if name in self._drained else NodeState.up,
                )
                for i, (name, model, gpus) in enumerate(self.spec.nodes)
            ]
            jobs = [
                job.report.model_copy(
                    update={
                        "allocations": [
                            AllocationReport(node=node, gpu_indices=sorted(indices))
                            for node, indices in job.placement.items()
                        ],
                        "submit": self._submit_spec(job),
                    }
                )
                for job in self.jobs.values()
            ]
            samples = [
                SampleReport(
                    at=self.now,
                    metric=Metric.gpu_util,
                    node=name,
                    value=round((1 - len(free[name]) / gpus) * self._rng.uniform(0.55, 0.95), 3),
                )
                for name, _, gpus in self.spec.nodes
            ] + [
                SampleReport(
                    at=self.now,
                    metric=Metric.demand_replicas,
                    job=service.name,
                    value=diurnal(service.peak_replicas, self.now),
                )
                for service in self.spec.services
            ]
            return ClusterState(observed_at=self.now, nodes=nodes, jobs=jobs, samples=samples)

    def _submit_spec(self, job: SimJob) -> SubmitSpec | None:
        """How to submit a pending or running block job elsewhere (federated moves); None
        otherwise, and for an elastic training job (it stays where it was submitted).

        A pending job's spec asks for its whole run time (a pending job moves bare and
        starts over there), made once. A running job's is made at each read: its
        ``work_s`` is the run time it has *left* when checkpointable, since its move
        checkpoints it here and it resumes there — and a simulated job's "restore" is
        nothing but needing less work, because the job submitted from the spec starts
        from zero (``done`` 0) when released: carrying the whole run time would make it
        run again what it did here, and a restore that also applied the checkpoint's
        ``done_s`` to it would count that twice. Read before the checkpoint, it is a little
        more than is left when the checkpoint is taken: the moved job runs a few seconds
        too long, never too short. A running job that cannot checkpoint would start over,
        so its spec asks for its whole run time, like a pending one's."""
        if job.report.shape is not JobShape.block:
            return None
        if job.asked:
            return None  # an elastic training job: its range and pace would not travel
        if job.state is JobState.running:
            left = job.work - job.done if job.report.checkpointable else job.work
            return submit_spec(job.report, max(left, timedelta(seconds=1)))
        if job.state is not JobState.pending:
            return None
        if job.spec is None:
            job.spec = submit_spec(job.report, job.work)
        return job.spec

    @overload
    def submit(
        self,
        job: SubmitSpec,
        *,
        name: str,
        nodes: list[str] | None = None,
        hold: bool = False,
    ) -> str: ...
    @overload
    def submit(self, job: JobReport, work: timedelta) -> str: ...
    def submit(
        self,
        job: SubmitSpec | JobReport,
        work: timedelta | None = None,
        *,
        name: str | None = None,
        nodes: list[str] | None = None,
        hold: bool = False,
    ) -> str:
        """A job arrives now; its id here. Two ways in, one meaning (a submission):

        * ``submit(report, work)`` — the site's own workload or a test's, ``work`` of run
          time, under the report's own id;
        * ``submit(spec, name=…, nodes=…, hold=…)`` — connectors.base.SupportsSubmit, a
          federated move from another cluster (connectors.sim.submission), pinned to
          ``nodes`` when given and held (Reason ``JobHeldUser``, as Slurm's ``sbatch
          --hold``) when ``hold``: it waits for a ``release``, then starts on those nodes
          when they hold it. Idempotent by ``name``: a job that arrived under it before is
          returned as it is (not held or pinned again), nothing is submitted. A spec this
          cluster cannot run, or a pin to nodes it does not have, raises a non-retryable
          ConnectorError saying why."""
        with self._lock:
            if isinstance(job, JobReport):
                if work is None:
                    raise TypeError("submit(report, work): the job's run time is missing")
                self.jobs[job.external_id] = SimJob(
                    report=job.model_copy(update={"state": JobState.pending}), work=work
                )
                self._schedule()
                return job.external_id
            if not name:
                raise ConnectorError("submit: a federated move needs a name", retryable=False)
            return self._move_in(job, name, nodes=nodes or None, hold=hold)

    def _move_in(self, spec: SubmitSpec, name: str, *, nodes: list[str] | None, hold: bool) -> str:
        self._act()
        for existing in self.jobs.values():
            if existing.move_name == name:
                return existing.id
        unknown = sorted(set(nodes or []) - set(self._size))
        if unknown:
            raise ConnectorError(
                f"submit {name} to simulated cluster {self.cluster}: cannot pin the job to "
                f"{', '.join(unknown)}: no such node here (it has {', '.join(self._size)})",
                retryable=False,
            )
        self._moved_in += 1
        external_id = f"{self.cluster}-in{self._moved_in}"
        report, work = job_from_spec(spec, external_id=external_id, name=name, cluster=self.cluster)
        self._check_runnable(report, name, nodes)
        update: dict[str, Any] = {"submit_time": self.now}
        if hold:
            update["reason"] = "JobHeldUser"
        self.jobs[external_id] = SimJob(
            report=report.model_copy(update=update),
            work=work,
            move_name=name,
            pinned=list(dict.fromkeys(nodes)) if nodes else None,
            held=hold,
        )
        self._schedule()
        return external_id

    def withdraw(self, name: str) -> str | None:
        """SupportsSubmit: cancel the job that arrived as move ``name``; its id, or None
        when none did, it was cancelled (so a second withdraw cancels nothing) or it was
        refused before it ran (:meth:`refuse`). The job stays listed, so a late submit of
        the same move finds it and submits nothing. One that ran and ended here is a
        non-retryable error: the move took place."""
        with self._lock:
            self._act()
            for job in self.jobs.values():
                if (
                    job.move_name == name
                    and job.state in (JobState.finished, JobState.failed)
                    and ran(job.report)
                ):
                    raise ConnectorError(
                        f"withdraw {name} from {self.cluster}: job {job.id} of this move "
                        f"already ran here and {job.state.value}: the move took place, so "
                        "its source copy must not run again",
                        retryable=False,
                    )
                if job.move_name == name and job.state in _LIVE:
                    self._vacate(job, state=JobState.cancelled, end_time=self.now)
                    self._schedule()
                    return job.id
            return None

    def check_arrival(self, external_id: str) -> str:
        """SupportsArrivalCheck: a simulated scheduler checks a job at submit, as Slurm does,
        and may refuse a queued one later (:meth:`refuse`): the rule over its report
        (connectors.arrival)."""
        with self._lock:
            self._act()
            job = self.jobs.get(external_id)
            return check_reported(job.report if job is not None else None, external_id)

    def refuse(self, external_id: str, reason: str) -> None:
        """The scheduler gives up on a queued job it had accepted, before it ran: it ends
        failed with ``reason``. What Kueue does to a Workload it finds inadmissible, or Ray
        to a job whose runtime environment cannot be built; the simulated clusters stand for
        them with it (an operator's or a test's fault). A job that runs, or has ended, is
        not the queue's to refuse: a non-retryable ConnectorError."""
        with self._lock:
            self._act()
            job = self.job(external_id)
            if job.state is not JobState.pending:
                raise ConnectorError(
                    f"refuse job {external_id}: it is {job.state.value}, not queued",
                    retryable=False,
                )
            job.held = False
            self._vacate(job, state=JobState.failed, end_time=self.now, reason=reason[:255])
            self._schedule()

    def _check_runnable(self, report: JobReport, name: str, nodes: list[str] | None = None) -> None:
        """Refuse a job no placement here could ever hold: too few GPUs of its models (on
        ``nodes``, when it is pinned to them)."""
        allowed = set(report.allowed_gpu_models)
        usable = sum(
            gpus
            for node, gpus in self._size.items()
            if (not allowed or self._models[node] in allowed) and (not nodes or node in nodes)
        )
        if usable < report.gpus_requested:
            models = f" of {', '.join(sorted(allowed))}" if allowed else ""
            where = (
                f"the nodes it is pinned to ({', '.join(nodes)}) have"
                if nodes
                else "the cluster has"
            )
            raise ConnectorError(
                f"submit {name} to simulated cluster {self.cluster}: the job needs "
                f"{report.gpus_requested} GPUs{models}, {where} {usable}",
                retryable=False,
            )

    # -- the connector: scheduler-level actions --------------------------------------------

    def drain_node(self, node: str, *, reason: str = "drained by Shaper") -> None:
        """Place nothing new on ``node`` (its jobs keep running); idempotent."""
        with self._lock:
            self._node(node, "drain")
            self._drained.add(node)

    def undrain_node(self, node: str) -> None:
        """Place work on ``node`` again; idempotent."""
        with self._lock:
            self._node(node, "undrain")
            self._drained.discard(node)
            self._schedule()

    def _node(self, node: str, what: str) -> None:
        if node not in self._size:
            raise ConnectorError(
                f"{what} node {node}: simulated cluster {self.cluster} has no such node",
                retryable=False,
            )

    def job(self, external_id: str) -> SimJob:
        try:
            return self.jobs[external_id]
        except KeyError:
            raise ConnectorError(
                f"no job {external_id!r} on simulated cluster {self.cluster}", retryable=False
            ) from None

    def _act(self) -> None:
        self.advance_to(self._clock())

    def requeue(
        self,
        external_id: str,
        *,
        nodes: list[str] | None = None,
        exclude: list[str] | None = None,
        hold: bool = False,
    ) -> None:
        """Back to the queue (work since the last checkpoint is lost), optionally pinned;
        held when ``hold`` (it waits for a release or a start)."""
        with self._lock:
            self._act()
            job = self.job(external_id)
            if hold:
                job.held = True
                job.report = job.report.model_copy(update={"reason": "JobHeldAdmin"})
            if job.state is JobState.running:
                if not job.report.checkpointable:
                    job.done = timedelta(0)
                self._vacate(
                    job, state=JobState.pending, restart_count=job.report.restart_count + 1
                )
            if nodes is not None:
                job.pinned = list(nodes) or None
            if exclude is not None:
                job.excluded = list(exclude)
            self._schedule()

    def hold(self, external_id: str) -> None:
        with self._lock:
            self._act()
            job = self.job(external_id)
            job.held = True
            job.report = job.report.model_copy(update={"reason": "JobHeldAdmin"})

    def release(self, external_id: str) -> None:
        """Release a held job; a `start` step: place this job now if it fits anywhere."""
        with self._lock:
            self._act()
            job = self.job(external_id)
            job.held = False
            if job.state is JobState.pending:
                job.started_by_shaper = True
                self._schedule()

    def start(
        self,
        external_id: str,
        *,
        nodes: list[str] | None = None,
        replicas: int | None = None,
        gpus: dict[str, int] | None = None,
    ) -> None:
        """Start a pending, held or suspended job now, ahead of FIFO, on ``nodes`` if given;
        it starts when it fits there (at once when GPUs are free or reserved for it). An
        elastic training job starts at ``replicas`` (1-GPU replicas) when given, with
        exactly ``gpus`` GPUs on each node when given (the plan's placement)."""
        with self._lock:
            self._act()
            job = self.job(external_id)
            if job.state is JobState.running:
                return
            if job.state not in (JobState.pending, JobState.suspended):
                raise ConnectorError(
                    f"job {external_id} is {job.state.value}; it cannot start", retryable=False
                )
            if replicas is not None and job.asked:
                self._set_size(job, replicas)
                job.planned = dict(gpus) if gpus else None
            job.held = False
            job.pinned = list(nodes) if nodes else None
            job.started_by_shaper = True
            job.report = job.report.model_copy(update={"state": JobState.pending})
            self._schedule()

    def reserve(
        self,
        external_id: str,
        *,
        gpus: dict[str, int],
        ttl_s: float,
        counts_on: list[str] | None = None,
    ) -> None:
        """Hold ``gpus`` (node -> count) for the job: nobody else gets them as they free.
        With ``counts_on``, refuse when jobs outside it hold GPUs that are needed."""
        with self._lock:
            self._act()
            self.job(external_id)
            unknown = sorted(set(gpus) - set(self._size))
            if unknown:
                raise ConnectorError(
                    f"cannot reserve on unknown nodes {unknown} of {self.cluster}",
                    retryable=False,
                )
            if counts_on is not None:
                self._check_reservable(external_id, gpus, {*counts_on, external_id})
            if not self.spec.honours_reservations:
                return
            self.reservations[external_id] = {n: min(g, self._size[n]) for n, g in gpus.items()}
            self._reserved_until[external_id] = self.now + timedelta(seconds=ttl_s)

    def _check_reservable(self, job_id: str, gpus: dict[str, int], leaving: set[str]) -> None:
        """The GPUs can come free for the job: jobs outside ``leaving`` leave enough. (Other
        reservations are not counted: a plan's takers share nodes by its own counts.)"""
        for node, wanted in sorted(gpus.items()):
            others = {
                j.id: len(j.placement[node])
                for j in self.jobs.values()
                if node in j.placement and j.id not in leaving
            }
            if self._size[node] - sum(others.values()) < wanted:
                names = ", ".join(f"{j} ({g})" for j, g in sorted(others.items()))
                raise ConnectorError(
                    f"cannot hold {wanted} GPUs on {node} for {job_id}: held by {names}",
                    retryable=False,
                )

    def unreserve(self, external_id: str) -> None:
        with self._lock:
            self.reservations.pop(external_id, None)
            self._reserved_until.pop(external_id, None)
            self._schedule()

    def _hold_node_for(self, job: SimJob, node: str, gpus: int) -> None:
        if not self.spec.honours_reservations:
            return
        held = self.reservations.setdefault(job.id, {})
        held[node] = max(held.get(node, 0), gpus)
        self._reserved_until[job.id] = max(
            self._reserved_until.get(job.id, self.now), self.now + KEEP_SOURCE
        )

    def _drop_node_hold(self, job_id: str, node: str) -> None:
        held = self.reservations.get(job_id)
        if held is not None and held.pop(node, None) is not None and not held:
            self.reservations.pop(job_id, None)
            self._reserved_until.pop(job_id, None)

    def cancel(self, external_id: str) -> None:
        with self._lock:
            self._act()
            job = self.job(external_id)
            if job.state in _LIVE:
                self._vacate(job, state=JobState.cancelled, end_time=self.now)
                self._schedule()

    def cancel_moved(self, external_id: str, *, key: str) -> None:
        """SupportsMovedCancel: as Slurm's, the job keeps the key of the step that cancels it;
        and as Slurm's, a job this cluster no longer knows (ended and forgotten) leaves the
        move standing: failing the step would withdraw the target's copy, the only one."""
        with self._lock:
            self._act()
            job = self.jobs.get(external_id)
            if job is None:
                logger.warning(
                    "cancel job %s, moved to another cluster: %s no longer knows the job; "
                    "the move stands",
                    external_id,
                    self.cluster,
                )
                return
            if job.moved_by != key and job.state is not JobState.pending:
                raise ConnectorError(
                    f"cancel job {job.id}, moved to another cluster: it is {job.state.value} "
                    "and this move did not cancel it: someone else did, or started it, "
                    "during the move, which is undone",
                    retryable=False,
                )
            job.moved_by = key
            self.cancel(external_id)

    def suspend(self, external_id: str) -> None:
        """Stop a running job where it is, keeping its progress (and freeing its GPUs)."""
        with self._lock:
            self._act()
            job = self.job(external_id)
            if job.state is JobState.running:
                self._vacate(job, state=JobState.suspended, reason="suspended")
                self._schedule()

    def resume(self, external_id: str) -> None:
        """A suspended (or checkpointed) job goes back to the queue, first in line."""
        with self._lock:
            self._act()
            job = self.job(external_id)
            if job.state is JobState.suspended:
                job.started_by_shaper = True
                job.report = job.report.model_copy(update={"state": JobState.pending})
                self._schedule()

    def resize(self, external_id: str, *, replicas: int) -> None:
        with self._lock:
            self._act()
            job = self._service(external_id)
            low, high = job.report.min_replicas, job.report.max_replicas
            if not low <= replicas <= high:
                raise ConnectorError(
                    f"service {external_id}: {replicas} replicas is outside {low}..{high}",
                    retryable=False,
                )
            job.resized = True
            self._set_replicas(job, replicas)
            # The growth took what was held for it (or fitted elsewhere): the hold is spent.
            self.reservations.pop(job.id, None)
            self._reserved_until.pop(job.id, None)

    def resize_off(self, external_id: str, *, replicas: int, leave: dict[str, int]) -> None:
        """The service shrinks to ``replicas`` by dropping ``leave[node]`` of its replicas
        on each node (connectors.base.SupportsReplicaMoves); the others stay where they
        are. A service already at ``replicas`` is left as it is (a resent step)."""
        with self._lock:
            self._act()
            job = self._service(external_id)
            if job.report.replicas == replicas:
                return
            per_replica = job.report.gpus_requested
            placement = {node: list(indices) for node, indices in job.placement.items()}
            for node, count in sorted(leave.items()):
                held = placement.get(node, [])
                if len(held) < count * per_replica:
                    raise ConnectorError(
                        f"service {external_id} has {len(held) // per_replica} replicas on "
                        f"{node}, not the {count} to take off",
                        retryable=False,
                    )
                placement[node] = held[: len(held) - count * per_replica]
            left = sum(len(indices) for indices in placement.values()) // per_replica
            if left != replicas or not job.report.min_replicas <= replicas:
                raise ConnectorError(
                    f"service {external_id}: taking {sum(leave.values())} replicas off leaves "
                    f"{left}, not {replicas} (min {job.report.min_replicas})",
                    retryable=False,
                )
            job.resized = True
            job.placement = {node: indices for node, indices in placement.items() if indices}
            job.report = job.report.model_copy(update={"replicas": replicas})

    def _service(self, external_id: str) -> SimJob:
        job = self.job(external_id)
        if job.report.shape is not JobShape.elastic:
            raise ConnectorError(f"job {external_id} is not an elastic service", retryable=False)
        return job

    def _set_size(self, job: SimJob, replicas: int) -> None:
        """An elastic training job's size: what it asks of the scheduler (one GPU each)."""
        low, high = job.report.min_replicas, job.report.max_replicas
        if not low <= replicas <= high:
            raise ConnectorError(
                f"job {job.id}: {replicas} replicas is outside {low}..{high}", retryable=False
            )
        job.report = job.report.model_copy(
            update={"gpus_requested": replicas, "gang_size": replicas}
        )

    def resize_job(
        self,
        external_id: str,
        *,
        nodes: list[str],
        replicas: int,
        gpus: dict[str, int] | None = None,
    ) -> None:
        """SupportsJobResize: a running elastic training job to ``replicas`` GPUs on
        ``nodes`` — ``gpus`` on each when given (the plan's), else as many as it can keep
        there and then free ones — its own GPUs kept first on each node, then GPUs free (or
        held for it) there; it restarts from its checkpoint (``RESIZE_LOSS`` of work lost).
        "Not yet" (retryable) while the GPUs it grows onto are not free."""
        with self._lock:
            self._act()
            job = self.job(external_id)
            if not job.asked:
                raise ConnectorError(f"job {external_id} is not elastic", retryable=False)
            if job.state is not JobState.running:
                raise ConnectorError(
                    f"job {external_id} is {job.state.value}; only a running job is resized",
                    retryable=False,
                )
            held = sum(len(i) for i in job.placement.values())
            now = {n: len(i) for n, i in job.placement.items()}
            if (gpus is not None and now == gpus) or (
                gpus is None and held == replicas and set(job.placement) <= set(nodes)
            ):
                return  # done (a resend)
            if gpus is not None and sum(gpus.values()) != replicas:
                raise ConnectorError(
                    f"resize job {external_id}: {replicas} replicas, but the plan's GPUs add "
                    f"up to {sum(gpus.values())}",
                    retryable=False,
                )
            self._set_size(job, replicas)
            free = self._usable(self.free(), job.id)
            placement: dict[str, list[int]] = {}
            left = replicas
            for node in nodes:  # what it holds there first
                want = gpus.get(node, 0) if gpus is not None else left
                keep = job.placement.get(node, [])[: min(want, left)]
                if keep:
                    placement[node] = list(keep)
                    left -= len(keep)
            for node in nodes:
                if left <= 0:
                    break
                want = gpus.get(node, 0) if gpus is not None else left
                want = min(want - len(placement.get(node, [])), left)
                take = [i for i in free.get(node, []) if i not in job.placement.get(node, [])]
                take = take[: max(0, want)]
                if take:
                    placement.setdefault(node, []).extend(take)
                    left -= len(take)
            if left > 0:
                self._set_size(job, held)
                raise ConnectorError(
                    f"resize job {external_id}: {left} GPU(s) on {','.join(nodes)} not free yet",
                    retryable=True,
                )
            self._consume_reservation(job.id, placement)
            job.placement = {n: sorted(i) for n, i in placement.items()}
            job.done = max(timedelta(0), job.done - RESIZE_LOSS)
            self._schedule()

    # -- for the simulated node agents -----------------------------------------------------

    def take_off(self, external_id: str, node: str) -> timedelta:
        """Checkpoint on ``node``: the job stops holding GPUs and keeps its progress."""
        with self._lock:
            self._act()
            job = self.job(external_id)
            if job.state is not JobState.running or list(job.placement) != [node]:
                raise ConnectorError(
                    f"job {external_id} does not run on {node} alone "
                    f"(state {job.state.value}, nodes {sorted(job.placement) or 'none'})",
                    retryable=False,
                )
            gpus = len(job.placement[node])
            self._vacate(job, state=JobState.suspended, reason="checkpointed")
            # Its GPUs stay its own until it is restored elsewhere or released here.
            self._hold_node_for(job, node, gpus)
            self._schedule()
            return job.done

    def put_on(self, external_id: str, node: str, done: timedelta) -> None:
        """Restore on ``node`` with the progress the checkpoint kept."""
        with self._lock:
            self._act()
            job = self.job(external_id)
            if job.state is JobState.running and list(job.placement) == [node]:
                return
            if job.state is JobState.running:
                raise ConnectorError(
                    f"job {external_id} already runs on {sorted(job.placement)}; "
                    f"restoring it on {node} would run it twice",
                    retryable=False,
                )
            placement = self._fit(job.report.gpus_requested, self.free(), [node], [], job.id)
            if not placement:
                raise ConnectorError(
                    f"job {external_id} needs {job.report.gpus_requested} GPUs, "
                    f"{node} has {len(self.free().get(node, []))} free",
                    retryable=True,
                )
            job.done = done
            self._start(job, placement)
            job.report = job.report.model_copy(
                update={"restart_count": job.report.restart_count + 1}
            )

    def runs_on(self, external_id: str, node: str) -> bool:
        with self._lock:
            job = self.jobs.get(external_id)
            return job is not None and job.state is JobState.running and node in job.placement

    def stop_on(self, external_id: str, node: str) -> bool:
        """Stop the job where it runs on ``node`` (a compensating release); True if it ran."""
        with self._lock:
            self._drop_node_hold(external_id, node)
            job = self.jobs.get(external_id)
            if job is None or job.state is not JobState.running or node not in job.placement:
                self._schedule()
                return False
            self._vacate(job, state=JobState.suspended, reason="released")
            self._schedule()
            return True


def utc_now() -> datetime:
    return datetime.now(UTC)
