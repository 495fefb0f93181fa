"""GPU fragmentation for a pod mix (the reference's ``NodeGpuShareFragAmount``), which the
``fgd`` policy minimizes and every run reports.

The pod mix ("typical pods") is the most frequent pod shapes — (CPU, GPU milli, GPU count,
GPU models), CPU-only pods included, weighted by pod count — covering 95 % of the pods,
renormalized. For one shape, a node's free GPU capacity is all fragmented if the shape is
CPU-only, if the node's model is not one it accepts, if the node has too little CPU left
for it, or if it does not have enough GPUs with room for it; otherwise the free capacity on
GPUs too small for it is. Memory does not count, except for ``fgd-memory`` (which passes
the nodes' free memory: a node with less than the least memory a pod of a shape asks is one
the shape does not fit, as for CPU). A node's fragmentation is the popularity-weighted sum
over shapes.

The choice of shapes is the solver's (``solver.fragmentation.most_frequent``, which its
fractional placement uses too); here the measure is vectorized over nodes with numpy.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np

from sim.fgd.pod import Pod
from solver.fragmentation import POPULARITY, least_memory, most_frequent


class TaskMix:
    """The reference's typical pods: the most frequent pod shapes (CPU, GPU milli, GPU
    count, GPU models), CPU-only ones included, weighted by pod count, that cover
    ``popularity`` of the pods; popularities renormalized over the kept shapes."""

    def __init__(self, pods: Sequence[Pod], popularity: float = POPULARITY) -> None:
        counts = Counter(p.shape for p in pods)
        # The least memory a pod of each shape asks: what the solver's memory-aware measure
        # (``shaper-solver --solver-memory``) gives its typical shapes; this one ignores it.
        self.least_memory = least_memory((p.shape, p.mem) for p in pods)
        self.kinds = [
            (cpu, milli, gpus, models, share)
            for (cpu, milli, gpus, models), share in most_frequent(counts, popularity)
        ]
        self._index()

    def _index(self) -> None:
        """Group the GPU shapes by (milli, count, models): the GPU part of the test is
        shared by a group, only the CPU threshold differs."""
        self.cpu_only_share = sum(s for _, _, gpus, _, s in self.kinds if gpus == 0)
        groups: dict[tuple[int, int, tuple[str, ...]], list[tuple[int, int, float]]] = {}
        for cpu, milli, gpus, models, share in self.kinds:
            if gpus > 0:
                mem = self.least_memory.get((cpu, milli, gpus, models), 0)
                groups.setdefault((milli, gpus, models), []).append((cpu, mem, share))
        self.groups = [
            (
                milli,
                gpus,
                models,
                np.array([c for c, _, _ in v], float),
                np.array([m for _, m, _ in v], float),
                np.array([s for _, _, s in v]),
            )
            for (milli, gpus, models), v in groups.items()
        ]

    def set_kinds(self, kinds: Sequence[tuple[int, int, int, tuple[str, ...], float]]) -> None:
        """Replace the mix by (cpu, milli, gpus, models, popularity) shapes."""
        self.kinds = list(kinds)
        self._index()

    def node_fragmentation(
        self,
        gpu: np.ndarray,
        cpu: np.ndarray,
        models: np.ndarray | None = None,
        mem: np.ndarray | None = None,
    ) -> np.ndarray:
        """Expected fragmented GPU milli of each row of ``gpu`` (nodes × GPUs, -1 = no
        GPU) with ``cpu`` milli-CPU (and ``mem`` MiB, when given) left, for the mix (see
        the module docstring)."""
        free = np.where(gpu >= 0, gpu, 0)
        total = free.sum(axis=-1).astype(np.float64)
        result: np.ndarray = self.cpu_only_share * total
        for milli, gpus, spec, cpu_needs, mem_needs, shares in self.groups:
            fits = (gpu >= milli).sum(axis=-1) >= gpus
            if spec and models is not None:
                fits &= np.isin(models, spec)
            small = np.where(gpu < milli, free, 0).sum(axis=-1)
            ok = fits[..., None] & (cpu[..., None] >= cpu_needs)  # (..., kinds in group)
            if mem is not None:
                ok &= mem[..., None] >= mem_needs
            result = result + np.where(ok, small[..., None], total[..., None]) @ shares
        return result
