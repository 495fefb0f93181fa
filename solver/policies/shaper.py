"""Shaper: the greedy engine with migration, resize, preemption and look-ahead, then the
CP-SAT model (``solver.solve``) warm-started from the greedy plan; the better legal plan
is returned and its stats say which engine produced it."""

from __future__ import annotations

from solver.instance import Instance
from solver.plan import Plan
from solver.solve import solve


class ShaperPolicy:
    name = "shaper"

    def plan(self, instance: Instance) -> Plan:
        return solve(instance, policy=self.name)
