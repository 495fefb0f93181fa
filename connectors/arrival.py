"""Whether a job that a federated move submitted here is one this cluster's scheduler runs.

A pending job's move (app.actions.recipes) submits the job to its target, then asks the
target's connector to ``confirm`` it (``args.expect == "accepted"``, connectors.actions),
and only then cancels the home copy. The submit's answer says only that the scheduler
took the request; some schedulers find out later that they cannot run what they took, and
cancelling the home copy then would lose the job. So the confirm waits until the target's
scheduler holds the new copy in a state it runs from, and fails (the move is undone: the
copy withdrawn, the home copy released) when the scheduler has rejected it.

What counts as "accepted" depends on where each scheduler family finds out that it cannot
run a job:

* **Slurm** checks a job at ``sbatch`` (partition, account, QOS, limits) and refuses it
  there, so a job in its queue is one it will run when resources free — except the few
  pending reasons Slurm documents as never resolving by themselves
  (:data:`NEVER_RUNS_REASONS`). Pending, running or having run: accepted. Whether an
  ended copy ran is told from its state, times and node list together
  (connectors.slurm.arrival): Slurm's times have one-second resolution, and it stamps a
  job it ends in its queue with a start equal to its end.
* **Simulated** clusters check a job at submit (connectors.sim.cluster) like Slurm; they
  can also refuse a queued one afterwards (``SimCluster.refuse``), which is how the tests
  and the demo stand for the schedulers below.
* **Kubernetes** accepts any valid Job object; the Job controller may then fail to create
  its pods (a webhook, a PodSecurity level, a missing ServiceAccount) and its pods may fail
  to start (a missing Secret or ConfigMap of the source's namespace). Accepted once its pods
  exist and none is stuck on what no wait fixes (connectors.kubernetes.arrival).
* **Kueue** keeps the Job suspended until it admits its Workload: a Workload inadmissible
  for good (no such LocalQueue, an inactive ClusterQueue) is rejected; one waiting for quota
  is queued, accepted; admitted, it is then judged as Kubernetes judges a Job.
* **Ray** takes any Jobs API submission and builds its runtime environment while the job
  is PENDING, failing it there when it cannot: PENDING is not yet known; RUNNING (or
  ended after its entrypoint ran) is accepted (connectors.ray.connector).
* **Armada** takes any valid submission into its queue and its scheduler may refuse the job
  later (a ``failed`` event with cause ``Rejected``): queued (a held copy in the cordoned
  hold queue too), leased, pending, running or having run is accepted; failed, cancelled
  or preempted before its ``running`` event is rejected; not yet in the followed job sets'
  events, not yet known (connectors.armada.moves).

A copy that ran and then ended, succeeded or failed, is accepted: the move took place and
its failure is the job's own, as the ``withdraw`` of every connector says too (bringing the
home copy back would run the job a second time). One that ended without ever running
(failed or cancelled while queued) was rejected: nothing ran, and the home copy takes over.

A connector's ``withdraw`` and its arrival check apply the same "ran" rule, so that a copy
the confirm rejected is one the withdraw undoes, never one it refuses as having run (the
home copy would stay held for ever).

:func:`check_reported` is the rule over a ``JobReport``, for connectors whose report says
enough (sim, and any connector without ``SupportsArrivalCheck``).
"""

from __future__ import annotations

from connectors.base import ConnectorError
from wire.telemetry import JobReport, JobState

# Slurm's pending reasons that no wait resolves (squeue(1), "JOB REASON CODES"): the job
# stays in the queue for ever unless someone changes it. Matched as whole reasons.
NEVER_RUNS_REASONS = frozenset(
    {"BadConstraints", "DependencyNeverSatisfied", "InvalidAccount", "InvalidQOS"}
)


def not_yet(what: str) -> ConnectorError:
    """The arrival cannot be told yet: asked again (and, asked long enough, undone)."""
    return ConnectorError(f"{what}; not yet known to be runnable here", retryable=True)


def rejected(what: str) -> ConnectorError:
    """The scheduler will not run the copy: the move is undone."""
    return ConnectorError(f"{what}: the scheduler rejected the moved job", retryable=False)


def ran(job: JobReport) -> bool:
    """Whether the job ran here for a while: it started, and (if it has ended) ended after
    its start — a scheduler may stamp a job it ended in its queue with a start equal to its
    end (Slurm does; its connector judges with more than times: connectors.slurm.arrival)."""
    if job.start_time is None:
        return False
    return job.end_time is None or job.end_time > job.start_time


def check_reported(job: JobReport | None, external_id: str) -> str:
    """What was seen of the moved copy ``external_id`` as its connector reports it, when it is
    accepted; otherwise raises (:func:`not_yet`, :func:`rejected`) saying what was seen."""
    if job is None:
        raise not_yet(f"the scheduler does not report job {external_id} yet")
    seen = f"job {external_id} is {job.state.value}" + (f" ({job.reason})" if job.reason else "")
    if job.state in (JobState.failed, JobState.cancelled):
        if ran(job):
            return f"{seen}, after it ran here: the move took place"
        raise rejected(f"{seen} without having run")
    if job.state is JobState.pending and job.reason in NEVER_RUNS_REASONS:
        raise rejected(f"{seen}, a reason no wait resolves")
    return seen
