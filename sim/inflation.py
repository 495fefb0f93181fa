"""The FGD workload-inflation experiment on the Alibaba 2023 trace (ATC'23, Weng et al.).

A re-implementation, in numpy, of the experiment of the FGD paper's simulator
(``hkust-adsl/kubernetes-scheduler-simulator``: ``experiments/run_scripts/
generate_run_scripts.py``, ``scripts/generate_config_and_run.py``,
``pkg/simulator/core.go``, ``pkg/utils/frag.go``, ``pkg/simulator/plugin/*_score.go``):

* **Cluster**: the GPU nodes of the node list only (the reference schedules onto
  ``openb_node_list_gpu_node``: 1,213 nodes, 6,212 GPUs); CPU-only pods take CPU and memory
  on GPU nodes. ``cpu_nodes=True`` adds the CPU-only nodes (not the reference setup).
* **Workload** (``workloadTuningConfig`` with ratio 1.3, ``shufflePod``): every pod of the
  list once, in a seeded random order, then pods drawn at random with replacement and
  appended until the next one would take the GPU requests past ``target`` (1.3) × the
  cluster's GPU capacity (if the list alone asks for more, random pods are dropped
  instead). Pods arrive one by one, never leave, and a pod that fits nowhere stays
  unallocated. A pod asks for CPU, memory and either ``num_gpu`` whole GPUs or, when
  ``num_gpu = 1``, ``gpu_milli`` thousandths of one GPU, on one of its allowed models. A
  pod list with only these resource columns will do (:func:`read_pods` says what the
  others default to); a missing one is a :class:`~sim.traces.common.TraceError`.
* **Feasibility** (Kubernetes' resource filter and Open-Gpu-Share's): CPU, memory, model
  and GPU capacity.
* **Scores** (every feasible node is scored, all integers 0-100 as in the Kubernetes
  framework; the node with the highest score wins; ties go to the node that comes first in
  a fixed random order of the nodes, as in the reference: it builds against a fork of
  kube-scheduler (``k8s.io/kubernetes => github.com/mental2008/kubernetes v1.20.5-minor``
  in its ``go.mod``) whose ``selectHost`` keeps the smallest node name among the best,
  and its ``syncClusterResourceList`` prefixes every node name with a ``rand.Perm`` index.
  ``tie_break="random"`` is stock kube-scheduler's uniform choice instead):

  * ``random``: a random feasible node, and a random fitting GPU in it;
  * ``dot-product`` (Tetris; ``merge`` dimensions, ``max`` normalization): 100 × (1 −
    (CPU left · CPU asked / 128,000² + GPU left · GPU asked / 8,000²) / 2): the node whose
    free (CPU, GPU) vector has the *smallest* dot product with the request;
  * ``best-fit``: 100 × (1 − ½ CPU left after / 128,000 − ½ GPU left after / 8,000),
    then rescaled to 0-100 over the feasible nodes;
  * ``gpu-packing``: sharing an already used GPU scores 50-100 (fuller GPUs first), idle
    GPUs of a used node 33-50, a fully idle node 0-33 (smaller nodes first);
  * ``gpu-clustering``: nodes already hosting only pods of the same GPU kind (sharing, or
    the same number of whole GPUs) 75-100, mixed ones that include it 50-75, idle 25-50,
    others 0-25, fuller nodes first within each band;
  * ``fgd``: ``sigmoid((F_before − F_after) / 1000) × 100`` where F is the node's
    fragmentation for the pod mix (below); a GPU-sharing pod is tried on every GPU that
    fits it, and takes the best.

  Within a node, GPU-sharing pods go on the fitting GPU with the least free capacity (best
  fit) except under ``random`` (random GPU) and ``fgd`` (its own choice); whole-GPU pods
  take the lowest-numbered idle GPUs.
* **Fragmentation** (``NodeGpuShareFragAmount``): the pod mix ("typical pods") is the most
  frequent pod shapes — (CPU, GPU milli, GPU count, GPU models), CPU-only pods included,
  weighted by pod count — covering 95 % of the pods, renormalized. For one shape, a node's
  free GPU capacity is all fragmented if the shape is CPU-only, if the node's model is not
  one it accepts, if the node has too little CPU left for it, or if it does not have
  enough GPUs with room for it; otherwise the free capacity on GPUs too small for it is.
  Memory does not count. F is the popularity-weighted sum over shapes.
* **Metric** (``experiments/analysis``, Fig. 9a): unallocated GPU capacity (in GPUs,
  counted in milli-GPUs) against the arrived GPU requests in % of capacity; ``curve`` holds
  it at every integer percent (mean over the pods that arrived at that rounded percent).
  ``compare_to_baselines`` gives, per policy, the largest reduction against the best
  baseline *at the same arrival ratio* over the curve (the paper's "up to 49 %" is over
  this curve; its end point, 130 %, is where the reduction is largest in the reference's
  published results) besides the end figure.

Where this differs from the reference: the reference's pod shuffle is seeded from the clock
(its seed drives the appended pods and the node order), ours is seeded; its random numbers
differ from numpy's; the reference reports the median of ten seeds (42-51), the CLI runs one
seed. Published reference results for the default trace at 130 %: dot-product leaves about
8.7-9.5 % of the GPUs unallocated (540-590), FGD about 4.6 % (≈ 285).

``shaper-defrag`` adds what placement alone cannot: when a pod fits nowhere, Shaper may
migrate checkpointable pods (best-effort QoS, as in ``sim.traces.alibaba``; every pod with
``movable="all"``) between GPUs and nodes to make room, paying a migration each: first a
repack of the sharing pods inside one node, then moves of pods to other nodes, within a
budget of moves per failed pod. Its placement is ``placement`` (default ``fgd``, the best
placement on the default trace; any baseline can be given).

``shaper-preempt`` does the same, then, for a pod of a higher QoS class that still fits
nowhere, preempts best-effort pods where that gives more GPU to the pod than it takes from
them (evicted pods are placed elsewhere when they fit, and count as ``preempted``
otherwise): Shaper's SLA rules, where best-effort work yields. Both are the simulator's
stand-in for the solver's defragmentation until ``solver.Instance`` models fractional GPUs
(``gpu_milli``): the solver's policies cannot express this experiment yet.

Ties decide most placements: FGD's integer score ties on hundreds of nodes for nearly
every CPU-only and whole-GPU pod. Broken uniformly at random, they spread CPU-only pods
over every node and strand whole GPUs of 8-GPU nodes whose CPU is used up (``fgd`` leaves
≈ 630 GPUs unallocated at 130 %); broken by the fixed node order, as in the reference,
they pack (≈ 280, the reference's ≈ 285).
"""

from __future__ import annotations

import csv
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from sim.traces.alibaba import (
    NODE_COLUMNS,
    POD_REQUIRED,
    pod_models,
    pod_qos,
    read_alibaba_nodes,
    require_columns,
)
from sim.traces.common import TraceError, TraceInput

POLICIES = ("random", "best-fit", "dot-product", "gpu-packing", "gpu-clustering", "fgd")
SHAPER_POLICIES = ("shaper-defrag", "shaper-preempt")
ALL_POLICIES = (*POLICIES, *SHAPER_POLICIES)
BASELINES = POLICIES[:-1]
MAX_GPUS = 8
FULL = 1000
MAX_SPEC_CPU = 128_000  # the reference's normalization constants (milli-CPU, milli-GPU)
MAX_SPEC_GPU = 8_000
MAX_SCORE = 100
POPULARITY = 0.95  # typical pods: the most frequent shapes covering this share of pods


@dataclass(frozen=True, slots=True)
class Pod:
    cpu: int
    mem: int
    gpus: int
    milli: int
    models: tuple[str, ...]
    checkpointable: bool
    # Best-effort QoS: the lowest class, which ``shaper-preempt`` may preempt.
    best_effort: bool = False

    @property
    def gpu_request(self) -> int:
        """Requested GPU capacity in milli-GPUs."""
        return self.milli if self.gpus == 1 else self.gpus * FULL

    @property
    def shares(self) -> bool:
        return self.gpus == 1 and self.milli < FULL

    @property
    def shape(self) -> tuple[int, int, int, tuple[str, ...]]:
        """The pod's shape as the reference's typical pods see it (no memory)."""
        return (self.cpu, self.milli, self.gpus, self.models)

    @property
    def affinity(self) -> int:
        """GPU-clustering kind: -1 CPU-only, 0 GPU-sharing, n for n whole GPUs."""
        return -1 if self.gpus == 0 else (0 if self.shares else self.gpus)


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
    # (arrived requests / capacity, unallocated GPUs) at each integer percent of arrival.
    curve: list[tuple[float, float]] = field(default_factory=list)
    preempted: int = 0
    # Filled by ``compare_to_baselines``: the largest reduction in unallocated GPUs against
    # the best baseline at the same arrival ratio, and that ratio.
    best_reduction: float | None = None
    best_reduction_at: float | None = None
    cluster: Cluster | None = field(default=None, repr=False)

    def unallocated_at(self, ratio: float) -> float | None:
        """Unallocated GPUs on the curve at ``ratio`` (e.g. 1.0 = 100 %), if reached."""
        for r, value in self.curve:
            if abs(r - ratio) < 1e-9:
                return value
        return None

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
            "preempted": self.preempted,
            "best_reduction": self.best_reduction,
            "best_reduction_at": self.best_reduction_at,
            "curve": self.curve,
        }


def compare_to_baselines(
    results: Sequence[InflationResult], *, from_ratio: float = 0.75
) -> InflationResult | None:
    """Set ``best_reduction``/``best_reduction_at`` of every result against the best
    baseline among ``results`` at each arrival ratio of the curve (from ``from_ratio``, the
    left edge of the paper's Fig. 9a, where some GPUs are unallocated by every policy).
    Returns the best baseline at the end (fewest unallocated GPUs), or None without one."""
    baselines = [r for r in results if r.policy in BASELINES]
    if not baselines:
        return None
    best_at: dict[float, float] = {}
    for b in baselines:
        for ratio, value in b.curve:
            if ratio >= from_ratio - 1e-9:
                best_at[ratio] = min(best_at.get(ratio, np.inf), value)
    for r in results:
        best: tuple[float, float] | None = None
        for ratio, value in r.curve:
            base = best_at.get(ratio)
            if base is None or base <= 0:
                continue
            reduction = 1 - value / base
            if best is None or reduction > best[0]:
                best = (reduction, ratio)
        r.best_reduction, r.best_reduction_at = best if best else (None, None)
    return min(baselines, key=lambda r: r.unallocated_gpus)


@dataclass(frozen=True, slots=True)
class SeedSpread:
    """One policy over several seeds (the reference reports the median of seeds 42-51)."""

    policy: str
    seeds: int
    median_unallocated: float
    min_unallocated: float
    max_unallocated: float
    # 1 − unallocated / the best baseline's unallocated of the same seed (None: no baseline).
    median_reduction: float | None
    median_preempted: float
    median_migrations: float


def spread_over_seeds(runs: Sequence[Sequence[InflationResult]]) -> list[SeedSpread]:
    """``runs``: per seed, the results of every policy of that seed."""
    import statistics

    by_policy: dict[str, list[tuple[InflationResult, float | None]]] = {}
    for results in runs:
        best = compare_to_baselines(results)
        for r in results:
            cut = 1 - r.unallocated_gpus / best.unallocated_gpus if best else None
            by_policy.setdefault(r.policy, []).append((r, cut))
    spreads = []
    for policy, items in by_policy.items():
        unallocated = [r.unallocated_gpus for r, _ in items]
        cuts = [c for _, c in items if c is not None]
        spreads.append(
            SeedSpread(
                policy=policy,
                seeds=len(items),
                median_unallocated=statistics.median(unallocated),
                min_unallocated=min(unallocated),
                max_unallocated=max(unallocated),
                median_reduction=statistics.median(cuts) if cuts else None,
                median_preempted=statistics.median(r.preempted for r, _ in items),
                median_migrations=statistics.median(r.migrations for r, _ in items),
            )
        )
    return spreads


def read_pods(path: str | Path, *, movable: str = "be") -> list[Pod]:
    """Every pod of the list, CPU-only ones included (they take CPU and memory).

    The list needs the resource columns (``sim.traces.alibaba.POD_REQUIRED``: ``cpu_milli``,
    ``memory_mib``, ``num_gpu``, ``gpu_milli``) and may have only those: without
    ``gpu_spec`` a pod takes any GPU model, without ``qos`` it is best effort (``BE``, as
    an empty value is), and no time column is read (pods arrive in a seeded shuffle of the
    list). ``movable``: which pods Shaper may migrate: ``be`` (best-effort QoS only, as in
    the trace replays) or ``all`` (transparent checkpointing of every pod)."""
    if movable not in ("be", "all"):
        raise ValueError(f"movable must be 'be' or 'all', not {movable!r}")
    pods = []
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        require_columns(path, reader.fieldnames, POD_REQUIRED, what="pod list")
        for line, row in enumerate(reader, start=2):
            try:
                gpus = int(row["num_gpu"] or 0)
                cpu = int(row["cpu_milli"] or 0)
                mem = int(row["memory_mib"] or 0)
                milli = int(row["gpu_milli"] or 0)
            except ValueError as exc:
                raise TraceError(f"{path}:{line}: {exc}") from exc
            best_effort = pod_qos(row) == "BE"
            pods.append(
                Pod(
                    cpu=cpu,
                    mem=mem,
                    gpus=gpus,
                    milli=min(milli, FULL) if gpus == 1 else (FULL if gpus else 0),
                    models=pod_models(row),
                    checkpointable=movable == "all" or best_effort,
                    best_effort=best_effort,
                )
            )
    return pods


def read_node_rows(path: str | Path) -> list[tuple[str, str, int, int, int]]:
    """``(name, model, cpu_milli, memory_mib, gpus)`` of every node of the list."""
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        require_columns(
            path, reader.fieldnames, NODE_COLUMNS, what="node list", about=TraceInput.NODES
        )
        rows = []
        for line, row in enumerate(reader, start=2):
            try:
                gpus = int(row["gpu"] or 0)
                cpu = int(row["cpu_milli"])
                mem = int(row["memory_mib"])
            except ValueError as exc:
                raise TraceError(f"{path}:{line}: {exc}", about=TraceInput.NODES) from exc
            if not 0 <= gpus <= MAX_GPUS:
                # The free-capacity arrays hold MAX_GPUS GPUs per node: more would be cut.
                raise TraceError(
                    f"{path}:{line}: {gpus} GPUs; the experiment models 0 to {MAX_GPUS} per node",
                    about=TraceInput.NODES,
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


class TaskMix:
    """The reference's typical pods: the most frequent pod shapes (CPU, GPU milli, GPU
    count, GPU models), CPU-only ones included, weighted by pod count, that cover
    ``popularity`` of the pods; popularities renormalized over the kept shapes."""

    def __init__(self, pods: Sequence[Pod], popularity: float = POPULARITY) -> None:
        counts = Counter(p.shape for p in pods)
        # Most frequent first; ties in the reference's (reversed) shape order.
        ordered = sorted(
            counts.items(),
            key=lambda kv: (kv[1], kv[0][0], kv[0][1], kv[0][2], "|".join(kv[0][3])),
            reverse=True,
        )
        total = sum(counts.values())
        kept: list[tuple[tuple[int, int, int, tuple[str, ...]], int]] = []
        covered = 0
        for shape, n in ordered:
            if covered >= popularity * total:
                break
            kept.append((shape, n))
            covered += n
        self.kinds = [
            (cpu, milli, gpus, models, n / covered) for (cpu, milli, gpus, models), n in kept
        ]
        self._index()

    def _index(self) -> None:
        """Group the GPU shapes by (milli, count, models): the GPU part of the test is
        shared by a group, only the CPU threshold differs."""
        self.cpu_only_share = sum(s for _, _, gpus, _, s in self.kinds if gpus == 0)
        groups: dict[tuple[int, int, tuple[str, ...]], list[tuple[int, float]]] = {}
        for cpu, milli, gpus, models, share in self.kinds:
            if gpus > 0:
                groups.setdefault((milli, gpus, models), []).append((cpu, share))
        self.groups = [
            (milli, gpus, models, np.array([c for c, _ in v], float), np.array([s for _, s in v]))
            for (milli, gpus, models), v in groups.items()
        ]

    def set_kinds(self, kinds: Sequence[tuple[int, int, int, tuple[str, ...], float]]) -> None:
        """Replace the mix by (cpu, milli, gpus, models, popularity) shapes."""
        self.kinds = list(kinds)
        self._index()

    def node_fragmentation(
        self, gpu: np.ndarray, cpu: np.ndarray, models: np.ndarray | None = None
    ) -> np.ndarray:
        """Expected fragmented GPU milli of each row of ``gpu`` (nodes × GPUs, -1 = no
        GPU) with ``cpu`` milli-CPU left, for the mix (see the module docstring)."""
        free = np.where(gpu >= 0, gpu, 0)
        total = free.sum(axis=-1).astype(np.float64)
        result = self.cpu_only_share * total
        for milli, gpus, spec, cpu_needs, shares in self.groups:
            fits = (gpu >= milli).sum(axis=-1) >= gpus
            if spec and models is not None:
                fits &= np.isin(models, spec)
            small = np.where(gpu < milli, free, 0).sum(axis=-1)
            ok = fits[..., None] & (cpu[..., None] >= cpu_needs)  # (..., kinds in group)
            result = result + np.where(ok, small[..., None], total[..., None]) @ shares
        return result


def _sigmoid_score(delta: np.ndarray) -> np.ndarray:
    """FGD's score of a fragmentation decrease ``delta`` (milli-GPUs), 0-100."""
    return np.floor(MAX_SCORE / (1 + np.exp(-delta / 1000))).astype(np.int64)


def _fgd(
    cluster: Cluster, pod: Pod, candidates: np.ndarray, mix: TaskMix
) -> tuple[np.ndarray, np.ndarray]:
    """FGD's score of every candidate node and the GPU it would use (sharing pods)."""
    rows = cluster.gpu[candidates]
    cpu = cluster.cpu[candidates]
    models = cluster.model_names[candidates]
    before = mix.node_fragmentation(rows, cpu, models)
    cpu_after = cpu - pod.cpu
    choice = np.full(len(candidates), -1)
    if pod.shares:
        score = np.full(len(candidates), -1, dtype=np.int64)
        for g in range(MAX_GPUS):
            ok = rows[:, g] >= pod.milli
            if not ok.any():
                continue
            after = rows.copy()
            after[:, g] -= pod.milli
            s = _sigmoid_score(before - mix.node_fragmentation(after, cpu_after, models))
            better = ok & (s > score)  # the first GPU wins ties, as in the reference
            score = np.where(better, s, score)
            choice = np.where(better, g, choice)
        return score, choice
    after = rows.copy()
    if pod.gpus:
        idle = after == FULL
        after[idle & (np.cumsum(idle, axis=1) <= pod.gpus)] = 0
    return _sigmoid_score(before - mix.node_fragmentation(after, cpu_after, models)), choice


def _scores(policy: str, cluster: Cluster, pod: Pod, nodes: np.ndarray) -> np.ndarray:
    """The baselines' integer scores (0-100) of the candidate ``nodes``."""
    cpu_left = cluster.cpu[nodes]
    gpu_left = cluster.free_milli(nodes)
    if policy == "dot-product":
        dot = cpu_left * pod.cpu / MAX_SPEC_CPU**2 + gpu_left * pod.gpu_request / MAX_SPEC_GPU**2
        return np.floor(MAX_SCORE * (1 - dot / 2)).astype(np.int64)
    if policy == "best-fit":
        left = 0.5 * (cpu_left - pod.cpu) / MAX_SPEC_CPU
        left += 0.5 * (gpu_left - pod.gpu_request) / MAX_SPEC_GPU
        raw = np.trunc((1 - left) * MAX_SCORE).astype(np.int64)
        low, high = raw.min(), raw.max()
        if high == low:
            return np.zeros(len(nodes), dtype=np.int64)
        return np.asarray((raw - low) * MAX_SCORE // (high - low), dtype=np.int64)
    if policy == "gpu-packing":
        if pod.gpus == 0:
            return np.zeros(len(nodes), dtype=np.int64)
        rows = cluster.gpu[nodes]
        idle = (rows == FULL).sum(axis=1)
        count = cluster.gpu_count[nodes]
        score = np.zeros(len(nodes), dtype=np.int64)
        for i in range(len(nodes)):
            if idle[i] == count[i]:  # a fully idle node: smaller nodes first
                score[i] = max(MAX_SCORE // 3 - idle[i], idle[i])
                continue
            row = rows[i, : count[i]]
            order = np.argsort(row, kind="stable")  # least free first
            use = [g for g in order if row[g] >= pod.milli][: pod.gpus]
            whole = sum(1 for g in use if row[g] == FULL)
            if whole:
                score[i] = max(MAX_SCORE // 2 - whole, MAX_SCORE // 3)
            else:
                ratio = sum(int(row[g]) * 100 // FULL for g in use)
                score[i] = max(MAX_SCORE - ratio // 10, MAX_SCORE // 2)
        return score
    if policy == "gpu-clustering":
        if pod.gpus == 0:
            return np.zeros(len(nodes), dtype=np.int64)
        fill = (MAX_SCORE // 4) * (MAX_SPEC_GPU - gpu_left) // MAX_SPEC_GPU
        band = np.zeros(len(nodes), dtype=np.int64)
        for i, node in enumerate(nodes):
            kinds = {k for k, n in cluster.request_kinds[node].items() if n > 0}
            if pod.affinity in kinds:
                band[i] = 3 if len(kinds) == 1 else 2
            else:
                band[i] = 1 if not kinds else 0
        return np.asarray(fill + band * (MAX_SCORE // 4), dtype=np.int64)
    raise ValueError(f"unknown placement policy {policy!r}; one of {POLICIES}")


def _pick(score: np.ndarray, rng: np.random.Generator, rank: np.ndarray | None) -> int:
    """Index of the highest score; among ties, the smallest ``rank`` (the cluster's fixed
    node order), or a uniformly random one when there is no rank."""
    best = np.flatnonzero(score == score.max())
    if len(best) == 1:
        return int(best[0])
    if rank is not None:
        return int(best[np.argmin(rank[best])])
    return int(best[rng.integers(len(best))])


def _rank(cluster: Cluster, candidates: np.ndarray) -> np.ndarray | None:
    return None if cluster.tie_rank is None else cluster.tie_rank[candidates]


def select_node(
    policy: str,
    cluster: Cluster,
    pod: Pod,
    rng: np.random.Generator,
    mix: TaskMix,
    *,
    exclude: int | None = None,
) -> tuple[int, tuple[int, ...]] | None:
    """The node (and GPUs) ``policy`` gives ``pod``, never ``exclude`` (a node a pod was
    just evicted from), or None when it fits nowhere."""
    feasible = cluster.feasible(pod)
    if exclude is not None:
        feasible[exclude] = False
    candidates = np.flatnonzero(feasible)
    if len(candidates) == 0:
        return None
    if policy == "random":
        node = int(candidates[rng.integers(len(candidates))])
        return node, cluster.choose_gpus(node, pod, rng)
    if policy == "fgd":
        score, choice = _fgd(cluster, pod, candidates, mix)
        i = _pick(score, rng, _rank(cluster, candidates))
        node = int(candidates[i])
        if pod.shares:
            return node, (int(choice[i]),)
        return node, cluster.choose_gpus(node, pod)
    scores = _scores(policy, cluster, pod, candidates)
    node = int(candidates[_pick(scores, rng, _rank(cluster, candidates))])
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
                    cluster.move(node, i, g)
            return tuple(int(g) for g in target), moves
    return None


def _defragment(
    cluster: Cluster,
    pod: Pod,
    rng: np.random.Generator,
    mix: TaskMix,
    budget: int,
    placement: str = "fgd",
) -> tuple[int, tuple[int, ...], int] | None:
    """Make room for ``pod`` by moving checkpointable pods off one node.

    For each compatible node (most free GPU capacity first), try to evict its movable pods
    (smallest first) until the pod fits, re-placing each evicted pod elsewhere (by
    ``placement``, never back on this node). Undo everything if it does not work out."""
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
                target = select_node(placement, cluster, victim, rng, mix, exclude=int(node))
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


def _preempt_for(
    cluster: Cluster,
    pod: Pod,
    rng: np.random.Generator,
    mix: TaskMix,
    placement: str,
) -> tuple[int, int] | None:
    """Make room for a pod of a higher QoS class by preempting best-effort pods.

    Only where it pays in GPU: the best-effort pods taken off a node hold less GPU than
    ``pod`` asks for. Every candidate node is tried, cheapest first (least best-effort GPU
    to take off the GPUs ``pod`` would use); best-effort CPU-only pods leave too when CPU
    or memory is short (largest first), then best-effort pods on other GPUs. Each evicted
    pod is placed again elsewhere if it fits (a migration) and is preempted otherwise.
    Returns (moved, preempted), or None when no node works (nothing changed)."""
    need = pod.gpus if not pod.shares else 1
    room = FULL if not pod.shares else pod.milli
    hostable = (cluster.gpu >= 0) & (cluster.guarded + room <= FULL)
    be_milli = np.where(hostable, FULL - cluster.gpu - cluster.guarded, 10 * FULL * MAX_GPUS)
    cheapest = np.sort(be_milli, axis=1)[:, :need].sum(axis=1)
    ok = (
        cluster.model_mask(pod)
        & (cheapest < pod.gpu_request)
        & (cluster.cpu + cluster.be_cpu >= pod.cpu)
        & (cluster.mem + cluster.be_mem >= pod.mem)
    )
    nodes = np.flatnonzero(ok)
    for node in nodes[np.argsort(cheapest[nodes], kind="stable")]:
        node = int(node)
        hosted = cluster.hosted[node]
        chosen = set(np.argsort(be_milli[node], kind="stable")[:need].tolist())
        on_chosen = [
            i for i, (p, g) in enumerate(hosted) if p.best_effort and any(x in chosen for x in g)
        ]
        rest = sorted(
            (i for i, (p, g) in enumerate(hosted) if p.best_effort and i not in on_chosen),
            key=lambda i: (hosted[i][0].gpus > 0, -hosted[i][0].cpu),
        )
        victims = list(on_chosen)
        cpu = cluster.cpu[node] + sum(hosted[i][0].cpu for i in victims)
        mem = cluster.mem[node] + sum(hosted[i][0].mem for i in victims)
        for i in rest:
            if cpu >= pod.cpu and mem >= pod.mem:
                break
            victims.append(i)
            cpu += hosted[i][0].cpu
            mem += hosted[i][0].mem
        taken = sum(hosted[i][0].gpu_request for i in victims)
        if cpu < pod.cpu or mem < pod.mem or taken >= pod.gpu_request:
            continue
        evicted = [cluster.remove(node, i) for i in sorted(victims, reverse=True)]
        if not cluster.feasible(pod)[node]:
            for victim, gpus in evicted:
                cluster.place(node, victim, gpus)
            continue
        cluster.place(node, pod, cluster.choose_gpus(node, pod))
        moved = preempted = 0
        for victim, _ in sorted(evicted, key=lambda e: -e[0].gpu_request):
            target = select_node(placement, cluster, victim, rng, mix, exclude=node)
            if target is None:
                preempted += 1
            else:
                cluster.place(target[0], victim, target[1])
                moved += 1
        return moved, preempted
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


def _workload(
    pods: Sequence[Pod], capacity: int, target: float, rng: np.random.Generator
) -> list[Pod]:
    """Every pod once in random order, then random pods appended (or random pods dropped)
    until the GPU requests reach ``target`` × ``capacity`` (the reference's tuning)."""
    order = [pods[i] for i in rng.permutation(len(pods))]
    goal = target * capacity
    total = sum(p.gpu_request for p in order)
    if total > goal:
        while total > goal and order:
            total -= order.pop(int(rng.integers(len(order)))).gpu_request
        return order
    if not any(p.milli for p in pods):
        return order  # no pod asks for a GPU: drawing more would never reach the goal
    while True:
        pod = pods[int(rng.integers(len(pods)))]
        # The reference checks the per-GPU milli here, then adds the whole request.
        if total + pod.milli > goal:
            return order
        total += pod.gpu_request
        order.append(pod)


def _curve(arrived: np.ndarray, allocated: np.ndarray, capacity: int) -> list[tuple[float, float]]:
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
) -> InflationResult:
    """Run one inflation experiment; ``policy`` is one of ``POLICIES`` or
    ``SHAPER_POLICIES`` (which place by ``placement``). ``cpu_nodes`` adds the node
    list's CPU-only nodes to the cluster (the reference uses the GPU nodes only)."""
    if policy not in ALL_POLICIES:
        raise ValueError(f"unknown policy {policy!r}; one of {ALL_POLICIES}")
    if tie_break not in ("name", "random"):
        raise ValueError(f"tie_break must be 'name' or 'random', not {tie_break!r}")
    if placement not in POLICIES:
        raise ValueError(f"unknown placement {placement!r}; one of {POLICIES}")
    pods_all = read_pods(pods_path, movable=movable)
    read_alibaba_nodes(nodes_path)  # validates the node list's columns
    cluster = Cluster(nodes_path, include_cpu_nodes=cpu_nodes)
    mix = TaskMix(pods_all)
    rng = np.random.default_rng(seed)
    capacity = cluster.capacity_milli
    workload = _workload(pods_all, capacity, target, rng)
    if tie_break == "name":
        # The reference renames the nodes "%04d-<name>" by rand.Perm once the workload
        # is built; its scheduler fork then takes the smallest name among tied nodes.
        cluster.tie_rank = rng.permutation(len(cluster.names))
    if max_pods is not None:
        workload = workload[:max_pods]
    arrived = 0
    failed = 0
    migrations = 0
    arrivals = np.zeros(len(workload), dtype=np.int64)
    allocations = np.zeros(len(workload), dtype=np.int64)
    placement_policy = placement if policy in SHAPER_POLICIES else policy
    preempted = 0
    for count, pod in enumerate(workload):
        arrived += pod.gpu_request
        choice = select_node(placement_policy, cluster, pod, rng, mix)
        if choice is not None:
            cluster.place(choice[0], pod, choice[1])
        elif policy in SHAPER_POLICIES and pod.gpus > 0:
            repacked = _repack_somewhere(cluster, pod)
            if repacked is not None:
                migrations += repacked
            else:
                done = _defragment(cluster, pod, rng, mix, defrag_budget, placement)
                if done is not None:
                    migrations += done[2]
                elif policy == "shaper-preempt" and not pod.best_effort:
                    made = _preempt_for(cluster, pod, rng, mix, placement)
                    if made is None:
                        failed += 1
                    else:
                        migrations += made[0]
                        preempted += made[1]
                else:
                    failed += 1
        else:
            failed += 1
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
        pods_arrived=len(workload),
        pods_failed=failed,
        migrations=migrations,
        preempted=preempted,
        curve=_curve(arrivals, allocations, capacity),
        cluster=cluster,
    )
