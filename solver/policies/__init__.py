"""Placement policies behind one interface: ``get_policy(name).plan(instance) -> Plan``.

``fifo``      arrival order, no preemption, elastic services reserved at their daily peak
              (the baseline of the FIFO vs constraint-aware study);
``backfill``  FIFO with EASY backfill (Slurm-like), same elastic reservation;
``priority``  priority order with preemption, no migration (Kueue-like), elastic services
              follow demand;
``shaper``    the greedy engine with migration, resize and preemption, then the CP-SAT
              model warm-started from it; the better legal plan wins.
"""

from __future__ import annotations

from typing import Protocol

from solver.instance import Instance
from solver.plan import Plan
from solver.policies.backfill import BackfillPolicy
from solver.policies.fifo import FifoPolicy
from solver.policies.priority import PriorityPolicy
from solver.policies.shaper import ShaperPolicy


class Policy(Protocol):
    name: str

    def plan(self, instance: Instance) -> Plan: ...


_POLICIES: dict[str, type[FifoPolicy | BackfillPolicy | PriorityPolicy | ShaperPolicy]] = {
    "fifo": FifoPolicy,
    "backfill": BackfillPolicy,
    "priority": PriorityPolicy,
    "shaper": ShaperPolicy,
}

POLICY_NAMES: tuple[str, ...] = tuple(_POLICIES)


def get_policy(name: str) -> Policy:
    try:
        return _POLICIES[name]()
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; known: {', '.join(POLICY_NAMES)}") from None


__all__ = ["POLICY_NAMES", "Policy", "get_policy"]
