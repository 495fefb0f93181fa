"""The bridge between the simulation and the solver: state → ``Instance``, ``Plan`` → actions.

This is the only module of ``sim`` that knows the solver's types. The simulator plans with
exactly what the live control plane uses: ``solver.policies.get_policy(name).plan(instance)``,
checked by ``solver.validate.validate`` before anything is applied, as dispatch does.

Mapping (simulation → solver):

* a block job of ``g`` GPUs is ``Job(shape=block, replicas=g, gpus_per_replica=1)`` with
  ``max_nodes`` = the fewest nodes of its largest compatible node size that hold it (a
  4-GPU job stays on one 8-GPU node; a 16-GPU job spans two), its remaining run time at
  reference speed as ``expected_runtime_s``, its image size as ``checkpoint_size_mib`` and
  the time its last periodic checkpoint was written as ``last_checkpoint_time``, its own
  speeds on GPU models (``BlockJob.speeds``, e.g. Gavel's job types) in ``Instance.speeds``. The run
  time is ``runtime`` (:class:`RuntimeMode`): by default exact (traces record the real
  duration); ``predicted`` is what ``forecast.duration`` predicts from the jobs that
  finished before in this run (team, kind, GPUs; traces carry no user estimate) — as a
  site would know it — less the work done; a job past its prediction is expected to run
  as long again as it has (durations are heavy-tailed: the longer a job has run, the
  longer it is likely to go on); ``none`` gives no run time (jobs never end early, as
  for a scheduler that reports no time limit);
* an elastic training job (``BlockJob.max_gpus``) gives ``min_replicas``/``max_replicas``
  = its ``min_gpus``/``max_gpus``, ``replicas`` = the ``gpus`` it asks (its placement
  says what it holds), and ``max_nodes`` for the GPUs it asks (grown, it may spread over
  proportionally more: ``Job.node_limit``); a running one's
  run time is from its current run's start at its current size, a pending one's at its
  asked size (on ``g`` GPUs it runs ``(g / gpus) ** scaling`` times as fast);
* a service is ``Job(shape=elastic)`` whose ``forecast`` is its hourly demand from the
  current hour over ``forecast_hours`` hours, in replicas: demand is stated in replicas
  at reference speed and a replica on a slower model serves less, so it is converted at
  the speed of the GPUs the service holds (``_replicas_for``). Where the demand comes from
  is ``forecast`` (:class:`ForecastMode`): by default the simulator gives the policy a
  perfect forecast, as the study it reproduces does; ``model`` forecasts as the control
  plane does (``forecast.demand``: the SLA's quantile of an ETS forecast over the hourly
  demand of the last week, the same forecaster and quantile rule as
  ``app.shaping.snapshot``); ``peak`` reserves the highest hourly demand of that week at
  every step (the daily-peak reservation the forecast replaces). A service present when
  the simulation starts has run before it: its history before ``t = 0`` is its own curve;
  one that starts later has history from its start only;
* nodes carry their state (ready, draining, down); a team's SLA policy comes from the
  scenario; the migration cost model is the simulator's ``Transfer``;
* Shaper's own history of a job, for its dwell time and move budget: under the shaper
  policy (``feeds_history``), ``last_acted_at`` and ``actions_last_hour`` come from the
  actions its plans took on the job (``SimJob.acted_at``: starts, migrations,
  preemptions, requeues). The baselines stand for the sites' own schedulers, not for
  Shaper: they get no history, so their jobs are never frozen. A job lifted for a
  migration that could not land is ``overdue`` until it starts again. Nothing is ever
  ``locked``: the simulator applies a plan at once, no action stays in flight.

Several clusters (a workload whose nodes name more than one ``cluster``): a job is
submitted to one (``BlockJob.cluster``) and its image is where it last ran
(``SimJob.location``). By default each cluster is planned alone, as today's schedulers
do: one instance per cluster with its nodes, the jobs submitted there and the services
it serves, each planned by the policy on its own. A policy named ``federated-NAME``
plans the clusters as one federation group: one instance over all of them, where a
pending job may start in any cluster its residency permits (``BlockJob.cluster_selector``
and ``allowed_clusters`` over ``Workload.cluster_labels``, by
``solver.federation.residency_clusters``; where its image is, always) with
``Job.home_cluster`` = where its image is, so starting elsewhere costs the transfer
(``MigrationCostModel.remote_start_seconds``), while a running job moves only within its
cluster and a service stays in its own.

Mapping back: ``start`` → :class:`~sim.actions.Start`, ``migrate`` → ``Migrate``,
``resize`` → ``Resize`` for a service (GPUs per node / GPUs per replica) and ``Rescale``
for an elastic training job (its whole new placement), ``preempt`` → ``Preempt``
without checkpoint (work since the last checkpoint is lost), ``requeue`` → ``Preempt``
with checkpoint.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from enum import StrEnum
from typing import TYPE_CHECKING

from forecast import demand as demand_forecast
from forecast.duration import DurationPredictor, JobFeatures
from sim.actions import Action, Migrate, Preempt, Rescale, Resize, SimPlan, Start
from solver.federation import Residency, residency_clusters, split_by_cluster
from solver.instance import (
    GpuModel,
    Instance,
    Job,
    JobShape,
    MigrationCostModel,
    Node,
    NodeState,
    SlaPolicy,
    SolverConfig,
)
from solver.plan import ActionKind, Plan
from solver.policies import get_policy
from solver.validate import validate

if TYPE_CHECKING:
    from sim.engine import SimJob, SimService, Simulation

FORECAST_HOURS = 24
HOUR = 3600.0
DAY = 86400.0


HISTORY_HOURS = demand_forecast.HISTORY_DAYS * 24


class ForecastMode(StrEnum):
    perfect = "perfect"
    model = "model"
    peak = "peak"


class RuntimeMode(StrEnum):
    exact = "exact"
    predicted = "predicted"
    none = "none"  # no run time at all: what the control plane knew before forecast.duration


class PlanRejected(RuntimeError):
    """The policy returned a plan that the solver's own validator refuses."""


FEDERATED = "federated-"


def split_policy_name(name: str) -> tuple[str, bool]:
    """``federated-shaper`` → (``shaper``, True); ``shaper`` → (``shaper``, False)."""
    if name.startswith(FEDERATED):
        return name.removeprefix(FEDERATED), True
    return name, False


class SolverPlanner:
    """Plans each cycle with one of the solver's policies (fifo, backfill, priority, shaper)."""

    def __init__(
        self,
        policy: str,
        *,
        validate: bool = True,
        forecast_hours: int = FORECAST_HOURS,
        config_overrides: dict[str, object] | None = None,
        feeds_history: bool | None = None,
        forecast: ForecastMode | str = ForecastMode.perfect,
        runtime: RuntimeMode | str = RuntimeMode.exact,
    ) -> None:
        self.name = policy
        base, self.federated = split_policy_name(policy)
        self.forecast_mode = ForecastMode(forecast)
        self.forecaster = demand_forecast.DemandForecaster()
        self.runtime_mode = RuntimeMode(runtime)
        self.durations = DurationPredictor()
        self._unfinished: set[str] = set()  # block jobs queued or running at the last plan
        self.policy = get_policy(base)
        # Only Shaper's own actions freeze a job (see the module docstring).
        self.feeds_history = base == "shaper" if feeds_history is None else feeds_history
        self._clusters: list[str] = []
        self.validate = validate
        self.forecast_hours = forecast_hours
        self.config_overrides = dict(config_overrides or {})
        self._static: (
            tuple[tuple[GpuModel, ...], tuple[SlaPolicy, ...], MigrationCostModel, SolverConfig]
            | None
        ) = None
        self._largest_node: dict[str, int] = {}
        # Solver objects are immutable: reuse them while the simulated thing is unchanged.
        # ``model_construct`` skips per-field validation (the values come from a validated
        # workload); the Instance itself is still validated, references included.
        self._node_cache: dict[tuple[str, NodeState], Node] = {}
        self._job_cache: dict[str, tuple[tuple[object, ...], Job]] = {}
        self.invalid_plans = 0
        self.last_violations: list[str] = []
        # Which engine's plan won each re-plan ("greedy", "cp-sat", …), for the benchmark.
        self.engines: Counter[str] = Counter()

    # ------------------------------------------------------------ instance
    def _static_parts(
        self, sim: Simulation
    ) -> tuple[tuple[GpuModel, ...], tuple[SlaPolicy, ...], MigrationCostModel, SolverConfig]:
        if self._static is None:
            workload = sim.workload
            models = tuple(
                GpuModel(
                    name=m.name,
                    memory_mib=m.memory_gb * 1024,
                    precisions=frozenset({"fp32", "fp16", "bf16"} | ({"fp8"} if m.fp8 else set())),
                    speed=m.speed,
                )
                for m in workload.gpu_models.values()
            )
            # Every team gets an explicit policy (the default one unless the scenario says
            # otherwise), so the solver never has to make one up per job and per look-up.
            teams = {job.team for job in workload.jobs} | {s.team for s in workload.services}
            declared = dict(workload.sla_policies)
            policies = tuple(
                SlaPolicy.model_validate({"team": team, **declared.get(team, {})})
                for team in sorted(teams | set(declared))
            )
            transfer = workload.transfer
            migration = MigrationCostModel(
                bandwidth_mib_per_s=transfer.bandwidth_mib_per_s,
                overhead_s=transfer.overhead_s,
                inter_cluster_bandwidth_mib_per_s=transfer.inter_cluster_bandwidth_mib_per_s,
                inter_cluster_overhead_s=transfer.inter_cluster_overhead_s,
                inter_cluster_egress_gpu_s_per_gib=transfer.inter_cluster_egress_gpu_s_per_gib,
            )
            # Reproducible by default: one CP-SAT worker, deterministic time, the run's seed.
            defaults = {"deterministic": True, "num_workers": 1, "seed": workload.seed}
            config = SolverConfig.model_validate(
                {**defaults, **workload.solver_config, **self.config_overrides}
            )
            sizes: dict[str, list[int]] = {}
            for node in workload.nodes:
                sizes.setdefault(node.gpu_model, []).append(node.gpus)
            self._largest_node = {model: max(v) for model, v in sizes.items()}
            self._clusters = workload.clusters
            if len(self._clusters) > 1 and not self.federated:
                homeless = [j.id for j in workload.jobs if j.cluster is None]
                homeless += [s.id for s in workload.services if s.cluster is None]
                if homeless:
                    raise ValueError(
                        f"policy {self.name} plans each of {len(self._clusters)} clusters "
                        f"alone, but {', '.join(homeless[:5])} name no cluster: give each "
                        "job and service a cluster, or use federated-" + self.name
                    )
            self._static = (models, policies, migration, config)
        return self._static

    def instance(self, sim: Simulation) -> Instance:
        models, policies, migration, config = self._static_parts(sim)
        nodes = []
        for sim_node in sim.nodes.values():
            spec = sim_node.spec
            node_state = sim_node.state
            key = (spec.name, node_state)
            node = self._node_cache.get(key)
            if node is None:
                node = Node.model_construct(
                    name=spec.name,
                    cluster=spec.cluster,
                    gpu_model=spec.gpu_model,
                    gpus=spec.gpus,
                    cpu_milli=spec.cpu_milli,
                    memory_mib=spec.memory_mib,
                    labels={},
                    taints=frozenset(),
                    state=node_state,
                    free_gpu_indices=None,
                )
                self._node_cache[key] = node
            nodes.append(node)
        if self.runtime_mode is RuntimeMode.predicted:
            self._learn_durations(sim)
        jobs = [self._block_job(sim, s) for s in sim.running.values()]
        jobs += [self._block_job(sim, s) for s in sim.queue.values()]
        jobs += [self._service(sim, s) for s in sim.services.values()]
        speeds = {
            s.spec.id: dict(s.spec.speeds)
            for s in (*sim.running.values(), *sim.queue.values())
            if s.spec.speeds
        }
        return Instance(
            now=sim.now,
            gpu_models=models,
            nodes=tuple(nodes),
            jobs=tuple(jobs),
            policies=policies,
            migration=migration,
            config=config,
            speeds=speeds,
        )

    @staticmethod
    def _features(state: SimJob) -> JobFeatures:
        spec = state.spec
        return JobFeatures(team=spec.team, kind=spec.kind, gpus=spec.gpus)

    def _learn_durations(self, sim: Simulation) -> None:
        """The jobs done since the last plan teach the predictor their work (the run time
        at reference speed: what the prediction is in)."""
        from sim.engine import JobStatus  # the engine imports this module

        for job_id in self._unfinished.difference(sim.running, sim.queue):
            state = sim.jobs[job_id]
            if state.status is JobStatus.done:
                self.durations.observe(self._features(state), state.spec.work)
        self._unfinished = set(sim.running) | set(sim.queue)

    def _predicted_runtime(self, sim: Simulation, state: SimJob) -> float:
        """Walltime from the current run's start (running) or work (queued) to the
        predicted end (see the module docstring)."""
        predicted = self.durations.predict(self._features(state))
        done = state.progress
        if state.placement and state.rate > 0:
            begin = max(state.updated_at, state.overhead_until)
            done = min(state.spec.work, done + max(0.0, sim.now - begin) * state.rate)
        remaining = predicted - done if predicted > done else max(done, 1.0)
        if not state.placement:
            return remaining
        rate = state.rate if state.rate > 0 else 1.0
        pause = max(0.0, state.overhead_until - sim.now)
        return (sim.now - state.run_start) + pause + remaining / rate

    def _max_nodes(self, spec_gpus: int, allowed: tuple[str, ...]) -> int:
        largest = max(
            (size for model, size in self._largest_node.items() if not allowed or model in allowed),
            default=1,
        )
        return max(1, math.ceil(spec_gpus / max(1, largest)))

    def _block_job(self, sim: Simulation, state: SimJob) -> Job:
        spec = state.spec
        running = bool(state.placement)
        last_checkpoint = None
        if running and spec.checkpoint_interval > 0 and state.rate > 0:
            sim._update_progress(state)
            behind = (state.progress - state.checkpointed) / state.rate
            last_checkpoint = max(state.run_start, state.updated_at - behind)
        runtime: float | None
        if self.runtime_mode is RuntimeMode.none:
            runtime = None
        elif self.runtime_mode is RuntimeMode.predicted:
            runtime = self._predicted_runtime(sim, state)
        elif running:
            # Walltime from the current run's start to its (known) end: exact, as traces are.
            runtime = state.expected_end - state.run_start
        else:
            runtime = max(0.0, spec.work - state.progress)
        moved = sum(1 for t in state.moved_at if t > sim.now - DAY)
        stopped = sum(1 for t in state.preempted_at if t > sim.now - DAY)
        last_acted = None
        acted_last_hour = 0
        if self.feeds_history and state.acted_at:
            last_acted = state.acted_at[-1]
            acted_last_hour = sum(1 for t in state.acted_at if t > sim.now - HOUR)
        clusters, home = self._where(sim, state)
        key = (
            state.version,
            state.gpus_held,  # an elastic job's size changes within a version
            clusters,
            home,
            running,
            last_checkpoint,
            moved,
            stopped,
            runtime,
            last_acted,
            acted_last_hour,
            state.stranded,
        )
        cached = self._job_cache.get(spec.id)
        if cached is not None and cached[0] == key:
            return cached[1]
        job = Job.model_construct(
            id=spec.id,
            team=spec.team,
            shape=JobShape.block,
            priority=spec.priority,
            gpus_per_replica=1,
            replicas=spec.gpus,  # an elastic job's asked size; its placement says what it holds
            # A pod's CPU and memory are spread over its GPUs (one replica per GPU).
            cpu_milli_per_replica=-(-spec.cpu_milli // spec.gpus),
            memory_mib_per_replica=-(-spec.memory_mib // spec.gpus),
            max_nodes=self._max_nodes(spec.gpus, spec.gpu_models),  # at the size it asks
            allowed_gpu_models=frozenset(spec.gpu_models) if spec.gpu_models else None,
            gpu_memory_mib=0,
            precision=None,
            node_selector={},
            tolerations=frozenset(),
            clusters=clusters,
            home_cluster=home,
            submit_time=spec.submit_time,
            start_time=state.run_start if running else None,
            placement={n: len(i) for n, i in state.placement.items()},
            gpu_indices=None,
            expected_runtime_s=runtime,
            checkpointable=spec.checkpointable,
            checkpoint_size_mib=int(spec.image_gb * 1024),
            last_checkpoint_time=last_checkpoint,
            preemptible=spec.preemptible,
            last_moved_at=state.moved_at[-1] if running and state.moved_at else None,
            migrations_today=moved,
            preemptions_today=stopped,
            last_acted_at=last_acted,
            actions_last_hour=acted_last_hour,
            locked=False,
            overdue=state.stranded,
            min_replicas=spec.min_size if spec.elastic else 0,
            max_replicas=spec.max_gpus,
            forecast=(),
            forecast_step_s=3600,
        )
        self._job_cache[spec.id] = (key, job)
        return job

    def _where(self, sim: Simulation, state: SimJob) -> tuple[frozenset[str] | None, str | None]:
        """The clusters a block job may run in, and where its image is (see the module
        docstring); (None, None) when there is one cluster."""
        if len(self._clusters) <= 1:
            return None, None
        if state.placement:
            here = sim.nodes[next(iter(state.placement))].spec.cluster
            return frozenset({here}), here
        if self.federated:
            spec = state.spec
            if not spec.cluster_selector and spec.allowed_clusters is None:
                return None, state.location
            labels = sim.workload.cluster_labels
            rule = Residency(
                cluster_selector=dict(spec.cluster_selector),
                allowed_clusters=(
                    None if spec.allowed_clusters is None else frozenset(spec.allowed_clusters)
                ),
            )
            permitted = residency_clusters({c: labels.get(c, {}) for c in self._clusters}, rule)
            home = frozenset() if state.location is None else frozenset({state.location})
            return permitted | home, state.location
        return frozenset({state.location}) if state.location is not None else None, None

    @staticmethod
    def _replicas_for(sim: Simulation, state: SimService) -> Callable[[float], int]:
        """Demand (replicas at reference speed) → replicas the solver must plan.

        The solver counts replicas; the simulation serves ``speed`` per replica. The
        service's fastest held replicas count first; each further replica is assumed to
        run at the speed of its slowest held one, or of the slowest model it may use when
        it holds none (a placement on faster GPUs shows as spare at the next re-plan)."""
        models = sim.workload.gpu_models
        held = sorted(
            (
                models[sim.nodes[node].spec.gpu_model].speed
                for node, reps in state.placement.items()
                for _ in reps
            ),
            reverse=True,
        )
        allowed = state.spec.gpu_models or tuple(models)
        extra = held[-1] if held else min(models[m].speed for m in allowed)

        def replicas(demand: float) -> int:
            need = demand - 1e-9
            count = 0
            for speed in held:
                if need <= 0:
                    return count
                need -= speed
                count += 1
            return count + max(0, math.ceil(need / extra))

        return replicas

    def _service(self, sim: Simulation, state: SimService) -> Job:
        spec = state.spec
        hour_start = math.floor(sim.now / 3600) * 3600
        to_replicas = self._replicas_for(sim, state)
        demand = self._demand_ahead(sim, state, hour_start)
        forecast = tuple(
            min(spec.max_replicas, max(spec.min_replicas, to_replicas(d))) for d in demand
        )
        per = spec.gpus_per_replica
        return Job.model_construct(
            id=spec.id,
            team=spec.team,
            shape=JobShape.elastic,
            priority=spec.priority,
            gpus_per_replica=per,
            replicas=state.replicas,
            cpu_milli_per_replica=0,
            memory_mib_per_replica=0,
            max_nodes=None,
            allowed_gpu_models=frozenset(spec.gpu_models) if spec.gpu_models else None,
            gpu_memory_mib=0,
            precision=None,
            node_selector={},
            tolerations=frozenset(),
            clusters=(
                frozenset({spec.cluster})
                if spec.cluster is not None and len(self._clusters) > 1
                else None
            ),
            home_cluster=None,
            submit_time=spec.start_time,
            start_time=spec.start_time if state.replicas else None,
            placement={n: len(reps) * per for n, reps in state.placement.items() if reps},
            gpu_indices=None,
            expected_runtime_s=None,
            checkpointable=False,
            checkpoint_size_mib=None,
            last_checkpoint_time=None,
            preemptible=False,
            last_moved_at=None,
            migrations_today=0,
            preemptions_today=0,
            last_acted_at=None,
            actions_last_hour=0,
            locked=False,
            overdue=False,
            min_replicas=spec.min_replicas,
            max_replicas=spec.max_replicas,
            forecast=forecast,
            forecast_step_s=3600,
            forecast_origin=hour_start,
        )

    def _demand_ahead(self, sim: Simulation, state: SimService, hour_start: float) -> list[float]:
        """Demand (reference replicas) of the current hour and the ``forecast_hours - 1``
        after it, as ``forecast_mode`` sees it (see the module docstring)."""
        spec = state.spec
        hours = [hour_start + HOUR * h for h in range(self.forecast_hours)]
        if self.forecast_mode is ForecastMode.perfect:
            return [spec.demand_at(t) for t in hours]
        first = hour_start - HOUR * HISTORY_HOURS
        if spec.start_time > 0:
            first = max(first, math.floor(spec.start_time / HOUR) * HOUR)
        series = [spec.curve_at(first + HOUR * h) for h in range(int((hour_start - first) // HOUR))]
        now = spec.demand_at(sim.now)  # the current hour is observed, not forecast
        if not series:
            return [now] * self.forecast_hours
        if self.forecast_mode is ForecastMode.peak:
            return [max(now, *series)] * self.forecast_hours
        ahead = self.forecaster.forecast(
            spec.id,
            series,
            self.forecast_hours,
            now=sim.now,
            quantile=demand_forecast.quantile_for(spec.sla_target),
        )
        return [now, *(max(0.0, v) for v in ahead.upper[1:])]

    # ---------------------------------------------------------------- plan
    def plan(self, sim: Simulation) -> SimPlan:
        whole = self.instance(sim)
        parts = [whole] if self.federated else split_by_cluster(whole)
        actions: list[Action] = []
        elapsed = 0.0
        statuses = []
        for instance in parts:
            started = time.perf_counter()
            plan = self.policy.plan(instance)
            elapsed += time.perf_counter() - started
            self.engines[plan.stats.engine] += 1
            if self.validate:
                violations = validate(instance, plan)
                if violations:
                    self.invalid_plans += 1
                    self.last_violations = [str(v) for v in violations]
                    raise PlanRejected(
                        f"policy {self.name} at t={sim.now:.0f}: "
                        + "; ".join(self.last_violations[:5])
                    )
            actions += to_actions(plan, sim)
            statuses.append(str(plan.stats.status))
        return SimPlan(
            actions=actions,
            solve_seconds=elapsed,
            status=statuses[0] if len(set(statuses)) == 1 else ",".join(statuses),
            wake_at=self._thaw_time(sim, whole),
        )

    def _thaw_time(self, sim: Simulation, instance: Instance) -> float | None:
        """When the first job frozen by its dwell time or move budget may be acted on
        again: re-planning then is what the live cycle, every 30 s, does on its own."""
        if not self.feeds_history or not instance.frozen_ids:
            return None
        config = instance.config
        limit = config.max_actions_per_job_hour
        thaw = math.inf
        for job_id in instance.frozen_ids:
            state = sim.jobs.get(job_id)
            if state is None or not state.acted_at:
                continue
            recent = [t for t in state.acted_at if t > sim.now - HOUR]
            at = state.acted_at[-1] + config.dwell_s
            if len(recent) >= limit:
                # The budget frees up once enough of the past hour's actions age out.
                at = max(at, recent[len(recent) - limit] + HOUR)
            thaw = min(thaw, at)
        return thaw if math.isfinite(thaw) and thaw > sim.now else None


def to_actions(plan: Plan, sim: Simulation) -> list[Action]:
    actions: list[Action] = []
    for action in plan.actions:
        why = action.reason.code.value
        if action.kind is ActionKind.start:
            actions.append(Start(action.job_id, dict(action.to_placement), why))
        elif action.kind is ActionKind.migrate:
            actions.append(Migrate(action.job_id, dict(action.to_placement), why))
        elif action.kind is ActionKind.resize and action.job_id not in sim.services:
            # An elastic training job (the validator checked it is one): its whole new
            # placement, one GPU a replica.
            placement = {n: gpus for n, gpus in action.to_placement.items() if gpus}
            actions.append(Rescale(action.job_id, placement, why))
        elif action.kind is ActionKind.resize:
            svc = sim.services[action.job_id]
            per = svc.spec.gpus_per_replica
            target = {n: gpus // per for n, gpus in action.to_placement.items() if gpus}
            actions.append(Resize(action.job_id, target, why))
        elif action.kind is ActionKind.preempt:
            actions.append(Preempt(action.job_id, checkpoint=False, reason=why))
        elif action.kind is ActionKind.requeue:
            actions.append(Preempt(action.job_id, checkpoint=True, reason=why))
    return actions
