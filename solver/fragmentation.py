"""GPU fragmentation for a mix of typical shapes (FGD, Weng et al., ATC'23), in plain Python.

The typical shapes are the most frequent shapes of the expected work — (CPU, GPU milli,
GPU count, GPU models), CPU-only ones included, weighted by count — that cover 95 % of it,
their shares renormalized over the shapes kept (:func:`typical_shapes`). For one shape, a
node's free GPU capacity is all fragmented if the shape is CPU-only, if the node's model is
not one it accepts, if the node has too little CPU left for it, or if it does not have
enough GPUs with room for it; otherwise the free capacity on GPUs too small for it is. A
node's fragmentation (:func:`node_fragmentation`) is the share-weighted sum over shapes;
FGD places work where it grows least, scored by :func:`fgd_score`.

Memory: FGD's measure ignores it, so a node whose memory the placed work has used up still
counts its free GPUs as usable, and they strand there (on the Alibaba 2023 trace most GPU
pods that fail near saturation fail for memory on nodes with GPU room). A shape may carry the
least memory a job of it asks (``TypicalShape.memory_mib``, from :func:`least_memory`); a
node with less free memory then counts as a node with too little CPU does. Shapes without
it (0) give FGD's own measure.

Both the solver's fractional placement (``solver.greedy.sharing``) and the simulator's
reproduction of the FGD experiment (``sim.fgd``, vectorized over nodes with numpy) use it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from solver.instance import FULL_GPU_MILLI, TypicalShape

POPULARITY = 0.95  # typical shapes: the most frequent ones covering this share of the work
MAX_SCORE = 100

# (cpu_milli, gpu_milli, gpus, gpu models sorted; empty = any)
Shape = tuple[int, int, int, tuple[str, ...]]


def most_frequent(
    counts: Mapping[Shape, int], popularity: float = POPULARITY
) -> list[tuple[Shape, float]]:
    """The most frequent shapes covering ``popularity`` of the count, each with its share
    of what they cover; ties in the reference's (reversed) shape order."""
    ordered = sorted(
        counts.items(),
        key=lambda kv: (kv[1], kv[0][0], kv[0][1], kv[0][2], "|".join(kv[0][3])),
        reverse=True,
    )
    total = sum(counts.values())
    kept: list[tuple[Shape, int]] = []
    covered = 0
    for shape, n in ordered:
        if covered >= popularity * total:
            break
        kept.append((shape, n))
        covered += n
    return [(shape, n / covered) for shape, n in kept]


def typical_shapes(
    counts: Mapping[Shape, int],
    popularity: float = POPULARITY,
    memory: Mapping[Shape, int] | None = None,
) -> tuple[TypicalShape, ...]:
    """:func:`most_frequent` as the solver's :class:`~solver.instance.TypicalShape`
    (``memory``: each shape's least memory, :func:`least_memory`; None: not counted)."""
    return as_typical(most_frequent(counts, popularity), memory)


def least_memory(shapes_and_memory: Iterable[tuple[Shape, int]]) -> dict[Shape, int]:
    """The least memory (MiB) asked by the work of each shape: a node with less free
    memory can host none of it."""
    least: dict[Shape, int] = {}
    for shape, mem in shapes_and_memory:
        if shape not in least or mem < least[shape]:
            least[shape] = mem
    return least


def as_typical(
    shares: Iterable[tuple[Shape, float]], memory: Mapping[Shape, int] | None = None
) -> tuple[TypicalShape, ...]:
    """Shapes with their shares as the solver's :class:`~solver.instance.TypicalShape`,
    each with its least memory from ``memory`` (None, or a shape not in it: 0, not counted)."""
    return tuple(
        TypicalShape(
            cpu_milli=cpu,
            gpu_milli=milli,
            gpus=gpus,
            gpu_models=frozenset(models) if models else None,
            share=share,
            memory_mib=memory.get((cpu, milli, gpus, models), 0) if memory else 0,
        )
        for (cpu, milli, gpus, models), share in shares
    )


def node_fragmentation(
    free_milli: Sequence[int],
    free_cpu: int,
    model: str,
    shapes: Sequence[TypicalShape],
    free_mem: int | None = None,
) -> float:
    """Expected fragmented GPU milli of a node whose GPUs have ``free_milli`` free each,
    with ``free_cpu`` milli-CPU and ``free_mem`` MiB left (None: memory not counted), for
    the mix ``shapes`` (see the module docstring)."""
    total = sum(free_milli)
    result = 0.0
    for shape in shapes:
        if (
            shape.gpus == 0
            or free_cpu < shape.cpu_milli
            or (free_mem is not None and free_mem < shape.memory_mib)
            or (shape.gpu_models is not None and model not in shape.gpu_models)
            or sum(1 for free in free_milli if free >= shape.gpu_milli) < shape.gpus
        ):
            result += shape.share * total
        else:
            small = sum(free for free in free_milli if free < shape.gpu_milli)
            result += shape.share * small
    return result


class Fragmentation:
    """:func:`node_fragmentation` for one mix, cached: nodes in the same state (free milli
    per GPU, in any order, CPU left, model) cost one computation. Idle capacity only
    counts: a GPU with nothing free may be left out."""

    def __init__(self, shapes: tuple[TypicalShape, ...]) -> None:
        self.shapes = shapes
        # Without a shape that carries memory the node's memory changes nothing: left out
        # of the key, so nodes that differ only in memory share one entry.
        self.counts_memory = any(shape.memory_mib for shape in shapes)
        self._cache: dict[tuple[tuple[int, ...], int, str, int | None], float] = {}

    def __call__(
        self, free_milli: Sequence[int], free_cpu: int, model: str, free_mem: int | None = None
    ) -> float:
        mem = free_mem if self.counts_memory else None
        key = (tuple(sorted(free for free in free_milli if free > 0)), free_cpu, model, mem)
        value = self._cache.get(key)
        if value is None:
            value = node_fragmentation(key[0], free_cpu, model, self.shapes, mem)
            if len(self._cache) > 500_000:
                self._cache.clear()
            self._cache[key] = value
        return value


_MEASURES: dict[tuple[TypicalShape, ...], Fragmentation] = {}


def fragmentation_for(shapes: tuple[TypicalShape, ...]) -> Fragmentation:
    """The cached measure of ``shapes``, kept between plans (a simulator plans thousands
    of cycles with one mix)."""
    measure = _MEASURES.get(shapes)
    if measure is None:
        if len(_MEASURES) >= 4:
            _MEASURES.clear()
        measure = _MEASURES[shapes] = Fragmentation(shapes)
    return measure


def fgd_score(decrease: float) -> int:
    """FGD's 0-100 score of a fragmentation ``decrease`` (milli-GPUs; negative: growth)."""
    return math.floor(MAX_SCORE / (1 + math.exp(-decrease / FULL_GPU_MILLI)))
