"""Making room for a pod of a higher QoS class by preempting best-effort pods.

What ``shaper-preempt`` adds to ``shaper-defrag``: Shaper's SLA rule that best-effort work
yields. A pod of a higher QoS class that still fits nowhere takes the place of best-effort
pods, only where that gives more GPU to the pod than it takes from them; the evicted pods
are placed elsewhere when they fit (a migration) and count as preempted otherwise.
"""

from __future__ import annotations

import numpy as np

from sim.fgd.cluster import Cluster
from sim.fgd.fragmentation import TaskMix
from sim.fgd.placement import select_node
from sim.fgd.pod import FULL, MAX_GPUS, Pod


def preempt_for(
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
