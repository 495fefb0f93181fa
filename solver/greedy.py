"""Rule-based engine, legal by construction: every change goes through :class:`ClusterState`
and is checked against the hard constraints before it is kept.

One engine, configured by :class:`GreedyOptions`, is behind all four policies:

0. Frozen jobs (``Instance.is_frozen``: Shaper acted on them within the dwell time, their
   move budget is spent, or a saga is acting on them) are left exactly as they are in
   every policy: never started, moved, resized, preempted or requeued, and a frozen
   pending job neither blocks the FIFO queue nor takes a reservation.
   Jobs past their SLA's max queue wait go first, in every order, after services have
   scaled down and before they scale up; strict FIFO and backfill never hold them back,
   and a last pass retries any still pending on what the plan leaves free (so
   ``solver.validate``'s rule 10 holds by construction).
1. Elastic services: scale down to their target (demand now, or the daily peak for the
   FIFO baselines, which never scale down), then scale up, fastest GPUs first; with
   ``disrupt_for_services`` (the shaper), a service still short of demand may then move
   movable block jobs elsewhere (``migrate``) or stop preemptible checkpointable ones on a
   node (``preempt``), when
   the replicas gained are worth more than what is moved or stopped
   (:meth:`GreedyEngine.grow_by_disruption`).
2. Look-ahead (optional): capacity an elastic service's forecast will need within
   ``config.lookahead_s`` is withheld from long, non-checkpointable block jobs.
3. Pending block jobs in the policy's order (arrival, priority, or value = weight then
   size), each placed best-fit on one node or as a gang over the fewest nodes of one
   cluster and GPU model. A job that does not fit may, if the policy allows,
   a. preempt strictly lower-priority preemptible jobs (cheapest first), never taking a
      team below its guarantee, and only when the job's value
      ``w(j) · gpus · speed`` exceeds what the victims hold and lose
      ``Σ w(v) · gpus(v) · (speed + lost_seconds(v) / value_horizon_s)``; victims whose GPUs
      the job does not end up using go back where they were — this raises the value
      held, or
   b. defragment: move checkpointable single-node jobs off a few nodes (within the
      disruption budget) to make room, which only rearranges what is held
   (``defrag_first`` swaps the two: migration keeps work running, preemption frees room).
   Strict FIFO stops at the first job that does not fit; EASY backfill then reserves the
   head job's earliest start and lets later jobs run if they leave that reservation alone.
4. A reason for every decision and for every job left pending.
"""

from __future__ import annotations

import enum
import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from solver.actions import build_plan
from solver.compat import Compatibility
from solver.instance import Instance, Job
from solver.plan import Plan, Reason, ReasonCode, SolveStats, SolveStatus
from solver.state import ClusterState

DAY_S = 24 * 3600.0
OVERDUE_PREFIX = "past its max queue wait, yet not placeable: "


class Order(enum.StrEnum):
    ARRIVAL = "arrival"
    PRIORITY = "priority"
    VALUE = "value"


class ElasticMode(enum.StrEnum):
    PEAK = "peak"  # reserve the daily peak, never scale down (the study's FIFO baseline)
    DEMAND = "demand"  # follow the forecast for now


@dataclass(frozen=True)
class GreedyOptions:
    engine: str = "greedy"
    order: Order = Order.VALUE
    elastic: ElasticMode = ElasticMode.DEMAND
    strict_fifo: bool = False
    backfill: bool = False
    preempt: bool = False
    migrate: bool = False
    lookahead: bool = False
    defrag_first: bool = False  # try migration before preemption for a job that does not fit
    # The first job in the policy's order that starves (``Instance.is_starving``) and does
    # not fit gets an EASY-backfill reservation that every later job must leave alone.
    starvation_guard: bool = False
    preemption_candidates: int = 32  # nodes looked at per preemption attempt
    # A service short of its demand may move (``migrate``) or stop (``preempt``) block work
    # to grow (``GreedyEngine.grow_by_disruption``): the shaper's configuration.
    disrupt_for_services: bool = False

    @property
    def grows_services_by_disruption(self) -> bool:
        return self.disrupt_for_services and (self.preempt or self.migrate)


@dataclass
class _Reservation:
    """Capacity a service's forecast will need, withheld from long immovable jobs."""

    job: Job
    groups: frozenset[int]
    gpus: int
    seconds_until_needed: float
    # Running jobs at the start of the cycle that end before the need, and the GPUs each
    # holds in ``groups`` (see ``GreedyEngine._freed_before``).
    ending: dict[str, int] = field(default_factory=dict)
    ending_total: int = 0
    touched_seen: int = 0  # how much of the engine's touched log is counted in the total


@dataclass
class GreedyResult:
    instance: Instance
    state: ClusterState
    decisions: dict[str, Reason] = field(default_factory=dict)
    pending: dict[str, Reason] = field(default_factory=dict)

    def target(self) -> dict[str, dict[str, int]]:
        names = [node.name for node in self.instance.nodes]
        return {
            job_id: {names[node]: gpus for node, gpus in held.items()}
            for job_id, held in self.state.placement.items()
            if held
        }


def sort_key(instance: Instance, order: Order) -> dict[str, tuple[object, ...]]:
    keys: dict[str, tuple[object, ...]] = {}
    for job in instance.jobs:
        overdue = 0 if instance.is_overdue(job) else 1
        if order is Order.ARRIVAL:
            keys[job.id] = (overdue, job.submit_time, job.id)
        elif order is Order.PRIORITY:
            keys[job.id] = (overdue, -instance.weight(job), job.submit_time, job.id)
        else:
            keys[job.id] = (
                overdue,
                -instance.weight(job) * instance.boost(job),  # aging credit included
                -job.total_gpus,
                job.submit_time,
                job.id,
            )
    return keys


class GreedyEngine:
    def __init__(
        self, instance: Instance, options: GreedyOptions, compat: Compatibility | None = None
    ) -> None:
        self.instance = instance
        self.options = options
        self.config = instance.config
        self.state = ClusterState(instance, compat)
        self.compat = self.state.compat
        self.result = GreedyResult(instance=instance, state=self.state)
        self.usage_before = dict(self.state.team_usage)
        self.started_by_team: dict[str, int] = {}
        self.stopped_by_team: dict[str, int] = {}
        self.migrations = 0
        self.preemptions = 0
        self.touched: set[str] = set()  # started, moved or stopped this cycle
        self.touched_log: list[str] = []  # the same, in the order they were touched
        self.reservations: list[_Reservation] = []
        self.failed_place: dict[tuple[object, ...], tuple[int, bool]] = {}
        self.epoch = 0
        self.forecast_blocked: set[str] = set()
        self.budget_blocked: set[str] = set()
        self.elastic_targets: dict[str, int] = {}
        self.after_scale_down: dict[str, dict[int, int]] = {}
        self.weight = {job.id: instance.weight(job) for job in instance.jobs}
        self.overdue = {job.id for job in instance.jobs if instance.is_overdue(job)}
        self.can_preempt = options.preempt
        self.victims = {j.id for j in instance.jobs if self._could_be_victim(j)}
        self.movable = (
            {j.id for j in instance.jobs if self._could_move(j)} if options.migrate else set()
        )
        # Checkpointable single-node jobs that would be movable but for their dwell.
        self.movable_held_back = {
            j.id
            for j in instance.jobs
            if not j.is_elastic
            and j.checkpointable
            and len(j.placement) == 1
            and instance.is_frozen(j)
        }
        # Running jobs that would be victims but for their daily limit or their dwell.
        self.victims_held_back = {
            j.id
            for j in instance.jobs
            if j.is_running
            and (
                self._over_preemption_limit(j)
                or (not j.is_elastic and instance.is_frozen(j) and instance.is_preemptible(j))
            )
        }
        self.not_worth: dict[str, str] = {}  # job -> why no preemption for it paid off
        # Job moved or stopped -> (the job it made room for, the nodes it left for it).
        self.made_room_for: dict[str, tuple[str, frozenset[str]]] = {}
        self.preempt_failed: dict[tuple[object, ...], float] = {}
        # Lowest weight of a possible victim per node; victims only leave, so it stays a floor.
        self.victim_floor = [math.inf] * len(instance.nodes)
        for job in instance.jobs:
            if job.id in self.victims or job.id in self.victims_held_back:
                for node_name in job.placement:
                    node = self.state.node_index[node_name]
                    self.victim_floor[node] = min(self.victim_floor[node], self.weight[job.id])
        self.defrag_failed: dict[tuple[object, ...], bool] = {}  # -> blocked by the budget
        self.fit_cache: dict[tuple[object, ...], bool] = {}
        self.blocked: tuple[Job | None, float, set[int]] = (None, math.inf, set())
        self.guarded: Job | None = None  # the starving job the queue backfills around

    # -- driver ----------------------------------------------------------------------

    def run(self) -> GreedyResult:
        keys = sort_key(self.instance, self.options.order)
        queue = sorted(
            (j for j in self.instance.jobs if not j.is_elastic and not j.is_running),
            key=lambda j: keys[j.id],
        )
        # Jobs past their max queue wait go before everything else, services included.
        overdue = [job for job in queue if job.id in self.overdue]
        self._elastic_phase(overdue)
        if self.options.lookahead:
            self._build_reservations()
        self.place_queue([job for job in queue if job.id not in self.state.placement])
        self.diagnose(queue)
        return self.result

    # -- elastic services ---------------------------------------------------------------

    def _elastic_target(self, job: Job) -> int:
        current = self.state_replicas(job)
        if self.instance.is_frozen(job):
            return current  # a saga is resizing it: leave it as it is
        if self.options.elastic is ElasticMode.PEAK:
            target = max(current, job.peak_demand(DAY_S))
        else:
            target = job.peak_demand(self.config.scale_down_hold_s)
        step = job.max_replica_change
        if step is not None:
            target = max(current - step, min(current + step, target))
        return target

    def state_replicas(self, job: Job) -> int:
        return sum(self.state.held(job.id).values()) // job.gpus_per_replica

    def _elastic_phase(self, overdue: list[Job] | None = None) -> None:
        """Scale services down to their targets, place ``overdue`` block jobs (they outrank
        service growth), then scale services up: into free GPUs, then, if the options
        allow, by moving or stopping block work worth less than the demand it serves."""
        services = sorted(
            (j for j in self.instance.jobs if j.is_elastic),
            key=lambda j: (-self.weight[j.id], j.id),
        )
        targets = {job.id: self._elastic_target(job) for job in services}
        self.elastic_targets = targets
        for job in services:
            surplus = self.state_replicas(job) - targets[job.id]
            if surplus > 0:
                self._scale_down(job, surplus)
        self.after_scale_down = {job.id: dict(self.state.held(job.id)) for job in services}
        if overdue:
            self.place_queue(overdue)
        for job in services:
            missing = targets[job.id] - self.state_replicas(job)
            if missing > 0:
                self.scale_up(job, missing)
            missing = targets[job.id] - self.state_replicas(job)
            if missing > 0 and self.options.grows_services_by_disruption:
                self.grow_by_disruption(job, missing)
            self.record_elastic(job)

    def record_elastic(self, job: Job) -> None:
        """Reason for a service's resize (and for a service left with no replica)."""
        target = self.elastic_targets[job.id]
        replicas = self.state_replicas(job)
        self.result.decisions.pop(job.id, None)
        self.result.pending.pop(job.id, None)
        before = {self.state.node_index[n]: g for n, g in job.placement.items()}
        if self.state.held(job.id) != before:
            shortfall = target - replicas
            message = f"{job.held_gpus // job.gpus_per_replica} -> {replicas} replicas"
            if shortfall > 0:
                message += f", {shortfall} short of the target {target}"
            self.result.decisions[job.id] = Reason(
                code=ReasonCode.RESIZED_TO_DEMAND, message=message
            )
        if replicas == 0 and target > 0:
            self.result.pending[job.id] = Reason(
                code=ReasonCode.INSUFFICIENT_CAPACITY,
                message=f"no room for any of {target} replicas",
            )

    def _scale_down(self, job: Job, surplus: int) -> None:
        held = self.state.held(job.id)
        speed = [g.gpu_model.speed for g in self.compat.groups]
        group_of = self.compat.group_of_node
        # Slowest GPUs first (the fastest replicas serve), then the emptiest nodes, so
        # whole nodes come free.
        order = sorted(held, key=lambda n: (speed[group_of[n]], -self.state.free_gpus[n], n))
        for node in order:
            if surplus == 0:
                break
            replicas = min(surplus, self.state.held(job.id).get(node, 0) // job.gpus_per_replica)
            self.state.remove(job, node, replicas * job.gpus_per_replica)
            surplus -= replicas

    def scale_up(self, job: Job, missing: int) -> None:
        groups = self.state.ready_groups(job)
        cap = self.instance.policy_for(job).quota_cap
        while missing > 0:
            if cap is not None:
                room = (cap - self.state.team_usage[job.team]) // job.gpus_per_replica
                missing = min(missing, room)
                if missing <= 0:
                    break
            node = self.state.find_single_node(job, 1, groups)
            if node is None:
                break
            replicas = min(missing, self.state.replicas_fitting(job, node))
            self.state.add(job, node, replicas * job.gpus_per_replica)
            self.started_by_team[job.team] = (
                self.started_by_team.get(job.team, 0) + replicas * job.gpus_per_replica
            )
            missing -= replicas

    def grow_by_disruption(self, job: Job, missing: int) -> None:
        """Grow a service short of its demand onto nodes held by block work, node by node.

        On each node of the service's groups, residents make room cheapest first: a
        movable job (checkpointable, single node, off cooldown, budget left) migrates to
        free GPUs elsewhere; otherwise a preemptible job under its daily limit stops
        (requeued: a checkpointable one loses nothing). A node is taken only if the trade
        favours it in the objective's units: the replicas gained are worth
        ``w(s) · gpus_per_replica · (speed + elastic_unmet_weight)`` each (served work,
        unmet demand removed); a stopped job costs ``w(j) · gpus · speed`` (its work held
        now) plus the work it loses, a moved one its migration time. Guarantees, the
        per-cycle preemption cap and the migration budget hold as for block preemption.
        """
        nodes = self.instance.nodes
        job_by_id = self.instance.job_by_id
        now = self.instance.now
        horizon = self.config.value_horizon_s
        gpr = job.gpus_per_replica
        cap = self.instance.policy_for(job).quota_cap
        # Fastest GPUs first, then the nodes that need the fewest GPUs freed per replica.
        ranked: list[tuple[float, float, int]] = []
        for group in self.state.ready_groups(job):
            speed = self.compat.groups[group].gpu_model.speed
            for node in self.compat.groups[group].node_indices:
                if not self.state.ready[node] or nodes[node].gpus < gpr:
                    continue
                removable = sum(
                    gpus
                    for r, gpus in self.state.jobs_on_node[node].items()
                    if r not in self.touched
                    and not job_by_id[r].is_elastic
                    and (r in self.movable or self._service_victim(job_by_id[r]))
                )
                if removable <= 0:
                    continue
                free = self.state.free_gpus[node]
                room = min(missing, (free + removable) // gpr)
                if room <= 0:
                    continue
                ranked.append((-speed, max(0, room * gpr - free) / room, node))
        ranked.sort()
        for _, _, node in ranked:
            if missing <= 0:
                break
            if cap is not None and self.state.team_usage[job.team] + gpr > cap:
                break
            missing -= self._grow_on_node(job, node, missing, cap, now, horizon)

    def _service_victim(self, job: Job) -> bool:
        """A block job a service may stop to grow: preemptible, under its daily limit, and
        checkpointable (requeued without losing work)."""
        return self.options.preempt and job.id in self.victims and job.checkpointable

    def _removal_cost(self, resident: Job, node: int, now: float) -> tuple[float, bool]:
        """(cost, migrate?) of making ``resident`` leave ``node``, cheapest way first."""
        weight = self.weight[resident.id]
        horizon = self.config.value_horizon_s
        gpus = resident.total_gpus
        if resident.id in self.movable and self.migrations < self.config.max_migrations_per_cycle:
            seconds = self.instance.migration.migration_seconds(resident)
            return weight * gpus * seconds / horizon, True
        speed = self.compat.groups[self.compat.group_of_node[node]].gpu_model.speed
        lost = self.instance.migration.preemption_lost_seconds(resident, now)
        return weight * gpus * (speed + lost / horizon), False

    def _grow_on_node(
        self, job: Job, node: int, missing: int, cap: int | None, now: float, horizon: float
    ) -> int:
        """Make room for up to ``missing`` replicas of ``job`` on ``node``; replicas added."""
        job_by_id = self.instance.job_by_id
        config = self.config
        gpr = job.gpus_per_replica
        speed = self.compat.groups[self.compat.group_of_node[node]].gpu_model.speed
        gain_per_replica = self.weight[job.id] * gpr * (speed + config.elastic_unmet_weight)
        residents = [
            job_by_id[r]
            for r in self.state.jobs_on_node[node]
            if r not in self.touched
            and not job_by_id[r].is_elastic
            and (r in self.movable or self._service_victim(job_by_id[r]))
        ]
        costed = sorted(
            ((self._removal_cost(r, node, now), r) for r in residents),
            key=lambda c: (c[0][0] / c[1].total_gpus, c[1].id),
        )
        mark = self.state.mark()
        stopped_by_team = dict(self.stopped_by_team)
        started = dict(self.started_by_team)
        moved: list[tuple[Job, int]] = []
        stopped: list[Job] = []
        cost = 0.0
        preempt_cap = config.max_preemptions_per_cycle

        def undo() -> int:
            self.state.rollback(mark)
            self.stopped_by_team = stopped_by_team
            self.started_by_team = started
            return 0

        for (estimate, migrate), resident in costed:
            if self.state.replicas_fitting(job, node) >= missing:
                break
            if migrate and self.migrations + len(moved) < config.max_migrations_per_cycle:
                held = self.state.evict(resident)
                target = self.state.find_single_node(
                    resident, resident.replicas, self.state.ready_groups(resident), {node}
                )
                if target is not None:
                    self.state.place(resident, {target: resident.total_gpus})
                    moved.append((resident, target))
                    cost += estimate
                    continue
                self.state.place(resident, held)
            if not self._service_victim(resident):
                continue
            if preempt_cap is not None and self.preemptions + len(stopped) >= preempt_cap:
                continue
            own = gpr * missing if resident.team == job.team else 0
            if self._reclaimable(resident.team, own) < resident.held_gpus:
                continue
            lost = self.instance.migration.preemption_lost_seconds(resident, now)
            cost += self.weight[resident.id] * resident.total_gpus * (speed + lost / horizon)
            self.state.evict(resident)
            self.stopped_by_team[resident.team] = (
                self.stopped_by_team.get(resident.team, 0) + resident.held_gpus
            )
            stopped.append(resident)
        replicas = min(missing, self.state.replicas_fitting(job, node))
        if cap is not None:
            replicas = min(replicas, (cap - self.state.team_usage[job.team]) // gpr)
        if replicas <= 0 or not (moved or stopped) or gain_per_replica * replicas <= cost:
            return undo()
        self.state.add(job, node, replicas * gpr)
        self.started_by_team[job.team] = self.started_by_team.get(job.team, 0) + replicas * gpr
        # A same-team victim counted this growth as its team's start: check it holds.
        for victim in stopped:
            if self._reclaimable(victim.team, 0) < 0:
                return undo()
        name = self.instance.nodes[node].name
        for resident, target in moved:
            self.migrations += 1
            self.touch(resident.id)
            self.made_room_for[resident.id] = (job.id, frozenset({name}))
            self.result.decisions[resident.id] = Reason(
                code=ReasonCode.DEFRAGMENTATION,
                message=f"moved to {self.instance.nodes[target].name} to make room on {name} "
                f"for service {job.id}",
            )
        why = (
            f"stopped on {name} for service {job.id}, short of its demand "
            f"({gain_per_replica * replicas:.3g} > {cost:.3g} value units)"
        )
        for victim in stopped:
            self.made_room_for[victim.id] = (job.id, frozenset({name}))
        self._note_stopped(stopped, lambda _victim: why)
        self.epoch += 1
        return replicas

    def _note_stopped(self, victims: Iterable[Job], why: Callable[[Job], str]) -> None:
        """Count and explain the jobs a decision stops."""
        for victim in victims:
            self.preemptions += 1
            self.touch(victim.id)
            self.result.decisions[victim.id] = Reason(
                code=ReasonCode.PREEMPTED_BY_HIGHER_PRIORITY, message=why(victim)
            )

    # -- look-ahead ---------------------------------------------------------------------

    def _build_reservations(self) -> None:
        """One reservation per set of compatible groups: services that can use the same
        GPUs need them together, so their coming needs add up."""
        merged: dict[frozenset[int], _Reservation] = {}
        for job in self.instance.jobs:
            if not job.is_elastic or not job.forecast:
                continue
            # Growth beyond today's target; a shortfall now is the scale-up's business.
            replicas = max(self.state_replicas(job), self.elastic_targets.get(job.id, 0))
            steps = math.ceil(self.config.lookahead_s / job.forecast_step_s)
            needed_at = None
            peak = replicas
            for step in range(1, steps + 1):  # the coming steps; now is the scale-up's
                demand = job.demand_at(step)
                if demand > replicas and needed_at is None:
                    needed_at = step * job.forecast_step_s
                peak = max(peak, demand)
            if needed_at is None:
                continue
            groups = frozenset(self.state.ready_groups(job))
            gpus = (peak - replicas) * job.gpus_per_replica
            existing = merged.get(groups)
            if existing is None:
                merged[groups] = _Reservation(
                    job=job, groups=groups, gpus=gpus, seconds_until_needed=float(needed_at)
                )
            else:
                existing.gpus += gpus
                existing.seconds_until_needed = min(existing.seconds_until_needed, needed_at)
        self.reservations = [merged[key] for key in sorted(merged, key=sorted)]
        for reservation in self.reservations:
            for job_id, held in self.state.placement.items():
                gpus = self._ending_in(reservation, job_id, held, start=None)
                if gpus:
                    reservation.ending[job_id] = gpus
            reservation.ending_total = sum(reservation.ending.values())

    def _ending_in(
        self, reservation: _Reservation, job_id: str, held: dict[int, int], *, start: float | None
    ) -> int:
        """GPUs ``job_id`` holds in the reservation's groups if it ends before they are
        needed (from ``start``, default its own start time), else 0."""
        job = self.instance.job_by_id[job_id]
        runtime = job.expected_runtime_s
        if job.is_elastic or runtime is None:
            return 0
        now = self.instance.now
        began = start if start is not None else (job.start_time or now)
        if began + runtime > now + reservation.seconds_until_needed:
            return 0
        group_of = self.compat.group_of_node
        return sum(g for node, g in held.items() if group_of[node] in reservation.groups)

    def reservations_for(self, job: Job) -> list[_Reservation]:
        """Reservations a job must leave alone: none if it can move away in time (it is
        checkpointable or ends first), if it is past its max queue wait, or if it starves
        under the starvation guard (a forecast must not keep a job waiting for ever)."""
        if not self.reservations or job.checkpointable or job.id in self.overdue:
            return []
        if self.options.starvation_guard and self.instance.is_starving(job):
            return []
        runtime = job.expected_runtime_s
        return [r for r in self.reservations if runtime is None or runtime > r.seconds_until_needed]

    def _allowed_groups(self, job: Job, groups: list[int]) -> list[int]:
        reservations = self.reservations_for(job)
        if not reservations:
            return groups
        need = job.total_gpus
        short = [
            r.groups
            for r in reservations
            if self.state.compatible_free(r.groups) + self._freed_before(r) - need < r.gpus
        ]
        return [group for group in groups if not any(group in blocked for blocked in short)]

    def touch(self, job_id: str) -> None:
        """Record that this cycle started, moved or stopped ``job_id``."""
        if job_id not in self.touched:
            self.touched.add(job_id)
            self.touched_log.append(job_id)

    def _freed_before(self, reservation: _Reservation) -> int:
        """GPUs of the reservation's groups that block jobs holding them will have given back
        before they are needed (their expected runtime ends): a forecast peak can take
        those, so they need not be withheld now. A job without a runtime estimate is assumed
        to stay. Kept up to date from the jobs this cycle touched, each counted once when
        it is touched (a touched job is not moved or stopped again in the same cycle), so
        that the greedy pays O(jobs) per reservation in all, not per call."""
        log = self.touched_log
        while reservation.touched_seen < len(log):
            job_id = log[reservation.touched_seen]
            reservation.touched_seen += 1
            reservation.ending_total -= reservation.ending.pop(job_id, 0)
            held = self.state.held(job_id)
            if held:
                reservation.ending_total += self._ending_in(
                    reservation, job_id, held, start=self.instance.now
                )
        return reservation.ending_total

    # -- block jobs ---------------------------------------------------------------------

    def place_queue(self, queue: list[Job]) -> None:
        pending = self.result.pending
        # The strict-FIFO head (and its backfill reservation) carries over between calls.
        blocked_by, shadow_time, shadow_nodes = self.blocked
        frozen = self.instance.frozen_ids
        for job in queue:
            if job.id in frozen:
                pending[job.id] = self.frozen_reason(job)
                continue  # left as it is; never blocks the queue
            groups = self.state.ready_groups(job)
            if not groups or not self._could_ever_fit(job, groups):
                continue  # diagnosed at the end; never blocks the queue
            late = job.id in self.overdue
            backfilling = self.options.backfill or self.guarded is not None
            if blocked_by is not None and not backfilling and not late:
                pending[job.id] = Reason(
                    code=ReasonCode.QUEUE_ORDER, message=f"behind {blocked_by.id} in FIFO order"
                )
                continue
            cap = self.instance.policy_for(job).quota_cap
            if cap is not None and self.state.team_usage[job.team] + job.total_gpus > cap:
                pending[job.id] = Reason(
                    code=ReasonCode.QUOTA,
                    message=f"team {job.team} would use "
                    f"{self.state.team_usage[job.team] + job.total_gpus} GPUs > quota {cap}",
                )
                continue
            placement: dict[int, int] | None
            if blocked_by is not None and not late:
                placement = self._backfill(job, groups, shadow_time, shadow_nodes)
                if placement is None and job.id not in pending:
                    if self._try_place(job, groups, None, probe=True) is not None:
                        pending[job.id] = Reason(
                            code=ReasonCode.BACKFILL_RESERVATION,
                            message=f"would delay {blocked_by.id}, reserved from t={shadow_time:g}",
                        )
            else:
                placement = self._try_place(job, groups, None)
                if placement is None and self.options.defrag_first and self.options.migrate:
                    placement = self._try_defrag(job, groups)
                if placement is None and self.options.preempt:
                    placement = self._try_preempt(job, groups)
                if placement is None and self.options.migrate:
                    placement = self._try_defrag(job, groups)
            if placement is None:
                if self.options.strict_fifo and blocked_by is None:
                    blocked_by = job
                    if self.options.backfill:
                        shadow_time, shadow_nodes = self._shadow(job, groups)
                elif (
                    self.options.starvation_guard
                    and blocked_by is None
                    and self.instance.is_starving(job)
                ):
                    shadow_time, shadow_nodes = self._shadow(job, groups)
                    if shadow_nodes:  # no reservation without an end time to count on
                        blocked_by = self.guarded = job
                        pending[job.id] = Reason(
                            code=ReasonCode.INSUFFICIENT_CAPACITY,
                            message=f"waiting since t={job.submit_time:g}; GPUs on "
                            f"{len(shadow_nodes)} node(s) reserved for it from "
                            f"t={shadow_time:g}",
                        )
                continue
            self._start(job, placement)
        self.blocked = (blocked_by, shadow_time, shadow_nodes)
        self._place_overdue_leftovers(queue)

    def _start(self, job: Job, placement: dict[int, int]) -> None:
        self.state.place(job, placement)
        self.touch(job.id)
        self.started_by_team[job.team] = self.started_by_team.get(job.team, 0) + job.total_gpus
        code = ReasonCode.OVERDUE if self.instance.is_overdue(job) else ReasonCode.PLACED
        self.result.decisions.setdefault(
            job.id, Reason(code=code, message=self.placed_message(job, placement))
        )

    def _place_overdue_leftovers(self, queue: list[Job]) -> None:
        """Give every overdue job still pending one more try on what is free now.

        Preemptions and moves for later jobs can leave room an overdue job did not have
        at its turn. Starts only take room, so after this pass no pending overdue job fits
        the free GPUs as they are: the property ``solver.validate`` checks.
        """
        frozen = self.instance.frozen_ids
        late = [
            j
            for j in queue
            if j.id in self.overdue and j.id not in self.state.placement and j.id not in frozen
        ]
        if not late:
            return
        self.epoch += 1
        for job in late:
            groups = self.state.ready_groups(job)
            if not groups:
                continue
            cap = self.instance.policy_for(job).quota_cap
            if cap is not None and self.state.team_usage[job.team] + job.total_gpus > cap:
                continue
            placement = self._try_place(job, groups, None)
            if placement is None:
                continue
            self.result.pending.pop(job.id, None)
            self._start(job, placement)

    def frozen_reason(self, job: Job) -> Reason:
        return Reason(code=ReasonCode.DWELL, message=self.instance.frozen_because(job) or "frozen")

    def placed_message(self, job: Job, placement: dict[int, int]) -> str:
        names = ", ".join(
            f"{self.instance.nodes[n].name}:{g}" for n, g in sorted(placement.items())
        )
        if self.instance.is_overdue(job):
            return f"past its max queue wait; placed on {names}"
        return f"placed on {names}"

    def _could_ever_fit(self, job: Job, groups: list[int]) -> bool:
        """Whether the job fits the empty cluster (so blocking on it makes sense)."""
        key = (tuple(groups), job.replicas, job.gpus_per_replica, job.max_nodes)
        cached = self.fit_cache.get(key)
        if cached is None:
            cached = self._fits_empty(job, groups)
            self.fit_cache[key] = cached
        return cached

    def _fits_empty(self, job: Job, groups: list[int]) -> bool:
        nodes = self.instance.nodes
        per_cluster: dict[str, list[int]] = {}
        for group in groups:
            for node in self.compat.groups[group].node_indices:
                if self.state.ready[node]:
                    fit = nodes[node].gpus // job.gpus_per_replica
                    per_cluster.setdefault(self.compat.groups[group].cluster, []).append(fit)
        limit = job.max_nodes if job.max_nodes is not None else job.replicas
        for fits in per_cluster.values():
            fits.sort(reverse=True)
            if sum(fits[:limit]) >= job.replicas:
                return True
        return False

    def _fail_key(self, job: Job, extra: object) -> tuple[object, ...]:
        return (
            tuple(self.compat.groups_for(job)),
            job.replicas,
            job.gpus_per_replica,
            job.cpu_milli_per_replica,
            job.memory_mib_per_replica,
            job.max_nodes,
            extra,
        )

    def _try_place(
        self,
        job: Job,
        groups: list[int],
        exclude: set[int] | None,
        probe: bool = False,
    ) -> dict[int, int] | None:
        reservations = () if probe else tuple(id(r) for r in self.reservations_for(job))
        key = self._fail_key(job, ("place", reservations))
        if not exclude:
            failed = self.failed_place.get(key)
            if failed is not None and failed[0] == self.epoch:
                if failed[1]:
                    self.forecast_blocked.add(job.id)
                return None
        allowed = self._allowed_groups(job, groups) if reservations else groups
        placement = self.state.find_gang(job, job.replicas, allowed, job.max_nodes, exclude)
        blocked_by_forecast = False
        if placement is None and len(allowed) < len(groups):
            if self.state.find_gang(job, job.replicas, groups, job.max_nodes, exclude):
                self.forecast_blocked.add(job.id)
                blocked_by_forecast = True
        if placement is None and not exclude:
            self.failed_place[key] = (self.epoch, blocked_by_forecast)
        return placement

    # -- backfill -----------------------------------------------------------------------

    def _shadow(self, head: Job, groups: list[int]) -> tuple[float, set[int]]:
        """Earliest time the head job fits as running jobs end, and the nodes it would use."""
        now = self.instance.now
        ends: list[tuple[float, str]] = []
        for job_id in self.state.placement:
            job = self.instance.job_by_id[job_id]
            if job.is_elastic or job.expected_runtime_s is None:
                continue
            start = now if job.id in self.touched else (job.start_time or now)
            ends.append((start + job.expected_runtime_s, job_id))
        ends.sort()
        mark = self.state.mark()
        shadow: tuple[float, set[int]] = (math.inf, set())
        for end, job_id in ends:
            self.state.evict(self.instance.job_by_id[job_id])
            placement = self.state.find_gang(head, head.replicas, groups, head.max_nodes)
            if placement is not None:
                shadow = (end, set(placement))
                break
        self.state.rollback(mark)
        return shadow

    def _backfill(
        self, job: Job, groups: list[int], shadow_time: float, shadow_nodes: set[int]
    ) -> dict[int, int] | None:
        runtime = job.expected_runtime_s
        if runtime is not None and self.instance.now + runtime <= shadow_time:
            return self._try_place(job, groups, None)
        return self._try_place(job, groups, shadow_nodes or None)

    # -- defragmentation by migration ---------------------------------------------------

    def _could_move(self, job: Job) -> bool:
        """Static part of movability: checkpointable single-node block job, budget left."""
        if job.is_elastic or not job.is_running or not job.checkpointable:
            return False
        if len(job.placement) != 1 or self.instance.is_frozen(job):
            return False
        if (
            job.last_moved_at is not None
            and self.instance.now - job.last_moved_at < self.config.migration_cooldown_s
        ):
            return False
        limit = self.instance.policy_for(job).max_migrations_per_day
        return limit is None or job.migrations_today < limit

    def _try_defrag(self, job: Job, groups: list[int]) -> dict[int, int] | None:
        budget = self.config.max_migrations_per_cycle - self.migrations
        key = self._fail_key(job, ("defrag", budget > 0))
        if key in self.defrag_failed:
            if self.defrag_failed[key]:
                self.budget_blocked.add(job.id)
            return None
        blocked = False
        job_by_id = self.instance.job_by_id
        nodes = self.instance.nodes
        need = job.total_gpus
        limit = job.max_nodes if job.max_nodes is not None else job.replicas
        movable = self.movable
        touched = self.touched
        held_back = self.movable_held_back
        for group in self.state.group_order(self._allowed_groups(job, groups)):
            candidates: list[tuple[int, int, int, list[Job]]] = []
            frozen_sizes: list[int] = []  # nodes only frozen residents keep from moving
            for node in self.compat.groups[group].node_indices:
                if not self.state.ready[node] or nodes[node].gpus < job.gpus_per_replica:
                    continue
                on_node = self.state.jobs_on_node[node]
                if on_node and all(r in held_back or r in movable for r in on_node):
                    if any(r in held_back for r in on_node):
                        frozen_sizes.append(nodes[node].gpus)
                        continue
                if on_node and all(r in movable and r not in touched for r in on_node):
                    candidates.append(
                        (
                            len(on_node),
                            -self.state.free_gpus[node],
                            node,
                            [job_by_id[r] for r in on_node],
                        )
                    )
            candidates.sort(key=lambda c: (c[0], c[1], c[2]))
            chosen: list[tuple[int, list[Job]]] = []
            capacity = 0
            movers = 0
            for count, _, node, residents in candidates:
                if len(chosen) >= limit or movers + count > budget:
                    continue
                chosen.append((node, residents))
                capacity += nodes[node].gpus - nodes[node].gpus % job.gpus_per_replica
                movers += count
                if capacity >= need:
                    break
            if capacity < need:
                # Would emptying nodes have made room, were the budget larger or no
                # resident within its dwell time?
                sizes = sorted([nodes[c[2]].gpus for c in candidates] + frozen_sizes)
                room = sum(sizes[-limit:])
                if room >= need:
                    self.budget_blocked.add(job.id)
                    blocked = True
                continue
            placement = self._evacuate_and_place(job, groups, chosen)
            if placement is not None:
                return placement
        self.defrag_failed[key] = blocked
        return None

    def _evacuate_and_place(
        self, job: Job, groups: list[int], chosen: list[tuple[int, list[Job]]]
    ) -> dict[int, int] | None:
        mark = self.state.mark()
        evicted: list[tuple[Job, dict[int, int]]] = []
        for _, residents in chosen:
            for resident in residents:
                evicted.append((resident, self.state.evict(resident)))
        placement = self.state.find_gang(job, job.replicas, groups, job.max_nodes)
        if placement is None:
            self.state.rollback(mark)
            return None
        self.state.place(job, placement)
        # A resident whose node the job left room on stays: only a move that makes room
        # for the job is "moved to make room" for it.
        homeless: list[Job] = []
        for resident, original in sorted(evicted, key=lambda e: (-e[0].total_gpus, e[0].id)):
            if all(
                self.state.replicas_fitting(resident, node) * resident.gpus_per_replica >= gpus
                for node, gpus in original.items()
            ):
                self.state.place(resident, original)
            else:
                homeless.append(resident)
        moved: list[Job] = []
        for resident in homeless:
            resident_groups = self.state.ready_groups(resident)
            node = self.state.find_single_node(resident, resident.replicas, resident_groups)
            if node is None:
                self.state.rollback(mark)
                return None
            self.state.place(resident, {node: resident.total_gpus})
            moved.append(resident)
        if self.migrations + len(moved) > self.config.max_migrations_per_cycle:
            self.state.rollback(mark)
            self.budget_blocked.add(job.id)
            return None
        # Keep the evictions; the caller places the job itself.
        for node, gpus in placement.items():
            self.state.remove(job, node, gpus)
        names = self.instance.nodes
        for resident in moved:
            self.migrations += 1
            self.touch(resident.id)
            self.made_room_for[resident.id] = (job.id, frozenset(resident.placement))
            where = ", ".join(sorted(resident.placement))
            self.result.decisions[resident.id] = Reason(
                code=ReasonCode.DEFRAGMENTATION,
                message=f"moved to {names[next(iter(self.state.held(resident.id)))].name} "
                f"to make room on {where} for {job.id}",
            )
        self.epoch += 1
        return placement

    # -- preemption ---------------------------------------------------------------------

    def _reclaimable(self, team: str, extra_started: int) -> int:
        policy = self.instance.policy_by_team.get(team)
        guaranteed = policy.guaranteed_gpus if policy is not None else 0
        return (
            max(0, self.usage_before.get(team, 0) - guaranteed)
            + self.started_by_team.get(team, 0)
            + extra_started
            - self.stopped_by_team.get(team, 0)
        )

    def _could_be_victim(self, job: Job) -> bool:
        return (
            not job.is_elastic
            and job.is_running
            and self.instance.is_preemptible(job)
            and not self._over_preemption_limit(job)
            and not self.instance.is_frozen(job)
        )

    def _over_preemption_limit(self, job: Job) -> bool:
        limit = self.instance.policy_for(job).max_preemptions_per_day
        return limit is not None and job.preemptions_today >= limit

    def _try_preempt(self, job: Job, groups: list[int]) -> dict[int, int] | None:
        cap = self.config.max_preemptions_per_cycle
        if cap is not None and self.preemptions >= cap:
            self.budget_blocked.add(job.id)
            return None
        weight = self.weight[job.id]
        # A job of the same shape, team and urgency that failed with at least this weight
        # fails too: it has fewer victims and gains less.
        key = self._fail_key(job, ("preempt", job.team, job.id in self.overdue))
        if self.preempt_failed.get(key, -math.inf) >= weight:
            return None
        job_by_id = self.instance.job_by_id
        nodes = self.instance.nodes
        need = job.total_gpus
        victims_set = self.victims
        touched = self.touched
        weights = self.weight
        ranked: list[tuple[float, int, int, list[Job]]] = []
        blocked_by_limit = False
        floor = self.victim_floor
        for group in self._allowed_groups(job, groups):
            for node in self.compat.groups[group].node_indices:
                if floor[node] >= weight or not self.state.ready[node]:
                    continue
                on_node = self.state.jobs_on_node[node]
                victims = [
                    job_by_id[v]
                    for v in on_node
                    if v in victims_set and v not in touched and weights[v] < weight
                ]
                if not victims:
                    if any(v in self.victims_held_back and weights[v] < weight for v in on_node):
                        blocked_by_limit = True
                    continue
                victims.sort(key=lambda v: (weights[v.id], -v.total_gpus, v.id))
                free = self.state.free_gpus[node]
                cost = 0.0
                taken: list[Job] = []
                for victim in victims:
                    if free >= min(need, nodes[node].gpus):
                        break
                    taken.append(victim)
                    free += on_node[victim.id]
                    cost += self._stop_cost(victim)
                if free <= self.state.free_gpus[node]:
                    continue
                ranked.append((cost / free, node, free, taken))
                if len(ranked) >= self.options.preemption_candidates:
                    break
            if len(ranked) >= self.options.preemption_candidates:
                break
        ranked.sort(key=lambda r: (r[0], r[1]))
        single = [r for r in ranked if r[2] >= need]
        attempts: list[list[tuple[float, int, int, list[Job]]]] = [[r] for r in single[:3]]
        limit = job.max_nodes if job.max_nodes is not None else job.replicas
        if not single and limit > 1:
            gang: list[tuple[float, int, int, list[Job]]] = []
            total = 0
            for entry in ranked:
                gang.append(entry)
                total += entry[2]
                if total >= need:
                    break
            attempts.append(gang)
        for attempt in attempts:
            placement = self._evict_and_place(job, groups, attempt)
            if placement is not None:
                return placement
        if blocked_by_limit:
            self.budget_blocked.add(job.id)
        self.preempt_failed[key] = max(self.preempt_failed.get(key, -math.inf), weight)
        return None

    def _evict_and_place(
        self, job: Job, groups: list[int], attempt: Iterable[tuple[float, int, int, list[Job]]]
    ) -> dict[int, int] | None:
        """Stop the attempt's victims and find the job a placement; keep it only if it pays.

        Victims whose GPUs the placement leaves alone go back where they were (so a victim
        is only ever "stopped for" a job that takes its GPUs), and the trade must favour
        the job in the objective's units: its value ``w(j) · boost · Σ gpus · speed`` must
        exceed the victims' ``Σ w(v) · gpus · (speed + lost_seconds / value_horizon_s)`` —
        the work they hold now and the work since their last checkpoint that a stop loses.
        """
        mark = self.state.mark()
        stopped: list[tuple[Job, dict[int, int]]] = []
        stopped_by_team = dict(self.stopped_by_team)

        def undo() -> None:
            self.state.rollback(mark)
            self.stopped_by_team = stopped_by_team

        for _, _, _, victims in attempt:
            for victim in victims:
                if victim.id not in self.state.placement:
                    continue  # a gang victim already stopped from another node
                own = job.total_gpus if victim.team == job.team else 0
                if self._reclaimable(victim.team, own) < victim.held_gpus:
                    undo()
                    return None
                held = self.state.evict(victim)
                self.stopped_by_team[victim.team] = (
                    self.stopped_by_team.get(victim.team, 0) + victim.held_gpus
                )
                stopped.append((victim, held))
        placement = self.state.find_gang(
            job, job.replicas, self._allowed_groups(job, groups), job.max_nodes
        )
        if placement is None:
            undo()
            return None
        self.state.place(job, placement)
        # Put back the victims that still fit where they were, the costliest first.
        kept: list[Job] = []
        for victim, held in sorted(stopped, key=lambda s: (-self._stop_cost(s[0]), s[0].id)):
            fits = all(
                self.state.replicas_fitting(victim, node) * victim.gpus_per_replica >= gpus
                for node, gpus in held.items()
            )
            if fits:
                self.state.place(victim, held)
                self.stopped_by_team[victim.team] -= victim.held_gpus
            else:
                kept.append(victim)
        kept.sort(key=lambda v: v.id)
        cap = self.config.max_preemptions_per_cycle
        if cap is not None and self.preemptions + len(kept) > cap:
            undo()
            return None
        boost = self.config.overdue_weight if job.id in self.overdue else 1.0
        gain = (
            self.weight[job.id]
            * boost
            * sum(gpus * self._node_speed(node) for node, gpus in placement.items())
        )
        cost = sum(self._stop_cost(victim) for victim in kept)
        if kept and gain <= cost:
            self.not_worth[job.id] = (
                f"stopping lower-priority work for it would cost more than it gains "
                f"({cost:.3g} >= {gain:.3g} value units: work held and work lost since "
                "the last checkpoint)"
            )
            undo()
            return None
        # The caller places the job itself.
        for node, gpus in placement.items():
            self.state.remove(job, node, gpus)
        taken = {self.instance.nodes[node].name for node in placement}
        for victim in kept:
            self.made_room_for[victim.id] = (job.id, frozenset(taken & set(victim.placement)))

        def why(victim: Job) -> str:
            where = ", ".join(sorted(self.made_room_for[victim.id][1]))
            return (
                f"stopped for {job.id}, which takes its GPUs on {where} "
                f"(weight {self.weight[job.id]:g} > {self.weight[victim.id]:g}; "
                f"{gain:.3g} > {cost:.3g} value units)"
            )

        self._note_stopped(kept, why)
        self.epoch += 1
        return placement

    def _node_speed(self, node: int) -> float:
        return self.compat.groups[self.compat.group_of_node[node]].gpu_model.speed

    def _stop_cost(self, victim: Job) -> float:
        """What stopping a running block job costs, in objective units: the work it holds
        now and the work since its last checkpoint that it loses."""
        horizon = self.config.value_horizon_s
        lost = self.instance.migration.preemption_lost_seconds(victim, self.instance.now)
        index = self.state.node_index
        return self.weight[victim.id] * sum(
            gpus * (self._node_speed(index[name]) + lost / horizon)
            for name, gpus in victim.placement.items()
        )

    # -- reasons for what stays pending ---------------------------------------------------

    def diagnose(self, queue: list[Job]) -> None:
        pending = self.result.pending
        holder_weight = self._min_holder_weight()
        for job in queue:
            if job.id in self.state.placement or job.id in pending:
                continue
            all_groups = self.compat.groups_for(job)
            groups = self.state.ready_groups(job)
            if not all_groups:
                pending[job.id] = Reason(
                    code=ReasonCode.NO_COMPATIBLE_GPU_MODEL,
                    message="no node has a GPU model, memory, precision and labels it accepts",
                )
            elif not groups:
                pending[job.id] = Reason(
                    code=ReasonCode.NO_COMPATIBLE_GPU_MODEL,
                    message="no compatible node is ready",
                )
            elif not self._could_ever_fit(job, groups):
                pending[job.id] = Reason(
                    code=ReasonCode.INSUFFICIENT_CAPACITY,
                    message=f"{job.total_gpus} GPUs within the node spread limit exceed any "
                    "cluster's compatible nodes",
                )
            elif job.id in self.forecast_blocked:
                pending[job.id] = Reason(
                    code=ReasonCode.FORECAST_RESERVATION,
                    message="the free GPUs are needed by an elastic service's coming peak",
                )
            elif job.id in self.budget_blocked:
                pending[job.id] = Reason(
                    code=ReasonCode.DISRUPTION_BUDGET,
                    message="making room needs more migrations or preemptions than allowed, "
                    "or work that Shaper acted on lately (dwell time, move budget)",
                )
            elif job.id in self.not_worth:
                pending[job.id] = Reason(
                    code=ReasonCode.INSUFFICIENT_CAPACITY, message=self.not_worth[job.id]
                )
            elif self.state.compatible_free(groups) >= job.total_gpus:
                pending[job.id] = Reason(
                    code=ReasonCode.FRAGMENTATION,
                    message=f"{self.state.compatible_free(groups)} compatible GPUs free but "
                    f"no node or gang of {job.total_gpus} fits",
                )
            elif (
                self.can_preempt
                and min((holder_weight[g] for g in groups), default=math.inf) >= self.weight[job.id]
            ):
                pending[job.id] = Reason(
                    code=ReasonCode.LOWER_PRIORITY,
                    message="compatible GPUs are held by work of equal or higher priority",
                )
            else:
                pending[job.id] = Reason(
                    code=ReasonCode.INSUFFICIENT_CAPACITY,
                    message=f"{self.state.compatible_free(groups)} compatible GPUs free, "
                    f"{job.total_gpus} needed",
                )
        self._mark_overdue(queue)

    def _mark_overdue(self, queue: list[Job]) -> None:
        """Say so when a job past its max queue wait stays pending (the reason is why)."""
        pending = self.result.pending
        for job in queue:
            reason = pending.get(job.id)
            if reason is None or job.id not in self.overdue:
                continue
            if not reason.message.startswith(OVERDUE_PREFIX):
                pending[job.id] = Reason(
                    code=reason.code, message=f"{OVERDUE_PREFIX}{reason.message}"
                )

    def _min_holder_weight(self) -> list[float]:
        weights = [math.inf] * len(self.compat.groups)
        boost = self.config.overdue_weight
        for job_id, held in self.state.placement.items():
            # A job started past its max wait outranks everything it displaced.
            weight = self.weight[job_id]
            if self.instance.is_overdue(self.instance.job_by_id[job_id]):
                weight *= boost
            for node in held:
                group = self.compat.group_of_node[node]
                weights[group] = min(weights[group], weight)
        return weights


def run_greedy(
    instance: Instance, options: GreedyOptions, compat: Compatibility | None = None
) -> GreedyResult:
    return GreedyEngine(instance, options, compat).run()


def greedy_plan(instance: Instance, options: GreedyOptions, *, policy: str) -> Plan:
    started = time.perf_counter()
    result = run_greedy(instance, options)
    stats = SolveStats(
        status=SolveStatus.HEURISTIC,
        engine=options.engine,
        wall_time_s=time.perf_counter() - started,
    )
    plan = build_plan(
        instance,
        policy=policy,
        target=result.target(),
        decisions=result.decisions,
        pending=result.pending,
        stats=stats,
    )
    plan.stats.wall_time_s = time.perf_counter() - started
    return plan
