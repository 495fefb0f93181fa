"""Why GPUs sit idle: one cause for every idle GPU at an instant (``classify``), and
GPU-hours per cause integrated over time (``IdleHours``).

Pure (no DB, HTTP or simulator imports), so the control plane (``app.diagnosis``, from
stored history) and the simulator (``sim.diagnosis``, from its own state) both use it.
"""

from solver.diagnosis.causes import IdleCause
from solver.diagnosis.classify import Diagnosis, IdleGpus, Settled, classify, settle
from solver.diagnosis.hours import IdleHours, IdleRow
from solver.diagnosis.state import AllocationAt, ClusterAt, NodeAt, QueuedJobAt

__all__ = [
    "AllocationAt",
    "ClusterAt",
    "Diagnosis",
    "IdleCause",
    "IdleGpus",
    "IdleHours",
    "IdleRow",
    "NodeAt",
    "QueuedJobAt",
    "Settled",
    "classify",
    "settle",
]
