"""FIFO: arrival order, head-of-line blocking, no preemption, elastic reserved at peak."""

from __future__ import annotations

from solver.greedy import ElasticMode, GreedyOptions, Order, greedy_plan
from solver.instance import Instance
from solver.plan import Plan

OPTIONS = GreedyOptions(
    engine="fifo", order=Order.ARRIVAL, elastic=ElasticMode.PEAK, strict_fifo=True
)


class FifoPolicy:
    name = "fifo"

    def plan(self, instance: Instance) -> Plan:
        return greedy_plan(instance, OPTIONS, policy=self.name)
