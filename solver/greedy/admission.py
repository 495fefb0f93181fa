"""Admission: pending block jobs in the policy's order, each placed best-fit on one node or
as a gang over the fewest nodes of one cluster and GPU model.

A job that does not fit may, if the options allow, make room by preemption
(``solver.greedy.preemption``) or by migration (``solver.greedy.defragmentation``);
``defrag_first`` tries migration first. Strict FIFO stops at the first job that does not
fit; EASY backfill (``solver.greedy.backfill``) then lets later jobs run around its
reservation, as does the starvation guard for the first starving job. Frozen jobs are
left alone and never block the queue; jobs past their max queue wait are never held back,
and a last pass retries any still pending on what is free at the end (so
``solver.validate``'s rule 10 holds by construction).
"""

from __future__ import annotations

import math

from solver.greedy import backfill
from solver.greedy.defragmentation import Defragmentation
from solver.greedy.ledger import Ledger
from solver.greedy.lookahead import Lookahead
from solver.greedy.preemption import Preemption
from solver.instance import Job
from solver.plan import Reason, ReasonCode


class Admission:
    def __init__(
        self,
        ledger: Ledger,
        lookahead: Lookahead,
        preemption: Preemption,
        defragmentation: Defragmentation,
    ) -> None:
        self.ledger = ledger
        self.lookahead = lookahead
        self.preemption = preemption
        self.defragmentation = defragmentation
        options = ledger.options
        # May a job that does not fit make room? Turned off for the fill after CP-SAT.
        self.may_preempt = options.preempt
        # Defragmentation moves checkpointable jobs (``migrate``) and service replicas
        # (``move_replicas``).
        self.may_migrate = options.migrate or options.move_replicas
        # Job shape -> (epoch, blocked by a forecast) of a failed placement attempt.
        self.failed: dict[tuple[object, ...], tuple[int, bool]] = {}
        self.fit_cache: dict[tuple[object, ...], bool] = {}
        self.ready_sizes: dict[int, dict[int, int]] = {}  # group -> _ready_sizes
        # The strict-FIFO head (or guarded starving job) and its backfill reservation.
        self.blocked: tuple[Job | None, float, set[int]] = (None, math.inf, set())
        self.guarded: Job | None = None  # the starving job the queue backfills around

    def place_queue(self, queue: list[Job]) -> None:
        ledger = self.ledger
        state = ledger.state
        instance = ledger.instance
        options = ledger.options
        pending = ledger.result.pending
        # The strict-FIFO head (and its backfill reservation) carries over between calls.
        blocked_by, shadow_time, shadow_nodes = self.blocked
        frozen = instance.frozen_ids
        for job in queue:
            if job.id in frozen:
                pending[job.id] = ledger.frozen_reason(job)
                continue  # left as it is; never blocks the queue
            groups = self._worth_it(job, state.ready_groups(job))
            if not groups or not self.could_ever_fit(job, groups):
                continue  # diagnosed at the end; never blocks the queue
            late = job.id in ledger.overdue
            backfilling = options.backfill or self.guarded is not None
            if blocked_by is not None and not backfilling and not late:
                pending[job.id] = Reason(
                    code=ReasonCode.queue_order, message=f"behind {blocked_by.id} in FIFO order"
                )
                continue
            cap = instance.policy_for(job).quota_cap
            if cap is not None and state.team_usage[job.team] + job.total_gpus > cap:
                pending[job.id] = Reason(
                    code=ReasonCode.quota,
                    message=f"team {job.team} would use "
                    f"{state.team_usage[job.team] + job.total_gpus} GPUs > quota {cap}",
                )
                continue
            placement: dict[int, int] | None
            if blocked_by is not None and not late:
                avoid = backfill.nodes_to_avoid(ledger, job, shadow_time, shadow_nodes)
                placement = self._try_place(job, groups, avoid)
                if placement is None and job.id not in pending:
                    if self._try_place(job, groups, None, probe=True) is not None:
                        pending[job.id] = Reason(
                            code=ReasonCode.backfill_reservation,
                            message=f"would delay {blocked_by.id}, reserved from t={shadow_time:g}",
                        )
            else:
                placement = self._try_place(job, groups, None)
                if placement is None and options.defrag_first and self.may_migrate:
                    placement = self.defragmentation.try_defrag(job, groups)
                if placement is None and self.may_preempt:
                    placement = self.preemption.try_preempt(job, groups)
                if placement is None and self.may_migrate:
                    placement = self.defragmentation.try_defrag(job, groups)
                if placement is None and self.may_preempt:
                    placement = self.preemption.try_stop_longer(job, groups)
            if placement is None:
                if options.strict_fifo and blocked_by is None:
                    blocked_by = job
                    if options.backfill:
                        shadow_time, shadow_nodes = backfill.shadow(ledger, job, groups)
                elif options.starvation_guard and blocked_by is None and instance.is_starving(job):
                    shadow_time, shadow_nodes = backfill.shadow(ledger, job, groups)
                    if shadow_nodes:  # no reservation without an end time to count on
                        blocked_by = self.guarded = job
                        pending[job.id] = Reason(
                            code=ReasonCode.insufficient_capacity,
                            message=f"waiting since t={job.submit_time:g}; GPUs on "
                            f"{len(shadow_nodes)} node(s) reserved for it from "
                            f"t={shadow_time:g}",
                        )
                continue
            self._start(job, placement)
        self.blocked = (blocked_by, shadow_time, shadow_nodes)
        self._place_overdue_leftovers(queue)

    def _start(self, job: Job, placement: dict[int, int]) -> None:
        ledger = self.ledger
        ledger.state.place(job, placement)
        ledger.touch(job.id)
        ledger.count_started(job.team, job.total_gpus)
        code = ReasonCode.overdue if ledger.instance.is_overdue(job) else ReasonCode.placed
        ledger.result.decisions.setdefault(
            job.id, Reason(code=code, message=ledger.placed_message(job, placement))
        )

    def _place_overdue_leftovers(self, queue: list[Job]) -> None:
        """Give every overdue job still pending one more try on what is free now.

        Preemptions and moves for later jobs can leave room an overdue job did not have
        at its turn. Starts only take room, so after this pass no pending overdue job fits
        the free GPUs as they are: the property ``solver.validate`` checks.
        """
        ledger = self.ledger
        state = ledger.state
        frozen = ledger.instance.frozen_ids
        late = [
            j
            for j in queue
            if j.id in ledger.overdue and j.id not in state.placement and j.id not in frozen
        ]
        if not late:
            return
        ledger.epoch += 1
        for job in late:
            groups = self._worth_it(job, state.ready_groups(job))
            if not groups:
                continue
            cap = ledger.instance.policy_for(job).quota_cap
            if cap is not None and state.team_usage[job.team] + job.total_gpus > cap:
                continue
            placement = self._try_place(job, groups, None)
            if placement is None:
                continue
            ledger.result.pending.pop(job.id, None)
            self._start(job, placement)

    def could_ever_fit(self, job: Job, groups: list[int]) -> bool:
        """Whether the job fits the empty cluster (so blocking on it makes sense)."""
        spread = job.id in self.ledger.instance.one_replica_per_node
        key = (tuple(groups), job.replicas, job.gpus_per_replica, job.max_nodes, spread)
        cached = self.fit_cache.get(key)
        if cached is None:
            cached = self._fits_empty(job, groups)
            self.fit_cache[key] = cached
        return cached

    def _fits_empty(self, job: Job, groups: list[int]) -> bool:
        per_cluster: dict[str, dict[int, int]] = {}  # cluster -> node GPUs -> ready nodes
        for group in groups:
            sizes = self._ready_sizes(group)
            if sizes:
                counts = per_cluster.setdefault(self.ledger.compat.groups[group].cluster, {})
                for gpus, count in sizes.items():
                    counts[gpus] = counts.get(gpus, 0) + count
        limit = job.max_nodes if job.max_nodes is not None else job.replicas
        spread = job.id in self.ledger.instance.one_replica_per_node
        for counts in per_cluster.values():
            # The ``limit`` nodes that fit the most replicas, the largest first.
            left = limit
            fit = 0
            for gpus in sorted(counts, reverse=True):
                take = min(left, counts[gpus])
                fit += take * min(gpus // job.gpus_per_replica, 1 if spread else gpus)
                left -= take
                if not left:
                    break
            if fit >= job.replicas:
                return True
        return False

    def _ready_sizes(self, group: int) -> dict[int, int]:
        """How many ready nodes of each GPU count the group has (readiness does not change
        within a cycle)."""
        sizes = self.ready_sizes.get(group)
        if sizes is None:
            nodes = self.ledger.instance.nodes
            ready = self.ledger.state.ready
            sizes = {}
            for node in self.ledger.compat.groups[group].node_indices:
                if ready[node]:
                    sizes[nodes[node].gpus] = sizes.get(nodes[node].gpus, 0) + 1
            self.ready_sizes[group] = sizes
        return sizes

    def _home_groups(self, job: Job, groups: list[int]) -> list[int] | None:
        """The groups of the job's home cluster, to try first, when others are allowed too
        and none of theirs is worth the transfer: a model elsewhere faster by more than
        the transfer costs per GPU (``Instance.transfer_per_gpu``) goes first instead, with
        the rest, fastest first. None: no preference."""
        if job.home_cluster is None:
            return None
        compat = self.ledger.compat
        home = [g for g in groups if compat.groups[g].cluster == job.home_cluster]
        if not 0 < len(home) < len(groups):
            return None
        penalty = self.ledger.instance.transfer_per_gpu(job)
        speed = {g: self.ledger.state.group_speed(g, job) for g in groups}
        best_home = max(speed[g] for g in home)
        best_away = max(speed[g] for g in groups if g not in home)
        return home if best_away - penalty <= best_home else None

    def _worth_it(self, job: Job, groups: list[int]) -> list[int]:
        """The groups where starting ``job`` is worth what it costs: away from its home
        cluster a GPU must be worth more than its share of the image's transfer
        (``boost · speed > Instance.transfer_per_gpu``). Filtered here, before any way of
        placing it (fitting, making room, preempting, backfilling) looks at them."""
        if job.home_cluster is None:
            return groups
        instance = self.ledger.instance
        compat = self.ledger.compat
        cost = instance.transfer_per_gpu(job)
        boost = instance.boost(job)
        return [
            g
            for g in groups
            if compat.groups[g].cluster == job.home_cluster
            or boost * self.ledger.state.group_speed(g, job) > cost
        ]

    def _try_place(
        self,
        job: Job,
        groups: list[int],
        exclude: set[int] | None,
        probe: bool = False,
    ) -> dict[int, int] | None:
        ledger = self.ledger
        state = ledger.state
        reservations = () if probe else tuple(id(r) for r in self.lookahead.reservations_for(job))
        # Where its image is and how big: a start away may not pay its transfer.
        away = (job.home_cluster, job.checkpoint_size_mib) if job.home_cluster else None
        key = ledger.failure_key(job, ("place", reservations, away))
        if not exclude:
            failed = self.failed.get(key)
            if failed is not None and failed[0] == ledger.epoch:
                if failed[1]:
                    ledger.forecast_blocked.add(job.id)
                return None
        allowed = self.lookahead.allowed_groups(job, groups) if reservations else groups
        placement = None
        home = self._home_groups(job, allowed)
        if home:
            # Its own cluster first: anywhere else its image has to be sent there first.
            placement = state.find_gang(job, job.replicas, home, job.max_nodes, exclude)
        if placement is None:
            placement = state.find_gang(job, job.replicas, allowed, job.max_nodes, exclude)
        blocked_by_forecast = False
        if placement is None and len(allowed) < len(groups):
            if state.find_gang(job, job.replicas, groups, job.max_nodes, exclude):
                ledger.forecast_blocked.add(job.id)
                blocked_by_forecast = True
        if placement is None and not exclude:
            self.failed[key] = (ledger.epoch, blocked_by_forecast)
        return placement
