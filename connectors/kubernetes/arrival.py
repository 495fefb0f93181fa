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
  pod ran (its deadline passed in the queue);
* suspended: held in the queue (someone's hold; a Job Kueue manages is judged by its
  Workload first, below), accepted;
* no pod yet: not yet known. The controller creates pods within seconds unless it
  cannot, and then the confirm gives up after its polls and the move is undone (the
  Job's FailedCreate events say why; the connector's role has no right to read events);
* a pod whose containers cannot be created for a reason no wait fixes
  (:data:`NEVER_STARTS`): rejected; a pod still pulling its image: not yet known;
* otherwise its pods run, or wait for the kube-scheduler (queued): accepted.

**A Workload** (:func:`judge_workload`), for a Job Kueue manages: Kueue keeps the Job
suspended until it admits the Workload. Admitted, the Job is judged as above (suspended,
it is about to be resumed: not yet known until its pods are there); waiting for
quota in its ClusterQueue (QuotaReserved false, reason ``Pending``) it is queued, accepted;
inadmissible (no such LocalQueue, a stopped or inactive queue: reasons
:data:`INADMISSIBLE`) it was rejected; finished without its Job having run, rejected; not
yet looked at by Kueue (no QuotaReserved condition), not yet known.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client

from connectors.arrival import not_yet, rejected

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
        if took_place(job):
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
    if _true(conditions.get("Admitted")) or _true(conditions.get("Finished")):
        return None
    if workload.get("spec", {}).get("active", True) is False:
        return f"{seen} is deactivated: held in the queue"
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


def took_place(job: client.V1Job) -> str | None:
    """The condition of a Job that ended having run here (it succeeded, or a pod of it ran
    and ended); None while it may still run, or when it ended before any pod ran (a
    deadline, a pod that could never be created): such a copy did no work, and a move
    that made it may be undone."""
    ended = ran_condition(job)
    if ended is None:
        return None
    status = job.status or client.V1JobStatus()
    pods_ran = (status.succeeded or 0) + (status.failed or 0)
    return ended if ended in _SUCCEEDED or pods_ran else None


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
