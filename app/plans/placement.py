"""A plan's placement before and after, node by node, for the nodes its actions touch.

The shaping cycle stores it with the plan (``Plan.summary["placement"]``, from
``record``) because only then is the whole picture known: which jobs held each node's GPUs
when the plan was made, the ones the plan leaves alone included. Plans stored before that
are rebuilt from their actions' placements (``from_actions``): the jobs those actions
move, without the neighbours they leave alone.

Placements are GPU counts per node, as the solver plans them, with the GPUs' indices where
they are known: the scheduler's before (Kubernetes-style schedulers name none), the plan's
assignment after (``solver.indices``). A rebuilt placement has counts only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from solver import Instance
from solver import plan as sp

# The key in ``Plan.summary``; GET /plans leaves it out (GET /plans/{id}/placement serves it).
SUMMARY_KEY = "placement"


def _local(name: str) -> str:
    """A solver name (``cluster/name``) as the cluster knows it."""
    return name.split("/", 1)[-1]


def _add(held: dict[str, dict[str, int]], node: str, job: str, gpus: int) -> None:
    on_node = held.setdefault(node, {})
    left = on_node.get(job, 0) + gpus
    if left > 0:
        on_node[job] = left
    else:
        on_node.pop(job, None)


def record(instance: Instance, plan: sp.Plan, left_out: Iterable[int]) -> dict[str, Any]:
    """What ``Plan.summary["placement"]`` holds: for each node an action of the plan
    touches (``left_out``: indices of actions the plan defers), its GPUs and model, GPUs
    per job before and after the plan's actions, and which GPUs by index where known
    (before: as the scheduler reported them; after: as the plan assigns them)."""
    skipped = set(left_out)
    acting = [a for i, a in enumerate(plan.actions) if i not in skipped]
    moved = {a.job_id for a in acting}
    touched = {n for a in acting for n in (*a.from_placement, *a.to_placement)}
    before: dict[str, dict[str, int]] = {}
    indices_before: dict[str, dict[str, list[int]]] = {}
    indices_after: dict[str, dict[str, list[int]]] = {}
    for job in instance.jobs:
        for node, gpus in job.placement.items():
            if node in touched:
                _add(before, node, _local(job.id), gpus)
                known = (job.gpu_indices or {}).get(node)
                if known:
                    indices_before.setdefault(node, {})[_local(job.id)] = sorted(known)
                    if job.id not in moved:
                        indices_after.setdefault(node, {})[_local(job.id)] = sorted(known)
    after = {node: dict(jobs) for node, jobs in before.items()}
    for action in acting:
        for node, gpus in action.from_placement.items():
            _add(after, node, _local(action.job_id), -gpus)
        for node, gpus in action.to_placement.items():
            _add(after, node, _local(action.job_id), gpus)
            assigned = plan.gpu_indices.get(action.job_id, {}).get(node)
            if assigned:
                indices_after.setdefault(node, {})[_local(action.job_id)] = sorted(assigned)
    nodes = instance.node_by_name
    return {
        "nodes": {
            _local(node): {
                "gpu_model": nodes[node].gpu_model if node in nodes else None,
                "gpus": nodes[node].gpus if node in nodes else None,
                "before": dict(sorted(before.get(node, {}).items())),
                "after": dict(sorted(after.get(node, {}).items())),
                "indices_before": indices_before.get(node, {}),
                "indices_after": {
                    job: held
                    for job, held in indices_after.get(node, {}).items()
                    if job in after.get(node, {})
                },
            }
            for node in sorted(touched)
        }
    }


def from_actions(
    moves: Iterable[tuple[str, Mapping[str, int], Mapping[str, int]]],
) -> dict[str, Any]:
    """The same shape from a plan's actions alone (job, GPUs per node before, after):
    the nodes' sizes are unknown here and the jobs the actions leave alone are missing."""
    before: dict[str, dict[str, int]] = {}
    after: dict[str, dict[str, int]] = {}
    for job, source, target in moves:
        for node, gpus in source.items():
            _add(before, node, job, gpus)
            after.setdefault(node, {})
        for node, gpus in target.items():
            _add(after, node, job, gpus)
            before.setdefault(node, {})
    return {
        "nodes": {
            node: {
                "gpu_model": None,
                "gpus": None,
                "before": dict(sorted(before[node].items())),
                "after": dict(sorted(after[node].items())),
            }
            for node in sorted(before)
        }
    }
