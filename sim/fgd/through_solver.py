"""``shaper-solver``: the inflation experiment placed by the solver the service runs.

Every batch of arriving pods is one planning cycle: the cluster as it stands becomes a
``solver.Instance`` (every placed pod a running job on its GPUs, fractional pods on their
GPU index; the batch's GPU pods pending, in arrival order by ``submit_time``) and
``solver.solve.solve`` plans it, as the control plane's cycle does: whole-GPU pods by the
greedy engine (best fit, defragmentation by migration of checkpointable pods), fractional
pods by ``solver.greedy.sharing`` (FGD's score over the trace's typical pods, and a repack
of a node's checkpointable sharing pods when one fits nowhere). The plan's starts and
migrations are applied to the cluster; a pod the plan leaves pending is unallocated for
good, as in the reference (nothing leaves, so waiting would not help).

Where it differs from the other policies: pods are planned a batch at a time
(``batch`` GPU pods per solve at most; one per solve is the reference's order, and slow),
CPU-only pods — which ``solver.Instance`` cannot express (every job holds GPUs) — are
placed by FGD's own placement, by default in their arrival turn (each closes the batch of
GPU pods before it, which is planned first), and the solve runs without CP-SAT (the greedy path:
``SolverConfig(use_cp_sat=False)``), deterministic, with no preemption (the figure is
migration's, as ``shaper-defrag``'s is).

With ``memory`` (``--solver-memory``) the typical shapes carry the least memory their pods
ask (``TypicalShape.memory_mib``), so the solver's fragmentation counts a node's free GPUs
as fragmented for a shape whose memory the node no longer has, and the CPU-only pods are
placed by the same measure (``fgd-memory``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from sim.fgd.cluster import Cluster
from sim.fgd.fragmentation import TaskMix
from sim.fgd.placement import FGD_MEMORY, select_node
from sim.fgd.pod import FULL, Pod
from solver.fragmentation import as_typical
from solver.instance import (
    GpuModel,
    Instance,
    Job,
    MigrationCostModel,
    Node,
    SolverConfig,
)
from solver.plan import ActionKind, Plan
from solver.solve import solve

SOLVER_POLICY = "shaper-solver"
DEFAULT_BATCH = 50
# When a CPU-only pod (not a solver job) is placed: see run_through_solver.
CPU_ONLY_TURNS = ("arrival", "in-order", "last")
NO_MODEL = "none"  # the GPU model name of CPU-only nodes


@dataclass
class Applied:
    """What one plan did to the cluster."""

    placed: int
    failed: int
    migrations: int


class SolverCluster:
    """The cluster's pods as solver jobs, kept between cycles (a job is rebuilt only when
    its pod moves), and the cycle: instance, solve, apply."""

    def __init__(
        self,
        cluster: Cluster,
        mix: TaskMix,
        *,
        movable_budget: int,
        moves_across: bool = False,
        memory: bool = False,
    ) -> None:
        self.cluster = cluster
        order = (
            np.argsort(cluster.tie_rank, kind="stable")
            if cluster.tie_rank is not None
            else np.arange(len(cluster.names))
        )
        # Nodes in the tie-break order: the solver takes the first of equally good nodes.
        self.order = [int(i) for i in order]
        # CPU and memory of the CPU-only pods (not solver jobs): off the nodes' capacity.
        self.cpu_only_cpu = np.zeros(len(cluster.names), dtype=np.int64)
        self.cpu_only_mem = np.zeros(len(cluster.names), dtype=np.int64)
        self.nodes = self._nodes()
        self.node_index = {name: i for i, name in enumerate(cluster.names)}
        self.gpu_models = tuple(
            GpuModel(name=m or NO_MODEL, memory_mib=0) for m in sorted(set(cluster.models))
        )
        # ``memory``: each typical shape carries the least memory its pods ask, so the
        # solver's fragmentation counts GPUs on a node without that memory as fragmented.
        self.shapes = as_typical(
            (((cpu, milli, gpus, models), share) for cpu, milli, gpus, models, share in mix.kinds),
            mix.least_memory if memory else None,
        )
        self.config = SolverConfig(
            use_cp_sat=False,
            deterministic=True,
            preemption=False,
            max_migrations_per_cycle=movable_budget,
            migration_cooldown_s=0.0,
            dwell_s=0.0,
            share_moves_across_nodes=moves_across,
        )
        self.running: dict[str, Job] = {}  # pod id -> its job as placed
        # The cluster hosts pods as (pod, gpus) lists per node, and pods are shared objects
        # (drawn with replacement): the ids of what each node hosts, in the same order.
        self.hosted_ids: list[list[str]] = [[] for _ in cluster.names]
        self.pods: dict[str, Pod] = {}
        self.now = 0.0
        self._stale = False
        self.last_instance: Instance | None = None

    def _nodes(self) -> tuple[Node, ...]:
        cluster = self.cluster
        # Never 0 left, which would read "not modelled".
        cpu = np.maximum(cluster.cpu_cap - self.cpu_only_cpu, 1)
        mem = np.maximum(cluster.mem_cap - self.cpu_only_mem, 1)
        return tuple(
            Node(
                name=cluster.names[i],
                cluster="alibaba",
                gpu_model=cluster.models[i] or NO_MODEL,
                gpus=int(cluster.gpu_count[i]),
                cpu_milli=int(cpu[i]),
                memory_mib=int(mem[i]),
            )
            for i in self.order
        )

    def place_cpu_only(self, node: int, pod_id: str, pod: Pod) -> None:
        """A CPU-only pod, placed outside the solver: its CPU and memory leave the node."""
        self.place(node, pod_id, pod, ())
        self.cpu_only_cpu[node] += pod.cpu
        self.cpu_only_mem[node] += pod.mem
        self._stale = True

    @staticmethod
    def job(pod_id: str, pod: Pod, order: float, where: tuple[str, tuple[int, ...]] | None) -> Job:
        placement: dict[str, int] = {}
        indices: dict[str, tuple[int, ...]] | None = None
        if where is not None:
            node, gpus = where
            placement = {node: 1 if pod.shares else pod.gpus}
            indices = {node: gpus}
        return Job(
            id=pod_id,
            gpus_per_replica=1 if pod.shares else pod.gpus,
            gpu_milli=pod.milli if pod.shares else FULL,
            cpu_milli_per_replica=pod.cpu,
            memory_mib_per_replica=pod.mem,
            max_nodes=1,
            allowed_gpu_models=frozenset(pod.models) if pod.models else None,
            checkpointable=pod.checkpointable,
            preemptible=False,
            submit_time=order,
            start_time=order if where is not None else None,
            placement=placement,
            gpu_indices=indices,
        )

    def plan(self, batch: Sequence[tuple[str, Pod]]) -> Plan:
        self.now += 1.0
        step = 1.0 / (len(batch) + 1)  # arrival order within the batch
        pending = [
            self.job(pod_id, pod, self.now + i * step, None)
            for i, (pod_id, pod) in enumerate(batch)
        ]
        for pod_id, pod in batch:
            self.pods[pod_id] = pod
        if self._stale:
            self.nodes = self._nodes()
            self._stale = False
        instance = Instance(
            now=self.now + 1.0,
            gpu_models=self.gpu_models,
            nodes=self.nodes,
            jobs=(*self.running.values(), *pending),
            migration=MigrationCostModel(),
            config=self.config,
            typical_shapes=self.shapes,
        )
        self.last_instance = instance  # what the last plan was made for (tests check it)
        return solve(instance)

    def apply(self, plan: Plan, batch: Sequence[tuple[str, Pod]]) -> Applied:
        cluster = self.cluster
        placed = migrations = 0
        moves = [a for a in plan.actions if a.kind is ActionKind.migrate]
        # Moves first (off their old GPUs), then every landing.
        landings: list[tuple[str, str, tuple[int, ...]]] = []
        for action in moves:
            pod_id = action.job_id
            (old_node,) = action.from_placement
            index = self._hosted_index(old_node, pod_id)
            cluster.remove(self.node_index[old_node], index)
            (node,) = action.to_placement
            landings.append((pod_id, node, plan.gpu_indices[pod_id][node]))
            migrations += 1
        for action in plan.actions:
            if action.kind is ActionKind.start:
                (node,) = action.to_placement
                landings.append((action.job_id, node, plan.gpu_indices[action.job_id][node]))
                placed += 1
            elif action.kind is not ActionKind.migrate:
                raise AssertionError(f"unexpected {action.kind} of {action.job_id}")
        for pod_id, node, gpus in landings:
            pod = self.pods[pod_id]
            self.place(self.node_index[node], pod_id, pod, gpus)
            order = self.running[pod_id].submit_time if pod_id in self.running else self.now
            self.running[pod_id] = self.job(pod_id, pod, order, (node, gpus))
        failed = sum(1 for pod_id, _ in batch if pod_id not in self.running)
        for pod_id, _ in batch:
            if pod_id not in self.running:
                self.pods.pop(pod_id, None)
        return Applied(placed=placed, failed=failed, migrations=migrations)

    def place(self, node: int, pod_id: str, pod: Pod, gpus: tuple[int, ...]) -> None:
        self.cluster.place(node, pod, gpus)
        self.hosted_ids[node].append(pod_id)

    def _hosted_index(self, node_name: str, pod_id: str) -> int:
        ids = self.hosted_ids[self.node_index[node_name]]
        index = ids.index(pod_id)
        ids.pop(index)
        return index


def run_through_solver(
    cluster: Cluster,
    workload: Sequence[Pod],
    mix: TaskMix,
    rng: np.random.Generator,
    *,
    budget: int,
    batch: int = DEFAULT_BATCH,
    progress: Callable[[float], None] | None = None,
    goal: float = 1.0,
    moves_across: bool = False,
    cpu_only: str = "in-order",
    memory: bool = False,
) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Place ``workload`` through the solver, ``batch`` pods per solve (``moves_across``:
    ``SolverConfig.share_moves_across_nodes``; ``memory``: the typical shapes carry their
    pods' least memory, ``TypicalShape.memory_mib``). CPU-only pods take the turn ``cpu_only``
    names (one of ``CPU_ONLY_TURNS``): ``arrival``, placed as they come, before the GPU
    pods of their batch that came earlier but wait for its solve; ``in-order``, after
    those: a CPU-only pod closes the batch, which is planned first, so every pod is placed
    in arrival order as in the reference; ``last``, after the plan of the batch they
    arrived in, in arrival order (where the solver's value order puts jobs of no GPU,
    after those of equal weight that hold GPUs). Returns the arrived and allocated milli
    after every pod, the pods failed and the migrations."""
    if batch < 1:
        raise ValueError(f"batch must be at least 1, not {batch}")
    if cpu_only not in CPU_ONLY_TURNS:
        raise ValueError(f"cpu_only must be one of {CPU_ONLY_TURNS}, not {cpu_only!r}")
    solver_cluster = SolverCluster(
        cluster, mix, movable_budget=budget, moves_across=moves_across, memory=memory
    )
    arrivals = np.zeros(len(workload), dtype=np.int64)
    allocations = np.zeros(len(workload), dtype=np.int64)
    arrived = failed = migrations = 0
    waiting: list[tuple[str, Pod]] = []
    cpu_waiting: list[tuple[int, Pod]] = []
    first = 0  # index of the first pod of the batch being collected

    def flush(upto: int) -> None:
        """Plan the batch; each of its pods is recorded with what the batch's plan gave it
        and the pods before it (not the later ones: the curve stays per pod)."""
        nonlocal failed, migrations, first
        before = cluster.allocated_milli()
        if waiting:
            applied = solver_cluster.apply(solver_cluster.plan(waiting), waiting)
            failed += applied.failed
            migrations += applied.migrations
            waiting.clear()
        for count, pod in cpu_waiting:
            place_cpu_only(count, pod)
        cpu_waiting.clear()
        gained = np.zeros(upto - first, dtype=np.int64)
        for k in range(first, upto):
            if f"pod-{k}" in solver_cluster.running:
                gained[k - first] = workload[k].gpu_request
        allocations[first:upto] = before + np.cumsum(gained)
        first = upto

    def place_cpu_only(count: int, pod: Pod) -> None:
        """CPU-only: not a solver job; FGD's placement (counting memory, as the solver's
        measure then does, with ``memory``)."""
        nonlocal failed
        choice = select_node(FGD_MEMORY if memory else "fgd", cluster, pod, rng, mix)
        if choice is None:
            failed += 1
        else:
            solver_cluster.place_cpu_only(choice[0], f"cpu-{count}", pod)

    for count, pod in enumerate(workload):
        arrived += pod.gpu_request
        arrivals[count] = arrived
        if pod.gpus == 0 and cpu_only == "arrival":
            place_cpu_only(count, pod)
        elif pod.gpus == 0:
            cpu_waiting.append((count, pod))
        else:
            waiting.append((f"pod-{count}", pod))
        if len(waiting) >= batch or (pod.gpus == 0 and cpu_only == "in-order"):
            flush(count + 1)
            if progress is not None:
                progress(min(1.0, arrived / goal))
    flush(len(workload))
    return arrivals, allocations, failed, migrations
