"""Whether a Job that a move created here is one this cluster runs: the Kubernetes and
Kueue connectors' ``SupportsArrivalCheck`` (connectors.arrival says why each scheduler
family judges as it does), as functions of what the API server reports.

**A Job** (:func:`judge_job`). The API server takes any valid Job; what goes wrong after
the create is the Job controller failing to create its pods (an admission webhook, a
PodSecurity level, a missing ServiceAccount) or the kubelet failing to start them (a
Secret or ConfigMap the source's namespace had and this one lacks, an image name that
does not parse). So:

* ran to its end: accepted when its pods ran (it succeeded, or failed after they ran: its
  own failure, which ``withdraw`` refuses to undo too); rejected when it ended before any
  pod ran (its deadline passed in the queue, or the kubelet refused each of its pods at
  admission: :func:`took_place` says why only a pod seen to have started tells);
* suspended: held in the queue (someone's hold; a Job Kueue manages is judged by its
  Workload first, below), accepted;
* no pod yet: not yet known. The controller creates pods within seconds unless it
  cannot, and then the confirm gives up after its polls and the move is undone (the
  Job's FailedCreate events say why; the connector's role has no right to read events);
* a pod whose containers cannot be created for a reason no wait fixes
  (:data:`NEVER_STARTS`): rejected; a pod still pulling its image: not yet known;
* otherwise its pods run, or wait for the kube-scheduler (queued): accepted.

**A Workload** (:func:`judge_workload`), for a Job Kueue manages: Kueue keeps the Job
suspended until it admits the Workload. Deactivated (``spec.active: false``) by Shaper (a
held submit, a hold: the mark ``shaper.io/deactivated`` its deactivations write and its
reactivations take off), it is held in the queue, accepted; deactivated by Kueue itself
(an AdmissionCheck that rejected it, its requeuing limit reached: Kueue's DeactivationTarget
and Evicted conditions say which) or by anyone else, it stays out of admission until they
let it in, and is rejected with what its conditions say. Admitted, the Job is judged as
above (suspended, it is about to be resumed: not yet known until its pods are there); waiting for
quota in its ClusterQueue (QuotaReserved false, reason ``Pending``) it is queued, accepted;
inadmissible (no such LocalQueue, a stopped or inactive queue: reasons
:data:`INADMISSIBLE`) it was rejected; finished without its Job having run, rejected; not
yet looked at by Kueue (no QuotaReserved condition), not yet known.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kubernetes import client

from connectors.arrival import not_yet, rejected
from connectors.kubernetes.pods import DEACTIVATED_BY_SHAPER

# A Job's conditions once it has run to its end (the Job controller's, and the interim
# ones it sets while its pods finish).
RAN_CONDITIONS = ("Complete", "Failed", "SuccessCriteriaMet", "FailureTarget")
# Why a container waits that no wait fixes: the kubelet retries them for ever.
NEVER_STARTS = frozenset(
    {"CreateContainerConfigError", "CreateContainerError", "InvalidImageName", "ErrImageNeverPull"}
)
# Why a container waits for its image: a registry may answer on a later try.
STILL_PULLING = frozenset({"ErrImagePull", "ImagePullBackOff"})
# QuotaReserved=False reasons of a Workload Kueue will not admit as it stands.
INADMISSIBLE = frozenset({"Inadmissible", "Misconfigured"})
_SUCCEEDED = ("Complete", "SuccessCriteriaMet")
# The reason of the Failed (and FailureTarget) condition of a Job whose
# activeDeadlineSeconds passed (the Job controller's batch.JobReasonDeadlineExceeded).
DEADLINE_EXCEEDED = "DeadlineExceeded"
# The Workload conditions that say why Kueue deactivated it, most telling first.
_DEACTIVATION_CONDITIONS = (
    ("DeactivationTarget", "True"),
    ("Evicted", "True"),
    ("Requeued", "False"),
    ("QuotaReserved", "False"),
)


def judge_job(
    job: client.V1Job, pods: list[client.V1Pod], external_id: str, *, admitted: bool = False
) -> str:
    """What was seen of the moved Job ``external_id`` and its pods, when accepted; else
    raises (connectors.arrival's ``not_yet`` or ``rejected``) saying what was seen.
    ``admitted``: Kueue admitted its Workload, so a suspended Job is about to be resumed,
    not held: not yet known until its pods are there to judge."""
    seen = f"job {external_id}"
    status = job.status or client.V1JobStatus()
    ended = ran_condition(job)
    if ended is not None:
        if took_place(job, pods):
            return f"{seen} ran here and ended ({ended}): the move took place"
        raise rejected(f"{seen} ended ({ended}{_message(status, ended)}) before any pod ran")
    if (job.spec and job.spec.suspend) is True:
        if admitted:
            raise not_yet(f"{seen} is admitted and not yet resumed by Kueue")
        return f"{seen} is suspended: held in the queue"
    live = [p for p in pods if p.metadata.deletion_timestamp is None]
    if not live:
        raise not_yet(f"{seen} has no pod yet")
    for pod in live:
        for name, reason, message in _waiting(pod):
            if reason in NEVER_STARTS:
                raise rejected(
                    f"{seen}: container {name} of pod {pod.metadata.name} cannot start "
                    f"({reason}: {message[:200]})"
                )
    pulling = [(pod, reason) for pod in live for _, reason, _ in _waiting(pod)]
    pulling = [(pod, reason) for pod, reason in pulling if reason in STILL_PULLING]
    if pulling:
        pod, reason = pulling[0]
        raise not_yet(f"{seen}: pod {pod.metadata.name} is {reason}")
    bound = sorted(p.spec.node_name for p in live if p.spec and p.spec.node_name)
    if bound:
        return f"{seen} runs: its pods are on {','.join(bound)}"
    return f"{seen} is pending: its pods wait for the scheduler"


def judge_workload(workload: dict[str, Any], external_id: str) -> str | None:
    """What was seen of a moved Job's Workload when that settles it (queued, held);
    None when its Job is to be judged (:func:`judge_job`: admitted, or finished); else
    raises saying what was seen."""
    seen = f"job {external_id}'s Workload {workload.get('metadata', {}).get('name')}"
    conditions = {c.get("type"): c for c in workload.get("status", {}).get("conditions") or []}
    if _true(conditions.get("Finished")):
        return None
    if workload.get("spec", {}).get("active", True) is False:
        annotations = workload.get("metadata", {}).get("annotations") or {}
        if annotations.get(DEACTIVATED_BY_SHAPER):
            return f"{seen} is deactivated by Shaper: held in the queue"
        raise rejected(f"{seen} was deactivated, not by Shaper ({_deactivated_why(conditions)})")
    if _true(conditions.get("Admitted")):
        return None
    reserved = conditions.get("QuotaReserved")
    if reserved is None:
        raise not_yet(f"{seen} has not been considered by Kueue")
    if _true(reserved):
        return f"{seen} has its quota reserved: it is being admitted"
    reason, message = str(reserved.get("reason") or ""), str(reserved.get("message") or "")
    if reason in INADMISSIBLE:
        raise rejected(f"{seen} is inadmissible ({reason}: {message[:200]})")
    return f"{seen} is queued ({reason or 'pending'}: {message[:200]})"


def ran_condition(job: client.V1Job) -> str | None:
    """The condition that says a Job ran to its end; None while it may still run."""
    for condition in (job.status.conditions if job.status else None) or []:
        if condition.type in RAN_CONDITIONS and condition.status == "True":
            return str(condition.type)
    return None


def took_place(job: client.V1Job, pods: Sequence[client.V1Pod] = ()) -> str | None:
    """The condition of a Job that ended having run here (it succeeded, or a pod of it ran
    and ended); None while it may still run, or when it ended before any pod ran (a
    deadline, a pod that could never be created or start): such a copy did no work, and a
    move that made it may be undone. ``pods``: the Job's pods as the API server lists them
    now.

    A Failed Job's ``status.failed`` counts every pod the Job controller ended, those that
    never started too: the ones still Pending when ``activeDeadlineSeconds`` passed
    (condition reason ``DeadlineExceeded``), and ones the kubelet refused at admission
    (``UnexpectedAdmissionError``, ``OutOfnvidia.com/gpu``: failed with no container) that
    ``backoffLimit`` counts until ``BackoffLimitExceeded``. So, whatever the reason, the
    count says nothing of a run: when pods are listed, only one with a container that
    started says the Job ran (:func:`pod_started`).

    With no pod listed the counts are all there is. For a deadline the copy counts as not
    run: the controller deletes the pods it ends at the deadline, so the pod of a copy that
    ran until then is gone (the Job's status keeps counts only: ``ready``, ``terminating``,
    ``uncounted_terminated_pods`` are of the present, ``startTime`` is the Job's, not a
    pod's); the move is undone and the home copy runs — at worst a second time, after a run
    here its deadline cut short — rather than cancelling the home copy of a job that may
    never have run anywhere. For any other reason the controller keeps the pods it failed,
    so none listed means someone deleted them (or a TTL the Job as a whole), and a failed
    count is taken as a run: this fallback errs on the side of "ran" (the home copy is not
    brought back to run a second time), at the cost of a Job whose pods never started and
    were deleted since being kept as moved."""
    ended = ran_condition(job)
    if ended is None:
        return None
    status = job.status or client.V1JobStatus()
    if ended in _SUCCEEDED or status.succeeded:
        return ended
    if not status.failed:
        return None
    if pods:
        return ended if any(pod_started(pod) for pod in pods) else None
    return None if _reason(status, ended) == DEADLINE_EXCEEDED else ended


def pod_started(pod: client.V1Pod) -> bool:
    """Whether a container of the pod started (runs, or ended after it started), now or
    before a restart; a pod deleted while Pending has none (a container the kubelet never
    started is reported terminated without a start time)."""
    status = pod.status or client.V1PodStatus()
    containers = [*(status.init_container_statuses or []), *(status.container_statuses or [])]
    for container in containers:
        for state in (container.state, container.last_state):
            if state is None:
                continue
            if state.running is not None or (state.terminated and state.terminated.started_at):
                return True
    return False


def _reason(status: client.V1JobStatus, condition: str) -> str:
    for each in status.conditions or []:
        if each.type == condition:
            return str(each.reason or "")
    return ""


def _deactivated_why(conditions: dict[Any, dict[str, Any]]) -> str:
    """What Kueue says of a deactivation: its DeactivationTarget condition while it acts on
    it, then the Evicted (or Requeued, QuotaReserved) condition it leaves."""
    for kind, status in _DEACTIVATION_CONDITIONS:
        condition = conditions.get(kind)
        if condition is not None and condition.get("status") == status:
            reason, message = condition.get("reason") or "", condition.get("message") or ""
            return f"{kind} {reason}: {str(message)[:200]}"
    return "no condition says why"


def _true(condition: dict[str, Any] | None) -> bool:
    return condition is not None and condition.get("status") == "True"


def _waiting(pod: client.V1Pod) -> list[tuple[str, str, str]]:
    """(container, reason, message) of each container of the pod that waits to start."""
    status = pod.status or client.V1PodStatus()
    containers = [*(status.init_container_statuses or []), *(status.container_statuses or [])]
    waiting = []
    for container in containers:
        state = container.state.waiting if container.state else None
        if state is not None and state.reason:
            waiting.append((container.name, str(state.reason), str(state.message or "")))
    return waiting


def _message(status: client.V1JobStatus, condition: str) -> str:
    for each in status.conditions or []:
        if each.type == condition and each.message:
            return f": {str(each.message)[:200]}"
    return ""
