"""A pod of the inflation experiment: what it asks for, and the units it asks in.

Kept apart from the cluster and the policies because every other module of the package
reads pods and none of them should need the others to do so. GPU capacity is counted in
milli-GPUs (:data:`FULL` = one GPU), CPU in milli-CPUs and memory in MiB, as in the
Alibaba 2023 trace.
"""

from __future__ import annotations

from dataclasses import dataclass

MAX_GPUS = 8  # GPUs per node the free-capacity arrays hold
FULL = 1000  # one whole GPU, in milli-GPUs


@dataclass(frozen=True, slots=True)
class Pod:
    """CPU, memory and either ``gpus`` whole GPUs or, when ``gpus = 1``, ``milli``
    thousandths of one GPU, on one of ``models`` (empty: any model)."""

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
