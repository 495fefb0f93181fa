"""Holders: the GPUs that jobs holding part of one GPU use, kept out of the whole-GPU plan.

Shares of a GPU (``solver.greedy.sharing``) and MIG instances
(``solver.greedy.mig_placement``) are planned around the whole GPUs: every GPU they use
becomes one synthetic, locked whole-GPU job (a *holder*, with their CPU and memory) and
they leave the instance, so the whole-GPU plan neither moves nor stops them and puts no
whole-GPU job there. Once that plan is made, the holders leave it and the jobs come back
with their own placement (:class:`PlanParts`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from solver.instance import Instance, Job
from solver.plan import Action, Plan, Reason

GpuKey = tuple[str, int]  # (node, GPU index)


@dataclass
class SplitGpus:
    """An instance split into its part planned whole (``whole``, holders included) and
    the jobs that hold part of a GPU."""

    instance: Instance
    whole: Instance
    holders: dict[str, GpuKey]  # holder id -> (node, GPU index)


def holder_jobs(
    prefix: str, users: Mapping[GpuKey, Sequence[Job]]
) -> tuple[list[Job], dict[str, GpuKey]]:
    """One locked holder per GPU (id ``<prefix><node>/<index>``, team ``prefix``) with the
    CPU and memory of the jobs that use it, in (node, GPU) order; and holder id -> GPU."""
    jobs: list[Job] = []
    holders: dict[str, GpuKey] = {}
    for (node, gpu), users_here in sorted(users.items()):
        job_id = f"{prefix}{node}/{gpu}"
        holders[job_id] = (node, gpu)
        jobs.append(
            Job(
                id=job_id,
                team=prefix,
                placement={node: 1},
                gpu_indices={node: (gpu,)},
                cpu_milli_per_replica=sum(j.cpu_milli_per_replica for j in users_here),
                memory_mib_per_replica=sum(j.memory_mib_per_replica for j in users_here),
                preemptible=False,
                locked=True,
            )
        )
    return jobs, holders


def quota_outside(instance: Instance, users: Mapping[GpuKey, Sequence[Job]]) -> dict[str, int]:
    """``instance.quota_held_outside`` with one GPU more per job in ``users`` for its team:
    what the whole-GPU part must count against each team's quota (a share of a GPU and a
    MIG instance count one GPU, as ``solver.validate`` counts them; the holders, which
    stand for their GPUs in that part, belong to no team)."""
    held = dict(instance.quota_held_outside)
    for users_here in users.values():
        for job in users_here:
            held[job.team] = held.get(job.team, 0) + 1
    return held


@dataclass
class PlanParts:
    """A whole-GPU plan without its holders, for the jobs that hold part of a GPU to be
    added to, then made a :class:`Plan` again (:meth:`plan`)."""

    source: Plan
    placement: dict[str, dict[str, int]]
    indices: dict[str, dict[str, tuple[int, ...]]]
    actions: list[Action]
    pending: dict[str, Reason]

    @classmethod
    def without_holders(cls, plan: Plan, holders: Mapping[str, GpuKey]) -> PlanParts:
        return cls(
            source=plan,
            placement={k: dict(v) for k, v in plan.placement.items() if k not in holders},
            indices={k: dict(v) for k, v in plan.gpu_indices.items() if k not in holders},
            actions=list(plan.actions),
            pending={k: v for k, v in plan.pending.items() if k not in holders},
        )

    def plan(self, note: str, **fields: Any) -> Plan:
        """The plan, with ``note`` added to its stats and ``fields`` (``mig_starts``) set."""
        plan = self.source
        stats = plan.stats.model_copy()
        stats.note = f"{stats.note}; {note}" if stats.note else note
        return Plan(
            policy=plan.policy,
            placement=self.placement,
            actions=self.actions,
            pending=self.pending,
            gpu_indices=self.indices,
            stats=stats,
            **fields,
        )
