"""Preemption: a pending block job that does not fit may stop strictly lower-priority
preemptible work (cheapest first, per node), never taking a team below its guarantee and
only when the job's value ``w(j) · boost · gpus · speed · F`` exceeds what the victims hold
and lose ``Σ w(v) · gpus(v) · (speed + lost_seconds(v) / value_horizon_s)``. Victims whose
GPUs the job does not end up using go back where they were, so a victim is only ever
"stopped for" a job that takes its GPUs.

``F = min(left, H) / H``, with ``left`` the expected run time left of the victim that ends
last and ``H`` the value horizon: victims that end within the horizon give their GPUs back
by themselves, so stopping them gains the job only the wait until then, while what they
hold and the work they lose since their last checkpoint are lost whole. Without it, a job
minutes from its end was killed, losing hours of work, for a job that could have had its
GPUs minutes later (training-heavy: 7.3 GPU-hours lost to start a job 20 minutes early).
A victim with no estimate, or one running past it, counts as ending no sooner than the
horizon. ``F`` only ever turns a stop down. It is the shaper's
(``GreedyOptions.stops_weigh_time_left``); the baselines stop with ``F = 1``. (Ranking the
candidate nodes by cost net of that gain was tried: it chose larger stops, 19 → 28
preemptions on contended-hetero for less value.)

Also the rule by which services stop block work (``solver.greedy.elastic``): only
checkpointable victims, which a requeue costs nothing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

from solver.greedy.ledger import Ledger
from solver.greedy.lookahead import Lookahead
from solver.greedy.shortest_remaining import ShortestRemaining
from solver.instance import Job

Candidate = tuple[float, int, int, list[Job]]  # (cost per GPU freed, node, GPUs freed, victims)
# (the job's placement, the victims it keeps stopped) -> why each was stopped (what follows
# "stopped for J, which takes its GPUs on N"), or None when the trade does not pay.
Judge = Callable[[dict[int, int], list[Job]], Callable[[Job], str] | None]


class Preemption:
    def __init__(self, ledger: Ledger, lookahead: Lookahead) -> None:
        self.ledger = ledger
        self.lookahead = lookahead
        instance = ledger.instance
        weights = ledger.weight
        node_index = ledger.state.node_index
        frozen_ids = instance.frozen_ids  # Instance.is_frozen of each of its own jobs
        self.failed: dict[tuple[object, ...], float] = {}  # -> highest weight that failed
        # stop_cost by victim: it reads only what a solve never changes (the victim's weight,
        # its placement in the instance, node speeds, the clock), and the search asks for
        # the same victims again and again (a profile at 10,000 jobs: 200,000 calls).
        self._stop_costs: dict[str, float] = {}
        # Possible victims, and running jobs that would be victims but for their daily
        # limit or their dwell.
        self.victims: set[str] = set()
        self.victims_held_back: set[str] = set()
        # Lowest weight of either per node; victims only leave, so it stays a floor.
        self.victim_floor = [math.inf] * len(instance.nodes)
        # The possible victims placed on each node in the instance, in the order a stop
        # takes them (lowest weight, then largest, then id). A victim only ever leaves its
        # nodes for good by being touched (moved or stopped), so the ones still on a node
        # and untouched are this list filtered: try_preempt walks it instead of sorting
        # what each node holds at each attempt (at 100,000 GPUs: 110,000 sorts per plan).
        self.victims_on_node: dict[int, list[tuple[float, int, str, Job]]] = {}
        floor = self.victim_floor
        for job in instance.jobs:
            if not job.is_running:
                continue
            over_limit = self._over_preemption_limit(job)
            victim = False
            if job.is_elastic:
                if not over_limit:
                    continue
            else:
                preemptible = instance.is_preemptible(job)
                frozen = job.id in frozen_ids
                victim = preemptible and not over_limit and not frozen
                if not victim and not over_limit and not (frozen and preemptible):
                    continue
            (self.victims if victim else self.victims_held_back).add(job.id)
            weight = weights[job.id]
            for node_name in job.placement:
                node = node_index[node_name]
                floor[node] = min(floor[node], weight)
                if victim:  # ids differ, so the sort never compares jobs
                    entry = (weight, -job.total_gpus, job.id, job)
                    self.victims_on_node.setdefault(node, []).append(entry)
        for on_node in self.victims_on_node.values():
            on_node.sort()
        # Stops for shorter work of no more weight (``SolverConfig.shortest_remaining``).
        self.shorter = ShortestRemaining(self) if ledger.options.shortest_remaining else None

    def _over_preemption_limit(self, job: Job) -> bool:
        limit = self.ledger.instance.policy_for(job).max_preemptions_per_day
        return limit is not None and job.preemptions_today >= limit

    def service_victim(self, job: Job) -> bool:
        """A block job a service may stop to grow: preemptible, under its daily limit, and
        checkpointable (requeued without losing work)."""
        return self.ledger.options.preempt and job.id in self.victims and job.checkpointable

    def try_preempt(self, job: Job, groups: list[int]) -> dict[int, int] | None:
        """A placement for ``job`` on GPUs freed by stopping lower-priority work, or None.
        The victims stay stopped; the caller places the job."""
        ledger = self.ledger
        state = ledger.state
        compat = ledger.compat
        cap = ledger.config.max_preemptions_per_cycle
        if cap is not None and ledger.preemptions >= cap:
            ledger.budget_blocked.add(job.id)
            return None
        weight = ledger.weight[job.id]
        # A job of the same shape, team and urgency that failed with at least this weight
        # fails too: it has fewer victims and gains less.
        key = ledger.failure_key(job, ("preempt", job.team, job.id in ledger.overdue))
        if self.failed.get(key, -math.inf) >= weight:
            return None
        nodes = ledger.instance.nodes
        need = job.total_gpus
        touched = ledger.touched
        weights = ledger.weight
        held_back = self.victims_held_back
        victims_on_node = self.victims_on_node
        stop_costs = self._stop_costs
        most = ledger.options.preemption_candidates
        ranked: list[Candidate] = []
        blocked_by_limit = False
        floor = self.victim_floor
        for group in self.lookahead.allowed_groups(job, groups):
            for node in compat.groups[group].node_indices:
                if floor[node] >= weight or not state.ready[node]:
                    continue
                on_node = state.jobs_on_node[node]
                # The node's victims still there, cheapest first, until the job fits.
                free = before = state.free_gpus[node]
                enough = min(need, nodes[node].gpus)
                cost = 0.0
                taken: list[Job] = []
                any_victim = False
                for victim_weight, _, victim_id, victim in victims_on_node.get(node, ()):
                    if victim_weight >= weight:
                        break
                    if victim_id in touched or victim_id not in on_node:
                        continue
                    any_victim = True
                    if free >= enough:
                        break
                    taken.append(victim)
                    free += on_node[victim_id]
                    known = stop_costs.get(victim_id)
                    cost += known if known is not None else self.stop_cost(victim)
                if not any_victim:
                    if any(v in held_back and weights[v] < weight for v in on_node):
                        blocked_by_limit = True
                    continue
                if free <= before:
                    continue
                ranked.append((cost / free, node, free, taken))
                if len(ranked) >= most:
                    break
            if len(ranked) >= most:
                break
        ranked.sort(key=lambda r: (r[0], r[1]))
        # A gang that runs one replica per node never fits one node, and takes a replica's
        # GPUs from each (``Instance.one_replica_per_node``).
        spread = job.replicas > 1 and job.id in ledger.instance.one_replica_per_node
        single = [] if spread else [r for r in ranked if r[2] >= need]
        attempts: list[list[Candidate]] = [[r] for r in single[:3]]
        limit = job.max_nodes if job.max_nodes is not None else job.replicas
        if not single and limit > 1:
            gang: list[Candidate] = []
            total = 0
            for entry in ranked:
                gang.append(entry)
                total += min(entry[2], job.gpus_per_replica) if spread else entry[2]
                if total >= need:
                    break
            attempts.append(gang)
        for attempt in attempts:
            placement = self._evict_and_place(job, groups, attempt)
            if placement is not None:
                return placement
        if blocked_by_limit:
            ledger.budget_blocked.add(job.id)
        self.failed[key] = max(self.failed.get(key, -math.inf), weight)
        return None

    def try_stop_longer(self, job: Job, groups: list[int]) -> dict[int, int] | None:
        """A placement for ``job`` on GPUs freed by stopping longer work of no more weight
        (``solver.greedy.shortest_remaining``), or None; off unless the options ask."""
        if self.shorter is None:
            return None
        return self.shorter.try_stop_longer(job, groups)

    def _evict_and_place(
        self, job: Job, groups: list[int], attempt: Iterable[Candidate]
    ) -> dict[int, int] | None:
        """Stop the attempt's victims and place the job if the trade favours it in the
        objective's units: its value ``w(j) · boost · Σ gpus · speed`` must exceed the
        victims' ``Σ w(v) · gpus · (speed + lost_seconds / value_horizon_s)`` — the work
        they hold now and the work since their last checkpoint that a stop loses."""
        victims = [victim for _, _, _, candidates in attempt for victim in candidates]
        return self.stop_and_place(
            job, groups, victims, lambda placement, kept: self._pays(job, placement, kept)
        )

    def stop_and_place(
        self, job: Job, groups: list[int], victims: Iterable[Job], judge: Judge
    ) -> dict[int, int] | None:
        """Stop ``victims`` and find the job a placement; keep it only if ``judge`` says
        why the victims it keeps stopped were stopped.

        Victims whose GPUs the placement leaves alone go back where they were (so a victim
        is only ever "stopped for" a job that takes its GPUs); no team goes below its
        guarantee, and the per-cycle cap holds. The caller places the job itself.
        """
        ledger = self.ledger
        state = ledger.state
        mark = state.mark()
        stopped: list[tuple[Job, dict[int, int]]] = []
        stopped_by_team = dict(ledger.stopped_by_team)

        def undo() -> None:
            state.rollback(mark)
            ledger.stopped_by_team = stopped_by_team

        for victim in victims:
            if victim.id not in state.placement:
                continue  # a gang victim already stopped from another node
            own = job.total_gpus if victim.team == job.team else 0
            if ledger.reclaimable(victim.team, own) < victim.held_gpus:
                undo()
                return None
            held = state.evict(victim)
            ledger.stopped_by_team[victim.team] = (
                ledger.stopped_by_team.get(victim.team, 0) + victim.held_gpus
            )
            stopped.append((victim, held))
        placement = state.find_gang(
            job, job.replicas, self.lookahead.allowed_groups(job, groups), job.max_nodes
        )
        if placement is None:
            undo()
            return None
        state.place(job, placement)
        # Put back the victims that still fit where they were, the costliest first.
        kept: list[Job] = []
        for victim, held in sorted(stopped, key=lambda s: (-self.stop_cost(s[0]), s[0].id)):
            fits = all(
                state.replicas_fitting(victim, node) * victim.gpus_per_replica >= gpus
                for node, gpus in held.items()
            )
            if fits:
                state.place(victim, held)
                ledger.stopped_by_team[victim.team] -= victim.held_gpus
            else:
                kept.append(victim)
        kept.sort(key=lambda v: v.id)
        cap = ledger.config.max_preemptions_per_cycle
        if cap is not None and ledger.preemptions + len(kept) > cap:
            undo()
            return None
        why = judge(placement, kept) if kept else None
        if kept and why is None:
            undo()
            return None
        for node, gpus in placement.items():
            state.remove(job, node, gpus)
        taken = {ledger.instance.nodes[node].name for node in placement}
        for victim in kept:
            ledger.made_room(victim.id, job.id, frozenset(taken & set(victim.placement)))
        if why is not None:
            detail = why

            def reason(victim: Job) -> str:
                where = ", ".join(sorted(ledger.made_room_for[victim.id][1]))
                return f"stopped for {job.id}, which takes its GPUs on {where}{detail(victim)}"

            ledger.note_stopped(kept, reason)
        ledger.epoch += 1
        return placement

    def _pays(
        self, job: Job, placement: dict[int, int], kept: list[Job]
    ) -> Callable[[Job], str] | None:
        """Why each of ``kept`` is stopped for ``job``, or None (noted) when its value
        does not exceed what they hold and lose (``_evict_and_place``)."""
        ledger = self.ledger
        boost = ledger.config.overdue_weight if job.id in ledger.overdue else 1.0
        # The job would have had the GPUs anyway once the last victim ended.
        wait_share = max((self.horizon_share(victim) for victim in kept), default=1.0)
        gain = (
            ledger.weight[job.id]
            * boost
            * wait_share
            * sum(gpus * ledger.job_speed(job, node) for node, gpus in placement.items())
        )
        cost = sum(self.stop_cost(victim) for victim in kept)
        if gain <= cost:
            ledger.not_worth[job.id] = (
                f"stopping lower-priority work for it would cost more than it gains "
                f"({cost:.3g} >= {gain:.3g} value units: work held and work lost since "
                "the last checkpoint)"
            )
            return None

        return lambda victim: (
            f" (weight {ledger.weight[job.id]:g} > {ledger.weight[victim.id]:g}; "
            f"{gain:.3g} > {cost:.3g} value units)"
        )

    def horizon_share(self, victim: Job) -> float:
        """The share of the value horizon that a running job is expected to go on running
        (1 without an estimate, or past it: it says nothing of the end then)."""
        if not self.ledger.options.stops_weigh_time_left:
            return 1.0
        instance = self.ledger.instance
        left = instance.time_left(victim)
        if left is None:
            return 1.0
        return min(left, instance.config.value_horizon_s) / instance.config.value_horizon_s

    def stop_cost(self, victim: Job) -> float:
        """What stopping a running block job costs, in objective units: the work it holds
        now and the work since its last checkpoint that it loses."""
        known = self._stop_costs.get(victim.id)
        if known is not None:
            return known
        ledger = self.ledger
        horizon = ledger.config.value_horizon_s
        lost = ledger.instance.migration.preemption_lost_seconds(victim, ledger.instance.now)
        index = ledger.state.node_index
        cost = ledger.weight[victim.id] * sum(
            gpus * (ledger.job_speed(victim, index[name]) + lost / horizon)
            for name, gpus in victim.placement.items()
        )
        self._stop_costs[victim.id] = cost
        return cost
