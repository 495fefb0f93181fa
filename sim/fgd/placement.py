"""Where a placement policy puts a pod: the table of policies by name, and the tie-break.

Each policy takes the feasible candidate nodes and returns the node and the GPUs it gives
the pod. ``random`` picks a random feasible node and a random fitting GPU in it; the
scoring policies take the node with the highest score (:mod:`sim.fgd.scores`) and the GPUs
:meth:`~sim.fgd.cluster.Cluster.choose_gpus` gives (best fit); ``fgd`` places a
GPU-sharing pod on the GPU its score chose.

Ties decide most placements: FGD's integer score ties on hundreds of nodes for nearly
every CPU-only and whole-GPU pod. They go to the node that comes first in a fixed random
order of the nodes (``Cluster.tie_rank``), as in the reference: it builds against a fork
of kube-scheduler (``k8s.io/kubernetes => github.com/mental2008/kubernetes
v1.20.5-minor`` in its ``go.mod``) whose ``selectHost`` keeps the smallest node name among
the best, and its ``syncClusterResourceList`` prefixes every node name with a
``rand.Perm`` index. Without a rank (``tie_break="random"``) the choice is uniform, as in
stock kube-scheduler: that spreads CPU-only pods over every node and strands whole GPUs of
8-GPU nodes whose CPU is used up (``fgd`` leaves ≈ 630 GPUs unallocated at 130 % instead
of ≈ 280, the reference's ≈ 285).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Protocol

import numpy as np

from sim.fgd.cluster import Cluster
from sim.fgd.fragmentation import TaskMix
from sim.fgd.pod import Pod
from sim.fgd.scores import (
    best_fit_scores,
    dot_product_scores,
    fgd_scores,
    gpu_clustering_scores,
    gpu_packing_scores,
)

Choice = tuple[int, tuple[int, ...]]  # a node and the GPUs of it that a pod gets
NodeScores = Callable[[Cluster, Pod, np.ndarray], np.ndarray]


class Placement(Protocol):
    """A placement policy: the node, among the non-empty ``candidates``, and its GPUs."""

    def __call__(
        self,
        cluster: Cluster,
        pod: Pod,
        candidates: np.ndarray,
        rng: np.random.Generator,
        mix: TaskMix,
    ) -> Choice: ...


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


def place_at_random(
    cluster: Cluster, pod: Pod, candidates: np.ndarray, rng: np.random.Generator, mix: TaskMix
) -> Choice:
    node = int(candidates[rng.integers(len(candidates))])
    return node, cluster.choose_gpus(node, pod, rng)


def place_by_fgd(
    cluster: Cluster,
    pod: Pod,
    candidates: np.ndarray,
    rng: np.random.Generator,
    mix: TaskMix,
    *,
    memory: bool = False,
) -> Choice:
    score, choice = fgd_scores(cluster, pod, candidates, mix, memory=memory)
    i = _pick(score, rng, _rank(cluster, candidates))
    node = int(candidates[i])
    if pod.shares:
        return node, (int(choice[i]),)
    return node, cluster.choose_gpus(node, pod)


def by_score(scores: NodeScores) -> Placement:
    """The placement that takes the best node by ``scores`` and its best-fit GPUs."""

    def place(
        cluster: Cluster,
        pod: Pod,
        candidates: np.ndarray,
        rng: np.random.Generator,
        mix: TaskMix,
    ) -> Choice:
        score = scores(cluster, pod, candidates)
        node = int(candidates[_pick(score, rng, _rank(cluster, candidates))])
        return node, cluster.choose_gpus(node, pod)

    return place


PLACEMENTS: dict[str, Placement] = {
    "random": place_at_random,
    "best-fit": by_score(best_fit_scores),
    "dot-product": by_score(dot_product_scores),
    "gpu-packing": by_score(gpu_packing_scores),
    "gpu-clustering": by_score(gpu_clustering_scores),
    "fgd": place_by_fgd,
}
POLICIES = tuple(PLACEMENTS)
# FGD with memory counted in its fragmentation (``TaskMix.least_memory``): accepted by name,
# not among the reference's policies (not run by default, not a baseline).
FGD_MEMORY = "fgd-memory"
PLACEMENTS[FGD_MEMORY] = partial(place_by_fgd, memory=True)
# What FGD is measured against: every placement policy but FGD.
BASELINES = tuple(name for name in POLICIES if name != "fgd")


def select_node(
    policy: str,
    cluster: Cluster,
    pod: Pod,
    rng: np.random.Generator,
    mix: TaskMix,
    *,
    exclude: int | None = None,
) -> Choice | None:
    """The node (and GPUs) ``policy`` gives ``pod``, never ``exclude`` (a node a pod was
    just evicted from), or None when it fits nowhere."""
    feasible = cluster.feasible(pod)
    if exclude is not None:
        feasible[exclude] = False
    candidates = np.flatnonzero(feasible)
    if len(candidates) == 0:
        return None
    place = PLACEMENTS.get(policy)
    if place is None:
        raise ValueError(f"unknown placement policy {policy!r}; one of {POLICIES}")
    return place(cluster, pod, candidates, rng, mix)
