"""Priority (Kueue-like): highest weight first, preempting strictly lower-priority
preemptible work within guarantees; no migration; elastic services follow demand."""

from __future__ import annotations

from solver.greedy import ElasticMode, GreedyOptions, Order, greedy_plan
from solver.instance import Instance
from solver.plan import Plan

OPTIONS = GreedyOptions(
    engine="priority",
    order=Order.PRIORITY,
    elastic=ElasticMode.DEMAND,
    preempt=True,
    preemption_candidates=256,  # as many as the shaper's greedy looks at
)


class PriorityPolicy:
    name = "priority"

    def plan(self, instance: Instance) -> Plan:
        return greedy_plan(instance, OPTIONS, policy=self.name)
