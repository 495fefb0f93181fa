"""What each kind of scheduler lets a plan do, in one place: the saga, the shaping cycle
and the action service all ask here.

* **Places itself** (Slurm, Kubernetes, Kueue, Ray, Armada): the scheduler decides where a
  job runs (a pod cannot be restored behind the kubelet's back either). A job moves by a
  requeue pinned to its target, not behind the scheduler's back; a service grows where
  the scheduler puts it; a reservation is given back by the plan when the action it was
  for ends, because the scheduler cannot tell when a move is over.
* **Sends jobs to nodes** (all but Kueue and Ray): a plan may move a running job to a node.
  Kueue admits a Workload and the scheduler places its pods; a start is a reactivation and
  a requeue cannot be pinned, so no migration is planned there. Ray places a job's actors
  and placement groups itself (connectors/ray: a requeue pinned to nodes is refused).
* **Restarts a gang where told** (Slurm, the simulated clusters): a running job on several
  nodes moves whole (an upgrade onto faster GPUs: ``SolverConfig.gang_upgrades``) by a
  requeue held and pinned to its new nodes and a start there; it resumes from its own
  checkpoint, as a checkpointable job requeued by a plan does (no node's process image is
  moved: ``app.actions.recipes``). Not yet Kubernetes (its connector pins a Job only to
  resume it from an image Shaper staged), nor Armada (untested there); Kueue and Ray pin
  nothing.
* **Takes moves** (Slurm, Kubernetes, Kueue, Ray, Armada, the simulated clusters): the
  connector submits a job moved from another cluster and withdraws it
  (``connectors.base.SupportsSubmit``).
* **Reserves** (the simulated clusters, Slurm): the connector can hold GPUs for one job
  (``connectors.base.SupportsReservation``), so plans get ``reserve`` actions for what
  they free.
* **Holds nodes for a moved job** (Slurm): it places itself, starts a job pinned to nodes
  and reserves them, so a federated move holds the GPUs it was planned onto for the copy
  it submits there before anything is given up at home (``app.actions.recipes``).
  Kubernetes, Kueue, Ray and Armada hold no GPUs for a job; the simulated clusters do,
  but place nothing themselves.
"""

from __future__ import annotations

from wire.telemetry import SchedulerKind

SCHEDULER_OWNED = frozenset(
    {
        SchedulerKind.slurm,
        SchedulerKind.kubernetes,
        SchedulerKind.kueue,
        SchedulerKind.ray,
        SchedulerKind.armada,
    }
)
RESERVING = frozenset({SchedulerKind.sim, SchedulerKind.slurm})
UNPINNABLE = frozenset({SchedulerKind.kueue, SchedulerKind.ray})
RESTARTING_GANGS = frozenset({SchedulerKind.slurm, SchedulerKind.sim})
TAKING_MOVES = frozenset(
    {
        SchedulerKind.slurm,
        SchedulerKind.kubernetes,
        SchedulerKind.kueue,
        SchedulerKind.ray,
        SchedulerKind.armada,
        SchedulerKind.sim,
    }
)


def places_itself(scheduler: str) -> bool:
    return SchedulerKind(scheduler) in SCHEDULER_OWNED


def reserves(scheduler: str) -> bool:
    return SchedulerKind(scheduler) in RESERVING


def moves_jobs(scheduler: str) -> bool:
    return SchedulerKind(scheduler) not in UNPINNABLE


def restarts_gangs(scheduler: str) -> bool:
    return SchedulerKind(scheduler) in RESTARTING_GANGS


def takes_moves(scheduler: str) -> bool:
    return SchedulerKind(scheduler) in TAKING_MOVES


def holds_moved_jobs(scheduler: str) -> bool:
    return places_itself(scheduler) and moves_jobs(scheduler) and reserves(scheduler)
