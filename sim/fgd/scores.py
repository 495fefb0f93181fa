"""The node scores of the placement policies, one function per policy.

Every feasible node is scored with an integer 0-100, as in the Kubernetes scheduling
framework (the reference's ``pkg/simulator/plugin/*_score.go``); the highest score wins
(:mod:`sim.fgd.placement` breaks ties). Each function takes the cluster, the pod and the
candidate nodes and returns one score per candidate:

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
  fragmentation for the pod mix (:mod:`sim.fgd.fragmentation`); a GPU-sharing pod is tried
  on every GPU that fits it, and takes the best, so FGD also returns that GPU.
"""

from __future__ import annotations

import numpy as np

from sim.fgd.cluster import Cluster
from sim.fgd.fragmentation import TaskMix
from sim.fgd.pod import FULL, MAX_GPUS, Pod

MAX_SPEC_CPU = 128_000  # the reference's normalization constants (milli-CPU, milli-GPU)
MAX_SPEC_GPU = 8_000
MAX_SCORE = 100


def dot_product_scores(cluster: Cluster, pod: Pod, nodes: np.ndarray) -> np.ndarray:
    cpu_left = cluster.cpu[nodes]
    gpu_left = cluster.free_milli(nodes)
    dot = cpu_left * pod.cpu / MAX_SPEC_CPU**2 + gpu_left * pod.gpu_request / MAX_SPEC_GPU**2
    score: np.ndarray = np.floor(MAX_SCORE * (1 - dot / 2)).astype(np.int64)
    return score


def best_fit_scores(cluster: Cluster, pod: Pod, nodes: np.ndarray) -> np.ndarray:
    cpu_left = cluster.cpu[nodes]
    gpu_left = cluster.free_milli(nodes)
    left = 0.5 * (cpu_left - pod.cpu) / MAX_SPEC_CPU
    left += 0.5 * (gpu_left - pod.gpu_request) / MAX_SPEC_GPU
    raw = np.trunc((1 - left) * MAX_SCORE).astype(np.int64)
    low, high = raw.min(), raw.max()
    if high == low:
        return np.zeros(len(nodes), dtype=np.int64)
    return np.asarray((raw - low) * MAX_SCORE // (high - low), dtype=np.int64)


def gpu_packing_scores(cluster: Cluster, pod: Pod, nodes: np.ndarray) -> np.ndarray:
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


def gpu_clustering_scores(cluster: Cluster, pod: Pod, nodes: np.ndarray) -> np.ndarray:
    if pod.gpus == 0:
        return np.zeros(len(nodes), dtype=np.int64)
    gpu_left = cluster.free_milli(nodes)
    fill = (MAX_SCORE // 4) * (MAX_SPEC_GPU - gpu_left) // MAX_SPEC_GPU
    band = np.zeros(len(nodes), dtype=np.int64)
    for i, node in enumerate(nodes):
        kinds = {k for k, n in cluster.request_kinds[node].items() if n > 0}
        if pod.affinity in kinds:
            band[i] = 3 if len(kinds) == 1 else 2
        else:
            band[i] = 1 if not kinds else 0
    return np.asarray(fill + band * (MAX_SCORE // 4), dtype=np.int64)


def _sigmoid_score(delta: np.ndarray) -> np.ndarray:
    """FGD's score of a fragmentation decrease ``delta`` (milli-GPUs), 0-100."""
    return np.floor(MAX_SCORE / (1 + np.exp(-delta / 1000))).astype(np.int64)


def fgd_scores(
    cluster: Cluster, pod: Pod, candidates: np.ndarray, mix: TaskMix, *, memory: bool = False
) -> tuple[np.ndarray, np.ndarray]:
    """FGD's score of every candidate node and the GPU it would use (sharing pods);
    ``memory``: the fragmentation counts the nodes' free memory (``fgd-memory``)."""
    rows = cluster.gpu[candidates]
    cpu = cluster.cpu[candidates]
    models = cluster.model_names[candidates]
    mem = cluster.mem[candidates] if memory else None
    before = mix.node_fragmentation(rows, cpu, models, mem)
    cpu_after = cpu - pod.cpu
    mem_after = mem - pod.mem if mem is not None else None
    choice = np.full(len(candidates), -1)
    if pod.shares:
        score = np.full(len(candidates), -1, dtype=np.int64)
        for g in range(MAX_GPUS):
            ok = rows[:, g] >= pod.milli
            if not ok.any():
                continue
            after = rows.copy()
            after[:, g] -= pod.milli
            s = _sigmoid_score(before - mix.node_fragmentation(after, cpu_after, models, mem_after))
            better = ok & (s > score)  # the first GPU wins ties, as in the reference
            score = np.where(better, s, score)
            choice = np.where(better, g, choice)
        return score, choice
    after = rows.copy()
    if pod.gpus:
        idle = after == FULL
        after[idle & (np.cumsum(idle, axis=1) <= pod.gpus)] = 0
    return _sigmoid_score(
        before - mix.node_fragmentation(after, cpu_after, models, mem_after)
    ), choice
