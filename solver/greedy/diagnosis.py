"""Diagnosis: a reason for every block job left pending, the most specific that applies
(no compatible GPU model, never fits, held for a forecast, over the disruption budget, not
worth the preemption, fragmentation, lower priority than what holds the GPUs, or plain
capacity), prefixed for a job past its max queue wait."""

from __future__ import annotations

import math

from solver.greedy.admission import Admission
from solver.greedy.ledger import Ledger
from solver.instance import Job
from solver.plan import Reason, ReasonCode

OVERDUE_PREFIX = "past its max queue wait, yet not placeable: "


class Diagnosis:
    def __init__(self, ledger: Ledger, admission: Admission) -> None:
        self.ledger = ledger
        self.admission = admission

    def diagnose(self, queue: list[Job]) -> None:
        ledger = self.ledger
        state = ledger.state
        pending = ledger.result.pending
        holder_weight = self._min_holder_weight()
        for job in queue:
            if job.id in state.placement or job.id in pending:
                continue
            all_groups = ledger.compat.groups_for(job)
            groups = state.ready_groups(job)
            if not all_groups:
                pending[job.id] = Reason(
                    code=ReasonCode.no_compatible_gpu_model,
                    message="no node has a GPU model, memory, precision and labels it accepts",
                )
            elif not groups:
                pending[job.id] = Reason(
                    code=ReasonCode.no_compatible_gpu_model,
                    message="no compatible node is ready",
                )
            elif not self.admission.could_ever_fit(job, groups):
                pending[job.id] = Reason(
                    code=ReasonCode.insufficient_capacity,
                    message=f"{job.total_gpus} GPUs within the node spread limit exceed any "
                    "cluster's compatible nodes",
                )
            elif job.id in ledger.forecast_blocked:
                pending[job.id] = Reason(
                    code=ReasonCode.forecast_reservation,
                    message="the free GPUs are needed by an elastic service's coming peak",
                )
            elif job.id in ledger.budget_blocked:
                pending[job.id] = Reason(
                    code=ReasonCode.disruption_budget,
                    message="making room needs more migrations or preemptions than allowed, "
                    "or work that Shaper acted on lately (dwell time, move budget)",
                )
            elif job.id in ledger.not_worth:
                pending[job.id] = Reason(
                    code=ReasonCode.insufficient_capacity, message=ledger.not_worth[job.id]
                )
            elif state.compatible_free(groups) >= job.total_gpus:
                pending[job.id] = Reason(
                    code=ReasonCode.fragmentation,
                    message=f"{state.compatible_free(groups)} compatible GPUs free but "
                    f"no node or gang of {job.total_gpus} fits",
                )
            elif (
                ledger.options.preempt
                and min((holder_weight[g] for g in groups), default=math.inf)
                >= ledger.weight[job.id]
            ):
                pending[job.id] = Reason(
                    code=ReasonCode.lower_priority,
                    message="compatible GPUs are held by work of equal or higher priority",
                )
            else:
                pending[job.id] = Reason(
                    code=ReasonCode.insufficient_capacity,
                    message=f"{state.compatible_free(groups)} compatible GPUs free, "
                    f"{job.total_gpus} needed",
                )
        self._mark_overdue(queue)

    def _mark_overdue(self, queue: list[Job]) -> None:
        """Say so when a job past its max queue wait stays pending (the reason is why)."""
        ledger = self.ledger
        pending = ledger.result.pending
        for job in queue:
            reason = pending.get(job.id)
            if reason is None or job.id not in ledger.overdue:
                continue
            if not reason.message.startswith(OVERDUE_PREFIX):
                pending[job.id] = Reason(
                    code=reason.code, message=f"{OVERDUE_PREFIX}{reason.message}"
                )

    def _min_holder_weight(self) -> list[float]:
        ledger = self.ledger
        compat = ledger.compat
        weights = [math.inf] * len(compat.groups)
        boost = ledger.config.overdue_weight
        overdue = ledger.overdue
        group_of_node = compat.group_of_node
        for job_id, held in ledger.state.placement.items():
            # A job started past its max wait outranks everything it displaced.
            weight = ledger.weight[job_id]
            if job_id in overdue:
                weight *= boost
            for node in held:
                group = group_of_node[node]
                if weight < weights[group]:
                    weights[group] = weight
        return weights
