"""Which GPUs (by index on the node) each job holds after a plan.

Jobs that keep GPUs on a node keep their indices (a service that shrinks keeps the first
ones). Indices of running jobs the snapshot does not give are taken from outside the
node's ``free_gpu_indices`` when those are known, else the lowest free ones. New holders
get an aligned contiguous block when their count is a power of two (NVLink islands and
MIG-free partitioning favour it), else the lowest free indices; largest first.
"""

from __future__ import annotations

from solver.instance import Instance, Job


def _aligned_block(free: list[bool], count: int) -> list[int] | None:
    if count <= 0 or count & (count - 1):
        return None
    if count == 1:  # most holders: the first free GPU, found without slicing
        return [free.index(True)] if True in free else None
    for start in range(0, len(free) - count + 1, count):
        if all(free[start : start + count]):
            return list(range(start, start + count))
    return None


def assign_gpu_indices(
    instance: Instance, placement: dict[str, dict[str, int]]
) -> dict[str, dict[str, tuple[int, ...]]]:
    result: dict[str, dict[str, tuple[int, ...]]] = {}
    job_by_id = instance.job_by_id
    node_by_name = instance.node_by_name
    by_node: dict[str, list[tuple[Job, int]]] = {}
    for job_id, target in placement.items():
        job = job_by_id[job_id]
        for node_name, gpus in target.items():
            holders = by_node.get(node_name)
            if holders is None:
                by_node[node_name] = [(job, gpus)]
            else:
                holders.append((job, gpus))
    for node_name in sorted(by_node):
        node = node_by_name[node_name]
        size = node.gpus
        free = [True] * size
        unplaced: list[tuple[Job, int]] = []
        # 1. Known indices of jobs that stay.
        for job, gpus in by_node[node_name]:
            known = job.gpu_indices.get(node_name, ()) if job.gpu_indices else ()
            if known and job.placement.get(node_name, 0):
                kept = [i for i in known if 0 <= i < size and free[i]][:gpus]
                for i in kept:
                    free[i] = False
                result.setdefault(job.id, {})[node_name] = tuple(sorted(kept))
                if len(kept) < gpus:
                    unplaced.append((job, gpus - len(kept)))
            else:
                unplaced.append((job, gpus))
        if not unplaced:
            continue  # every holder stays where the snapshot says
        # 2. Staying jobs without known indices: the snapshot's busy GPUs first.
        busy_hint: list[int] | None = None
        later: list[tuple[Job, int]] = []
        for job, count in unplaced:
            if job.placement.get(node_name, 0):
                if busy_hint is None:
                    free_hint = set(node.free_gpu_indices or ())
                    busy_hint = (
                        [i for i in range(size) if i not in free_hint]
                        if node.free_gpu_indices is not None
                        else []
                    )
                if busy_hint:
                    take = [i for i in busy_hint if free[i]][:count]
                    for i in take:
                        free[i] = False
                    have = result.setdefault(job.id, {}).get(node_name, ())
                    result[job.id][node_name] = tuple(sorted((*have, *take)))
                    if len(take) < count:
                        later.append((job, count - len(take)))
                    continue
            later.append((job, count))
        # 3. Everything else: aligned blocks for powers of two, largest first.
        later.sort(key=lambda item: (-item[1], item[0].id))
        for job, count in later:
            block = _aligned_block(free, count)
            if block is None:
                block = [i for i in range(size) if free[i]][:count]
            for i in block:
                free[i] = False
            held = result.get(job.id)
            if held is None:
                result[job.id] = {node_name: tuple(block)}  # a block is in ascending order
                continue
            earlier = held.get(node_name, ())
            held[node_name] = tuple(sorted((*earlier, *block))) if earlier else tuple(block)
    return result
