"""One run of the workload-inflation experiment: the pods arrive one by one and the policy
places each, or leaves it unallocated.

The cluster is the GPU nodes of the node list only (the reference schedules onto
``openb_node_list_gpu_node``: 1,213 nodes, 6,212 GPUs); CPU-only pods take CPU and memory
on GPU nodes, and ``cpu_nodes=True`` adds the CPU-only nodes (not the reference setup).
After every pod the run records the arrived requests and the allocated capacity; the
arrival curve (:func:`arrival_curve`) and the end figures make an
:class:`~sim.fgd.results.InflationResult`.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np

from sim.fgd.cluster import Cluster
from sim.fgd.fragmentation import TaskMix
from sim.fgd.placement import FGD_MEMORY, POLICIES, select_node
from sim.fgd.pod import FULL
from sim.fgd.results import InflationResult
from sim.fgd.shaper import MAKE_ROOM, SHAPER_POLICIES
from sim.fgd.through_solver import DEFAULT_BATCH, SOLVER_POLICY, run_through_solver
from sim.fgd.workload import inflated_workload, read_pods
from sim.traces.alibaba import read_alibaba_nodes

ALL_POLICIES = (*POLICIES, *SHAPER_POLICIES)
# Accepted but not run by default: ``shaper-solver`` (the solver itself; being measured).
# ``fgd-memory``: FGD counting memory too, the same measure ``shaper-solver`` can use.
KNOWN_POLICIES = (*ALL_POLICIES, SOLVER_POLICY, FGD_MEMORY)
# Ties between equally scored nodes: the reference's fixed node order, or at random.
TIE_BREAKS = ("name", "random")


def arrival_curve(
    arrived: np.ndarray, allocated: np.ndarray, capacity: int
) -> list[tuple[float, float]]:
    """Unallocated GPUs at each integer percent of arrival: the mean over the pods whose
    arrival rounds to it (the reference's ``merge_alloc_discrete.py``)."""
    if len(arrived) == 0:
        return []
    percent = np.round(arrived / capacity * 100).astype(np.int64)
    curve = []
    for p in np.unique(percent):
        used = allocated[percent == p].mean()
        curve.append((float(p) / 100, float((capacity - used) / FULL)))
    return curve


def run_inflation(
    nodes_path: str | Path,
    pods_path: str | Path,
    policy: str,
    *,
    target: float = 1.3,
    seed: int = 42,
    max_pods: int | None = None,
    defrag_budget: int = 4,
    movable: str = "be",
    cpu_nodes: bool = False,
    placement: str = "fgd",
    tie_break: str = "name",
    progress: Callable[[float], None] | None = None,
    solver_batch: int = DEFAULT_BATCH,
    solver_moves_across: bool = False,
    solver_cpu_only: str = "in-order",
    solver_memory: bool = False,
) -> InflationResult:
    """Run one inflation experiment; ``policy`` is one of ``POLICIES`` or
    ``SHAPER_POLICIES`` (which place by ``placement``), or ``shaper-solver`` (the
    solver, ``solver_batch`` pods per solve, ``solver_moves_across``: shares moved to other
    nodes, ``solver_cpu_only``: the CPU-only pods' turn (checked by ``run_through_solver``),
    ``solver_memory``: the fragmentation counts memory,
    :mod:`sim.fgd.through_solver`). ``cpu_nodes``
    adds the node list's CPU-only nodes to the cluster (the reference uses the GPU nodes
    only)."""
    if policy not in KNOWN_POLICIES:
        raise ValueError(f"unknown policy {policy!r}; one of {KNOWN_POLICIES}")
    if tie_break not in TIE_BREAKS:
        raise ValueError(f"tie_break must be 'name' or 'random', not {tie_break!r}")
    if placement not in POLICIES:
        raise ValueError(f"unknown placement {placement!r}; one of {POLICIES}")
    pods_all = read_pods(pods_path, movable=movable)
    read_alibaba_nodes(nodes_path)  # validates the node list's columns
    cluster = Cluster(nodes_path, include_cpu_nodes=cpu_nodes)
    mix = TaskMix(pods_all)
    rng = np.random.default_rng(seed)
    capacity = cluster.capacity_milli
    workload = inflated_workload(pods_all, capacity, target, rng)
    if tie_break == "name":
        # The reference renames the nodes "%04d-<name>" by rand.Perm once the workload
        # is built; its scheduler fork then takes the smallest name among tied nodes.
        cluster.tie_rank = rng.permutation(len(cluster.names))
    if max_pods is not None:
        workload = workload[:max_pods]
    arrived = 0
    failed = 0
    migrations = 0
    preempted = 0
    arrivals = np.zeros(len(workload), dtype=np.int64)
    allocations = np.zeros(len(workload), dtype=np.int64)
    pods_arrived = len(workload)
    if policy == SOLVER_POLICY:
        arrivals, allocations, failed, migrations = run_through_solver(
            cluster,
            workload,
            mix,
            rng,
            budget=defrag_budget * solver_batch,
            batch=solver_batch,
            progress=progress,
            goal=target * capacity,
            moves_across=solver_moves_across,
            cpu_only=solver_cpu_only,
            memory=solver_memory,
        )
        workload = []  # placed already
        arrived = int(arrivals[-1]) if len(arrivals) else 0
    make_room = MAKE_ROOM.get(policy)
    placement_policy = placement if make_room is not None else policy
    for count, pod in enumerate(workload):
        arrived += pod.gpu_request
        choice = select_node(placement_policy, cluster, pod, rng, mix)
        if choice is not None:
            cluster.place(choice[0], pod, choice[1])
        else:
            room = (
                make_room(cluster, pod, rng, mix, budget=defrag_budget, placement=placement)
                if make_room is not None and pod.gpus > 0
                else None
            )
            if room is None:
                failed += 1
            else:
                migrations += room.migrations
                preempted += room.preempted
        arrivals[count] = arrived
        allocations[count] = cluster.allocated_milli()
        if progress is not None and count % 200 == 0:
            progress(min(1.0, arrived / (target * capacity)))
    allocated = cluster.allocated_milli()
    idle = capacity - allocated
    frag = float(mix.node_fragmentation(cluster.gpu, cluster.cpu, cluster.model_names).sum())
    whole = int(((cluster.gpu >= 0) & (cluster.gpu < FULL)).sum())
    return InflationResult(
        policy=policy,
        capacity_gpus=capacity / FULL,
        arrived_gpus=arrived / FULL,
        allocated_gpus=allocated / FULL,
        unallocated_gpus=idle / FULL,
        whole_gpus_allocated=whole,
        fragmented_share=min(1.0, frag / idle) if idle else 0.0,
        pods_arrived=pods_arrived,
        pods_failed=failed,
        migrations=migrations,
        preempted=preempted,
        curve=arrival_curve(arrivals, allocations, capacity),
        cluster=cluster,
    )
