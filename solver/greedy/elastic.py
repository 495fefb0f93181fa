"""Elastic growth: services are sized to their target (demand now, or the daily peak for
the FIFO baselines, which never scale down) in two steps around the overdue block jobs,
which outrank service growth.

``scale_down`` frees surplus replicas, slowest GPUs first and then the emptiest nodes, so
whole nodes come free. ``scale_up`` grows each service into free GPUs, fastest first;
with ``disrupt_for_services`` (the shaper), a service still short of demand may then move
movable block jobs elsewhere or stop preemptible checkpointable ones on a node, when the
replicas gained are worth more than what is moved or stopped (``grow_by_disruption``).
"""

from __future__ import annotations

from solver.greedy.defragmentation import Defragmentation
from solver.greedy.ledger import Ledger
from solver.greedy.options import ElasticMode
from solver.greedy.preemption import Preemption
from solver.instance import Job
from solver.plan import Reason, ReasonCode

DAY_S = 24 * 3600.0


class ElasticGrowth:
    def __init__(
        self, ledger: Ledger, preemption: Preemption, defragmentation: Defragmentation
    ) -> None:
        self.ledger = ledger
        self.preemption = preemption
        self.defragmentation = defragmentation
        self.services = sorted(
            (j for j in ledger.instance.jobs if j.is_elastic),
            key=lambda j: (-ledger.weight[j.id], j.id),
        )

    def _target(self, job: Job) -> int:
        ledger = self.ledger
        current = ledger.replicas(job)
        if ledger.instance.is_frozen(job):
            return current  # a saga is resizing it: leave it as it is
        if ledger.options.elastic is ElasticMode.PEAK:
            target = max(current, job.peak_demand(DAY_S))
        else:
            target = job.peak_demand(ledger.config.scale_down_hold_s)
        step = job.max_replica_change
        if step is not None:
            target = max(current - step, min(current + step, target))
        return target

    def scale_down(self) -> None:
        """Set every service's target and scale down those above it."""
        ledger = self.ledger
        targets = {job.id: self._target(job) for job in self.services}
        ledger.elastic_targets = targets
        for job in self.services:
            surplus = ledger.replicas(job) - targets[job.id]
            if surplus > 0:
                self._scale_down(job, surplus)
        ledger.after_scale_down = {job.id: dict(ledger.state.held(job.id)) for job in self.services}

    def grow(self) -> None:
        """Scale services up to their targets: into free GPUs, then, if the options allow,
        by moving or stopping block work worth less than the demand it serves."""
        ledger = self.ledger
        targets = ledger.elastic_targets
        for job in self.services:
            missing = targets[job.id] - ledger.replicas(job)
            if missing > 0:
                self.scale_up(job, missing)
            missing = targets[job.id] - ledger.replicas(job)
            if missing > 0 and ledger.options.grows_services_by_disruption:
                self._grow_by_disruption(job, missing)
            self.record(job)

    def record(self, job: Job) -> None:
        """Reason for a service's resize (and for a service left with no replica)."""
        ledger = self.ledger
        target = ledger.elastic_targets[job.id]
        replicas = ledger.replicas(job)
        ledger.result.decisions.pop(job.id, None)
        ledger.result.pending.pop(job.id, None)
        before = {ledger.state.node_index[n]: g for n, g in job.placement.items()}
        if ledger.state.held(job.id) != before:
            shortfall = target - replicas
            message = f"{job.held_gpus // job.gpus_per_replica} -> {replicas} replicas"
            if shortfall > 0:
                message += f", {shortfall} short of the target {target}"
            ledger.result.decisions[job.id] = Reason(
                code=ReasonCode.resized_to_demand, message=message
            )
        if replicas == 0 and target > 0:
            ledger.result.pending[job.id] = Reason(
                code=ReasonCode.insufficient_capacity,
                message=f"no room for any of {target} replicas",
            )

    def _scale_down(self, job: Job, surplus: int) -> None:
        ledger = self.ledger
        state = ledger.state
        held = state.held(job.id)
        speed = [g.gpu_model.speed for g in ledger.compat.groups]
        group_of = ledger.compat.group_of_node
        # Slowest GPUs first (the fastest replicas serve), then the emptiest nodes, so
        # whole nodes come free.
        order = sorted(held, key=lambda n: (speed[group_of[n]], -state.free_gpus[n], n))
        for node in order:
            if surplus == 0:
                break
            replicas = min(surplus, state.held(job.id).get(node, 0) // job.gpus_per_replica)
            state.remove(job, node, replicas * job.gpus_per_replica)
            surplus -= replicas

    def scale_up(self, job: Job, missing: int) -> None:
        """Add up to ``missing`` replicas in free GPUs, within the team's quota."""
        ledger = self.ledger
        state = ledger.state
        groups = state.ready_groups(job)
        cap = ledger.instance.policy_for(job).quota_cap
        while missing > 0:
            if cap is not None:
                room = (cap - state.team_usage[job.team]) // job.gpus_per_replica
                missing = min(missing, room)
                if missing <= 0:
                    break
            node = state.find_single_node(job, 1, groups)
            if node is None:
                break
            replicas = min(missing, state.replicas_fitting(job, node))
            if state.gang_fit is not None:
                replicas = 1  # each replica where it leaves the least waste
            state.add(job, node, replicas * job.gpus_per_replica)
            ledger.count_started(job.team, replicas * job.gpus_per_replica)
            missing -= replicas

    def _removable(self, resident: Job) -> bool:
        """A block resident a service may displace: movable, or a service victim."""
        return (
            resident.id not in self.ledger.touched
            and not resident.is_elastic
            and (
                resident.id in self.defragmentation.movable
                or self.preemption.service_victim(resident)
            )
        )

    def _grow_by_disruption(self, job: Job, missing: int) -> None:
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
        ledger = self.ledger
        state = ledger.state
        compat = ledger.compat
        nodes = ledger.instance.nodes
        job_by_id = ledger.instance.job_by_id
        now = ledger.instance.now
        horizon = ledger.config.value_horizon_s
        gpr = job.gpus_per_replica
        cap = ledger.instance.policy_for(job).quota_cap
        # Fastest GPUs first, then the nodes that need the fewest GPUs freed per replica.
        ranked: list[tuple[float, float, int]] = []
        for group in state.ready_groups(job):
            speed = compat.groups[group].gpu_model.speed
            for node in compat.groups[group].node_indices:
                if not state.ready[node] or nodes[node].gpus < gpr:
                    continue
                removable = sum(
                    gpus
                    for r, gpus in state.jobs_on_node[node].items()
                    if self._removable(job_by_id[r])
                )
                if removable <= 0:
                    continue
                free = state.free_gpus[node]
                room = min(missing, (free + removable) // gpr)
                if room <= 0:
                    continue
                ranked.append((-speed, max(0, room * gpr - free) / room, node))
        ranked.sort()
        for _, _, node in ranked:
            if missing <= 0:
                break
            if cap is not None and state.team_usage[job.team] + gpr > cap:
                break
            missing -= self._grow_on_node(job, node, missing, cap, now, horizon)

    def _removal_cost(self, resident: Job, node: int, now: float) -> tuple[float, bool]:
        """(cost, migrate?) of making ``resident`` leave ``node``, cheapest way first."""
        ledger = self.ledger
        weight = ledger.weight[resident.id]
        horizon = ledger.config.value_horizon_s
        gpus = resident.total_gpus
        if (
            resident.id in self.defragmentation.movable
            and ledger.migrations < ledger.config.max_migrations_per_cycle
        ):
            seconds = ledger.instance.migration.migration_seconds(resident)
            return weight * gpus * seconds / horizon, True
        speed = ledger.job_speed(resident, node)
        lost = ledger.instance.migration.preemption_lost_seconds(resident, now)
        return weight * gpus * (speed + lost / horizon), False

    def _grow_on_node(
        self, job: Job, node: int, missing: int, cap: int | None, now: float, horizon: float
    ) -> int:
        """Make room for up to ``missing`` replicas of ``job`` on ``node``; replicas added."""
        ledger = self.ledger
        state = ledger.state
        instance = ledger.instance
        job_by_id = instance.job_by_id
        config = ledger.config
        gpr = job.gpus_per_replica
        speed = ledger.node_speed(node)
        gain_per_replica = ledger.weight[job.id] * gpr * (speed + config.elastic_unmet_weight)
        residents = [
            job_by_id[r] for r in state.jobs_on_node[node] if self._removable(job_by_id[r])
        ]
        costed = sorted(
            ((self._removal_cost(r, node, now), r) for r in residents),
            key=lambda c: (c[0][0] / c[1].total_gpus, c[1].id),
        )
        mark = state.mark()
        stopped_by_team = dict(ledger.stopped_by_team)
        started = dict(ledger.started_by_team)
        moved: list[tuple[Job, int]] = []
        stopped: list[Job] = []
        cost = 0.0
        preempt_cap = config.max_preemptions_per_cycle

        def undo() -> int:
            state.rollback(mark)
            ledger.stopped_by_team = stopped_by_team
            ledger.started_by_team = started
            return 0

        for (estimate, migrate), resident in costed:
            if state.replicas_fitting(job, node) >= missing:
                break
            if migrate and ledger.migrations + len(moved) < config.max_migrations_per_cycle:
                held = state.evict(resident)
                ready = state.ready_groups(resident)
                target = state.find_move_target(resident, ready, held, {node})
                if target is not None:
                    state.place(resident, {target: resident.total_gpus})
                    moved.append((resident, target))
                    if instance.nodes[target].cluster != instance.nodes[node].cluster:
                        # Moved to another cluster: priced with the transfer over the link.
                        seconds = instance.migration.migration_seconds(resident, across=True)
                        cost += ledger.weight[resident.id] * resident.total_gpus * seconds / horizon
                    else:
                        cost += estimate
                    # Onto GPUs slower for it: the time it then runs longer.
                    slower = self.defragmentation.slowdown(resident, held)
                    cost += ledger.weight[resident.id] * slower / horizon
                    continue
                state.place(resident, held)
            if not self.preemption.service_victim(resident):
                continue
            if preempt_cap is not None and ledger.preemptions + len(stopped) >= preempt_cap:
                continue
            own = gpr * missing if resident.team == job.team else 0
            if ledger.reclaimable(resident.team, own) < resident.held_gpus:
                continue
            lost = instance.migration.preemption_lost_seconds(resident, now)
            held_speed = ledger.job_speed(resident, node)
            cost += ledger.weight[resident.id] * resident.total_gpus * (held_speed + lost / horizon)
            state.evict(resident)
            ledger.stopped_by_team[resident.team] = (
                ledger.stopped_by_team.get(resident.team, 0) + resident.held_gpus
            )
            stopped.append(resident)
        replicas = min(missing, state.replicas_fitting(job, node))
        if cap is not None:
            replicas = min(replicas, (cap - state.team_usage[job.team]) // gpr)
        if replicas <= 0 or not (moved or stopped) or gain_per_replica * replicas <= cost:
            return undo()
        state.add(job, node, replicas * gpr)
        ledger.count_started(job.team, replicas * gpr)
        # A same-team victim counted this growth as its team's start: check it holds.
        for victim in stopped:
            if ledger.reclaimable(victim.team, 0) < 0:
                return undo()
        name = instance.nodes[node].name
        for resident, target in moved:
            ledger.migrations += 1
            ledger.touch(resident.id)
            ledger.made_room(resident.id, job.id, frozenset({name}))
            ledger.result.decisions[resident.id] = Reason(
                code=ReasonCode.defragmentation,
                message=f"moved to {instance.nodes[target].name} to make room on {name} "
                f"for service {job.id}",
            )
        why = (
            f"stopped on {name} for service {job.id}, short of its demand "
            f"({gain_per_replica * replicas:.3g} > {cost:.3g} value units)"
        )
        for victim in stopped:
            ledger.made_room(victim.id, job.id, frozenset({name}))
        ledger.note_stopped(stopped, lambda _victim: why)
        ledger.epoch += 1
        return replicas
