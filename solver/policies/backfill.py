"""FIFO with EASY backfill (Slurm-like): the blocked head job gets a reservation at the
earliest time running jobs' walltimes free enough GPUs; later jobs start now if they end
before it or stay off its nodes. Jobs without ``expected_runtime_s`` never end early."""

from __future__ import annotations

from solver.greedy import ElasticMode, GreedyOptions, Order, greedy_plan
from solver.instance import Instance
from solver.plan import Plan

OPTIONS = GreedyOptions(
    engine="backfill",
    order=Order.ARRIVAL,
    elastic=ElasticMode.PEAK,
    strict_fifo=True,
    backfill=True,
)


class BackfillPolicy:
    name = "backfill"

    def plan(self, instance: Instance) -> Plan:
        return greedy_plan(instance, OPTIONS, policy=self.name)
