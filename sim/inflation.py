"""The FGD workload-inflation experiment on the Alibaba 2023 trace (ATC'23, Weng et al.).

Pods drawn at random (with replacement, seeded) from the pod list arrive one by one, with
no departures, into the cluster of the node list until the GPUs they request reach
``target`` (1.3) × the cluster's GPU capacity. Each pod asks for CPU, memory and either
``num_gpu`` whole GPUs or, when ``num_gpu = 1``, ``gpu_milli`` thousandths of one GPU, on
one of its allowed GPU models. A pod that fits nowhere is not allocated (and stays so:
there are no departures). The figure of merit is the GPU capacity left unallocated at the
end (in GPUs, counted in milli-GPUs), next to the share of idle GPU capacity that is
fragmented (unusable by the pod mix).

Placement policies, as in the FGD paper and its simulator:

* ``random``: a random feasible node;
* ``best-fit``: the node with the least normalized CPU + memory + GPU left after placing;
* ``dot-product``: the node whose free (CPU, memory, GPU) vector, normalized by the
  node's capacity, has the largest dot product with the pod's request;
* ``gpu-packing``: share an already used GPU first, then use idle GPUs of active nodes,
  then idle nodes (best-fit within each class);
* ``gpu-clustering``: nodes already hosting pods with the same GPU request first;
* ``fgd``: fragmentation gradient descent: the node and GPU that least increase the
  node's expected fragmentation for the pod mix (task types weighted by popularity).

Within a node a GPU-sharing pod goes on the feasible GPU with the least free capacity
(best fit), except under ``fgd``, which evaluates every feasible GPU.

``shaper-defrag`` adds what placement alone cannot: when a pod fits nowhere, Shaper may
migrate checkpointable pods (best-effort QoS, as in ``sim.traces.alibaba``) between GPUs
and nodes to make room, paying a migration each. It runs the ``fgd`` placement first and
defragments only on failure, within a migration budget per failed pod. It is the
simulator's stand-in for the solver's defragmentation until ``solver.Instance`` models
fractional GPUs (``gpu_milli``): the solver's policies cannot express this experiment yet.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sim.traces.alibaba import read_alibaba_nodes

POLICIES = ("random", "best-fit", "dot-product", "gpu-packing", "gpu-clustering", "fgd")
ALL_POLICIES = (*POLICIES, "shaper-defrag")
MAX_GPUS = 8
FULL = 1000


@dataclass(frozen=True, slots=True)
class Pod:
    cpu: int
    mem: int
    gpus: int
    milli: int
    models: tuple[str, ...]
    checkpointable: bool

    @property
    def gpu_request(self) -> int:
        """Requested GPU capacity in milli-GPUs."""
        return self.milli if self.gpus == 1 else self.gpus * FULL

    @property
    def shares(self) -> bool:
        return self.gpus == 1 and self.milli < FULL


@dataclass(slots=True)
class InflationResult:
    policy: str
    capacity_gpus: float
    arrived_gpus: float
    allocated_gpus: float
    unallocated_gpus: float
    whole_gpus_allocated: int
    fragmented_share: float
    pods_arrived: int
    pods_failed: int
    migrations: int = 0
    curve: list[tuple[float, float]] = field(default_factory=list)
    cluster: Cluster | None = field(default=None, repr=False)

    def to_json(self) -> dict[str, object]:
        return {
            "policy": self.policy,
            "capacity_gpus": self.capacity_gpus,
            "arrived_gpus": self.arrived_gpus,
            "allocated_gpus": self.allocated_gpus,
            "unallocated_gpus": self.unallocated_gpus,
            "whole_gpus_allocated": self.whole_gpus_allocated,
            "fragmented_share": self.fragmented_share,
            "pods_arrived": self.pods_arrived,
            "pods_failed": self.pods_failed,
            "migrations": self.migrations,
            "curve": self.curve,
        }


def read_pods(path: str | Path, *, movable: str = "be") -> list[Pod]:
    """Every pod of the list, CPU-only ones included (they take CPU and memory).

    ``movable``: which pods Shaper may migrate: ``be`` (best-effort QoS only, as in the
    trace replays) or ``all`` (transparent checkpointing of every pod)."""
    if movable not in ("be", "all"):
        raise ValueError(f"movable must be 'be' or 'all', not {movable!r}")
    import csv

    pods = []
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            gpus = int(row["num_gpu"] or 0)
            pods.append(
                Pod(
                    cpu=int(row["cpu_milli"] or 0),
                    mem=int(row["memory_mib"] or 0),
                    gpus=gpus,
                    milli=int(row["gpu_milli"] or 0) if gpus == 1 else (FULL if gpus else 0),
                    models=tuple(m for m in (row["gpu_spec"] or "").split("|") if m),
                    checkpointable=movable == "all" or (row["qos"] or "BE") == "BE",
                )
            )
    return pods


class Cluster:
    """Free CPU, memory and per-GPU milli capacity of every node, as numpy arrays."""

    def __init__(self, nodes_path: str | Path, *, include_cpu_nodes: bool = True) -> None:
        import csv

        with open(nodes_path, newline="") as handle:
            rows = list(csv.DictReader(handle))
        if not include_cpu_nodes:
            rows = [r for r in rows if int(r["gpu"] or 0) > 0]
        n = len(rows)
        self.names = [r["sn"] for r in rows]
        self.models = [r["model"] or "" for r in rows]
        self.cpu_cap = np.array([int(r["cpu_milli"]) for r in rows], dtype=np.int64)
        self.mem_cap = np.array([int(r["memory_mib"]) for r in rows], dtype=np.int64)
        self.gpu_count = np.array([int(r["gpu"] or 0) for r in rows], dtype=np.int64)
        self.cpu = self.cpu_cap.copy()
        self.mem = self.mem_cap.copy()
        self.gpu = np.full((n, MAX_GPUS), -1, dtype=np.int64)
        for i, count in enumerate(self.gpu_count):
            self.gpu[i, :count] = FULL
        self.model_index = {m: i for i, m in enumerate(sorted(set(self.models)))}
        self.node_model = np.array([self.model_index[m] for m in self.models])
        self.hosted: list[list[tuple[Pod, tuple[int, ...]]]] = [[] for _ in range(n)]
        self.request_kinds: list[Counter[int]] = [Counter() for _ in range(n)]

    @property
    def capacity_milli(self) -> int:
        return int(self.gpu_count.sum()) * FULL

    def allocated_milli(self) -> int:
        free = np.where(self.gpu >= 0, self.gpu, 0).sum()
        return self.capacity_milli - int(free)

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

    def choose_gpus(self, node: int, pod: Pod) -> tuple[int, ...]:
        row = self.gpu[node]
        if pod.gpus == 0:
            return ()
        if pod.shares:
            fits = np.where(row >= pod.milli, row, FULL + 1)
            return (int(np.argmin(fits)),)
        return tuple(int(i) for i in np.flatnonzero(row == FULL)[: pod.gpus])

    def place(self, node: int, pod: Pod, gpus: tuple[int, ...]) -> None:
        self.cpu[node] -= pod.cpu
        self.mem[node] -= pod.mem
        for g in gpus:
            self.gpu[node, g] -= pod.milli if pod.shares else FULL
        self.hosted[node].append((pod, gpus))
        self.request_kinds[node][pod.gpu_request] += 1

    def remove(self, node: int, index: int) -> tuple[Pod, tuple[int, ...]]:
        pod, gpus = self.hosted[node].pop(index)
        self.cpu[node] += pod.cpu
        self.mem[node] += pod.mem
        for g in gpus:
            self.gpu[node, g] += pod.milli if pod.shares else FULL
        self.request_kinds[node][pod.gpu_request] -= 1
        return pod, gpus


class TaskMix:
    """The pod mix as (GPU request, popularity) classes, for fragmentation measures."""

    def __init__(self, pods: list[Pod]) -> None:
        counts = Counter((p.gpus, p.milli) for p in pods if p.gpus > 0)
        total = sum(counts.values())
        self.kinds = [(gpus, milli, n / total) for (gpus, milli), n in counts.most_common()]
        # Median CPU and memory of each kind: a node without them cannot host the kind.
        self.needs: dict[tuple[int, int], tuple[float, float]] = {}
        for gpus, milli, _ in self.kinds:
            same = [p for p in pods if (p.gpus, p.milli) == (gpus, milli)]
            self.needs[(gpus, milli)] = (
                float(np.median([p.cpu for p in same])),
                float(np.median([p.mem for p in same])),
            )

    def node_fragmentation(
        self, gpu: np.ndarray, cpu: np.ndarray | None = None, mem: np.ndarray | None = None
    ) -> np.ndarray:
        """Expected fragmented GPU milli per row of ``gpu`` (nodes × GPUs) for the mix.

        For a task kind, a node's free GPU capacity is fragmented where the kind cannot
        use it: all of it when the kind does not fit the node at all (GPUs, or — when
        ``cpu``/``mem`` are given — the kind's median CPU or memory), else the free
        capacity on GPUs too small for it (GPU-sharing kinds)."""
        free = np.where(gpu >= 0, gpu, 0)
        total_free = free.sum(axis=-1)
        full_gpus = (gpu == FULL).sum(axis=-1)
        result = np.zeros(gpu.shape[:-1], dtype=np.float64)
        for gpus, milli, share in self.kinds:
            if gpus == 1 and milli < FULL:
                small = np.where((gpu >= 0) & (gpu < milli), free, 0).sum(axis=-1)
                fits = (gpu >= milli).any(axis=-1)
                frag = np.where(fits, small, total_free)
            else:
                frag = np.where(full_gpus >= gpus, total_free - full_gpus * FULL, total_free)
            if cpu is not None and mem is not None:
                need_cpu, need_mem = self.needs.get((gpus, milli), (0.0, 0.0))
                frag = np.where((cpu >= need_cpu) & (mem >= need_mem), frag, total_free)
            result += share * frag
        return result


def _normalized_left(cluster: Cluster, nodes: np.ndarray, pod: Pod) -> np.ndarray:
    cpu = (cluster.cpu[nodes] - pod.cpu) / np.maximum(cluster.cpu_cap[nodes], 1)
    mem = (cluster.mem[nodes] - pod.mem) / np.maximum(cluster.mem_cap[nodes], 1)
    free = np.where(cluster.gpu[nodes] >= 0, cluster.gpu[nodes], 0).sum(axis=1)
    gpu = (free - pod.gpu_request) / np.maximum(cluster.gpu_count[nodes] * FULL, 1)
    left: np.ndarray = cpu + mem + gpu
    return left


def select_node(
    policy: str, cluster: Cluster, pod: Pod, rng: np.random.Generator, mix: TaskMix
) -> tuple[int, tuple[int, ...]] | None:
    candidates = np.flatnonzero(cluster.feasible(pod))
    if len(candidates) == 0:
        return None
    if policy == "random":
        node = int(rng.choice(candidates))
    elif policy == "best-fit":
        node = int(candidates[np.argmin(_normalized_left(cluster, candidates, pod))])
    elif policy == "dot-product":
        free = np.where(cluster.gpu[candidates] >= 0, cluster.gpu[candidates], 0).sum(axis=1)
        gpu_cap = np.maximum(cluster.gpu_count[candidates] * FULL, 1)
        score = (
            pod.cpu * cluster.cpu[candidates] / np.maximum(cluster.cpu_cap[candidates], 1) ** 2
            + pod.mem * cluster.mem[candidates] / np.maximum(cluster.mem_cap[candidates], 1) ** 2
            + pod.gpu_request * free / gpu_cap**2
        )
        node = int(candidates[np.argmax(score)])
    elif policy == "gpu-packing":
        rows = cluster.gpu[candidates]
        used_node = ((rows >= 0) & (rows < FULL)).any(axis=1)
        if pod.shares:
            shared_fit = ((rows >= pod.milli) & (rows < FULL)).any(axis=1)
            tier = np.where(shared_fit, 0, np.where(used_node, 1, 2))
        else:
            tier = np.where(used_node, 1, 2)
        key = tier * 10.0 + _normalized_left(cluster, candidates, pod)
        node = int(candidates[np.argmin(key)])
    elif policy == "gpu-clustering":
        same = np.array(
            [cluster.request_kinds[i][pod.gpu_request] > 0 for i in candidates], dtype=bool
        )
        key = np.where(same, 0.0, 10.0) + _normalized_left(cluster, candidates, pod)
        node = int(candidates[np.argmin(key)])
    elif policy == "fgd":
        return _fgd(cluster, pod, candidates, mix)
    else:
        raise ValueError(f"unknown placement policy {policy!r}; one of {POLICIES}")
    return node, cluster.choose_gpus(node, pod)


def _fgd(
    cluster: Cluster, pod: Pod, candidates: np.ndarray, mix: TaskMix
) -> tuple[int, tuple[int, ...]]:
    rows = cluster.gpu[candidates]
    before = mix.node_fragmentation(rows)
    if pod.gpus == 0:
        return int(candidates[np.argmin(_normalized_left(cluster, candidates, pod))]), ()
    if pod.shares:
        # Try the pod on each GPU of each candidate; infeasible GPUs score +inf.
        best = (np.inf, -1, -1)
        for g in range(MAX_GPUS):
            ok = rows[:, g] >= pod.milli
            if not ok.any():
                continue
            after_rows = rows.copy()
            after_rows[:, g] -= pod.milli
            delta = mix.node_fragmentation(after_rows) - before
            delta = np.where(ok, delta, np.inf)
            i = int(np.argmin(delta))
            if delta[i] < best[0]:
                best = (float(delta[i]), i, g)
        return int(candidates[best[1]]), (best[2],)
    after_rows = rows.copy()
    for i in range(len(candidates)):
        idle = np.flatnonzero(after_rows[i] == FULL)[: pod.gpus]
        after_rows[i, idle] = 0
    delta = mix.node_fragmentation(after_rows) - before
    i = int(np.argmin(delta))
    node = int(candidates[i])
    return node, cluster.choose_gpus(node, pod)


def _repack_node(cluster: Cluster, node: int, pod: Pod) -> tuple[tuple[int, ...], int] | None:
    """Re-assign the node's movable GPU-sharing pods to its GPUs so that ``pod`` fits.

    A move inside a node restores a checkpoint on another GPU of the same machine (no
    network transfer). Pods that cannot move (not checkpointable, or whole-GPU) keep their
    GPUs. For each choice of target GPU(s), the movable pods are packed first-fit
    decreasing into what is left; the first packing that works is applied. Returns the
    GPUs for ``pod`` and the number of pods moved, or None (nothing changed)."""
    count = int(cluster.gpu_count[node])
    if count == 0 or cluster.cpu[node] < pod.cpu or cluster.mem[node] < pod.mem:
        return None
    hosted = cluster.hosted[node]
    movable = [i for i, (p, _) in enumerate(hosted) if p.shares and p.checkpointable]
    if not movable:
        return None
    fixed = np.zeros(count, dtype=np.int64)
    for i, (p, gpus) in enumerate(hosted):
        if i in movable:
            continue
        for g in gpus:
            fixed[g] += p.milli if p.shares else FULL
    need = pod.milli if pod.shares else FULL
    targets: list[tuple[int, ...]]
    if pod.shares:
        targets = [
            (int(g),) for g in np.argsort(-(FULL - fixed), kind="stable") if fixed[g] + need <= FULL
        ]
    else:
        empty = [int(g) for g in range(count) if fixed[g] == 0]
        if len(empty) < pod.gpus:
            return None
        targets = [tuple(empty[: pod.gpus])]
    order = sorted(movable, key=lambda i: -hosted[i][0].milli)
    for target in targets[:4]:
        room = FULL - fixed
        for g in target:
            room[g] -= need
        assignment: dict[int, int] = {}
        for i in order:
            milli = hosted[i][0].milli
            fits = np.flatnonzero(room >= milli)
            if len(fits) == 0:
                break
            g = int(fits[np.argmin(room[fits])])  # best fit
            room[g] -= milli
            assignment[i] = g
        else:
            moves = 0
            for i, g in assignment.items():
                p, gpus = hosted[i]
                if gpus != (g,):
                    moves += 1
                    cluster.gpu[node, gpus[0]] += p.milli
                    cluster.gpu[node, g] -= p.milli
                    hosted[i] = (p, (g,))
            return tuple(int(g) for g in target), moves
    return None


def _defragment(
    cluster: Cluster,
    pod: Pod,
    rng: np.random.Generator,
    mix: TaskMix,
    budget: int,
) -> tuple[int, tuple[int, ...], int] | None:
    """Make room for ``pod`` by moving checkpointable pods off one node.

    For each compatible node (most free GPU capacity first), try to evict its movable pods
    (smallest first) until the pod fits, re-placing each evicted pod elsewhere (FGD
    placement, never back on this node). Undo everything if it does not work out."""
    mask = cluster.model_mask(pod) if pod.gpus else np.ones(len(cluster.names), bool)
    free = np.where(cluster.gpu >= 0, cluster.gpu, 0).sum(axis=1)
    order = np.flatnonzero(mask & (free >= pod.gpu_request))
    order = order[np.argsort(-free[order], kind="stable")][:32]
    for node in order:
        movable = [(i, p) for i, (p, _) in enumerate(cluster.hosted[node]) if p.checkpointable]
        if not movable:
            continue
        movable.sort(key=lambda item: item[1].gpu_request)
        moved: list[tuple[int, Pod, tuple[int, ...]]] = []
        evicted: list[tuple[Pod, tuple[int, ...]]] = []
        ok = False
        # Pods are shared objects (drawn with replacement), so find each by identity.
        for _, victim in movable[:budget]:
            index = next(i for i, (p, _) in enumerate(cluster.hosted[node]) if p is victim)
            evicted.append(cluster.remove(int(node), index))
            if cluster.feasible(pod)[node]:
                ok = True
                break
        if ok:
            gpus = cluster.choose_gpus(int(node), pod)
            cluster.place(int(node), pod, gpus)
            for victim, _ in evicted:
                cpu_left = cluster.cpu[node]
                cluster.cpu[node] = -1  # keeps the victim off this node
                target = select_node("fgd", cluster, victim, rng, mix)
                cluster.cpu[node] = cpu_left
                if target is None:
                    ok = False
                    break
                cluster.place(target[0], victim, target[1])
                moved.append((target[0], victim, target[1]))
            if ok:
                return int(node), gpus, len(evicted)
            # Roll back, newest first: each placement is then the last entry of its node.
            for target_node, _, _ in reversed(moved):
                cluster.remove(target_node, len(cluster.hosted[target_node]) - 1)
            cluster.remove(int(node), len(cluster.hosted[node]) - 1)
        for victim, gpus in evicted:
            cluster.place(int(node), victim, gpus)
    return None


def _repack_somewhere(cluster: Cluster, pod: Pod) -> int | None:
    """Try an in-node repack on the compatible nodes with the most free GPU capacity."""
    mask = cluster.model_mask(pod) & (cluster.cpu >= pod.cpu) & (cluster.mem >= pod.mem)
    free = np.where(cluster.gpu >= 0, cluster.gpu, 0).sum(axis=1)
    nodes = np.flatnonzero(mask & (free >= pod.gpu_request))
    for node in nodes[np.argsort(-free[nodes], kind="stable")][:64]:
        done = _repack_node(cluster, int(node), pod)
        if done is not None:
            gpus, moves = done
            cluster.place(int(node), pod, gpus)
            return moves
    return None


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
    progress: Callable[[float], None] | None = None,
) -> InflationResult:
    """Run one inflation experiment; ``policy`` is one of ``POLICIES`` or
    ``shaper-defrag``."""
    if policy not in ALL_POLICIES:
        raise ValueError(f"unknown policy {policy!r}; one of {ALL_POLICIES}")
    pods_all = read_pods(pods_path, movable=movable)
    read_alibaba_nodes(nodes_path)  # validates the node list's columns
    cluster = Cluster(nodes_path)
    mix = TaskMix(pods_all)
    rng = np.random.default_rng(seed)
    capacity = cluster.capacity_milli
    goal = target * capacity
    arrived = 0
    count = 0
    failed = 0
    migrations = 0
    curve: list[tuple[float, float]] = []
    placement_policy = "fgd" if policy == "shaper-defrag" else policy
    step = capacity * 0.02
    next_mark = step
    while arrived < goal and (max_pods is None or count < max_pods):
        pod = pods_all[int(rng.integers(len(pods_all)))]
        count += 1
        arrived += pod.gpu_request
        choice = select_node(placement_policy, cluster, pod, rng, mix)
        if choice is not None:
            cluster.place(choice[0], pod, choice[1])
        elif policy == "shaper-defrag" and pod.gpus > 0:
            repacked = _repack_somewhere(cluster, pod)
            if repacked is not None:
                migrations += repacked
                continue_placed = True
            else:
                continue_placed = False
            if not continue_placed:
                done = _defragment(cluster, pod, rng, mix, defrag_budget)
                if done is None:
                    failed += 1
                else:
                    migrations += done[2]
        else:
            failed += 1
        if arrived >= next_mark:
            curve.append((arrived / capacity, (capacity - cluster.allocated_milli()) / FULL))
            next_mark += step
            if progress is not None:
                progress(min(1.0, arrived / goal))
    allocated = cluster.allocated_milli()
    idle = capacity - allocated
    frag = float(mix.node_fragmentation(cluster.gpu).sum())
    whole = int(((cluster.gpu >= 0) & (cluster.gpu < FULL)).sum())
    return InflationResult(
        policy=policy,
        capacity_gpus=capacity / FULL,
        arrived_gpus=arrived / FULL,
        allocated_gpus=allocated / FULL,
        unallocated_gpus=idle / FULL,
        whole_gpus_allocated=whole,
        fragmented_share=frag / idle if idle else 0.0,
        pods_arrived=count,
        pods_failed=failed,
        migrations=migrations,
        curve=curve,
        cluster=cluster,
    )
