"""Where every allocated GPU-second of a block job went: the simulator's conservation law.

A block job's GPUs are *allocated* to it while it holds them, and also while they dump its
checkpoint after it let them go (the engine frees GPUs at once so that the next owner can
be placed, but marks them busy until the dump ends: see ``Simulation._stop``). Every such
GPU-second falls in exactly one category:

* ``productive``: computing progress that was kept (the job completed, or the progress
  was durably checkpointed by the end of the run);
* ``lost``: computing progress that was later lost (a preemption or node failure after
  the last checkpoint);
* ``in_flight``: computing progress that is neither kept nor lost when the run ends
  (a job still running at the cap that cannot be checkpointed);
* ``checkpoint``: dumping a preempted job's checkpoint, restoring one, or a new owner
  waiting for a previous owner's dump to finish;
* ``migration``: a migration's checkpoint on the source, its restore on the target, and a
  new owner waiting for a migration's dump on the GPUs it left;
* ``resize``: the same for an elastic training job's rescale (a checkpoint and a restart
  on its new GPUs): the restart's wait on every GPU it holds after it, the dump on the
  GPUs it left, and a new owner waiting for that dump.

The engine records held time and each category as they happen; :func:`check` verifies
``allocated = productive + lost + in_flight + checkpoint + migration + resize`` per job and
in total to ``TOLERANCE_GPU_S``. A gap means the engine charged time to no one (the bug this
module was written to catch: a migration's source-side cost was counted nowhere).

Progress made on a slower or faster GPU model, or on more or fewer GPUs than an elastic
job asks for, is kept as held time: each piece of progress carries the rate and the GPU
count it was made at, so ``productive`` is GPU-time, not reference work
(``useful_gpu_hours`` in the metrics is reference work).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

TOLERANCE_GPU_S = 36.0  # 0.01 GPU-hour
CATEGORIES = ("productive", "lost", "in_flight", "checkpoint", "migration", "resize")


@dataclass(slots=True)
class JobLedger:
    """One job's allocated GPU-seconds and their categories."""

    allocated: float = 0.0
    lost: float = 0.0
    checkpoint: float = 0.0
    migration: float = 0.0
    resize: float = 0.0
    # Filled when the run ends: progress held as (work, rate, GPUs) pieces since the job
    # began; pieces are taken off the top when work is lost, so the rest was kept or is in
    # flight.
    productive: float = 0.0
    in_flight: float = 0.0
    pieces: list[list[float]] = field(default_factory=list)

    def add_progress(self, work: float, rate: float, gpus: int) -> None:
        """``work`` of progress made at ``rate`` (work a second) on ``gpus`` GPUs."""
        if work <= 0:
            return
        last = self.pieces[-1] if self.pieces else None
        if last is not None and abs(last[1] - rate) < 1e-12 and last[2] == gpus:
            last[0] += work
        else:
            self.pieces.append([work, rate, float(gpus)])

    def take_back(self, work: float) -> float:
        """Remove the last ``work`` of progress; return the GPU-seconds held to make it."""
        gpu_seconds = 0.0
        while work > 1e-12 and self.pieces:
            piece = self.pieces[-1]
            taken = min(work, piece[0])
            gpu_seconds += taken / piece[1] * piece[2]
            piece[0] -= taken
            work -= taken
            if piece[0] <= 1e-12:
                self.pieces.pop()
        return gpu_seconds

    def charge(self, kind: str, gpu_seconds: float) -> None:
        if kind == "checkpoint":
            self.checkpoint += gpu_seconds
        elif kind == "migration":
            self.migration += gpu_seconds
        elif kind == "resize":
            self.resize += gpu_seconds
        else:
            raise ValueError(f"unknown overhead kind {kind!r}")

    def close(self, *, kept_work: float) -> None:
        """Split the progress still held into kept (``productive``) and ``in_flight``."""
        total = sum(work / rate * gpus for work, rate, gpus in self.pieces)
        self.in_flight = self.take_back(sum(piece[0] for piece in self.pieces) - kept_work)
        self.productive = total - self.in_flight

    def accounted(self) -> float:
        return (
            self.productive
            + self.lost
            + self.in_flight
            + self.checkpoint
            + self.migration
            + self.resize
        )

    def totals(self) -> dict[str, float]:
        return {name: getattr(self, name) for name in CATEGORIES}


class ConservationError(AssertionError):
    """Allocated GPU-time that no category explains, or explained twice."""


def check(ledgers: Iterable[tuple[str, JobLedger]], *, allocated_total: float) -> float:
    """Verify the law per job and in total; return the total gap (GPU-seconds).

    ``allocated_total`` is the engine's own integral of GPUs held by block jobs plus
    GPUs dumping their checkpoints, measured independently of the per-job records.
    """
    per_job = 0.0
    accounted = 0.0
    for job_id, ledger in ledgers:
        gap = ledger.allocated - ledger.accounted()
        if abs(gap) > TOLERANCE_GPU_S:
            raise ConservationError(
                f"job {job_id}: {ledger.allocated / 3600:.3f} GPU-h allocated, "
                f"{ledger.accounted() / 3600:.3f} accounted {ledger.totals()}"
            )
        per_job += ledger.allocated
        accounted += ledger.accounted()
    if abs(per_job - allocated_total) > TOLERANCE_GPU_S:
        raise ConservationError(
            f"jobs' allocations sum to {per_job / 3600:.3f} GPU-h, the cluster's integral to "
            f"{allocated_total / 3600:.3f} GPU-h"
        )
    return allocated_total - accounted
