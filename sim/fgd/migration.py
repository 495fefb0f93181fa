"""Making room for a pod that fits nowhere by migrating checkpointable pods.

What placement alone cannot do, and ``shaper-defrag`` adds: migrate checkpointable pods
(best-effort QoS, as in ``sim.traces.alibaba``; every pod with ``movable="all"``) between
GPUs and nodes, paying a migration each. First a repack of the GPU-sharing pods inside one
node (:func:`repack_somewhere`), then moves of pods to other nodes within a budget of moves
per failed pod (:func:`defragment`). Both change nothing when they fail.
"""

from __future__ import annotations

import numpy as np

from sim.fgd.cluster import Cluster
from sim.fgd.fragmentation import TaskMix
from sim.fgd.placement import select_node
from sim.fgd.pod import FULL, Pod


def repack_node(cluster: Cluster, node: int, pod: Pod) -> tuple[tuple[int, ...], int] | None:
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


def repack_somewhere(cluster: Cluster, pod: Pod) -> int | None:
    """Try an in-node repack on the compatible nodes with the most free GPU capacity;
    place ``pod`` and return the pods moved, or None (nothing changed)."""
    mask = cluster.model_mask(pod) & (cluster.cpu >= pod.cpu) & (cluster.mem >= pod.mem)
    free = np.where(cluster.gpu >= 0, cluster.gpu, 0).sum(axis=1)
    nodes = np.flatnonzero(mask & (free >= pod.gpu_request))
    for node in nodes[np.argsort(-free[nodes], kind="stable")][:64]:
        done = repack_node(cluster, int(node), pod)
        if done is not None:
            gpus, moves = done
            cluster.place(int(node), pod, gpus)
            return moves
    return None


def defragment(
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
    ``placement``, never back on this node). Undo everything if it does not work out.
    Returns the node, the GPUs ``pod`` got and the pods moved, or None."""
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
