"""The cluster of the inflation experiment: its node list and the free capacity of every
node, as numpy arrays that the policies score in one pass over all nodes.

Feasibility is Kubernetes' resource filter and Open-Gpu-Share's: CPU, memory, GPU model
and GPU capacity (memory counts here, though not in the fragmentation measure). Within a
node, GPU-sharing pods go on the fitting GPU with the least free capacity (best fit), or a
random fitting one when the policy is ``random``; whole-GPU pods take the lowest-numbered
idle GPUs. Besides the free capacity the cluster keeps what the policies need to know
about the pods it hosts: which kinds of pod each node hosts (``gpu-clustering``) and what
preempting its best-effort pods would give back (``shaper-preempt``).
"""

from __future__ import annotations

import csv
from collections import Counter
from pathlib import Path

import numpy as np

from sim.fgd.pod import FULL, MAX_GPUS, Pod
from sim.traces.alibaba import NODE_COLUMNS, require_columns
from sim.traces.common import TraceError, TraceInput


def read_node_rows(path: str | Path) -> list[tuple[str, str, int, int, int]]:
    """``(name, model, cpu_milli, memory_mib, gpus)`` of every node of the list."""
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        require_columns(
            path, reader.fieldnames, NODE_COLUMNS, what="node list", about=TraceInput.nodes
        )
        rows = []
        for line, row in enumerate(reader, start=2):
            try:
                gpus = int(row["gpu"] or 0)
                cpu = int(row["cpu_milli"])
                mem = int(row["memory_mib"])
            except ValueError as exc:
                raise TraceError(f"{path}:{line}: {exc}", about=TraceInput.nodes) from exc
            if not 0 <= gpus <= MAX_GPUS:
                # The free-capacity arrays hold MAX_GPUS GPUs per node: more would be cut.
                raise TraceError(
                    f"{path}:{line}: {gpus} GPUs; the experiment models 0 to {MAX_GPUS} per node",
                    about=TraceInput.nodes,
                )
            rows.append((row["sn"], row["model"] or "", cpu, mem, gpus))
    return rows


class Cluster:
    """Free CPU, memory and per-GPU milli capacity of every node, as numpy arrays."""

    def __init__(self, nodes_path: str | Path, *, include_cpu_nodes: bool = True) -> None:
        rows = read_node_rows(nodes_path)
        if not include_cpu_nodes:
            rows = [r for r in rows if r[4] > 0]
        n = len(rows)
        self.names = [name for name, *_ in rows]
        self.models = [model for _, model, *_ in rows]
        self.model_names = np.array(self.models)
        self.cpu_cap = np.array([cpu for _, _, cpu, _, _ in rows], dtype=np.int64)
        self.mem_cap = np.array([mem for _, _, _, mem, _ in rows], dtype=np.int64)
        self.gpu_count = np.array([gpus for *_, gpus in rows], dtype=np.int64)
        self.cpu = self.cpu_cap.copy()
        self.mem = self.mem_cap.copy()
        self.gpu = np.full((n, MAX_GPUS), -1, dtype=np.int64)
        for i, count in enumerate(self.gpu_count):
            self.gpu[i, :count] = FULL
        self.model_index = {m: i for i, m in enumerate(sorted(set(self.models)))}
        self.node_model = np.array([self.model_index[m] for m in self.models])
        self.hosted: list[list[tuple[Pod, tuple[int, ...]]]] = [[] for _ in range(n)]
        # Ties between equally scored nodes go to the smallest rank (None: at random).
        self.tie_rank: np.ndarray | None = None
        # What preempting a node's best-effort pods would give back: their CPU and memory,
        # and per GPU the milli held by the other pods (which stay).
        self.be_cpu = np.zeros(n, dtype=np.int64)
        self.be_mem = np.zeros(n, dtype=np.int64)
        self.guarded = np.zeros((n, MAX_GPUS), dtype=np.int64)
        # GPU-clustering: pods per kind (Pod.affinity, GPU pods only) on each node.
        self.request_kinds: list[Counter[int]] = [Counter() for _ in range(n)]

    @property
    def capacity_milli(self) -> int:
        return int(self.gpu_count.sum()) * FULL

    def allocated_milli(self) -> int:
        free = np.where(self.gpu >= 0, self.gpu, 0).sum()
        return self.capacity_milli - int(free)

    def free_milli(self, nodes: np.ndarray | slice = slice(None)) -> np.ndarray:
        rows = self.gpu[nodes]
        free: np.ndarray = np.where(rows >= 0, rows, 0).sum(axis=-1)
        return free

    def model_mask(self, pod: Pod) -> np.ndarray:
        if not pod.models:
            return self.gpu_count > 0 if pod.gpus else np.ones(len(self.names), bool)
        wanted = [self.model_index[m] for m in pod.models if m in self.model_index]
        return np.isin(self.node_model, wanted) & (self.gpu_count > 0)

    def feasible(self, pod: Pod) -> np.ndarray:
        ok = (self.cpu >= pod.cpu) & (self.mem >= pod.mem)
        if pod.gpus == 0:
            return ok
        ok &= self.model_mask(pod)
        if pod.shares:
            fits: np.ndarray = ok & (self.gpu >= pod.milli).any(axis=1)
        else:
            fits = ok & ((self.gpu == FULL).sum(axis=1) >= pod.gpus)
        return fits

    def choose_gpus(
        self, node: int, pod: Pod, rng: np.random.Generator | None = None
    ) -> tuple[int, ...]:
        """Best-fit GPU for a sharing pod (a random fitting one when ``rng`` is given),
        the lowest-numbered idle GPUs for whole-GPU pods."""
        row = self.gpu[node]
        if pod.gpus == 0:
            return ()
        if pod.shares:
            if rng is not None:
                return (int(rng.choice(np.flatnonzero(row >= pod.milli))),)
            fits = np.where(row >= pod.milli, row, FULL + 1)
            return (int(np.argmin(fits)),)
        return tuple(int(i) for i in np.flatnonzero(row == FULL)[: pod.gpus])

    def place(self, node: int, pod: Pod, gpus: tuple[int, ...]) -> None:
        self.cpu[node] -= pod.cpu
        self.mem[node] -= pod.mem
        for g in gpus:
            self.gpu[node, g] -= pod.milli if pod.shares else FULL
        self.hosted[node].append((pod, gpus))
        self._account(node, pod, gpus, 1)
        if pod.gpus:
            self.request_kinds[node][pod.affinity] += 1

    def _account(self, node: int, pod: Pod, gpus: tuple[int, ...], sign: int) -> None:
        if pod.best_effort:
            self.be_cpu[node] += sign * pod.cpu
            self.be_mem[node] += sign * pod.mem
            return
        for g in gpus:
            self.guarded[node, g] += sign * (pod.milli if pod.shares else FULL)

    def move(self, node: int, index: int, gpu: int) -> None:
        """Put the node's ``index``-th pod, a sharing one, on another of its GPUs."""
        pod, gpus = self.hosted[node][index]
        self._account(node, pod, gpus, -1)
        self.gpu[node, gpus[0]] += pod.milli
        self.gpu[node, gpu] -= pod.milli
        self.hosted[node][index] = (pod, (gpu,))
        self._account(node, pod, (gpu,), 1)

    def remove(self, node: int, index: int) -> tuple[Pod, tuple[int, ...]]:
        pod, gpus = self.hosted[node].pop(index)
        self._account(node, pod, gpus, -1)
        self.cpu[node] += pod.cpu
        self.mem[node] += pod.mem
        for g in gpus:
            self.gpu[node, g] += pod.milli if pod.shares else FULL
        if pod.gpus:
            self.request_kinds[node][pod.affinity] -= 1
        return pod, gpus
