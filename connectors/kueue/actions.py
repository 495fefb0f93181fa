"""What the Kueue connector does to a cluster: hold a Workload out of admission, let it back
in, and preempt it with a checkpoint so that it resumes where it stopped.

Kueue decides which Workloads run; Shaper steers it through ``spec.active`` of a Workload
(``kueue.x-k8s.io/v1beta2``), the supported way to stop an admitted one: deactivating evicts
it (condition ``Evicted``, reason ``Deactivated``), Kueue suspends its Job, the pods go, the
quota is released, and it stays out of admission until reactivated; then it queues again and
is admitted like any other. Kueue deactivates Workloads itself too (an AdmissionCheck that
rejected one, its requeuing limit reached), so every deactivation of Shaper's marks the
Workload (``shaper.io/deactivated``) and its reactivation takes the mark off: a moved copy's
confirm (connectors.kubernetes.arrival) tells Shaper's hold from Kueue's rejection by it.
What was measured against Kueue v0.17.0 and Kubernetes v1.37:

* Setting ``spec.suspend`` of an admitted Job that Kueue manages does not stop it: Kueue
  unsuspends it at once, the Job controller has already killed its pods, new ones start from
  scratch, and the quota stays reserved. So "suspend the Workload's job" is deactivation;
  connectors.kubernetes.actions.suspend_job refuses Kueue's Jobs.
* While a Workload is evicted, Kueue's stop of its Job (run on each reconcile; read in
  pkg/controller/jobs/job, not measured alone) restores the Job's pod template metadata
  from the Workload's ``spec.podSets``, so an annotation patched only on the template may
  be removed again; ``spec.podSets`` may change once the quota is released (Kueue's
  webhook freezes it only while quota is reserved), so the resume pointer is written there
  and on the Job. Kueue compares only containers and tolerations of a Job and its Workload,
  so neither write makes it rebuild the Workload.

Checkpoint-aware preemption (kubernetes-sigs/kueue#477) follows the contract of
connectors.kubernetes.actions: the pod template says ``shaper.io/checkpointable: "true"`` and
declares ``SHAPER_RESUME_FROM`` from the annotation ``shaper.io/resume-from``. A pointer to
kubelet checkpoint images (``checkpoint-image:…``: the kubelet's checkpoint of the pod's
containers, imported as images on its node; connectors.kubernetes.restore_webhook) also
labels the template and the pod sets ``shaper.io/restore: checkpoint-image``; on
re-admission the restore webhook gives the new pod those images and pins it to that node,
and containerd restores the processes (measured on a real node:
tests/k8s/test_real_node_checkpoint_preemption.py). Such a pointer restores one pod: a
Workload running more, or elsewhere than the images' node, is refused before it stops.
The node agent takes that checkpoint: ``connectors.kubernetes.node_agent.agent_checkpoint``
is the ``checkpoint`` callback that calls the agent on the pod's node (``shaper agent
api``: the kubelet's checkpoint API, then the archive imported into the node's containerd
as a checkpoint image, agent.kubelet) and answers its pointer; the Kueue connector passes
it when it is given the agents' URL (``node_agent_url``) and a suspend comes without a
pointer from the saga.

RBAC (kueue.x-k8s.io unless said): ``deactivate``/``reactivate``: patch workloads;
``preempt_with_checkpoint``: get, patch, update workloads; get, patch batch jobs; list pods;
``forget_lost_images`` and ``evict_for_lost_images`` (the connector's upkeep): get nodes
(core); get, patch, update workloads; get, patch batch jobs; list pods.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Any

from kubernetes import client

from connectors.base import ConnectorError
from connectors.kubernetes.actions import (
    IMAGES_LOST,
    JOB_UID_LABEL,
    JSON_PATCH,
    MERGE_PATCH,
    REQUEST_TIMEOUT_S,
    SETTLE_TIMEOUT_S,
    Conflict,
    PodOnNode,
    Unprocessable,
    annotation_path,
    call,
    job_pods,
    node_exists,
    pods_stranded,
    read_job,
    read_job_json,
    template_blocker,
    wait_until,
)
from connectors.kubernetes.pins import LIFTING_PIN, images_node
from connectors.kubernetes.pods import DEACTIVATED_BY_SHAPER, RESUME_FROM, STOPPED_BY_STEP
from connectors.kubernetes.restore_webhook import (
    RESTORE_BY_IMAGE,
    RESTORE_LABEL,
    ImageRestore,
    Refused,
    image_restore,
)

GROUP, VERSION, WORKLOADS = "kueue.x-k8s.io", "v1beta2", "workloads"
# Kueue's own marker on a Job it is in the middle of stopping (pkg/controller/jobs/job).
KUEUE_STOPPING = "kueue.x-k8s.io/stopping"
# Attempts at a read-modify-write of a Workload that Kueue updates concurrently.
CONFLICT_ATTEMPTS = 5

Checkpoint = Callable[[list[PodOnNode]], str]


def _custom(api: client.ApiClient) -> client.CustomObjectsApi:
    return client.CustomObjectsApi(api)


def _resource(namespace: str, workload: str) -> str:
    return f"workloads.{GROUP} {workload} in {namespace}"


def read_workload(api: client.ApiClient, *, namespace: str, workload: str) -> dict[str, Any]:
    custom = _custom(api)
    found: dict[str, Any] = call(
        "get",
        _resource(namespace, workload),
        lambda: custom.get_namespaced_custom_object(
            GROUP, VERSION, namespace, WORKLOADS, workload, _request_timeout=REQUEST_TIMEOUT_S
        ),
    )
    return found


def _set_active(
    api: client.ApiClient,
    *,
    namespace: str,
    workload: str,
    active: bool,
    step_key: str | None = None,
) -> None:
    # Shaper's own deactivation is marked in the same patch, and the mark goes with the
    # reactivation (a merge patch's null deletes it): an inactive Workload without it is
    # one Kueue (or someone else) deactivated, which no release of Shaper's lets run.
    annotations: dict[str, str | None] = {DEACTIVATED_BY_SHAPER: None if active else "true"}
    # A step that acts on a Workload the upkeep is letting go (evict_for_lost_images) takes
    # it over: the upkeep then leaves it as the step did.
    annotations[LIFTING_PIN] = None
    if step_key is not None:
        annotations[STOPPED_BY_STEP] = step_key
    body: dict[str, Any] = {"spec": {"active": active}, "metadata": {"annotations": annotations}}
    _patch_workload(api, namespace=namespace, workload=workload, body=body)


def _patch_workload(
    api: client.ApiClient,
    *,
    namespace: str,
    workload: str,
    body: Any,
    content_type: str = MERGE_PATCH,
) -> None:
    custom = _custom(api)
    call(
        "patch",
        _resource(namespace, workload),
        lambda: custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            WORKLOADS,
            workload,
            body,
            _content_type=content_type,
            _request_timeout=REQUEST_TIMEOUT_S,
        ),
    )


def deactivate(
    api: client.ApiClient, *, namespace: str, workload: str, step_key: str | None = None
) -> None:
    """Hold a Workload out of admission (``spec.active: false``); an admitted one is evicted,
    its Job suspended by Kueue and its pods deleted (their work lost unless checkpointed:
    :func:`preempt_with_checkpoint`). Returns once Kueue has the request, not when the pods
    are gone. Idempotent; a missing Workload is a non-retryable error. ``step_key`` (a saga
    step's idempotency key) is written on the Workload in the same patch:
    :func:`stopped_by`."""
    _set_active(api, namespace=namespace, workload=workload, active=False, step_key=step_key)


def stopped_by(workload: dict[str, Any], step_key: str | None) -> bool:
    """Whether the step with this idempotency key deactivated the Workload (its stamp)."""
    annotations = workload.get("metadata", {}).get("annotations") or {}
    return step_key is not None and annotations.get(STOPPED_BY_STEP) == step_key


def reactivate(api: client.ApiClient, *, namespace: str, workload: str) -> None:
    """Let a Workload be admitted again (``spec.active: true``): it queues in its
    ClusterQueue and Kueue admits it when quota and ordering allow. Idempotent."""
    _set_active(api, namespace=namespace, workload=workload, active=True)


def is_active(workload: dict[str, Any]) -> bool:
    return bool(workload.get("spec", {}).get("active", True))


def condition_true(workload: dict[str, Any], kind: str) -> bool:
    conditions = workload.get("status", {}).get("conditions") or []
    return any(c.get("type") == kind and c.get("status") == "True" for c in conditions)


def job_of(workload: dict[str, Any]) -> str:
    """The name of the batch/v1 Job that owns a Workload; other kinds are not supported yet."""
    metadata = workload["metadata"]
    for owner in metadata.get("ownerReferences") or []:
        if (
            owner.get("controller")
            and owner.get("kind") == "Job"
            and owner.get("apiVersion") == "batch/v1"
        ):
            return str(owner["name"])
    raise ConnectorError(
        f"workload {metadata['name']} in {metadata['namespace']} is not a batch/v1 Job's; "
        "checkpoint-aware preemption supports Jobs only",
        retryable=False,
    )


def preempt_with_checkpoint(
    api: client.ApiClient,
    *,
    namespace: str,
    workload: str,
    checkpoint: Checkpoint,
    allow_restart: bool = False,
    step_key: str | None = None,
    timeout_s: float = SETTLE_TIMEOUT_S,
) -> str | None:
    """Preempt a Workload so that it resumes from a checkpoint when Kueue admits it again.

    1. ``checkpoint(pods)`` — the Job's running pods and their nodes; the connector passes a
       function that returns the resume pointer: the one the saga's checkpoint step gave,
       or the node agent's kubelet checkpoint (connectors.kubernetes.node_agent) —
       only while the Workload is still active: once it is inactive its pods are stopping
       and the pointer already stored is the latest.
    2. The pointer goes on the Job (annotation ``shaper.io/resume-from``) before anything
       stops, so a crash after this point loses nothing.
    3. The Workload is deactivated (held): Kueue evicts it, suspends the Job, the pods go.
    4. Once the quota is released, the pointer is written into the Workload's pod set and the
       Job's pod template, so the pods Kueue starts on re-admission carry it (and read it as
       ``SHAPER_RESUME_FROM``). :func:`reactivate` lets it run again.

    A ``checkpoint-image:`` pointer (connectors.kubernetes.restore_webhook) also labels the
    template and pod sets for the restore webhook, and must name the one running pod's node.

    Returns the resume pointer (None when nothing ran, so there was nothing to checkpoint).
    A Job whose pods could not resume (not checkpointable, or no ``SHAPER_RESUME_FROM``
    declared) is refused before anything happens unless ``allow_restart``. Idempotent: a
    retry of a call that timed out waiting for Kueue does not checkpoint again, and the
    deactivation carries ``step_key`` (:func:`deactivate`) for the caller's own resend
    check. Raises a
    retryable error when Kueue takes longer than ``timeout_s`` to stop the Job, and passes
    on the checkpoint function's errors (nothing has changed then).
    """
    batch = client.BatchV1Api(api)
    current = read_workload(api, namespace=namespace, workload=workload)
    job = job_of(current)
    job_resource = f"jobs {job} in {namespace}"
    owner = read_job(api, namespace=namespace, job=job)
    resume_from: str | None = (owner.metadata.annotations or {}).get(RESUME_FROM)
    if is_active(current):
        pods = _running_pods(api, namespace=namespace, job_uid=owner.metadata.uid)
        blocker = template_blocker(api, owner.spec.template) if pods else None
        if blocker and not allow_restart:
            raise ConnectorError(
                f"cannot preempt workload {workload} in {namespace} with a checkpoint: "
                f"{blocker}, and no policy allows a restart",
                retryable=False,
            )
        if pods and not blocker:
            pointer = checkpoint(pods)
            _check_image_restore(pointer, pods, what=f"workload {workload} in {namespace}")
            # Before anything stops: from here on a crash loses no work.
            call(
                "patch",
                job_resource,
                lambda: batch.patch_namespaced_job(
                    job,
                    namespace,
                    {"metadata": {"annotations": {RESUME_FROM: pointer}}},
                    _content_type=MERGE_PATCH,
                    _request_timeout=REQUEST_TIMEOUT_S,
                ),
            )
            resume_from = pointer
        deactivate(api, namespace=namespace, workload=workload, step_key=step_key)
    elif LIFTING_PIN in (current["metadata"].get("annotations") or {}):
        # Held already by the upkeep's let-go (evict_for_lost_images): this step takes it
        # over, and the Workload stays held.
        taken = {"metadata": {"annotations": {LIFTING_PIN: None}}}
        _patch_workload(api, namespace=namespace, workload=workload, body=taken)

    wait_stopped(api, namespace=namespace, workload=workload, job=job, timeout_s=timeout_s)
    if resume_from is not None:
        # A checkpoint image's pointer also labels the pods for the restore webhook; any
        # other pointer takes an earlier one's label off (null deletes it).
        what = f"workload {workload} in {namespace}"
        restore = RESTORE_BY_IMAGE if _image_restore(resume_from, what=what) else None
        _store_in_pod_sets(
            api,
            namespace=namespace,
            workload=workload,
            annotations={RESUME_FROM: resume_from},
            labels={RESTORE_LABEL: restore},
        )
        template = {
            "metadata": {
                "annotations": {RESUME_FROM: resume_from},
                "labels": {RESTORE_LABEL: restore},
            }
        }
        call(
            "patch",
            job_resource,
            lambda: batch.patch_namespaced_job(
                job,
                namespace,
                {"spec": {"template": template}},
                _content_type=MERGE_PATCH,
                _request_timeout=REQUEST_TIMEOUT_S,
            ),
        )
    return resume_from


def forget_lost_images(
    api: client.ApiClient, *, namespace: str, workload: str, node: str
) -> str | None:
    """A Workload held out of admission (no quota reserved: deactivated by a preemption
    with a checkpoint, or queued) whose Job is to resume from checkpoint images on
    ``node``, which is no longer in the cluster (the API server answers 404 for it): the
    images went with it, and the restore webhook would hold its pods to that node for
    good once it is admitted. The pointer and the restore label come off the pod sets
    (Kueue restores the Job's template from them while it is evicted) and then off the
    Job, its copy too; the Workload stays as it was
    (held, or queued): once admitted, its pods start from their own checkpoint or
    afresh. A line, or None when there is nothing to do (the node is there, quota is
    reserved, the Job still has pods or points elsewhere by now)."""
    if node_exists(api, node):
        return None
    current = read_workload(api, namespace=namespace, workload=workload)
    if condition_true(current, "QuotaReserved"):
        return None  # its pod sets are frozen while it holds quota
    job = job_of(current)
    found = read_job_json(api, namespace=namespace, job=job)
    template = found["spec"]["template"]
    status = found.get("status") or {}
    if images_node(template) != node or not found["spec"].get("suspend") or status.get("active"):
        return None
    _store_in_pod_sets(
        api,
        namespace=namespace,
        workload=workload,
        annotations={RESUME_FROM: None},
        labels={RESTORE_LABEL: None},
    )
    # A merge patch, not a test of the pointer as read: the pod-set write makes Kueue, while
    # the Workload is evicted, restore the template from them at once, and the pointer may
    # be off it already (the Job's own copy is not). Nothing writes another pointer on a Job
    # that holds no quota but the same one again (preempt_with_checkpoint, from that copy).
    forgotten = {
        "metadata": {"annotations": {RESUME_FROM: None}},
        "spec": {
            "template": {
                "metadata": {"annotations": {RESUME_FROM: None}, "labels": {RESTORE_LABEL: None}}
            }
        },
    }
    batch = client.BatchV1Api(api)
    call(
        "patch",
        f"jobs {job} in {namespace}",
        lambda: batch.patch_namespaced_job(
            job,
            namespace,
            forgotten,
            _content_type=MERGE_PATCH,
            _request_timeout=REQUEST_TIMEOUT_S,
        ),
    )
    return (
        f"job {job} of workload {workload} in {namespace}: the checkpoint images it is held "
        f"to resume from went with node {node}, no longer in the cluster; the pointer is off "
        "its pod sets and its template, the workload stays as it was, and its pods will start "
        "from their own checkpoint or afresh"
    )


def evict_for_lost_images(
    api: client.ApiClient,
    *,
    namespace: str,
    workload: str,
    node: str,
    timeout_s: float = SETTLE_TIMEOUT_S,
) -> str | None:
    """An admitted Workload whose Job's pods wait for good for ``node``, gone from the
    cluster with the checkpoint images they were to resume from (the restore webhook holds
    them there; none of its pods is on a node, and the scheduler found none for one):
    Kueue keeps its quota reserved and its pod sets frozen meanwhile, so it is let go.
    Deactivated, marked ``shaper.io/lifting-pin`` (so that a connector stopped halfway
    finishes next round; the mark's value names the node) → once Kueue has stopped it, the
    pointer comes off (:func:`forget_lost_images`) → reactivated by a JSON patch that tests
    the mark is still there and takes it off: it queues again, and its pods start from
    their own checkpoint or afresh. A plan's step that deactivates or reactivates it
    meanwhile takes the mark off (:func:`_set_active`), and the Workload is left as that
    step made it. A line, or None when there is nothing to do (the node is there by the API
    server's word, the Workload is inactive or holds no quota, a pod of it is placed)."""
    current = read_workload(api, namespace=namespace, workload=workload)
    mark = (current["metadata"].get("annotations") or {}).get(LIFTING_PIN)
    if mark is None:
        if not is_active(current) or not condition_true(current, "QuotaReserved"):
            return None
        if node_exists(api, node):
            return None
        owner = read_job(api, namespace=namespace, job=job_of(current))
        pods = [api.sanitize_for_serialization(p) for p in job_pods(api, owner)]
        if not pods_stranded(pods):
            return None
        mark = f"{IMAGES_LOST}{node}"
        # Only if it is still active: a plan's hold (or Kueue) that deactivated it since
        # keeps it as it made it.
        stop: list[dict[str, Any]] = [{"op": "test", "path": "/spec/active", "value": True}]
        if current["metadata"].get("annotations") is None:
            stop.append({"op": "add", "path": "/metadata/annotations", "value": {}})
        stop += [
            {"op": "add", "path": annotation_path(LIFTING_PIN), "value": mark},
            {"op": "add", "path": annotation_path(DEACTIVATED_BY_SHAPER), "value": "true"},
            {"op": "replace", "path": "/spec/active", "value": False},
        ]
        try:
            _patch_workload(
                api, namespace=namespace, workload=workload, body=stop, content_type=JSON_PATCH
            )
        except Unprocessable:
            return None  # deactivated meanwhile: not the upkeep's to let go
    elif is_active(current):
        return None  # reactivated by someone else, who will have taken the mark off
    node = mark.removeprefix(IMAGES_LOST)
    wait_stopped(
        api, namespace=namespace, workload=workload, job=job_of(current), timeout_s=timeout_s
    )
    forgot = forget_lost_images(api, namespace=namespace, workload=workload, node=node)
    mark_path, deactivated_path = (
        annotation_path(LIFTING_PIN),
        annotation_path(DEACTIVATED_BY_SHAPER),
    )
    again = [
        {"op": "test", "path": mark_path, "value": mark},
        {"op": "remove", "path": mark_path},
        # Added first, so that the remove holds whether it is there or not.
        {"op": "add", "path": deactivated_path, "value": "true"},
        {"op": "remove", "path": deactivated_path},
        {"op": "replace", "path": "/spec/active", "value": True},
    ]
    try:
        _patch_workload(
            api, namespace=namespace, workload=workload, body=again, content_type=JSON_PATCH
        )
    except Unprocessable:
        return None  # a step took it over meanwhile (the mark is gone): it is the step's
    pointer = "the pointer taken off, " if forgot else ""
    return (
        f"workload {workload} in {namespace}: its pods waited for node {node}, gone from the "
        f"cluster with the checkpoint images they were to resume from; it was let go, {pointer}"
        "and queued again: its pods start from their own checkpoint or afresh"
    )


def wait_stopped(
    api: client.ApiClient,
    *,
    namespace: str,
    workload: str,
    job: str,
    timeout_s: float = SETTLE_TIMEOUT_S,
) -> None:
    """Until Kueue has released a deactivated Workload's quota and stopped its Job
    (suspended, Kueue's own stopping marker gone, no pod active): then the pointer can be
    written into its pod sets, and a reactivation queues it again instead of finding it
    still admitted. A retryable error when Kueue takes longer than ``timeout_s``."""

    def stopped() -> bool:
        seen = read_workload(api, namespace=namespace, workload=workload)
        if condition_true(seen, "QuotaReserved"):
            return False
        found = read_job(api, namespace=namespace, job=job)
        stopping = KUEUE_STOPPING in (found.metadata.annotations or {})
        return bool(found.spec.suspend) and not stopping and not found.status.active

    wait_until(f"Kueue to stop job {job} of workload {workload} in {namespace}", stopped, timeout_s)


def _running_pods(api: client.ApiClient, *, namespace: str, job_uid: str) -> list[PodOnNode]:
    core = client.CoreV1Api(api)
    listed = call(
        "list",
        f"pods in {namespace}",
        lambda: core.list_namespaced_pod(
            namespace,
            label_selector=f"{JOB_UID_LABEL}={job_uid}",
            _request_timeout=REQUEST_TIMEOUT_S,
        ),
    )
    return [
        PodOnNode(
            namespace=namespace, pod=p.metadata.name, node=p.spec.node_name, uid=p.metadata.uid
        )
        for p in listed.items
        if p.spec.node_name
        and p.metadata.deletion_timestamp is None
        and p.status.phase in ("Pending", "Running")
    ]


def _store_in_pod_sets(
    api: client.ApiClient,
    *,
    namespace: str,
    workload: str,
    annotations: dict[str, str | None],
    labels: dict[str, str | None],
) -> None:
    """Write the pointer into every pod set's template annotations (and the restore label;
    None takes either off): Kueue restores the Job's template from these while the Workload
    is evicted. Read-modify-replace (a merge patch would replace the whole list), retried
    while Kueue writes the same object."""
    custom = _custom(api)
    resource = _resource(namespace, workload)
    for attempt in range(CONFLICT_ATTEMPTS):
        current = read_workload(api, namespace=namespace, workload=workload)
        changed = False
        for pod_set in current["spec"]["podSets"]:
            metadata = pod_set["template"].setdefault("metadata", {})
            for field, wanted in (("annotations", annotations), ("labels", labels)):
                have = dict(metadata.get(field) or {})
                merged = {**have, **wanted}
                merged = {k: v for k, v in merged.items() if v is not None}
                if merged != have:
                    metadata[field] = merged
                    changed = True
        if not changed:
            return
        try:
            call(
                "update",
                resource,
                partial(
                    custom.replace_namespaced_custom_object,
                    GROUP,
                    VERSION,
                    namespace,
                    WORKLOADS,
                    workload,
                    current,
                    _request_timeout=REQUEST_TIMEOUT_S,
                ),
            )
            return
        except Conflict:
            if attempt == CONFLICT_ATTEMPTS - 1:
                raise


def _check_image_restore(pointer: str, pods: list[PodOnNode], *, what: str) -> None:
    """A checkpoint image's pointer (connectors.kubernetes.restore_webhook) names one pod's
    containers on one node: refused, before anything stops, when it is malformed or the
    Job runs more than one pod, or another node than the image's."""
    restore = _image_restore(pointer, what=what)
    if restore is None:
        return
    if len(pods) != 1 or pods[0].node != restore.node:
        where = ", ".join(f"{p.pod} on {p.node}" for p in pods)
        raise ConnectorError(
            f"cannot preempt {what} with checkpoint images: they restore one pod on "
            f"{restore.node}, and its running pods are {where}",
            retryable=False,
        )


def _image_restore(pointer: str, *, what: str) -> ImageRestore | None:
    try:
        return image_restore(pointer)
    except Refused as refused:
        raise ConnectorError(f"cannot preempt {what}: {refused}", retryable=False) from None
