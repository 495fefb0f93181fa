"""Discrete-event simulation of one or more clusters in simulated time.

Algorithm (one run):

1. Seed the event queue with job arrivals, node events, hourly demand ticks of every
   service, the first cadence re-plan and the end of the horizon.
2. Pop every event that shares the earliest time; before applying them, integrate the
   metrics over the interval since the previous time (utilization, demand served,
   fragmentation are piecewise constant between events).
3. Apply the events: arrivals enter the queue, completions free GPUs, failures evict work
   (losing what was not checkpointed), drains close nodes to new work, demand ticks move
   the services' targets.
4. If any of them asks for a re-plan (or the cadence fires, or the planner asked to be
   woken now: ``SimPlan.wake_at``), ask the planner for a plan over the current state
   and apply its actions in a fixed order — preempt, shrink services, lift migrating and
   rescaled jobs off their GPUs, land the rescales (elastic training jobs at their new
   size), then the migrations, grow services, start — rejecting (and counting) any action
   that is not legal in the current state. Each applied action is
   recorded on its job (``SimJob.acted_at``, ``SimService.resized_at``): the churn
   metrics count them, and the shaper's planner feeds them back to the solver as
   Shaper's own recent actions (its dwell time and move budget).
5. At the horizon (the end of the measured window: arrivals and node events stop there),
   record the window's figures (utilization, value, demand served). Then, unless the run
   was asked to stop there, keep going with no new arrivals until every block job is done
   or a cap is reached (``drain_cap``; reported when hit), so that completion times are
   measured on every job rather than on the ones that happened to finish early.
6. At the end, close the books: every job is completed, running or queued, its useful work
   is what was completed or durably checkpointed, and every allocated GPU-second is
   accounted in ``sim.ledger`` (checked with ``check_invariants``).

The engine never decides anything itself: every start, preemption, migration and resize
comes from the planner (``sim.adapter.SolverPlanner`` drives the solver's policies).
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum, StrEnum
from typing import Protocol

from sim.actions import Migrate, Preempt, Rescale, Resize, SimPlan, Start
from sim.diagnosis import IdleTracker
from sim.ledger import JobLedger, check
from sim.workload import BlockJob, Node, Service, Workload
from solver.instance import NodeState

EPS = 1e-6
HOUR = 3600.0
# A drain stops at the latest at: horizon + max(a day, 3 × the horizon, 4 × (all the work
# packed perfectly on every GPU) + the longest job): far beyond any policy that makes
# progress, so a run that hits it is one where some job can never run or a policy starves
# it (it is then reported, not hidden).
DRAIN_CAP_MIN_S = 24 * HOUR


class EventKind(IntEnum):
    # Order matters for events at the same instant: free before taking.
    COMPLETION = 0
    NODE = 1
    ARRIVAL = 2
    DEMAND = 3
    REPLAN = 4
    HORIZON = 5
    DUMPED = 6  # a checkpoint dump ends: the GPUs' busy count changes, nothing else


class JobStatus(StrEnum):
    queued = "queued"
    running = "running"
    done = "done"


class Planner(Protocol):
    name: str

    def plan(self, sim: Simulation) -> SimPlan: ...


@dataclass(slots=True)
class SimJob:
    """A block job as the simulation runs it: its spec and where it is now."""

    spec: BlockJob
    status: JobStatus = JobStatus.queued
    placement: dict[str, tuple[int, ...]] = field(default_factory=dict)
    progress: float = 0.0
    checkpointed: float = 0.0
    rate: float = 0.0
    updated_at: float = 0.0
    overhead_until: float = 0.0
    first_start: float | None = None
    end_time: float | None = None
    queued_since: float = 0.0
    queue_wait: float = 0.0
    version: int = 0
    preemptions: int = 0
    migrations: int = 0
    resizes: int = 0  # rescales of an elastic training job (also in ``moved_at``)
    run_start: float = 0.0
    expected_end: float = 0.0
    moved_at: list[float] = field(default_factory=list)
    preempted_at: list[float] = field(default_factory=list)
    # Every action a plan took on the job (start, migration, preemption or requeue).
    acted_at: list[float] = field(default_factory=list)
    # Lifted for a migration that could not land: back in the queue by the policy's doing.
    stranded: bool = False
    # GPU-time accounting (``sim.ledger``): when the current hold began, and the overhead
    # intervals (kind, start, end) during which the hold makes no progress.
    ledger: JobLedger = field(default_factory=JobLedger)
    held_since: float = 0.0
    overheads: list[tuple[str, float, float]] = field(default_factory=list)
    # Work kept at the horizon (the window's value), set when the horizon passes.
    kept_at_horizon: float | None = None
    # The cluster its image (inputs, checkpoint) is in: where it was submitted until it
    # runs elsewhere. Starting it in another cluster sends the image there first.
    location: str | None = None

    @property
    def gpus_held(self) -> int:
        return sum(len(idx) for idx in self.placement.values())


@dataclass(slots=True)
class SimService:
    """A service as the simulation runs it: its spec and its replicas now."""

    spec: Service
    placement: dict[str, list[tuple[int, ...]]] = field(default_factory=dict)
    resized_at: list[float] = field(default_factory=list)  # resizes that changed it

    @property
    def replicas(self) -> int:
        return sum(len(reps) for reps in self.placement.values())

    def replicas_by_node(self) -> dict[str, int]:
        return {node: len(reps) for node, reps in self.placement.items() if reps}


@dataclass(slots=True)
class SimNode:
    """A node as the simulation runs it: its spec, its GPUs' owners, up or draining."""

    spec: Node
    owners: list[str | None]
    free: int = 0
    up: bool = True
    draining: bool = False
    # A GPU a job has left may still be dumping its checkpoint: busy until then, for a
    # migration or a checkpoint (``busy_kind``) of job ``busy_job``.
    busy_until: list[float] = field(default_factory=list)
    busy_kind: list[str] = field(default_factory=list)
    busy_job: list[str] = field(default_factory=list)

    @property
    def schedulable(self) -> bool:
        return self.up and not self.draining

    @property
    def state(self) -> NodeState:
        """The node as the solver and the idle classifier name it."""
        if not self.up:
            return NodeState.down
        return NodeState.draining if self.draining else NodeState.up


@dataclass(slots=True)
class Counters:
    allocated_gpu_seconds: float = 0.0
    available_gpu_seconds: float = 0.0
    capacity_gpu_seconds: float = 0.0
    block_gpu_seconds: float = 0.0
    block_job_seconds: float = 0.0  # running block jobs × time
    service_gpu_seconds: float = 0.0
    serving_gpu_seconds: float = 0.0
    fragmented_gpu_seconds: float = 0.0
    idle_gpu_seconds: float = 0.0
    demand_seconds: float = 0.0
    unmet_demand_seconds: float = 0.0
    # Free GPUs still dumping the checkpoint of a job that left them (allocated to it).
    draining_gpu_seconds: float = 0.0
    migrations: int = 0
    # Rescales of running elastic training jobs (a checkpoint and a restart at a new size).
    resizes: int = 0
    # Starts and migrations in a cluster other than the one the job's image was in, and
    # the GiB of images that crossed between clusters for them.
    remote_starts: int = 0
    gib_crossed: float = 0.0
    preemptions: int = 0
    evictions: int = 0
    rejected_actions: int = 0
    replans: int = 0
    # Re-plans at which some queued job fitted the free GPUs taken together but not on the
    # fewest nodes its gang may span: fragmentation, not capacity, kept it waiting.
    fragmentation_blocked_replans: int = 0
    solve_seconds: float = 0.0
    rejections: Counter[str] = field(default_factory=Counter)


@dataclass(slots=True)
class Segment:
    node: str
    gpu: int
    start: float
    end: float
    owner: str
    kind: str


def default_drain_span(workload: Workload) -> float:
    """How long after the horizon a drain may go on by default (see ``DRAIN_CAP_MIN_S``)."""
    jobs = [j for j in workload.jobs if j.submit_time <= workload.horizon]
    speeds = [m.speed for m in workload.gpu_models.values()]
    speeds += [speed for j in jobs for _, speed in j.speeds]
    slowest = min(speeds, default=1.0) or 1.0
    packed = sum(j.work * j.gpus for j in jobs) / max(1, workload.total_gpus)
    # An elastic job may run at its fewest GPUs, slower than on the ones it asks for.
    longest = max((j.work / j.size_factor(j.min_size) for j in jobs), default=0.0)
    return max(DRAIN_CAP_MIN_S, 3 * workload.horizon, (4 * packed + longest) / slowest)


class Simulation:
    """State and event loop; ``run()`` once per instance."""

    def __init__(
        self,
        workload: Workload,
        planner: Planner,
        *,
        replan_interval: float | None = None,
        replan_on_events: bool = True,
        min_replan_gap: float = 0.0,
        record_occupancy: bool | None = None,
        check_invariants: bool = False,
        progress: Callable[[float, float], None] | None = None,
        drain: bool = True,
        drain_cap: float | None = None,
        diagnose: bool = True,
    ) -> None:
        workload.validate()
        self.workload = workload
        self.planner = planner
        self.replan_interval = (
            workload.replan_interval if replan_interval is None else replan_interval
        )
        self.replan_on_events = replan_on_events
        self.min_replan_gap = min_replan_gap
        total = workload.total_gpus
        self._total_gpus = total
        self.record_occupancy = total <= 256 if record_occupancy is None else record_occupancy
        self.check_invariants = check_invariants
        self.progress_callback = progress
        self.drain = drain
        horizon = workload.horizon
        self.drain_cap = (
            horizon + default_drain_span(workload) if drain_cap is None else max(horizon, drain_cap)
        )
        self.run_end = horizon  # when the run stopped: the horizon, the drain or the cap
        self.drained = False  # every job that arrived was done by ``run_end``
        self.window: Counters | None = None  # the counters at the horizon
        # Why GPUs sit idle over the window (``sim.diagnosis``); off for callers that only
        # want the other figures fast.
        self.idle: IdleTracker | None = IdleTracker(workload) if diagnose else None

        self.now = 0.0
        self.nodes: dict[str, SimNode] = {
            n.name: SimNode(
                spec=n,
                owners=[None] * n.gpus,
                free=n.gpus,
                busy_until=[0.0] * n.gpus,
                busy_kind=[""] * n.gpus,
                busy_job=[""] * n.gpus,
            )
            for n in workload.nodes
        }
        self.jobs: dict[str, SimJob] = {}
        self.queue: dict[str, SimJob] = {}
        self.running: dict[str, SimJob] = {}
        self.services: dict[str, SimService] = {s.id: SimService(spec=s) for s in workload.services}
        self.counters = Counters()
        self._draining: dict[tuple[str, int], float] = {}  # free GPUs dumping, until when
        self.segments: list[Segment] = []
        self._open_segments: dict[tuple[str, int], tuple[float, str, str]] = {}
        self.timeline: list[tuple[float, float, int, int, float]] = []
        self.service_hours: dict[tuple[str, int], list[float]] = {}
        self._events: list[tuple[float, int, int, str, int]] = []
        self._seq = itertools.count()
        self._pending_sizes: Counter[int] = Counter()
        self._allocated = 0
        self._available = total
        self._frag_cache: tuple[int, int] | None = None
        # Schedulable nodes counted by (free GPUs, size): fragmentation in O(distinct keys).
        self._free_hist: Counter[tuple[int, int]] = Counter(
            (n.gpus, n.gpus) for n in workload.nodes
        )
        self._replan_requested = False
        self._last_replan = -math.inf
        self._replan_scheduled_at = math.inf
        self._wake_at = math.inf  # the earliest re-plan a planner asked for
        self._finished = False

    # ----------------------------------------------------------------- events
    def _push(self, time: float, kind: EventKind, ref: str = "", version: int = 0) -> None:
        heapq.heappush(self._events, (time, int(kind), next(self._seq), ref, version))

    def _seed(self) -> None:
        horizon = self.workload.horizon
        for job in self.workload.jobs:
            if job.submit_time <= horizon:
                self._push(job.submit_time, EventKind.ARRIVAL, job.id)
        self._job_specs = {job.id: job for job in self.workload.jobs}
        self._job_specs_due = [job for job in self.workload.jobs if job.submit_time <= horizon]
        for index, event in enumerate(self.workload.node_events):
            if event.time <= horizon:
                self._push(event.time, EventKind.NODE, str(index))
        if self.services:
            self._push(0.0, EventKind.DEMAND)  # each tick pushes the next hour's
        if self.replan_interval > 0:
            self._push(0.0, EventKind.REPLAN, "cadence")
        self._push(horizon, EventKind.HORIZON)

    # ------------------------------------------------------------------- run
    def run(self) -> Simulation:
        if self._finished:
            raise RuntimeError("a Simulation runs once")
        self._seed()
        horizon = self.workload.horizon
        stop = self.drain_cap if self.drain else horizon
        while self._events:
            time = self._events[0][0]
            if time > stop:
                break
            self._advance(time)
            replan = False
            end = False
            while self._events and self._events[0][0] <= time + EPS:
                _, kind, _, ref, version = heapq.heappop(self._events)
                if kind == EventKind.HORIZON:
                    self._close_window()
                    end = not self.drain
                elif kind == EventKind.REPLAN:
                    if ref == "cadence":
                        replan = True
                        self._push(time + self.replan_interval, EventKind.REPLAN, "cadence")
                    elif ref == "gap":
                        self._replan_scheduled_at = math.inf
                        replan = True
                    elif ref == "wake" and time + EPS >= self._wake_at:
                        self._wake_at = math.inf
                        replan = True
                else:
                    replan |= self._handle(EventKind(kind), ref, version)
            if end or (self.window is not None and self._all_done()):
                break
            if replan or self._replan_requested:
                self._maybe_replan(time)
            if self.progress_callback is not None:
                self.progress_callback(time, horizon)
        if not self._all_done():
            # Cut off: by the horizon (no drain) or by the cap.
            self._advance(stop)
        self.drained = self._all_done()
        self.run_end = self.now
        self._close(self.now)
        self._finished = True
        if self.progress_callback is not None:
            self.progress_callback(self.now, horizon)
        return self

    def _all_done(self) -> bool:
        return not self.queue and not self.running and len(self.jobs) == len(self._job_specs_due)

    def _close_window(self) -> None:
        """The horizon: record the window's counters and each job's work kept by then."""
        c = self.counters
        self.window = Counters(
            **{
                name: getattr(c, name)
                for name in Counters.__dataclass_fields__
                if name != "rejections"
            }
        )
        for state in self.jobs.values():
            self._update_progress(state)
            if state.status == JobStatus.done:
                state.kept_at_horizon = state.spec.work
            elif state.status == JobStatus.running and state.spec.checkpointable:
                # A running checkpointable job could be checkpointed at the horizon.
                state.kept_at_horizon = state.progress
            else:
                state.kept_at_horizon = state.checkpointed

    def _maybe_replan(self, time: float) -> None:
        if time - self._last_replan + EPS < self.min_replan_gap:
            due = self._last_replan + self.min_replan_gap
            if due < self._replan_scheduled_at:
                self._replan_scheduled_at = due
                self._push(due, EventKind.REPLAN, "gap")
            self._replan_requested = False
            return
        self._replan_requested = False
        self._last_replan = time
        self.counters.replans += 1
        if self.queue and self._blocked_by_fragmentation():
            self.counters.fragmentation_blocked_replans += 1
        plan = self.planner.plan(self)
        self.counters.solve_seconds += plan.solve_seconds
        self.apply(plan)
        wake = plan.wake_at
        if wake is not None and time + EPS < wake < self._wake_at:
            self._wake_at = wake
            self._push(wake, EventKind.REPLAN, "wake")

    def _blocked_by_fragmentation(self) -> bool:
        """Whether a queued job fits the free GPUs of the nodes it accepts taken together,
        but not on the fewest of them its gang may span (ceil(GPUs / largest node), the
        span ``sim.adapter`` gives the solver). An elastic job needs its fewest GPUs, over
        the span of its most. One check per distinct (sizes, models)."""
        seen: set[tuple[int, int, tuple[str, ...]]] = set()
        for state in self.queue.values():
            spec = state.spec
            key = (spec.min_size, spec.max_size, spec.gpu_models)
            if key in seen:
                continue
            seen.add(key)
            nodes = [
                n
                for n in self.nodes.values()
                if n.schedulable and spec.can_run_on(n.spec.gpu_model)
            ]
            if not nodes:
                continue
            need = spec.min_size
            span = max(1, math.ceil(spec.max_size / max(n.spec.gpus for n in nodes)))
            free = sorted((n.free for n in nodes), reverse=True)
            if sum(free) >= need and sum(free[:span]) < need:
                return True
        return False

    def _handle(self, kind: EventKind, ref: str, version: int) -> bool:
        if kind == EventKind.ARRIVAL:
            spec = self._job_specs[ref]
            state = SimJob(
                spec=spec, updated_at=self.now, queued_since=self.now, location=spec.cluster
            )
            self.jobs[spec.id] = state
            self._enqueue(state)
            return self.replan_on_events
        if kind == EventKind.COMPLETION:
            state = self.jobs[ref]
            if state.version != version or state.status != JobStatus.running:
                return False
            self._update_progress(state)
            state.progress = state.spec.work
            state.checkpointed = state.spec.work
            self._release(state)
            state.status = JobStatus.done
            state.end_time = self.now
            del self.running[state.spec.id]
            return self.replan_on_events
        if kind == EventKind.NODE:
            event = self.workload.node_events[int(ref)]
            node = self.nodes[event.node]
            if node.schedulable:
                self._free_hist[(node.free, node.spec.gpus)] -= 1
            if event.kind == "fail":
                self._fail_node(node)
            elif event.kind == "drain":
                node.draining = True
            else:
                if not node.up:
                    self._available += node.spec.gpus
                node.up = True
                node.draining = False
            if node.schedulable:
                self._free_hist[(node.free, node.spec.gpus)] += 1
            self._frag_cache = None
            return True
        if kind == EventKind.DUMPED:
            return False
        if kind == EventKind.DEMAND:
            following = self.now + HOUR
            if following <= (self.drain_cap if self.drain else self.workload.horizon):
                self._push(following, EventKind.DEMAND)
            return True
        raise AssertionError(kind)

    # ------------------------------------------------------------ accounting
    def _advance(self, time: float) -> None:
        dt = time - self.now
        if dt > EPS:
            if self.idle is not None:  # reads the state held since the last event
                self.idle.add(self, self.now, time)
            c = self.counters
            c.allocated_gpu_seconds += self._allocated * dt
            c.available_gpu_seconds += self._available * dt
            c.capacity_gpu_seconds += self._total_gpus * dt
            service_gpus, serving_gpus = self._service_usage()
            c.service_gpu_seconds += service_gpus * dt
            c.serving_gpu_seconds += serving_gpus * dt
            c.block_gpu_seconds += (self._allocated - service_gpus) * dt
            c.block_job_seconds += len(self.running) * dt
            idle, fragmented = self._idle_and_fragmented()
            c.idle_gpu_seconds += idle * dt
            c.fragmented_gpu_seconds += fragmented * dt
            self._integrate_services(self.now, time)
            self._sample(self.now)
            if self._draining:  # after the sample, which reads the dumps still running
                self._integrate_draining(self.now, time)
        self.now = max(self.now, time)

    def _integrate_draining(self, t0: float, t1: float) -> None:
        """Charge free GPUs still dumping a departed job's checkpoint to that job."""
        for key, until in list(self._draining.items()):
            node_name, index = key
            node = self.nodes[node_name]
            seconds = min(t1, until) - t0
            if seconds > 0 and node.up and node.owners[index] is None:
                job = self.jobs[node.busy_job[index]]
                job.ledger.allocated += seconds
                job.ledger.charge(node.busy_kind[index], seconds)
                self.counters.draining_gpu_seconds += seconds
            if until <= t1 + EPS:
                del self._draining[key]

    def _dumping_free(self, time: float) -> int:
        """Free GPUs still dumping a checkpoint at ``time`` (constant until the next event)."""
        count = 0
        for (node_name, index), until in self._draining.items():
            node = self.nodes[node_name]
            count += until > time + EPS and node.up and node.owners[index] is None
        return count

    def _mark_busy(
        self, placement: dict[str, tuple[int, ...]], seconds: float, job: str, kind: str
    ) -> None:
        """GPUs just left by ``job`` dump its checkpoint for ``seconds`` more."""
        for node_name, indices in placement.items():
            node = self.nodes[node_name]
            for index in indices:
                until = max(node.busy_until[index], self.now + seconds)
                node.busy_until[index] = until
                node.busy_kind[index] = kind
                node.busy_job[index] = job
                self._draining[(node_name, index)] = until
        self._push(self.now + seconds, EventKind.DUMPED)

    def _service_usage(self) -> tuple[int, float]:
        """GPUs held by services, and the part of them that serves demand now."""
        held_total = 0
        serving = 0.0
        for svc in self.services.values():
            held = svc.replicas * svc.spec.gpus_per_replica
            held_total += held
            capacity = self._service_capacity(svc)
            if capacity > 0:
                # Replicas reserved beyond demand are allocated but idle.
                serving += held * min(1.0, svc.spec.demand_at(self.now) / capacity)
        return held_total, serving

    def _sample(self, time: float) -> None:
        idle, fragmented = self._idle_and_fragmented()
        frag = fragmented / idle if idle else 0.0
        held, serving = self._service_usage() if self.services else (0, 0.0)
        busy = self._allocated - held + serving + self._dumping_free(time)
        point = (time, busy, self._available, len(self.queue), frag)
        if self.timeline and abs(self.timeline[-1][0] - time) < EPS:
            self.timeline[-1] = point
        else:
            self.timeline.append(point)

    def _idle_and_fragmented(self) -> tuple[int, int]:
        """Idle GPUs, and those of them on nodes too full for the smallest queued job."""
        if self._frag_cache is not None:
            return self._frag_cache
        smallest = min(self._pending_sizes) if self._pending_sizes else 0
        idle = 0
        fragmented = 0
        for (free, size), count in self._free_hist.items():
            idle += free * count
            if smallest and free < min(smallest, size):
                fragmented += free * count
        self._frag_cache = (idle, fragmented)
        return idle, fragmented

    def _integrate_services(self, t0: float, t1: float) -> None:
        # Demand is constant within an hour; split the interval at hour boundaries.
        t = t0
        while t < t1 - EPS:
            hour = int(t // 3600)
            t_end = min(t1, (hour + 1) * 3600.0)
            dt = t_end - t
            for svc in self.services.values():
                demand = svc.spec.demand_at(t)
                served = min(demand, self._service_capacity(svc))
                bucket = self.service_hours.setdefault((svc.spec.id, hour), [0.0, 0.0])
                bucket[0] += demand * dt
                bucket[1] += served * dt
                self.counters.demand_seconds += demand * dt
                self.counters.unmet_demand_seconds += (demand - served) * dt
            t = t_end

    def dumping_gpus(self) -> list[tuple[str, str]]:
        """(node, job) of every free GPU still dumping a checkpoint of a job that left it."""
        return [
            (node_name, self.nodes[node_name].busy_job[index])
            for (node_name, index), until in self._draining.items()
            if until > self.now + EPS
            and self.nodes[node_name].up
            and self.nodes[node_name].owners[index] is None
        ]

    def service_capacity(self, svc: SimService) -> float:
        """Replicas of demand the service serves now (a replica serves its model's speed)."""
        return self._service_capacity(svc)

    def _service_capacity(self, svc: SimService) -> float:
        models = self.workload.gpu_models
        return sum(
            len(reps) * models[self.nodes[node].spec.gpu_model].speed
            for node, reps in svc.placement.items()
        )

    # -------------------------------------------------------------- job state
    def _enqueue(self, state: SimJob) -> None:
        state.status = JobStatus.queued
        state.queued_since = self.now
        self.queue[state.spec.id] = state
        self._pending_sizes[state.spec.min_size] += 1  # the fewest GPUs it may start on
        self._frag_cache = None

    def _dequeue(self, state: SimJob) -> None:
        del self.queue[state.spec.id]
        size = state.spec.min_size
        self._pending_sizes[size] -= 1
        if not self._pending_sizes[size]:
            del self._pending_sizes[size]
        self._frag_cache = None
        state.queue_wait += self.now - state.queued_since

    def _update_progress(self, state: SimJob) -> None:
        if state.status != JobStatus.running:
            return
        begin = max(state.updated_at, state.overhead_until)
        if self.now > begin:
            before = state.progress
            state.progress = min(state.spec.work, state.progress + (self.now - begin) * state.rate)
            state.ledger.add_progress(state.progress - before, state.rate, state.gpus_held)
        state.updated_at = self.now
        interval = state.spec.checkpoint_interval
        if interval > 0:
            # The EPS absorbs float drift at a checkpoint boundary; never beyond progress.
            last = min(state.progress, math.floor(state.progress / interval + EPS) * interval)
            state.checkpointed = max(state.checkpointed, last)

    def _schedule_completion(self, state: SimJob) -> None:
        state.version += 1
        begin = max(self.now, state.overhead_until)
        remaining = max(0.0, state.spec.work - state.progress)
        state.expected_end = begin + remaining / state.rate
        self._push(
            begin + remaining / state.rate, EventKind.COMPLETION, state.spec.id, state.version
        )

    def _rate(self, job: BlockJob, placement: dict[str, tuple[int, ...]]) -> float:
        """A gang runs at its slowest GPU: the least, over the models it holds, of the job's
        speed there (its own, else the model's); an elastic job × its size factor."""
        models = self.workload.gpu_models
        speed = min(job.speed_on(models[self.nodes[node].spec.gpu_model]) for node in placement)
        if job.elastic:
            speed *= job.size_factor(sum(len(indices) for indices in placement.values()))
        return speed

    # ------------------------------------------------------------ GPU owners
    def _take(
        self, node: SimNode, count: int, owner: str, kind: str, prefer: tuple[int, ...] = ()
    ) -> tuple[int, ...]:
        """Take ``count`` free GPUs of ``node``: those in ``prefer`` first (a job keeping
        the GPUs it held), then the lowest free indices."""
        taken = [index for index in prefer if node.owners[index] is None][:count]
        for index, current in enumerate(node.owners):
            if len(taken) == count:
                break
            if current is None and index not in taken:
                taken.append(index)
        if len(taken) < count:
            raise AssertionError(f"node {node.spec.name}: {count} GPUs not free")
        for index in taken:
            node.owners[index] = owner
            if self.record_occupancy:
                self._open_segments[(node.spec.name, index)] = (self.now, owner, kind)
        if node.schedulable:
            self._free_hist[(node.free, node.spec.gpus)] -= 1
            self._free_hist[(node.free - count, node.spec.gpus)] += 1
        node.free -= count
        self._allocated += count
        self._frag_cache = None
        return tuple(taken)

    def _give_back(self, node_name: str, indices: tuple[int, ...], owner: str) -> None:
        node = self.nodes[node_name]
        for index in indices:
            if node.owners[index] != owner:
                raise AssertionError(f"GPU {node_name}/{index} not held by {owner}")
            node.owners[index] = None
            if self.record_occupancy:
                start, seg_owner, kind = self._open_segments.pop((node_name, index))
                if self.now > start + EPS:
                    self.segments.append(
                        Segment(node_name, index, start, self.now, seg_owner, kind)
                    )
        if node.schedulable:
            self._free_hist[(node.free, node.spec.gpus)] -= 1
            self._free_hist[(node.free + len(indices), node.spec.gpus)] += 1
        node.free += len(indices)
        self._allocated -= len(indices)
        self._frag_cache = None

    def _release(self, state: SimJob) -> None:
        self._settle_hold(state)
        for node, indices in state.placement.items():
            self._give_back(node, indices, state.spec.id)
        state.placement = {}

    def _settle_hold(self, state: SimJob) -> None:
        """Book the GPU-time held since ``held_since``, and its overhead intervals."""
        gpus = state.gpus_held
        state.ledger.allocated += gpus * (self.now - state.held_since)
        for kind, start, end in state.overheads:
            seconds = min(end, self.now) - max(start, state.held_since)
            if seconds > 0:
                state.ledger.charge(kind, gpus * seconds)
        state.held_since = self.now

    def _remote_seconds(self, state: SimJob) -> float:
        """What sending the job's image to the cluster it was just placed in costs (0 when
        it is there already); the image is there from now on."""
        cluster = self.nodes[next(iter(state.placement))].spec.cluster
        if state.location is None or state.location == cluster:
            return 0.0
        state.location = cluster
        self.counters.remote_starts += 1
        self.counters.gib_crossed += state.spec.image_gb
        return self.workload.transfer.remote_seconds(state.spec.image_gb)

    def _overheads(
        self, own: list[tuple[str, float]], placement: dict[str, tuple[int, ...]]
    ) -> tuple[float, list[tuple[str, float, float]]]:
        """The overhead intervals of a job just placed, and when it may compute.

        Its own costs (sending its image from another cluster, a restore, or a migration's
        checkpoint and restore) come first, one after the other; then, if a GPU it took is
        still dumping a previous owner's checkpoint, the wait for the slowest of them,
        charged as that dump's kind.
        """
        intervals: list[tuple[str, float, float]] = []
        ready = self.now
        for kind, seconds in own:
            if seconds > 0:
                intervals.append((kind, ready, ready + seconds))
                ready += seconds
        slowest = ("", 0.0)
        for name, indices in placement.items():
            node = self.nodes[name]
            for index in indices:
                if node.busy_until[index] > slowest[1]:
                    slowest = (node.busy_kind[index], node.busy_until[index])
        if slowest[1] > ready:
            intervals.append((slowest[0], ready, slowest[1]))
            ready = slowest[1]
        return ready, intervals

    # ----------------------------------------------------------------- nodes
    def _fail_node(self, node: SimNode) -> None:
        if node.up:
            self._available -= node.spec.gpus
        node.up = False
        self._frag_cache = None
        victims = [s for s in self.running.values() if node.spec.name in s.placement]
        for state in victims:
            self._stop(state, checkpoint=False, by_policy=False)
        for svc in self.services.values():
            reps = svc.placement.pop(node.spec.name, [])
            for indices in reps:
                self._give_back(node.spec.name, indices, svc.spec.id)

    # ---------------------------------------------------------------- checks
    def _check_placement(
        self, placement: dict[str, int], models_ok: Callable[[str], bool]
    ) -> str | None:
        if not placement or any(count <= 0 for count in placement.values()):
            return "empty placement"
        for name, count in placement.items():
            node = self.nodes.get(name)
            if node is None:
                return f"unknown node {name}"
            if not node.schedulable:
                return f"node {name} not schedulable"
            if not models_ok(node.spec.gpu_model):
                return f"model {node.spec.gpu_model} not allowed"
            if node.free < count:
                return f"node {name}: {count} GPUs requested, {node.free} free"
        return None

    def _reject(self, why: str) -> None:
        self.counters.rejected_actions += 1
        self.counters.rejections[why.split(":")[0].split(" ")[0]] += 1

    # ------------------------------------------------------------- the plan
    def apply(self, plan: SimPlan) -> None:
        """Apply a plan's actions in a fixed, physically sensible order.

        Preemptions and service shrinks free GPUs first; then every migrating or rescaled
        job is lifted off its GPUs (a rescale that shrinks frees some), the rescales land,
        then the migrations, services grow and jobs start. A move whose target is not free
        lands back where it was, at no cost, or, where that is taken too, leaves the job
        queued (``stranded``: the policy owes it a place).
        """
        starts = [a for a in plan.actions if isinstance(a, Start)]
        preempts = [a for a in plan.actions if isinstance(a, Preempt)]
        migrates = [a for a in plan.actions if isinstance(a, Migrate)]
        rescales = [a for a in plan.actions if isinstance(a, Rescale)]
        resizes = [a for a in plan.actions if isinstance(a, Resize)]
        for stop in preempts:
            state = self.running.get(stop.job)
            if state is None:
                self._reject(f"preempt {stop.job}: not running")
                continue
            if not state.spec.preemptible:
                self._reject(f"preempt {stop.job}: not preemptible")
                continue
            state.acted_at.append(self.now)
            self._stop(state, checkpoint=stop.checkpoint)
        grows = []
        services_before: dict[str, dict[str, int]] = {}
        for resize in resizes:
            svc = self.services.get(resize.service)
            if svc is None:
                self._reject(f"resize {resize.service}: unknown service")
                continue
            services_before[svc.spec.id] = svc.replicas_by_node()
            grows.append((svc, self._shrink_service(svc, resize.placement)))
        lifted: list[tuple[Migrate, SimJob, dict[str, tuple[int, ...]]]] = []
        lifted_ids: set[str] = set()
        for move in migrates:
            state = self.running.get(move.job)
            if state is None:
                self._reject(f"migrate {move.job}: not running")
                continue
            if not state.spec.checkpointable:
                self._reject(f"migrate {move.job}: not checkpointable")
                continue
            if move.job in lifted_ids:
                self._reject(f"migrate {move.job}: moved twice")
                continue
            # The GPUs it holds now: an elastic job may run at another size than it asks.
            if sum(move.placement.values()) != state.gpus_held:
                self._reject(f"migrate {move.job}: wrong GPU count")
                continue
            source = self._lift(state, move.placement)
            if source is not None:
                lifted.append((move, state, source))
                lifted_ids.add(move.job)
        rescaled: list[tuple[Rescale, SimJob, dict[str, tuple[int, ...]]]] = []
        for rescale in rescales:
            state = self.running.get(rescale.job)
            why = None
            if state is None:
                why = "not running"
            elif not state.spec.elastic:
                why = "not elastic"
            elif not state.spec.checkpointable:
                why = "not checkpointable"
            elif rescale.job in lifted_ids:
                why = "moved twice"
            elif not (
                state.spec.min_size <= sum(rescale.placement.values()) <= state.spec.max_size
            ):
                why = "wrong GPU count"
            if why is not None or state is None:
                self._reject(f"rescale {rescale.job}: {why}")
                continue
            source = self._lift(state, rescale.placement)
            if source is not None:
                rescaled.append((rescale, state, source))
                lifted_ids.add(rescale.job)
        # Rescales land first: each keeps the GPUs it held where it can, and marks those
        # it leaves as dumping its checkpoint before a migration may land on them.
        for rescale, state, source in rescaled:
            why = self._check_placement(rescale.placement, state.spec.can_run_on)
            if why is not None:
                self._reject(f"rescale {rescale.job}: {why}")
                self._land_back(state, source, "resize", prefer=True)
                continue
            self._rescale(state, source, rescale.placement)
        for move, state, source in lifted:
            why = self._check_placement(move.placement, state.spec.can_run_on)
            if why is not None:
                self._reject(f"migrate {move.job}: {why}")
                self._land_back(state, source, "migration")
                continue
            self._migrate(state, source, move.placement)
        for svc, target in grows:
            self._grow_service(svc, target)
            if svc.replicas_by_node() != services_before[svc.spec.id]:
                svc.resized_at.append(self.now)
        for start in starts:
            state = self.queue.get(start.job)
            if state is None:
                self._reject(f"start {start.job}: not queued")
                continue
            # An elastic job may start on any size it runs on; a rigid one on its own.
            count = sum(start.placement.values())
            if not state.spec.min_size <= count <= state.spec.max_size:
                self._reject(f"start {start.job}: wrong GPU count")
                continue
            why = self._check_placement(start.placement, state.spec.can_run_on)
            if why is not None:
                self._reject(f"start {start.job}: {why}")
                continue
            state.acted_at.append(self.now)
            state.stranded = False
            self._start(state, start.placement)
        if self.check_invariants:
            self.assert_invariants()

    def _lift(self, state: SimJob, target: dict[str, int]) -> dict[str, tuple[int, ...]] | None:
        """Take a job about to move or be rescaled off its GPUs, its progress brought up to
        now; the GPUs it held, or None when ``target`` is where it is (nothing to do)."""
        if {n: len(i) for n, i in state.placement.items()} == target:
            return None
        self._update_progress(state)
        source = state.placement
        self._release(state)
        state.acted_at.append(self.now)
        return source

    def _land_back(
        self,
        state: SimJob,
        source: dict[str, tuple[int, ...]],
        kind: str,
        *,
        prefer: bool = False,
    ) -> None:
        """A lifted job whose target is taken: back on its source's nodes at no cost, or,
        where they are taken too, queued with its progress checkpointed (the move's dump is
        paid on the GPUs it left)."""
        target = {n: len(i) for n, i in source.items()}
        if self._check_placement(target, state.spec.can_run_on) is None:
            self._place(state, target, source if prefer else None)  # stays: no cost
            state.version += 1
            self._schedule_completion(state)
            state.acted_at.pop()  # nothing happened to it after all
            return
        # Lifted but nowhere to land: it was checkpointed, so it waits queued, and the
        # policy owes it a place (``SolverPlanner`` marks it overdue).
        seconds = self.workload.transfer.checkpoint_seconds(state.spec.image_gb)
        self._mark_busy(source, seconds, state.spec.id, kind)
        state.checkpointed = state.progress
        state.stranded = True
        del self.running[state.spec.id]
        self._requeue_after_loss(state)

    def _place(
        self,
        state: SimJob,
        placement: dict[str, int],
        prefer: dict[str, tuple[int, ...]] | None = None,
    ) -> None:
        prefer = prefer or {}
        state.placement = {
            name: self._take(
                self.nodes[name], count, state.spec.id, state.spec.kind.value, prefer.get(name, ())
            )
            for name, count in placement.items()
        }
        state.rate = self._rate(state.spec, state.placement)
        state.updated_at = self.now
        state.run_start = self.now
        state.held_since = self.now

    def _start(self, state: SimJob, placement: dict[str, int]) -> None:
        self._dequeue(state)
        self._place(state, placement)
        state.status = JobStatus.running
        if state.first_start is None:
            state.first_start = self.now
        transfer = self.workload.transfer
        costs = [("migration", self._remote_seconds(state))]
        if state.progress > 0:
            costs.append(("checkpoint", transfer.restore_seconds(state.spec.image_gb)))
        state.overhead_until, state.overheads = self._overheads(costs, state.placement)
        self.running[state.spec.id] = state
        self._schedule_completion(state)

    def _migrate(
        self, state: SimJob, source: dict[str, tuple[int, ...]], target: dict[str, int]
    ) -> None:
        transfer = self.workload.transfer
        # The source's GPUs dump the checkpoint while the target's wait for it and restore.
        checkpoint = transfer.checkpoint_seconds(state.spec.image_gb)
        self._mark_busy(source, checkpoint, state.spec.id, "migration")
        self._place(state, target)
        cost = transfer.migration_seconds(state.spec.image_gb) + self._remote_seconds(state)
        state.overhead_until, state.overheads = self._overheads(
            [("migration", cost)], state.placement
        )
        state.migrations += 1
        state.moved_at.append(self.now)
        self.counters.migrations += 1
        self._schedule_completion(state)

    def _rescale(
        self, state: SimJob, source: dict[str, tuple[int, ...]], target: dict[str, int]
    ) -> None:
        """An elastic job's checkpoint and restart on ``target`` (another size, maybe other
        nodes), priced as a migration: the GPUs it leaves dump the checkpoint, and every
        GPU it holds after makes no progress for the checkpoint and the restore. It keeps
        the GPUs it held where ``target`` leaves it some."""
        transfer = self.workload.transfer
        checkpoint = transfer.checkpoint_seconds(state.spec.image_gb)
        self._mark_busy(source, checkpoint, state.spec.id, "resize")
        self._place(state, target, source)
        cost = transfer.migration_seconds(state.spec.image_gb) + self._remote_seconds(state)
        state.overhead_until, state.overheads = self._overheads([("resize", cost)], state.placement)
        state.checkpointed = state.progress  # the restart reads the checkpoint it wrote
        state.resizes += 1
        state.moved_at.append(self.now)
        self.counters.resizes += 1
        self._schedule_completion(state)

    def _stop(self, state: SimJob, *, checkpoint: bool, by_policy: bool = True) -> None:
        self._update_progress(state)
        transfer = self.workload.transfer
        placement = state.placement
        self._release(state)
        if checkpoint and state.spec.checkpointable:
            seconds = transfer.checkpoint_seconds(state.spec.image_gb)
            self._mark_busy(placement, seconds, state.spec.id, "checkpoint")
            state.checkpointed = state.progress
        del self.running[state.spec.id]
        if by_policy:
            state.preemptions += 1
            state.preempted_at.append(self.now)
            self.counters.preemptions += 1
        else:
            self.counters.evictions += 1
        self._requeue_after_loss(state)

    def _requeue_after_loss(self, state: SimJob) -> None:
        lost = state.progress - state.checkpointed
        if lost > EPS:
            state.ledger.lost += state.ledger.take_back(lost)
        state.progress = state.checkpointed
        state.version += 1
        self._enqueue(state)

    # --------------------------------------------------------------- services
    def _shrink_service(self, svc: SimService, target: dict[str, int]) -> dict[str, int]:
        for node_name in list(svc.placement):
            reps = svc.placement[node_name]
            keep = target.get(node_name, 0)
            while len(reps) > keep:
                self._give_back(node_name, reps.pop(), svc.spec.id)
            if not reps:
                del svc.placement[node_name]
        return target

    def _grow_service(self, svc: SimService, target: dict[str, int]) -> None:
        per = svc.spec.gpus_per_replica
        for node_name, want in target.items():
            node = self.nodes.get(node_name)
            if node is None or not node.schedulable:
                self._reject(f"resize {svc.spec.id}: node {node_name} not schedulable")
                continue
            if not svc.spec.can_run_on(node.spec.gpu_model):
                self._reject(f"resize {svc.spec.id}: model not allowed")
                continue
            reps = svc.placement.setdefault(node_name, [])
            while len(reps) < want:
                if node.free < per:
                    self._reject(f"resize {svc.spec.id}: node {node_name} full")
                    break
                reps.append(self._take(node, per, svc.spec.id, "service"))
            if not reps:
                del svc.placement[node_name]

    # ------------------------------------------------------------------ end
    def _close(self, end: float) -> None:
        for state in self.running.values():
            self._update_progress(state)
            if state.spec.checkpointable:
                state.checkpointed = state.progress
            self._settle_hold(state)
        for state in self.queue.values():
            state.queue_wait += end - state.queued_since
            state.queued_since = end
        for state in self.jobs.values():
            kept = state.spec.work if state.status == JobStatus.done else state.checkpointed
            state.ledger.close(kept_work=kept)
        self._sample(end)
        if self.record_occupancy:
            for (node, index), (start, owner, kind) in self._open_segments.items():
                if end > start + EPS:
                    self.segments.append(Segment(node, index, start, end, owner, kind))
        if self.check_invariants:
            self.assert_invariants()
            self.check_ledger()

    def check_ledger(self) -> float:
        """The GPU-time conservation law (``sim.ledger``); returns the gap in GPU-seconds."""
        c = self.counters
        return check(
            ((job_id, state.ledger) for job_id, state in self.jobs.items()),
            allocated_total=c.block_gpu_seconds + c.draining_gpu_seconds,
        )

    def assert_invariants(self) -> None:
        """Conservation: every GPU has at most one owner and every owner knows its GPUs."""
        seen: dict[tuple[str, int], str] = {}
        for state in self.running.values():
            assert state.status == JobStatus.running, state.spec.id
            assert state.spec.min_size <= state.gpus_held <= state.spec.max_size, state.spec.id
            for node, indices in state.placement.items():
                for index in indices:
                    key = (node, index)
                    assert key not in seen, f"GPU {key} double-allocated"
                    seen[key] = state.spec.id
        for svc in self.services.values():
            for node, reps in svc.placement.items():
                for indices in reps:
                    for index in indices:
                        key = (node, index)
                        assert key not in seen, f"GPU {key} double-allocated"
                        seen[key] = svc.spec.id
        owners = {
            (name, index): owner
            for name, node in self.nodes.items()
            for index, owner in enumerate(node.owners)
            if owner is not None
        }
        assert owners == seen, "node owner table disagrees with placements"
        assert self._allocated == len(seen)
        for state in self.jobs.values():
            assert state.progress <= state.spec.work + EPS, state.spec.id
            assert state.checkpointed <= state.progress + EPS, state.spec.id
            in_queue = state.spec.id in self.queue
            in_running = state.spec.id in self.running
            assert in_queue + in_running + (state.status == JobStatus.done) == 1, state.spec.id
        hist: Counter[tuple[int, int]] = Counter()
        for name, node_state in self.nodes.items():
            if not node_state.up:
                assert all(owner is None for owner in node_state.owners), name
            assert node_state.free == sum(owner is None for owner in node_state.owners), name
            if node_state.schedulable:
                hist[(node_state.free, node_state.spec.gpus)] += 1
        assert +self._free_hist == hist, "free-GPU histogram out of date"
        done = sum(1 for state in self.jobs.values() if state.status == JobStatus.done)
        assert len(self.jobs) == done + len(self.running) + len(self.queue), "jobs not conserved"

    # -------------------------------------------------------------- helpers
    def job_specs_not_arrived(self) -> int:
        return len(self.workload.jobs) - len(self.jobs)

    def free_gpus(self, node: str) -> int:
        return self.nodes[node].free
