"""Look-ahead: capacity an elastic service's forecast will need within
``config.lookahead_s`` is withheld from long, non-checkpointable block jobs.

One reservation per set of compatible groups (services that can use the same GPUs need
them together). A job may use reserved GPUs when it can get out of the way in time:
it is checkpointable, ends before the need, is past its max queue wait, or starves under
the starvation guard (a forecast must not keep a job waiting for ever). GPUs that running
jobs give back before the need count as free for the reservation, and so do GPUs held by
block work the service itself may stop to grow (``ElasticGrowth``, when the options let
services disrupt): checkpointable, preemptible jobs of lower weight than every service of
the reservation, under their daily preemption limit. A checkpointable job may take
reserved GPUs because it can get out of the way; once it runs, the GPUs it holds are
still the service's to take back. Counting them as lost to the service withheld free GPUs
from long jobs that the peak did not need (contended-failures, seeds 1-10: 4.1 % of
``priority``'s value lost against 1.3 % with them counted, services' unmet demand 0.3 →
0.1 replica-hours). It is a trade where the peak then stops that work: contended-hetero
serves 0.9 replica-hours more demand for 0.6 utilization points.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from solver.greedy.ledger import Ledger
from solver.instance import Job


@dataclass
class Reservation:
    """Capacity a service's forecast will need, withheld from long immovable jobs."""

    job: Job
    groups: frozenset[int]
    gpus: int
    seconds_until_needed: float
    # Running jobs at the start of the cycle that end before the need, and the GPUs each
    # holds in ``groups`` (see ``Lookahead.freed_before``).
    ending: dict[str, int] = field(default_factory=dict)
    ending_total: int = 0
    # The lowest weight among the services it reserves for: block work below it, which
    # a service may stop at its peak, holds GPUs the reservation can count on.
    weight: float = math.inf
    # Running jobs a service could stop at the need, and the GPUs each holds in
    # ``groups`` (``Lookahead.stoppable_in``); kept up to date as ``ending`` is.
    stoppable: dict[str, int] = field(default_factory=dict)
    stoppable_total: int = 0
    touched_seen: int = 0  # how much of the ledger's touched log is counted in the total


class Lookahead:
    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.reservations: list[Reservation] = []

    def reserve(self) -> None:
        """One reservation per set of compatible groups: services that can use the same
        GPUs need them together, so their coming needs add up."""
        ledger = self.ledger
        state = ledger.state
        merged: dict[frozenset[int], Reservation] = {}
        for job in ledger.instance.jobs:
            if not job.is_elastic or not job.forecast:
                continue
            # Growth beyond today's target; a shortfall now is the scale-up's business.
            replicas = max(ledger.replicas(job), ledger.elastic_targets.get(job.id, 0))
            steps = math.ceil(ledger.config.lookahead_s / job.forecast_step_s)
            needed_at = None
            peak = replicas
            for step in range(1, steps + 1):  # the coming steps; now is the scale-up's
                demand = job.demand_at(step)
                if demand > replicas and needed_at is None:
                    needed_at = job.seconds_until_step(step, ledger.instance.now)
                peak = max(peak, demand)
            if needed_at is None:
                continue
            groups = frozenset(state.ready_groups(job))
            gpus = (peak - replicas) * job.gpus_per_replica
            weight = ledger.weight[job.id]
            existing = merged.get(groups)
            if existing is None:
                merged[groups] = Reservation(
                    job=job,
                    groups=groups,
                    gpus=gpus,
                    seconds_until_needed=float(needed_at),
                    weight=weight,
                )
            else:
                existing.gpus += gpus
                existing.seconds_until_needed = min(existing.seconds_until_needed, needed_at)
                existing.weight = min(existing.weight, weight)
        self.reservations = [merged[key] for key in sorted(merged, key=sorted)]
        for reservation in self.reservations:
            for job_id, held in state.placement.items():
                gpus = self._ending_in(reservation, job_id, held, start=None)
                if gpus:
                    reservation.ending[job_id] = gpus
                    continue
                gpus = self.stoppable_in(reservation, job_id, held)
                if gpus:
                    reservation.stoppable[job_id] = gpus
            reservation.ending_total = sum(reservation.ending.values())
            reservation.stoppable_total = sum(reservation.stoppable.values())

    def _ending_in(
        self, reservation: Reservation, job_id: str, held: dict[int, int], *, start: float | None
    ) -> int:
        """GPUs ``job_id`` holds in the reservation's groups if it ends before they are
        needed (from ``start``, default its own start time), else 0."""
        instance = self.ledger.instance
        job = instance.job_by_id[job_id]
        runtime = job.expected_runtime_s
        if job.is_elastic or runtime is None:
            return 0
        now = instance.now
        began = start if start is not None else (job.start_time or now)
        if began + runtime > now + reservation.seconds_until_needed:
            return 0
        group_of = self.ledger.compat.group_of_node
        return sum(g for node, g in held.items() if group_of[node] in reservation.groups)

    def stoppable_in(self, reservation: Reservation, job_id: str, held: dict[int, int]) -> int:
        """GPUs ``job_id`` holds in the reservation's groups if the services it reserves for
        may stop the job to grow at their peak, else 0: the options let services stop work
        (``GreedyOptions.grows_services_by_disruption`` with ``preempt``), and the job is a
        checkpointable, preemptible block job under its daily preemption limit whose weight
        is below every such service's (the growth trades a replica's value and its unmet
        demand against the job's work; a lower weight is what makes that trade pay)."""
        ledger = self.ledger
        options = ledger.options
        if not (options.preempt and options.disrupt_for_services):
            return 0
        instance = ledger.instance
        job = instance.job_by_id[job_id]
        if job.is_elastic or not job.checkpointable or not instance.is_preemptible(job):
            return 0
        if ledger.weight[job_id] >= reservation.weight:
            return 0
        limit = instance.policy_for(job).max_preemptions_per_day
        if limit is not None and job.preemptions_today >= limit:
            return 0
        group_of = ledger.compat.group_of_node
        return sum(g for node, g in held.items() if group_of[node] in reservation.groups)

    def reservations_for(self, job: Job) -> list[Reservation]:
        """Reservations a job must leave alone: none if it can move away in time (it is
        checkpointable or ends first), if it is past its max queue wait, if it starves
        under the starvation guard, or if it has waited ``aging_s`` or longer
        (``SolverConfig.lookahead_spares_aged``): a forecast must not keep a job waiting
        for ever, and where several services peak at different hours some peak is always
        within the look-ahead."""
        ledger = self.ledger
        if not self.reservations or job.checkpointable or job.id in ledger.overdue:
            return []
        instance = ledger.instance
        if ledger.options.starvation_guard and instance.is_starving(job):
            return []
        if instance.config.lookahead_spares_aged and instance.boost(job) > 1:
            return []  # aging credit earned: aging_s waited (boost is 1 without aging)
        runtime = job.expected_runtime_s
        return [r for r in self.reservations if runtime is None or runtime > r.seconds_until_needed]

    def allowed_groups(self, job: Job, groups: list[int]) -> list[int]:
        """``groups`` less those a reservation the job must leave alone would be short in."""
        reservations = self.reservations_for(job)
        if not reservations:
            return groups
        need = job.total_gpus
        state = self.ledger.state
        short = [
            r.groups
            for r in reservations
            if state.compatible_free(r.groups) + self._freed_before(r) - need < r.gpus
        ]
        return [group for group in groups if not any(group in blocked for blocked in short)]

    def _freed_before(self, reservation: Reservation) -> int:
        """GPUs of the reservation's groups that block jobs holding them will have given back
        before they are needed (their expected runtime ends), or that the services may take
        back from them then (``stoppable_in``): a forecast peak can take those, so they need
        not be withheld now. A job without a runtime estimate is assumed to stay (unless it
        is stoppable). Kept up to date from the jobs this cycle touched, each counted once when
        it is touched (a touched job is not moved or stopped again in the same cycle), so
        that the greedy pays O(jobs) per reservation in all, not per call."""
        ledger = self.ledger
        log = ledger.touched_log
        while reservation.touched_seen < len(log):
            job_id = log[reservation.touched_seen]
            reservation.touched_seen += 1
            reservation.ending_total -= reservation.ending.pop(job_id, 0)
            reservation.stoppable_total -= reservation.stoppable.pop(job_id, 0)
            held = ledger.state.held(job_id)
            if not held:
                continue
            gpus = self._ending_in(reservation, job_id, held, start=ledger.instance.now)
            if gpus:
                reservation.ending[job_id] = gpus
                reservation.ending_total += gpus
                continue
            gpus = self.stoppable_in(reservation, job_id, held)
            if gpus:
                reservation.stoppable[job_id] = gpus
                reservation.stoppable_total += gpus
        return reservation.ending_total + reservation.stoppable_total
