"""Actions the simulator applies, in the simulator's own terms.

``sim.adapter`` turns a ``solver.plan.Plan`` into these; tests may also script them
directly. A placement maps node name → number of GPUs (block jobs) or number of replicas
(services); the engine picks the GPU indices. ``Rescale`` resizes an elastic training job,
``Resize`` a service.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Start:
    job: str
    placement: dict[str, int]
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Preempt:
    """Stop a running job and put it back in the queue.

    With ``checkpoint`` and a checkpointable job, progress is kept (checkpoint time is
    paid); otherwise work since the last periodic checkpoint is lost.
    """

    job: str
    checkpoint: bool = True
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Migrate:
    job: str
    placement: dict[str, int]
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Rescale:
    """Resize a running elastic training job (``BlockJob.max_gpus``): checkpoint it and
    restart it on ``placement``, its whole new placement (node → GPUs, any count from its
    ``min_gpus`` to its ``max_gpus``; nodes it holds now may stay, go or be joined by
    others). Priced as a migration (``Transfer.migration_seconds``)."""

    job: str
    placement: dict[str, int]
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Resize:
    service: str
    placement: dict[str, int]
    reason: str = ""


Action = Start | Preempt | Migrate | Rescale | Resize


@dataclass(slots=True)
class SimPlan:
    actions: list[Action] = field(default_factory=list)
    solve_seconds: float = 0.0
    status: str = ""
    # Plan again at this time: a job the plan had to leave alone (its dwell time, its
    # move budget) is free to act on then. The live cycle runs every 30 s and notices on
    # its own; the simulator's cadence is far coarser.
    wake_at: float | None = None
