"""What the Kubernetes connector does to a cluster: scale (a Deployment also off named
nodes), evict, cordon, suspend, move and delete Jobs, delete pods.

Each function takes an ``ApiClient`` (connectors.kubernetes.client) and names its objects
by keyword; the connector class maps saga steps onto them. Every one is idempotent — a
retry after success changes nothing or finishes what a crash left half done — and raises
:class:`ConnectorError` with ``retryable`` set as Kueue's guide on errors advises: the API
server down, a timeout, 429, 409 and 5xx may pass on a retry; 400/403/404/422 will not,
and their message names the verb and the resource, so a missing RBAC rule reads as one.

What each needs of the connector's ClusterRole:

=====================  ===============================================================
scale                  patch apps deployments/scale, statefulsets/scale
evict                  create pods/eviction
cordon, uncordon       patch nodes
suspend_job/resume     get, patch batch jobs (recreate_job_pinned,
                       suspend_job_to_resume and restart_job too)
delete_job             delete batch jobs
shrink_indexed_job,    get, patch batch jobs; list pods (indexed_pods)
restart_indexed_job
(pod_gates) lifting    patch pods (connectors.kubernetes.pod_gates; the deployed role
the placement gate     grants it with components/pod-placement, whose admission policy
                       lets the connector change nothing of a pod but that)
resize_deployment_off  get deployments, list pods, patch deployments/scale; patch pods
                       (its pods' deletion cost: components/pod-placement again, whose
                       policy lets it set that annotation alone on a ReplicaSet's pod)
delete_pod             delete pods
lift_stale_pin,        get, patch batch jobs; list pods (the upkeep's: a pin Shaper set
mark_pin_started       lasts one run, connectors.kubernetes.pins)
=====================  ===============================================================

deploy/kubernetes/ grants what the saga's steps (connectors.kubernetes.capabilities) call:
``evict`` is a library function that no plan drives yet, so the deployed role does not
allow it; ``cordon``/``uncordon`` are an operator's drain and undrain of a node (the
``drain`` and ``undrain`` steps), which need ``patch nodes`` in the role.

Moving work follows one contract with the workload, the same as the node agent's
``signal`` backend: a pod that can move says so with the annotation
``shaper.io/checkpointable: "true"`` and reads where to resume from the environment
variable ``SHAPER_RESUME_FROM``. A Job's pod template is immutable except for its
scheduling directives and metadata (even while suspended; k8s.io/kubernetes
pkg/apis/batch/validation), so a Job's template must declare the variable from the
Downward API — ``valueFrom.fieldRef.fieldPath: metadata.annotations['shaper.io/resume-from']``
— and Shaper sets that annotation (connectors.kubernetes.pods.resume_blocker is the test,
shared with telemetry's ``checkpointable``). A Job that would lose its work is never stopped
unless the caller allows a restart. A pointer to kubelet checkpoint *images*
(``checkpoint-image:…``, connectors.kubernetes.restore_webhook) also puts the label
``shaper.io/restore: checkpoint-image`` on the template, and the restore webhook swaps the
images of the pods the Job controller creates for them: the process is restored by
containerd, not by the workload.

Bare pods are not moved: moving one is delete-then-create, and if the connector died or
timed out between the two nothing would ever recreate the pod (its work and its spec
would be gone). Work that must move runs as a Job, whose controller keeps the pod spec.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, TypeVar

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError as TransportError

from connectors.base import ConnectorError
from connectors.kubernetes import pod_placement
from connectors.kubernetes.pins import (
    LIFTING_PIN,
    PIN_ANNOTATION,
    Pin,
    affinity_nodes,
    images_node,
    new_pin,
    node_set,
    pinned_nodes,
    read_pin,
)
from connectors.kubernetes.pod_placement import COMPLETION_INDEX, POD_NODES_ANNOTATION
from connectors.kubernetes.pods import (
    JOB_CONTROLLER,
    QUEUE_LABEL,
    RESUME_FROM,
    STOPPED_BY_STEP,
    JobGroup,
    OwnerRef,
    elastic_size,
    owner_of,
    parse_time,
    pod_gpus,
    pod_live,
    pod_node,
    pod_spec_gpus,
    resume_blocker,
    training_range,
)
from connectors.kubernetes.restore_webhook import (
    RESTORE_BY_IMAGE,
    RESTORE_LABEL,
    Refused,
    image_restore,
)
from connectors.kubernetes.submission import pinned_affinity

JOB_UID_LABEL = "batch.kubernetes.io/controller-uid"
# One request's ceiling: the saga retries a step that times out, the API server does not
# need to be waited on longer.
REQUEST_TIMEOUT_S = 30.0
# How long a function waits for the cluster to finish what it asked (a pod to go, a Job
# to be stopped) before it answers "retry"; a retry resumes from where this one stopped.
SETTLE_TIMEOUT_S = 60.0
POLL_S = 0.2
# How long an elastic restart waits for its deleted pods to be gone before it goes on (a
# pod on an unreachable node stays terminating until the node returns).
DELETED_PODS_WAIT_S = 30.0
# How long a pod of a gang whose pinned run lost a pod must have found no node, while the
# others run, before the upkeep stops the gang to give it its own placement back
# (gang_stranded): a failed node's pods are evicted only after its taints' five minutes,
# so by then the node has been gone a while; the wait is for the scheduler, whose
# preemption on the pinned nodes may still make room.
GANG_STRANDED_S = 60.0
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"

T = TypeVar("T")


class ObjectGone(ConnectorError):
    """404: the object (or its kind) does not exist; callers that delete treat it as done."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=False)


class Unprocessable(ConnectorError):
    """422: the API server refused the request's content (a JSON patch's ``test`` failed)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=False)


class Conflict(ConnectorError):
    """409: the object changed since it was read (or a precondition failed); read again."""

    def __init__(self, message: str) -> None:
        super().__init__(message, retryable=True)


def call(verb: str, resource: str, send: Callable[[], T]) -> T:
    """``send()``, with the API server's refusals turned into :class:`ConnectorError`.

    ``verb`` and ``resource`` (``"patch"``, ``"deployments/scale web in ns-a"``) name the
    request in every message, so a 403 says which RBAC rule is missing.
    """
    what = f"{verb} {resource}"
    try:
        return send()
    except ApiException as error:
        raise api_error(error, what) from error
    except (TransportError, OSError) as error:
        raise ConnectorError(f"{what}: API server unreachable: {error}", retryable=True) from error


def api_error(error: ApiException, what: str) -> ConnectorError:
    status = int(error.status or 0)
    message = f"{what}: {status} {_reason(error)}"
    if status == 404:
        return ObjectGone(message)
    if status == 409:
        return Conflict(message)
    if status == 422:
        return Unprocessable(message)
    if status == 403:
        return ConnectorError(
            f"{message} (the connector's RBAC does not allow it)", retryable=False
        )
    # 429: throttled, or a disruption budget; 5xx and no status at all: the server or the way to it.
    retryable = status in (0, 408, 429) or status >= 500
    return ConnectorError(message, retryable=retryable)


def _reason(error: ApiException) -> str:
    """The Status message the API server sent, with its causes; else the HTTP reason."""
    try:
        body = json.loads(error.body or "")
    except (TypeError, ValueError):
        return str(error.reason or error.body or "")
    if not isinstance(body, dict):
        return str(error.reason)
    text = str(body.get("message") or error.reason)
    causes = (body.get("details") or {}).get("causes") or []
    extra = [str(c.get("message")) for c in causes if c.get("message")]
    return "; ".join([text, *extra])


def _core(api: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api)


def _batch(api: client.ApiClient) -> client.BatchV1Api:
    return client.BatchV1Api(api)


def wait_until(what: str, done: Callable[[], bool], timeout_s: float) -> None:
    """Poll ``done`` until true; a retryable error when the cluster takes longer."""
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            raise ConnectorError(
                f"timed out after {timeout_s:.0f} s waiting for {what}", retryable=True
            )
        time.sleep(POLL_S)


# -- elastic services -------------------------------------------------------------------


def scale(
    api: client.ApiClient,
    *,
    namespace: str,
    kind: Literal["deployment", "statefulset"],
    name: str,
    replicas: int,
) -> None:
    """Set the replicas of a Deployment or StatefulSet through its ``/scale`` subresource.

    The subresource needs only ``patch`` on ``deployments/scale``/``statefulsets/scale``,
    not on the whole object (so the connector cannot change what the service runs), and is
    what the HorizontalPodAutoscaler uses. Setting the same count again is a no-op.
    """
    if replicas < 0:
        raise ConnectorError(f"replicas must be >= 0, got {replicas}", retryable=False)
    apps = client.AppsV1Api(api)
    body = {"spec": {"replicas": replicas}}
    if kind == "deployment":
        call(
            "patch",
            f"deployments/scale {name} in {namespace}",
            lambda: apps.patch_namespaced_deployment_scale(
                name, namespace, body, _content_type=MERGE_PATCH, _request_timeout=REQUEST_TIMEOUT_S
            ),
        )
    elif kind == "statefulset":
        call(
            "patch",
            f"statefulsets/scale {name} in {namespace}",
            lambda: apps.patch_namespaced_stateful_set_scale(
                name, namespace, body, _content_type=MERGE_PATCH, _request_timeout=REQUEST_TIMEOUT_S
            ),
        )
    else:
        raise ConnectorError(
            f"cannot scale a {kind!r}: only deployment and statefulset", retryable=False
        )


# -- moving a Deployment's replicas off nodes -------------------------------------------

# The ReplicaSet controller, scaling down, deletes the pods with the lowest value of this
# annotation first among running, ready pods (after pods not placed yet, pending or not
# ready: "Pod deletion cost" in the ReplicaSet docs). The value is an int32; the lowest
# marks the replicas Shaper chose, and tells them from a site's own costs.
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"
MOVE_COST = str(-(2**31))


def resize_deployment_off(
    api: client.ApiClient,
    *,
    namespace: str,
    deployment: str,
    replicas: int,
    leave: Mapping[str, int],
    timeout_s: float = SETTLE_TIMEOUT_S,
) -> None:
    """Shrink a Deployment to ``replicas``, taking ``leave[node]`` replicas off each named
    node: mark that many of its running pods there with the lowest deletion cost, scale it
    through ``/scale`` (:func:`scale`), and wait until the ReplicaSet is deleting the
    marked pods (:func:`_wait_left`; a retryable error after ``timeout_s``, and a retry
    waits on). Not until they are gone: a pod stops within its grace period, which an
    inference server may set to minutes to drain its requests, and the confirm that
    follows (``args.gpus_at_most``) waits for their GPUs, reading the pods still stopping.

    Refused for good (non-retryable) before anything changes when :func:`_mark_leaving`
    says so, and the marks an earlier delivery of the step left are taken off then; its
    "not yet" (a replica that stays still starting) is waited out up to ``timeout_s``
    (:func:`_mark_when_settled`); after the scale, if the ReplicaSet kept a marked pod all
    the same (its mark is then taken off). A Deployment already at ``replicas`` (a resent
    step) only has the pods still marked on the named nodes waited on (a mark elsewhere, an
    earlier move's, is taken off); with none, it is left as it is. Needs ``patch pods``
    within the admission policy of deploy/kubernetes/components/pod-placement."""
    where = ", ".join(f"{count} off {node}" for node, count in sorted(leave.items()))
    what = f"resize deployment {deployment} in {namespace} to {replicas} ({where})"
    if replicas < 0 or any(count < 1 for count in leave.values()):
        raise ConnectorError(f"cannot {what}: counts must be positive", retryable=False)
    current = _read_deployment(api, namespace=namespace, name=deployment)
    desired = 1 if current.spec.replicas is None else int(current.spec.replicas)
    pods = deployment_pods(api, current)
    own = template_cost(current)
    if desired == replicas:
        marked = [pod for pod in pods if _marked(pod)]
        here = [pod for pod in marked if pod_node(pod) in leave]
        _unmark(api, namespace, [pod for pod in marked if pod not in here and pod_active(pod)], own)
        _wait_left(api, current, here, replicas=replicas, what=what, timeout_s=timeout_s)
        return
    chosen = _mark_when_settled(
        api,
        current,
        pods,
        leave,
        desired=desired,
        replicas=replicas,
        what=what,
        own=own,
        timeout_s=timeout_s,
    )
    try:
        scale(api, namespace=namespace, kind="deployment", name=deployment, replicas=replicas)
    except ConnectorError as error:
        if not error.retryable:
            _unmark(api, namespace, chosen, own)
        raise
    _wait_left(api, current, chosen, replicas=replicas, what=what, timeout_s=timeout_s)


def _mark_when_settled(
    api: client.ApiClient,
    current: client.V1Deployment,
    pods: list[dict[str, Any]],
    leave: Mapping[str, int],
    *,
    desired: int,
    replicas: int,
    what: str,
    own: str | None,
    timeout_s: float,
) -> list[dict[str, Any]]:
    """:func:`_mark_leaving`, asked again while it answers "not yet" — a replica that stays
    is still starting (not placed, pending, not ready) and the ReplicaSet would delete it
    before the chosen one — until ``timeout_s``: the saga asks a step again only a few
    times, seconds apart, and a model server warming up takes longer. Refused for good,
    the marks an earlier delivery of the step left come off."""
    namespace = current.metadata.namespace
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return _mark_leaving(
                api, namespace, pods, leave, desired=desired, replicas=replicas, what=what, own=own
            )
        except ConnectorError as error:
            if not error.retryable:
                _unmark(api, namespace, [pod for pod in pods if _marked(pod)], own)
                raise
            if time.monotonic() > deadline:
                raise
        time.sleep(POLL_S)
        pods = deployment_pods(api, current)


def _mark_leaving(
    api: client.ApiClient,
    namespace: str,
    pods: list[dict[str, Any]],
    leave: Mapping[str, int],
    *,
    desired: int,
    replicas: int,
    what: str,
    own: str | None,
) -> list[dict[str, Any]]:
    """Mark the pods that leave (:func:`pick_leaving`; an earlier step's marks on others
    taken off); the pods marked. Non-retryable, before any change, when the shrink removes
    fewer replicas than ``leave`` takes off, when a rollout runs (the Deployment's pods are
    of several ReplicaSets, which a scale shrinks in proportion) or when a named node holds
    fewer of its replicas; retryable ("not yet") when pods the ReplicaSet deletes first
    (not placed, pending, not ready) would go instead (:func:`leaving_blocker`): they may
    be running and ready at the next try. A shrink that removes more than ``leave`` (the
    Deployment asks for replicas the control plane did not see running) is let through
    when the extra are pods not running and ready (the ReplicaSet takes those first, then
    the marked ones); refused for good when it would reach running ones the plan keeps."""
    moving = sum(leave.values())
    if desired - replicas < moving:
        raise ConnectorError(
            f"cannot {what}: it has {desired} replica(s), and a scale to {replicas} "
            f"removes {desired - replicas}, fewer than the {moving} to move",
            retryable=False,
        )
    staying = [pod for pod in pods if pod_active(pod)]
    replica_sets = sorted({_replica_set(pod) for pod in staying})
    if len(replica_sets) > 1:
        raise ConnectorError(
            f"cannot {what}: a rollout is under way (its pods are of ReplicaSets "
            f"{', '.join(replica_sets)}, which a scale shrinks in proportion)",
            retryable=False,
        )
    chosen = pick_leaving(staying, leave, what=what)
    blocker = leaving_blocker(staying, chosen, replicas=replicas)
    if blocker:
        raise ConnectorError(f"not yet: {what}: {blocker}", retryable=True)
    unsettled = sum(1 for pod in staying if pod not in chosen and not _settled(pod))
    if len(staying) - replicas - len(chosen) > unsettled:
        raise ConnectorError(
            f"cannot {what}: it runs {len(staying)} replica(s), more than the plan saw; a "
            f"scale to {replicas} would also remove running replicas the plan keeps",
            retryable=False,
        )
    chosen_names = {_name(pod) for pod in chosen}
    _unmark(
        api, namespace, [p for p in staying if _marked(p) and _name(p) not in chosen_names], own
    )
    return [
        pod if _marked(pod) else _set_cost(api, namespace, _name(pod), MOVE_COST) for pod in chosen
    ]


def _read_deployment(api: client.ApiClient, *, namespace: str, name: str) -> client.V1Deployment:
    apps = client.AppsV1Api(api)
    found: client.V1Deployment = call(
        "get",
        f"deployments {name} in {namespace}",
        lambda: apps.read_namespaced_deployment(
            name, namespace, _request_timeout=REQUEST_TIMEOUT_S
        ),
    )
    return found


def deployment_pods(api: client.ApiClient, current: client.V1Deployment) -> list[dict[str, Any]]:
    """The Deployment's pods as the API server has them now (its selector's pods whose
    ReplicaSet is the Deployment's: connectors.kubernetes.pods.owner_of), as dicts; those
    that ended left out."""
    namespace, name = current.metadata.namespace, current.metadata.name
    found = call(
        "list",
        f"pods of deployment {name} in {namespace}",
        lambda: _core(api).list_namespaced_pod(
            namespace,
            label_selector=label_selector(api.sanitize_for_serialization(current.spec.selector)),
            _request_timeout=REQUEST_TIMEOUT_S,
        ),
    )
    ours = OwnerRef("Deployment", namespace, name)
    pods = [api.sanitize_for_serialization(pod) for pod in found.items]
    return [pod for pod in pods if owner_of(pod) == ours and pod_live(pod)]


def label_selector(selector: Mapping[str, Any] | None) -> str:
    """A LabelSelector as the ``labelSelector`` query parameter spells it."""
    selector = selector or {}
    terms = [f"{key}={value}" for key, value in sorted((selector.get("matchLabels") or {}).items())]
    for expression in selector.get("matchExpressions") or []:
        key, operator = expression["key"], expression["operator"]
        values = ",".join(expression.get("values") or [])
        terms.append(
            {
                "In": f"{key} in ({values})",
                "NotIn": f"{key} notin ({values})",
                "Exists": key,
                "DoesNotExist": f"!{key}",
            }[operator]
        )
    return ",".join(terms)


def pick_leaving(
    pods: list[dict[str, Any]], leave: Mapping[str, int], *, what: str
) -> list[dict[str, Any]]:
    """``leave[node]`` of the active pods on each named node: those an earlier delivery of
    the step marked first, then pods not ready (the ReplicaSet would take them first
    anyway), then by name. Non-retryable when a node holds fewer."""
    chosen: list[dict[str, Any]] = []
    for node, count in sorted(leave.items()):
        there = sorted(
            (pod for pod in pods if pod_node(pod) == node),
            key=lambda pod: (not _marked(pod), _ready(pod), _name(pod)),
        )
        if len(there) < count:
            raise ConnectorError(
                f"cannot {what}: node {node} runs {len(there)} of its replicas, not {count}",
                retryable=False,
            )
        chosen.extend(there[:count])
    return chosen


def leaving_blocker(
    pods: list[dict[str, Any]], chosen: list[dict[str, Any]], *, replicas: int
) -> str | None:
    """Why the ReplicaSet would not delete ``chosen`` on a scale to ``replicas``: of the
    ``len(pods) - replicas`` it deletes, it takes pods not placed yet, pending or not
    ready before any running, ready one, whatever its deletion cost. None: it deletes the
    chosen ones."""
    chosen_names = {_name(pod) for pod in chosen}
    first = [pod for pod in pods if _name(pod) not in chosen_names and not _settled(pod)]
    deleted = len(pods) - replicas
    if len(first) + len(chosen) <= deleted:
        return None
    return (
        f"{len(first)} of its replicas not running and ready ({', '.join(map(_name, first))}) "
        f"would be removed before the {len(chosen)} chosen, of {deleted} removed"
    )


def _wait_left(
    api: client.ApiClient,
    current: client.V1Deployment,
    leaving: list[dict[str, Any]],
    *,
    replicas: int,
    what: str,
    timeout_s: float,
) -> None:
    """Until none of the pods ``leaving`` is active: each gone, or deleted and stopping
    (it holds its GPUs until it has stopped, which the confirm step waits for: waiting
    here for a grace period of minutes failed the step after its retries).
    Non-retryable once the Deployment is down to ``replicas`` active pods with one of them
    among those (the ReplicaSet deleted others: their marks are taken off); retryable
    after ``timeout_s``."""
    uids = {pod["metadata"]["uid"] for pod in leaving}
    namespace = current.metadata.namespace

    def gone() -> bool:
        pods = deployment_pods(api, current)
        kept = [pod for pod in pods if pod["metadata"]["uid"] in uids and pod_active(pod)]
        if not kept:
            return True
        active = [pod for pod in pods if pod_active(pod)]
        if len(active) <= replicas:
            _unmark(api, namespace, kept, template_cost(current))
            raise ConnectorError(
                f"cannot {what}: the ReplicaSet removed other replicas and kept "
                f"{', '.join(f'{_name(pod)} on {pod_node(pod)}' for pod in kept)} "
                "(it removes replicas not placed, pending or not ready first)",
                retryable=False,
            )
        return False

    wait_until(f"the replicas moved off to be deleted ({what})", gone, timeout_s)


def _unmark(
    api: client.ApiClient, namespace: str, pods: list[dict[str, Any]], own: str | None
) -> None:
    """Take the move's mark off those of ``pods`` (as last read) that carry it and stay
    (else any later scale-down deletes them first): back to ``own``, the deletion cost the
    Deployment's pod template gives its pods (:func:`template_cost`; none: the annotation
    taken off). A pod gone meanwhile needs none. (An update that changes nothing is not one
    the admission policy lets through.)"""
    for pod in pods:
        if not _marked(pod):
            continue
        try:
            _set_cost(api, namespace, _name(pod), own)
        except ObjectGone:
            continue


def template_cost(deployment: client.V1Deployment) -> str | None:
    """The pod-deletion-cost a Deployment's pod template gives its pods, which a pod the
    move marked gets back; None without one, or with the move's own (nothing of the site's
    to give back). A cost a site's own controller set on one pod is not kept: the admission
    policy lets the connector change no other annotation, so there is nowhere to keep it."""
    metadata = deployment.spec.template.metadata if deployment.spec.template else None
    cost = ((metadata.annotations if metadata else None) or {}).get(DELETION_COST)
    return None if cost in (None, MOVE_COST) else str(cost)


def _set_cost(api: client.ApiClient, namespace: str, pod: str, cost: str | None) -> dict[str, Any]:
    """Set (None: take off) a pod's deletion cost, and nothing else of it: the one change
    to a pod the admission policy lets the connector make besides lifting its gate. The
    pod as patched."""
    body = {"metadata": {"annotations": {DELETION_COST: cost}}}
    patched = call(
        "patch",
        f"pods {pod} in {namespace}",
        lambda: _core(api).patch_namespaced_pod(
            pod, namespace, body, _content_type=MERGE_PATCH, _request_timeout=REQUEST_TIMEOUT_S
        ),
    )
    found: dict[str, Any] = api.sanitize_for_serialization(patched)
    return found


def _name(pod: Mapping[str, Any]) -> str:
    return str(pod["metadata"]["name"])


def _replica_set(pod: Mapping[str, Any]) -> str:
    refs = pod["metadata"].get("ownerReferences") or []
    return next((str(ref["name"]) for ref in refs if ref.get("controller")), "")


def _marked(pod: Mapping[str, Any]) -> bool:
    return (pod["metadata"].get("annotations") or {}).get(DELETION_COST) == MOVE_COST


def pod_active(pod: Mapping[str, Any]) -> bool:
    """Counted by its owner (a ReplicaSet, a Job): not ended, not being deleted."""
    return pod_live(pod) and not pod["metadata"].get("deletionTimestamp")


def _ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _settled(pod: Mapping[str, Any]) -> bool:
    """Placed, running and ready: a pod the ReplicaSet ranks by its deletion cost."""
    running = (pod.get("status") or {}).get("phase") == "Running"
    return bool(pod_node(pod)) and running and _ready(pod)


# -- pods and nodes ---------------------------------------------------------------------


def evict(api: client.ApiClient, *, namespace: str, pod: str, uid: str | None = None) -> None:
    """Evict a pod through the Eviction API (policy/v1), which honours PodDisruptionBudgets.

    A budget that would be violated answers 429: a retryable :class:`ConnectorError` with
    the API server's reason (the budget and how many pods it needs), since it passes once
    another replica is Ready. A pod already gone is success. ``uid`` makes a retry safe
    for controllers that reuse names (StatefulSet): a pod of the same name but another uid
    is a new incarnation and is left alone.
    """
    core = _core(api)
    options = client.V1DeleteOptions(preconditions=client.V1Preconditions(uid=uid)) if uid else None
    eviction = client.V1Eviction(
        metadata=client.V1ObjectMeta(name=pod, namespace=namespace), delete_options=options
    )
    try:
        call(
            "create",
            f"pods/eviction {pod} in {namespace}",
            lambda: core.create_namespaced_pod_eviction(
                pod, namespace, eviction, _request_timeout=REQUEST_TIMEOUT_S
            ),
        )
    except ObjectGone:
        return
    except Conflict:
        # The uid precondition failed: the pod we meant has gone and another took its name.
        if uid:
            return
        raise


def delete_pod(api: client.ApiClient, *, namespace: str, pod: str) -> None:
    """Delete a pod (cancel of a bare pod) with its own grace period; gone already is done."""
    core = _core(api)
    try:
        call(
            "delete",
            f"pods {pod} in {namespace}",
            lambda: core.delete_namespaced_pod(pod, namespace, _request_timeout=REQUEST_TIMEOUT_S),
        )
    except ObjectGone:
        return


def cordon(api: client.ApiClient, *, node: str) -> None:
    """Mark a node unschedulable (``kubectl cordon``); pods on it keep running."""
    _set_unschedulable(api, node=node, unschedulable=True)


def uncordon(api: client.ApiClient, *, node: str) -> None:
    """Let the scheduler place pods on a node again (``kubectl uncordon``)."""
    _set_unschedulable(api, node=node, unschedulable=None)


def _set_unschedulable(api: client.ApiClient, *, node: str, unschedulable: bool | None) -> None:
    core = _core(api)
    # null removes the field, as kubectl uncordon leaves a node: false is its default.
    body = {"spec": {"unschedulable": unschedulable}}
    call(
        "patch",
        f"nodes {node}",
        lambda: core.patch_node(
            node, body, _content_type=MERGE_PATCH, _request_timeout=REQUEST_TIMEOUT_S
        ),
    )


# -- pinning ----------------------------------------------------------------------------


@dataclass(frozen=True)
class PodOnNode:
    """A pod of the work being checkpointed, and where it runs (what the node agent needs)."""

    namespace: str
    pod: str
    node: str
    uid: str


# -- Jobs (batch/v1) --------------------------------------------------------------------


def read_job(api: client.ApiClient, *, namespace: str, job: str) -> client.V1Job:
    """The Job as the API server has it now (errors as :func:`call` says)."""
    batch = _batch(api)
    found: client.V1Job = call(
        "get",
        f"jobs {job} in {namespace}",
        lambda: batch.read_namespaced_job(job, namespace, _request_timeout=REQUEST_TIMEOUT_S),
    )
    return found


def read_job_json(api: client.ApiClient, *, namespace: str, job: str) -> dict[str, Any]:
    """The Job as the API server sent it (JSON): every field, also those newer than this
    client's models, which a typed read drops — what a JSON patch's ``test`` compares."""
    batch = _batch(api)
    response = call(
        "get",
        f"jobs {job} in {namespace}",
        lambda: batch.read_namespaced_job(
            job, namespace, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S
        ),
    )
    found: dict[str, Any] = json.loads(response.data)
    return found


def _patch_job(
    api: client.ApiClient,
    *,
    namespace: str,
    job: str,
    body: dict[str, Any] | list[dict[str, Any]],
    content_type: str = MERGE_PATCH,
) -> client.V1Job:
    """A merge patch of a Job; with ``JSON_PATCH`` a list of RFC 6902 operations, whose
    ``test`` operations make it all or nothing."""
    batch = _batch(api)
    return call(
        "patch",
        f"jobs {job} in {namespace}",
        lambda: batch.patch_namespaced_job(
            job, namespace, body, _content_type=content_type, _request_timeout=REQUEST_TIMEOUT_S
        ),
    )


def _take_over_lift(api: client.ApiClient, current: client.V1Job) -> None:
    """A step acting on a Job that a lift of a stale pin left suspended halfway
    (lift_stale_pin) takes it over: the mark goes, so the next upkeep does not let run a
    Job this step holds."""
    if LIFTING_PIN in (current.metadata.annotations or {}):
        body: dict[str, Any] = {"metadata": {"annotations": {LIFTING_PIN: None}}}
        _patch_job(api, namespace=current.metadata.namespace, job=current.metadata.name, body=body)


def _refuse_if_kueue(current: client.V1Job, what: str) -> None:
    queue = (current.metadata.labels or {}).get(QUEUE_LABEL)
    if queue:
        raise ConnectorError(
            f"cannot {what}: Kueue manages it (LocalQueue {queue}) and undoes any change to "
            "spec.suspend of an admitted Job, restarting its pods; deactivate its Workload "
            "instead (connectors.kueue.actions)",
            retryable=False,
        )


def suspend_job(api: client.ApiClient, *, namespace: str, job: str) -> None:
    """Suspend a Job (``spec.suspend``): the Job controller deletes its active pods and
    creates none until it is resumed. For plain Kubernetes; a Job Kueue manages is refused
    (measured with Kueue v0.17: it unsuspends the Job at once, and the pods restart)."""
    current = read_job(api, namespace=namespace, job=job)
    _refuse_if_kueue(current, f"suspend job {job} in {namespace}")
    _take_over_lift(api, current)
    if current.spec.suspend:
        return
    _patch_job(api, namespace=namespace, job=job, body={"spec": {"suspend": True}})


def resume_job(api: client.ApiClient, *, namespace: str, job: str) -> None:
    """Let a suspended Job create its pods again (``spec.suspend: false``); see suspend_job."""
    current = read_job(api, namespace=namespace, job=job)
    _refuse_if_kueue(current, f"resume job {job} in {namespace}")
    _take_over_lift(api, current)
    if not current.spec.suspend:
        return
    _patch_job(api, namespace=namespace, job=job, body={"spec": {"suspend": False}})


def restart_job(
    api: client.ApiClient,
    *,
    namespace: str,
    job: str,
    step_key: str | None,
    hold: bool = False,
    timeout_s: float = SETTLE_TIMEOUT_S,
) -> None:
    """Restart a Job from scratch, the restart a plan asks for under a policy that allows
    it: suspend (its pods go), wait until none is active, then resume unless ``hold`` (it
    then stays suspended until a start lets it run).

    ``step_key``, the saga step's idempotency key, is written on the Job
    (``shaper.io/stopped-by-step``) in the patch that suspends it. A resend of the step
    that finds its own key does not stop the Job again: it only finishes what is left
    (waits for the pods to go, resumes unless ``hold``), and a Job that runs again since
    is left alone — without this a step resent after its answer was lost would throw away
    the work done since the first restart. Without a key every call restarts."""
    what = f"restart job {job} in {namespace}"
    current = read_job(api, namespace=namespace, job=job)
    _refuse_if_kueue(current, what)
    _take_over_lift(api, current)
    annotations = current.metadata.annotations or {}
    stamped = step_key is not None and annotations.get(STOPPED_BY_STEP) == step_key
    if stamped and not current.spec.suspend:
        return
    if not stamped:
        body: dict[str, Any] = {"spec": {"suspend": True}}
        if step_key is not None:
            body["metadata"] = {"annotations": {STOPPED_BY_STEP: step_key}}
        _patch_job(api, namespace=namespace, job=job, body=body)
    _wait_stopped(api, namespace=namespace, job=job, timeout_s=timeout_s)
    if not hold:
        _patch_job(api, namespace=namespace, job=job, body={"spec": {"suspend": False}})


def delete_job(api: client.ApiClient, *, namespace: str, job: str) -> None:
    """Delete a Job and, in the background, its pods (cancel); a Job already gone is done."""
    batch = _batch(api)
    try:
        call(
            "delete",
            f"jobs {job} in {namespace}",
            lambda: batch.delete_namespaced_job(
                job, namespace, propagation_policy="Background", _request_timeout=REQUEST_TIMEOUT_S
            ),
        )
    except ObjectGone:
        return


# -- elastic training: Indexed Jobs whose size changes --------------------------------------


def elastic_job_size(current: client.V1Job) -> int | None:
    """The size of an elastic Indexed Job as the client read it
    (connectors.kubernetes.pods.elastic_size); None for any other Job."""
    spec = current.spec
    return elastic_size(
        {
            "completionMode": spec.completion_mode,
            "completions": spec.completions,
            "parallelism": spec.parallelism,
        }
    )


def indexed_size(current: client.V1Job, what: str) -> int:
    """:func:`elastic_job_size`; any other Job is refused: Kubernetes lets only those
    change their completions."""
    size = elastic_job_size(current)
    if size is None:
        raise ConnectorError(
            f"cannot {what}: not an Indexed Job whose completions equal its parallelism, "
            "the only Jobs Kubernetes lets change size",
            retryable=False,
        )
    return size


def job_pods(api: client.ApiClient, current: client.V1Job) -> list[client.V1Pod]:
    """A Job's pods as the API server has them now, ended ones too."""
    namespace = current.metadata.namespace
    found = call(
        "list",
        f"pods of job {current.metadata.name} in {namespace}",
        lambda: _core(api).list_namespaced_pod(
            namespace,
            label_selector=f"{JOB_UID_LABEL}={current.metadata.uid}",
            _request_timeout=REQUEST_TIMEOUT_S,
        ),
    )
    return list(found.items)


def live_job_pods(api: client.ApiClient, current: client.V1Job) -> list[client.V1Pod]:
    """A Job's pods as the API server has them now, less those that ended or are being
    deleted (on their way out)."""
    return [
        pod
        for pod in job_pods(api, current)
        if not pod.metadata.deletion_timestamp
        and (pod.status.phase if pod.status else None) not in ("Succeeded", "Failed")
    ]


def indexed_pods(api: client.ApiClient, current: client.V1Job) -> dict[int, tuple[str, int]]:
    """The live pods of an Indexed Job bound to a node (:func:`live_job_pods`): index →
    (node, GPUs)."""
    placed: dict[int, tuple[str, int]] = {}
    for pod in live_job_pods(api, current):
        index = (pod.metadata.annotations or {}).get(COMPLETION_INDEX)
        if index is None or not index.isdigit():
            continue
        if pod.spec.node_name:
            placed[int(index)] = (pod.spec.node_name, pod_gpus(api.sanitize_for_serialization(pod)))
    return placed


def shrink_indexed_job(api: client.ApiClient, *, namespace: str, job: str, replicas: int) -> None:
    """Shrink a running elastic Indexed Job in place to ``replicas`` pods: completions =
    parallelism = ``replicas``. The Job controller deletes the pods of indexes
    ``replicas`` and up and leaves the others running (the job's elastic runtime goes on
    with fewer). Idempotent; growing is :func:`restart_indexed_job`'s."""
    what = f"shrink job {job} in {namespace} to {replicas} pod(s)"
    current = read_job(api, namespace=namespace, job=job)
    _refuse_if_kueue(current, what)
    size = indexed_size(current, what)
    if size == replicas:
        return
    if not 1 <= replicas < size:
        raise ConnectorError(f"cannot {what}: it runs {size}", retryable=False)
    _patch_job(
        api,
        namespace=namespace,
        job=job,
        body={"spec": {"completions": replicas, "parallelism": replicas}},
    )


def restart_indexed_job(
    api: client.ApiClient,
    *,
    namespace: str,
    job: str,
    replicas: int,
    nodes: list[str],
    step_key: str | None,
    pods_on: Mapping[str, int] | None = None,
    timeout_s: float = SETTLE_TIMEOUT_S,
) -> None:
    """Run an elastic Indexed Job at ``replicas`` pods on ``nodes``: suspend it (its pods
    go; the patch stamps ``step_key`` on it, as :func:`restart_job`'s does), wait until no
    pod is active (and, for a while, until those being deleted are gone: they hold GPUs
    the new pods are planned onto), set completions = parallelism = ``replicas`` and pin
    the template to ``nodes``, resume. Its new pods resume from the job's own checkpoint:
    an elastic training job keeps one (its runtime restarts on membership changes anyway),
    and the plan counts a restart's cost. So a running Job must be checkpointable (the
    contract of any Job Shaper stops: :func:`template_blocker`), and the pointer an
    earlier move left on its template is taken off (its pods have run on since that
    checkpoint). A held (suspended) Job is sized, pinned and let run with the pointer it
    carries: a plan's start at a size. A resend that finds its stamp on a Job running
    again leaves it; one that finds it still suspended finishes. If sizing or pinning is
    refused, a Job this step suspended is let run again before the error is raised.

    ``pods_on`` (the plan's GPUs on each node; None: the node set only) places each pod on
    its own node (connectors.kubernetes.pod_placement): the template is gated and the Job
    carries each index's node; the caller then lets its pods go
    (connectors.kubernetes.pod_gates). None takes an earlier restart's gate and map off."""
    what = f"restart job {job} in {namespace} at {replicas} pod(s) on {','.join(nodes)}"
    current = read_job(api, namespace=namespace, job=job)
    _refuse_if_kueue(current, what)
    stamped = (
        step_key is not None
        and (current.metadata.annotations or {}).get(STOPPED_BY_STEP) == step_key
    )
    running = not current.spec.suspend
    if not (running or stamped):  # a held Job keeps its pointer (below)
        _refuse_away_from_images(api, current, nodes=nodes, resume_from=None, what=what)
    _take_over_lift(api, current)
    indexed_size(current, what)
    if not nodes or replicas < 1:
        raise ConnectorError(f"cannot {what}: no node or no pod", retryable=False)
    if stamped and running:
        return  # an earlier delivery of this step restarted it
    if running:
        blocker = template_blocker(api, current.spec.template)
        if blocker:
            raise ConnectorError(f"cannot {what}: {blocker}", retryable=False)
    if running or (step_key is not None and not stamped):
        body: dict[str, Any] = {"spec": {"suspend": True}}
        body["metadata"] = {"annotations": {STOPPED_BY_STEP: step_key}}  # None takes one off
        _patch_job(api, namespace=namespace, job=job, body=body)
    # Suspended by this step, now or by an earlier delivery: it ran since its last pointer.
    ours = running or stamped
    stopped = _wait_stopped(api, namespace=namespace, job=job, timeout_s=timeout_s)
    _wait_deleted_pods(
        api, namespace=namespace, job=job, timeout_s=min(timeout_s, DELETED_PODS_WAIT_S)
    )
    if ours:
        # First, on its own: should the sizing below be refused, the Job let run again must
        # not resume from that old checkpoint either.
        _drop_pointer(api, namespace=namespace, job=job)
    template_spec = api.sanitize_for_serialization(current.spec.template.spec)
    affinity = pinned_affinity(template_spec.get("affinity"), nodes)
    placement = pod_placement.pod_nodes(replicas, pods_on, pod_spec_gpus(template_spec))
    sized = {
        "metadata": {
            "annotations": {
                POD_NODES_ANNOTATION: pod_placement.encode(placement) if placement else None,
                PIN_ANNOTATION: _pin_stamp(stopped, template_spec, nodes),
            }
        },
        "spec": {
            "completions": replicas,
            "parallelism": replicas,
            "template": {
                "spec": {
                    "affinity": affinity,
                    "schedulingGates": pod_placement.template_gates(
                        template_spec, gated=placement is not None
                    ),
                }
            },
        },
    }
    try:
        _patch_job(api, namespace=namespace, job=job, body=sized)
    except ConnectorError as error:
        if error.retryable or not ours:
            raise
        raise _let_run_again(api, namespace=namespace, job=job, error=error) from error
    _patch_job(api, namespace=namespace, job=job, body={"spec": {"suspend": False}})


def _drop_pointer(api: client.ApiClient, *, namespace: str, job: str) -> None:
    """Take the resume pointer and the restore webhook's label off a Job's template."""
    stale = {"annotations": {RESUME_FROM: None}, "labels": {RESTORE_LABEL: None}}
    _patch_job(api, namespace=namespace, job=job, body={"spec": {"template": {"metadata": stale}}})


def _let_run_again(
    api: client.ApiClient, *, namespace: str, job: str, error: ConnectorError
) -> ConnectorError:
    """Resume a Job a step suspended before it failed for good (nothing else would ever
    let it run again; the saga's compensation is an agent step); the error to raise, which
    says whether that worked."""
    try:
        _patch_job(api, namespace=namespace, job=job, body={"spec": {"suspend": False}})
    except ConnectorError as undo:
        return ConnectorError(
            f"{error}; and the Job this step suspended could not be let run again "
            f"({undo}): it stays suspended until resumed",
            retryable=False,
        )
    return ConnectorError(
        f"{error} (the Job this step suspended was let run again)", retryable=False
    )


def _wait_deleted_pods(
    api: client.ApiClient, *, namespace: str, job: str, timeout_s: float
) -> None:
    """Until a stopped Job's pods being deleted are gone (``status.terminating``), for at
    most ``timeout_s``, then on regardless: a pod on an unreachable node stays terminating
    until the node returns, and one with a long grace period may outlast the step; the
    new pods then wait for their GPUs."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not read_job(api, namespace=namespace, job=job).status.terminating:
            return
        time.sleep(POLL_S)


def template_blocker(api: client.ApiClient, template: client.V1PodTemplateSpec) -> str | None:
    """:func:`connectors.kubernetes.pods.resume_blocker` of a pod template the client read."""
    return resume_blocker(api.sanitize_for_serialization(template))


def _refuse_away_from_images(
    api: client.ApiClient,
    current: client.V1Job,
    *,
    nodes: list[str] | None,
    resume_from: str | None,
    what: str,
) -> None:
    """Refused for good, before anything changes: a malformed checkpoint-image pointer
    given, or a pin to ``nodes`` other than the node holding the checkpoint images the pods
    would resume from — the pointer given, else (``None``: the template's is kept, a plan's
    start of a held Job) the template's, read as the telemetry reads it
    (pins.images_node) — where the restore webhook holds every pod: pinned elsewhere
    too, they would wait for good."""
    if resume_from is None:
        held = images_node(api.sanitize_for_serialization(current.spec.template))
    else:
        try:
            restore = image_restore(resume_from)
        except Refused as refused:
            raise ConnectorError(f"cannot {what}: {refused}", retryable=False) from None
        held = restore.node if restore is not None else None
    if held is not None and nodes is not None and nodes != [held]:
        raise ConnectorError(
            f"cannot {what}: its checkpoint images are on node {held} only", retryable=False
        )


def recreate_job_pinned(
    api: client.ApiClient,
    *,
    namespace: str,
    job: str,
    nodes: list[str] | None,
    resume_from: str | None,
    allow_restart: bool = False,
    timeout_s: float = SETTLE_TIMEOUT_S,
) -> None:
    """Move a Job's pods to ``nodes``: suspend → wait until no pod is active → pin the pod
    template (required node affinity on ``kubernetes.io/hostname``) and set its annotation
    ``shaper.io/resume-from`` → resume.

    Kubernetes lets a suspended Job's scheduling directives and template metadata change
    once no pod is active (MutableSchedulingDirectivesForSuspendedJobs, on by default since
    1.36) — the way Kueue places the Jobs it admits. The containers cannot change, so the
    pods read the pointer from the annotation through the Downward API (module docstring).
    ``nodes=None`` keeps the template's placement (a restart where the scheduler chooses).
    ``resume_from=None`` keeps the pointer the Job already carries (a plan's start of a held
    Job: ``start(nodes)`` on plain Kubernetes). A running Job whose pods could not resume is
    refused unless ``allow_restart``; a suspended one without pods has nothing to lose.
    Idempotent: a Job already pinned there with that pointer and running is left alone
    (unless its template carries an elastic restart's placement gate: the move takes it
    off, which stops and restarts the Job); a retry after a timeout continues (a
    suspended Job is not suspended again).
    """
    where = f" to {','.join(nodes)}" if nodes else ""
    what = f"move job {job} in {namespace}{where}"
    current = read_job(api, namespace=namespace, job=job)
    _refuse_if_kueue(current, what)
    _refuse_away_from_images(api, current, nodes=nodes, resume_from=resume_from, what=what)
    _take_over_lift(api, current)
    template = current.spec.template
    if not current.spec.suspend and _prepared_as_asked(
        api, template, nodes=nodes, resume_from=resume_from
    ):
        return
    _stop_for_resume(
        api,
        current,
        nodes=nodes,
        resume_from=resume_from,
        allow_restart=allow_restart,
        timeout_s=timeout_s,
        what=what,
    )
    _patch_job(api, namespace=namespace, job=job, body={"spec": {"suspend": False}})


def suspend_job_to_resume(
    api: client.ApiClient,
    *,
    namespace: str,
    job: str,
    resume_from: str | None,
    nodes: list[str] | None = None,
    allow_restart: bool = False,
    timeout_s: float = SETTLE_TIMEOUT_S,
) -> None:
    """Suspend a Job so that its pods resume from ``resume_from`` (and run on ``nodes``,
    when given) once it is resumed: :func:`recreate_job_pinned` without the final resume.
    The Job stays suspended until :func:`resume_job` (or a ``recreate_job_pinned``) lets it
    run; this is how a checkpointed Job is held. ``resume_from=None`` keeps the pointer the
    template carries. A running Job whose pods could not resume is refused unless
    ``allow_restart``. Idempotent; retryable while its pods take longer than ``timeout_s``
    to go."""
    where = f" on {','.join(nodes)}" if nodes else ""
    what = f"suspend job {job} in {namespace} to resume{where}"
    current = read_job(api, namespace=namespace, job=job)
    _refuse_if_kueue(current, what)
    _refuse_away_from_images(api, current, nodes=nodes, resume_from=resume_from, what=what)
    _take_over_lift(api, current)
    _stop_for_resume(
        api,
        current,
        nodes=nodes,
        resume_from=resume_from,
        allow_restart=allow_restart,
        timeout_s=timeout_s,
        what=what,
    )


def _prepared_as_asked(
    api: client.ApiClient,
    template: client.V1PodTemplateSpec,
    *,
    nodes: list[str] | None,
    resume_from: str | None,
) -> bool:
    annotations = (template.metadata.annotations if template.metadata else None) or {}
    affinity = api.sanitize_for_serialization(template.spec.affinity)
    pinned = nodes is None or tuple(affinity_nodes(affinity)) == node_set(nodes)
    gated = any(
        g.name == pod_placement.PLACEMENT_GATE for g in template.spec.scheduling_gates or []
    )
    return pinned and not gated and resume_from in (None, annotations.get(RESUME_FROM))


def _pin_stamp(stopped: client.V1Job, template_spec: Mapping[str, Any], nodes: list[str]) -> str:
    """The stamp of a pin to ``nodes`` about to be written on a stopped Job whose template's
    pod spec is ``template_spec`` (connectors.kubernetes.pins: it lasts one run). Its
    count takes the pods that failed and are not counted yet as counted. Not the pods still
    terminating: those the suspension deleted are never counted as failed (measured), and
    taking them would leave a failure of the pinned run uncounted. (A pod someone else
    deleted just before, counted after the stamp, makes the pin stale early: not handled.)"""
    status = stopped.status
    uncounted = status.uncounted_terminated_pods
    failed = (status.failed or 0) + len((uncounted.failed if uncounted else None) or [])
    return new_pin(
        annotations=stopped.metadata.annotations,
        template_spec=template_spec,
        failed=failed,
        nodes=nodes,
    ).encode()


def _stop_for_resume(
    api: client.ApiClient,
    current: client.V1Job,
    *,
    nodes: list[str] | None,
    resume_from: str | None,
    allow_restart: bool,
    timeout_s: float,
    what: str,
) -> None:
    """Suspend → wait until no pod is active → pin the template and set its pointer.

    A non-retryable error after this call suspended the Job itself (a template patch the
    API server refuses, the Job deleted meanwhile) lets the Job run again before it is
    raised: the step failed, and nothing else would ever unsuspend the Job (the saga's
    compensation is an agent step). Its new pods then start from the pointer the template
    already carried, or from scratch. A Job that was suspended already, by an earlier
    attempt of the step whose wait timed out or by anyone else, is left suspended: this
    call cannot tell that it suspended it."""
    namespace, job = current.metadata.namespace, current.metadata.name
    template = current.spec.template
    # A suspended Job with no pod left loses nothing by moving (a plan's start of a held Job).
    running = not current.spec.suspend or bool(current.status.active)
    blocker = template_blocker(api, template) if running else None
    if blocker and not allow_restart:
        raise ConnectorError(
            f"cannot {what}: {blocker}, and no policy allows a restart", retryable=False
        )
    suspended_here = False
    if not current.spec.suspend:
        # A restart's stamp from an earlier step goes with this stop (null removes it in a
        # merge patch): a late resend of that restart must not take this stop for its own.
        body = {"metadata": {"annotations": {STOPPED_BY_STEP: None}}, "spec": {"suspend": True}}
        _patch_job(api, namespace=namespace, job=job, body=body)
        suspended_here = True
    try:
        _prepare_stopped(
            api,
            template,
            namespace=namespace,
            job=job,
            nodes=nodes,
            resume_from=resume_from,
            timeout_s=timeout_s,
        )
    except ConnectorError as error:
        if not suspended_here or error.retryable:
            raise
        raise _let_run_again(api, namespace=namespace, job=job, error=error) from error


def _prepare_stopped(
    api: client.ApiClient,
    template: client.V1PodTemplateSpec,
    *,
    namespace: str,
    job: str,
    nodes: list[str] | None,
    resume_from: str | None,
    timeout_s: float,
) -> None:
    """Wait until a suspended Job has no pod left, then pin its template and set its
    pointer. The pod placement an elastic restart left (connectors.kubernetes.pod_placement)
    comes off: a move places the Job by its node set."""
    stopped = _wait_stopped(api, namespace=namespace, job=job, timeout_s=timeout_s)
    template_spec = api.sanitize_for_serialization(template.spec)
    stamp = _pin_stamp(stopped, template_spec, nodes) if nodes is not None else None
    if _prepared_as_asked(api, template, nodes=nodes, resume_from=resume_from):
        if stamp is not None and (stopped.metadata.annotations or {}).get(PIN_ANNOTATION) != stamp:
            # Pinned there already, by a pin whose run is over: this pin is for the next.
            fresh: dict[str, Any] = {"metadata": {"annotations": {PIN_ANNOTATION: stamp}}}
            _patch_job(api, namespace=namespace, job=job, body=fresh)
        return
    prepared: dict[str, Any] = {"spec": {}}
    body: dict[str, Any] = {"spec": {"template": prepared}, "metadata": {"annotations": {}}}
    if pod_placement.has_gate(template_spec):
        prepared["spec"]["schedulingGates"] = pod_placement.template_gates(
            template_spec, gated=False
        )
        body["metadata"]["annotations"][POD_NODES_ANNOTATION] = None
    if nodes is not None:
        prepared["spec"]["affinity"] = pinned_affinity(template_spec.get("affinity"), nodes)
        body["metadata"]["annotations"][PIN_ANNOTATION] = stamp
    if resume_from is not None:
        # A checkpoint image's pointer also labels the pods for the restore webhook
        # (connectors.kubernetes.restore_webhook); any other takes that label off.
        restore = RESTORE_BY_IMAGE if image_restore(resume_from) else None
        prepared["metadata"] = {
            "annotations": {RESUME_FROM: resume_from},
            "labels": {RESTORE_LABEL: restore},
        }
    _patch_job(api, namespace=namespace, job=job, body=body)


def _wait_stopped(
    api: client.ApiClient, *, namespace: str, job: str, timeout_s: float
) -> client.V1Job:
    """Until a suspended Job is stopped (:func:`job_stopped`); a retryable error after
    ``timeout_s``. The Job as last read, stopped."""
    last: list[client.V1Job] = []

    def stopped() -> bool:
        last[:] = [read_job(api, namespace=namespace, job=job)]
        return job_stopped(api.sanitize_for_serialization(last[0]))

    wait_until(f"job {job} in {namespace} to stop its pods", stopped, timeout_s)
    return last[0]


def job_stopped(job: Mapping[str, Any]) -> bool:
    """Whether a suspended Job (JSON) is stopped: its controller says so (condition
    Suspended) and no pod is active — the API server's own test before a suspended Job's
    template may change."""
    status = job.get("status") or {}
    suspended = any(
        c.get("type") == "Suspended" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )
    return suspended and not status.get("active")


# -- a pin lasts one run (connectors.kubernetes.pins) -----------------------------------


def _token(key: str) -> str:
    """A map key as one JSON Pointer token (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


def annotation_path(key: str) -> str:
    """The JSON Pointer of an object's annotation ``key``."""
    return "/metadata/annotations/" + _token(key)


def _pointer_removal(job: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The JSON patch that takes the resume pointer off a Job's template (``job``: JSON,
    as read; it tests the pointer is still that), with the restore webhook's label."""
    template_meta = job["spec"]["template"]["metadata"]
    pointer_path = "/spec/template" + annotation_path(RESUME_FROM)
    ops: list[dict[str, Any]] = [
        {"op": "test", "path": pointer_path, "value": template_meta["annotations"][RESUME_FROM]},
        {"op": "remove", "path": pointer_path},
    ]
    if RESTORE_LABEL in (template_meta.get("labels") or {}):
        ops.append(
            {"op": "remove", "path": "/spec/template/metadata/labels/" + _token(RESTORE_LABEL)}
        )
    return ops


def mark_pin_started(api: client.ApiClient, *, namespace: str, job: str, stamp: str) -> bool:
    """Record on a Job's pin stamp ``stamp`` that its run began (a pod of it was seen on a
    pinned node): from then on the pin is stale (connectors.kubernetes.pins). False, and
    nothing written, when the Job carries another stamp by now or is gone."""
    pin = read_pin({PIN_ANNOTATION: stamp})
    if pin is None or pin.started:
        return False
    path = annotation_path(PIN_ANNOTATION)
    ops = [
        {"op": "test", "path": path, "value": stamp},
        {"op": "replace", "path": path, "value": replace(pin, started=True).encode()},
    ]
    try:
        _patch_job(api, namespace=namespace, job=job, body=ops, content_type=JSON_PATCH)
    except (Unprocessable, ObjectGone):
        return False  # the test failed (another stamp: a new pin, a lift), or gone
    return True


def pods_stranded(pods: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a Job's pods (as JSON) wait where they cannot be placed: none of its live
    pods is on a node and the scheduler found no node for one (``PodScheduled`` False,
    ``Unschedulable``). A Job between a failed pod and its replacement has no live pod and
    is not stranded: its next pod may be placed."""
    live = [p for p in pods if pod_active(p)]
    return (
        bool(live)
        and not any(pod_node(p) for p in live)
        and any(_unschedulable_since(p) is not None for p in live)
    )


def gang_stranded(
    job: Mapping[str, Any],
    pods: Sequence[Mapping[str, Any]],
    pin: Pin,
    *,
    for_s: float = GANG_STRANDED_S,
    now: datetime | None = None,
) -> bool:
    """Whether a Job's pinned run is a gang left part-stranded (``job``, its ``pods`` as
    JSON, ended ones too): the run lost a pod (:func:`run_lost_a_pod`), some of its live
    pods are on nodes, and a replacement made since the run began has found no node for
    ``for_s`` seconds (``Unschedulable`` since, and no node nominated for it by a
    preemption). A first pod of the run that waits for a node a plan is still freeing is
    not a lost one's replacement: that pin stays however long it takes, even once another
    pod failed."""
    live = [p for p in pods if pod_active(p)]
    if not any(pod_node(p) for p in live) or not run_lost_a_pod(job, pods, pin):
        return False
    began = parse_time((job.get("status") or {}).get("startTime"))
    cutoff = (now or datetime.now(UTC)) - timedelta(seconds=for_s)
    return began is not None and any(
        _replacement(p, began)
        and (since := _unschedulable_since(p)) is not None
        and since <= cutoff
        and not (p.get("status") or {}).get("nominatedNodeName")
        for p in live
        if not pod_node(p)
    )


def _replacement(pod: Mapping[str, Any], began: datetime) -> bool:
    """Whether a pod was made after its Job's run began (``began``: ``status.startTime``):
    the replacement of one the run lost, not one of the run's first pods, which may wait
    for a node a plan is freeing. The Job controller makes the first pods in the sync that
    stamps ``startTime`` (what this rests on; measured in the tests' runs): a first pod it
    could not make then (a quota still counting the pods being deleted, a webhook's
    timeout, a gang of more than one sync's 500 pods) counts as a replacement. Times are
    whole seconds: a replacement made in the run's first second is not told apart (left
    pinned)."""
    created = _created(pod)
    return created is not None and created > began


def _created(pod: Mapping[str, Any]) -> datetime | None:
    return parse_time((pod.get("metadata") or {}).get("creationTimestamp"))


def run_lost_a_pod(job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], pin: Pin) -> bool:
    """Whether the run ``pin`` is for lost a pod: the Job's failed count passed the stamp's
    (a pod failed or was deleted since the pin), or a pod of this run ended Failed (one a
    ``podFailurePolicy`` ignores is not counted). A pod of this run is one created since
    the Job last began to run (``status.startTime``, which Kubernetes resets when a Job is
    resumed; the pin was written while the Job was stopped: measured on Kubernetes 1.37).
    Its times are whole seconds, so a pod of the run before that ended Failed, uncounted,
    and was made in the second the Job ran again counts as this run's. ``job``, ``pods``:
    JSON, the Job's pods ended ones too."""
    status = job.get("status") or {}
    failed = status.get("failed") or 0
    if isinstance(failed, int) and failed > pin.failed:
        return True
    began = parse_time(status.get("startTime"))
    return began is not None and any(
        (pod.get("status") or {}).get("phase") == "Failed"
        and (created := _created(pod)) is not None
        and created >= began
        for pod in pods
    )


def _unschedulable_since(pod: Mapping[str, Any]) -> datetime | None:
    """When the scheduler last found no node for a pod (``PodScheduled`` False,
    ``Unschedulable``; a condition with no time counts as now); None if it has not."""
    for c in (pod.get("status") or {}).get("conditions") or []:
        if (
            c.get("type") == "PodScheduled"
            and c.get("status") == "False"
            and c.get("reason") == "Unschedulable"
        ):
            return parse_time(c.get("lastTransitionTime")) or datetime.now(UTC)
    return None


def lift_stale_pin(
    api: client.ApiClient,
    *,
    namespace: str,
    job: str,
    timeout_s: float = SETTLE_TIMEOUT_S,
    gang_stranded_s: float = GANG_STRANDED_S,
    now: datetime | None = None,
    known_nodes: Collection[str] | None = None,
) -> str | None:
    """Give a Job whose pin of Shaper's is stale (its run is over: connectors.kubernetes.pins) and
    whose pods cannot be placed its own placement back: suspend it (the annotation
    ``shaper.io/lifting-pin`` says why) → wait until no pod is active → restore the template's
    affinity and take the stamp off, in one JSON patch that tests both are still as read (an
    operator's edit since is kept) → let it run again, taking the annotation off. Its pods were
    only pending (nothing is lost), or it is a gang whose pinned run lost a pod that has found
    no node for ``gang_stranded_s`` while the others run (:func:`gang_stranded`; ``now``: the
    time to judge it at, by default the clock's), which cannot go on as it is: its running pods
    are stopped too, only where that loses no work (:func:`gang_blocker`: an elastic training
    job, whose pods resume from its own checkpoint; once they are stopped, the pointer a move
    left on its template, older than the work done since, comes off on its own, whatever becomes
    of the pin, as an elastic restart's does). Or its template resumes from checkpoint images on
    a node no longer in the cluster (:func:`lost_images_node`, given ``known_nodes``, and the
    API server's 404 for the node), so its pods, held there by Shaper's pin or by the restore
    webhook, wait for good: the pointer and the restore label come off, and the pin if there is
    one; a Job held (suspended) with such a pointer, whose start a plan would otherwise make
    onto that node alone, loses them without being let run (:func:`_forget_lost_images`).
    A line saying what was done, or None when the Job is left (no stale pin, held with no
    such pointer, managed by Kueue or another controller, its pods placed or about to be, a
    gang whose stop would lose work, the images' node still there by the API server's word).
    A Job found suspended with the annotation (the connector stopped halfway) is finished the
    same way (the annotation's value says whether running pods were stopped); one whose
    template changed since is let run as it is. Idempotent; the caller holds the connector's
    pins lock, so no step of a plan acts on the Job meanwhile."""
    found = read_job_json(api, namespace=namespace, job=job)
    annotations = found["metadata"].get("annotations") or {}
    suspended = bool(found["spec"].get("suspend"))
    lifting = annotations.get(LIFTING_PIN)
    pin = read_pin(annotations)
    if lifting is not None and not suspended:  # let run by someone else meanwhile
        dropped: dict[str, Any] = {"metadata": {"annotations": {LIFTING_PIN: None}}}
        _patch_job(api, namespace=namespace, job=job, body=dropped)
        return None
    if lifting is None and suspended:
        return _forget_lost_images(api, found, known_nodes=known_nodes)
    if lifting is None:
        if pin is None and lost_images_node(found, known_nodes) is None:
            return None  # nothing to lift (judge_lift): no need to list its pods
        current = read_job(api, namespace=namespace, job=job)
        pods = [api.sanitize_for_serialization(p) for p in job_pods(api, current)]
        lifting = judge_lift(
            found, pods, known_nodes=known_nodes, gang_stranded_s=gang_stranded_s, now=now
        ).mark
        if lifting is None:
            return None
        if lifting.startswith(IMAGES_LOST) and node_exists(api, lifting.removeprefix(IMAGES_LOST)):
            # The cache said the node left; the API server must say so too (404) before a
            # Job's only checkpoint is let go.
            return None
        stop: dict[str, Any] = {
            "metadata": {"annotations": {LIFTING_PIN: lifting}},
            "spec": {"suspend": True},
        }
        _patch_job(api, namespace=namespace, job=job, body=stop)
    _wait_stopped(api, namespace=namespace, job=job, timeout_s=timeout_s)
    gang = lifting.startswith(GANG_STOPPED)
    images = lifting.startswith(IMAGES_LOST)
    if gang or images:
        # First, on its own: whatever becomes of the pin, the gang's pods must not resume
        # from the move's checkpoint, older than the work they did since; nor any pod
        # from images that went with their node.
        _drop_pointer(api, namespace=namespace, job=job)
    stopped_json = read_job_json(api, namespace=namespace, job=job)
    pin = read_pin(stopped_json["metadata"].get("annotations"))
    done = "let run again as it is"
    template_spec = stopped_json["spec"]["template"]["spec"]
    # A Job suspended with its pointer alone (no pin of Shaper's: the restore webhook held
    # its pods to the images' node by their label, gone now) has no pin to lift.
    lost_node = lifting.removeprefix(IMAGES_LOST) if images else None
    held_there = pin is not None and lost_node in pin.nodes and pin.in_force(template_spec)
    if pin is not None and (pin.stale(stopped_json) or held_there):
        try:
            ops = _lift_ops(stopped_json, pin)
            _patch_job(api, namespace=namespace, job=job, body=ops, content_type=JSON_PATCH)
        except ConnectorError as error:
            if error.retryable:
                raise  # still suspended, with the annotation: the next upkeep goes on
            done = f"left pinned ({error})"
        else:
            own = pinned_nodes(pin.restored_spec(template_spec))
            done = f"given back its own placement ({','.join(own) or 'any node'})"
    if gang:
        done += "; its pods resume from its own checkpoint"
    resumed: dict[str, Any] = {
        "metadata": {"annotations": {LIFTING_PIN: None}},
        "spec": {"suspend": False},
    }
    _patch_job(api, namespace=namespace, job=job, body=resumed)
    if images:
        done = done if held_there else "let run again, its placement as it is"
        return (
            f"job {job} in {namespace}: the checkpoint images it was to resume from went with "
            f"node {lost_node}, no longer in the cluster; its pods start from their own "
            f"checkpoint or afresh, {done}"
        )
    nodes = ",".join(pin.nodes) if pin else "?"
    outlived = f"job {job} in {namespace}: Shaper's pin to {nodes} outlived its run"
    return f"{outlived}; {lifting}, {done}" if gang else f"{outlived}; {done}"


def _forget_lost_images(
    api: client.ApiClient, found: Mapping[str, Any], *, known_nodes: Collection[str] | None
) -> str | None:
    """A held (suspended) Job to resume from checkpoint images on a node no longer in the
    cluster (:func:`judge_lift`; the API server's 404 for the node): the pointer and the
    restore label come off its template, and Shaper's pin to that node if it holds it there,
    in one JSON patch that tests the pointer and the pin are still as read. It stays
    suspended (whoever held it lets it run: a plan's start, now to any node, is no longer
    refused) and its pods then start from their own checkpoint or afresh. A line, or None
    when there is nothing to do."""
    mark = judge_lift(found, [], known_nodes=known_nodes).mark
    if mark is None or not job_stopped(found):
        return None  # its pods still go: the API server keeps its template until then
    node = mark.removeprefix(IMAGES_LOST)
    if node_exists(api, node):
        return None  # the cache lags: a Job's only checkpoint is never let go on its word
    metadata, template = found["metadata"], found["spec"]["template"]
    ops = _pointer_removal(found)
    pin = read_pin(metadata.get("annotations"))
    done = "its placement as it is"
    if pin is not None and node in pin.nodes and pin.in_force(template["spec"]):
        ops.extend(_lift_ops(found, pin))
        own = pinned_nodes(pin.restored_spec(template["spec"]))
        done = f"Shaper's pin lifted, its own placement back ({','.join(own) or 'any node'})"
    namespace, job = metadata.get("namespace") or "default", metadata["name"]
    _patch_job(api, namespace=namespace, job=job, body=ops, content_type=JSON_PATCH)
    return (
        f"job {job} in {namespace}: the checkpoint images it is held to resume from went with "
        f"node {node}, no longer in the cluster; it stays held, {done}, and its pods will "
        "start from their own checkpoint or afresh"
    )


@dataclass(frozen=True)
class Judged:
    """What the upkeep is to do about one Job's placement (:func:`judge_lift`)."""

    # The lift to make, as ``shaper.io/lifting-pin`` will say it: "true" (only pending
    # pods stop), GANG_STOPPED… or IMAGES_LOST…; None: none.
    mark: str | None = None
    # Why a part-stranded gang is left pinned (gang_blocker); None when it is not one.
    blocked: str | None = None


def judge_lift(
    job: Mapping[str, Any],
    pods: Sequence[Mapping[str, Any]],
    *,
    known_nodes: Collection[str] | None,
    gang_stranded_s: float = GANG_STRANDED_S,
    now: datetime | None = None,
) -> Judged:
    """Whether Shaper's hold on a Job's placement is to be lifted, and how (``job`` and its
    ``pods`` as JSON, ended ones too): the rules of :func:`lift_stale_pin`, which the
    connector's upkeep applies to its caches and the lift again to what the API server
    says. Nothing for a Job that is Kueue's or another controller's. Checkpoint images on a
    node the list ``known_nodes`` lacks (a pin to them is never stale: Pin.stale), once its
    pods cannot be placed — at once for a held (suspended) Job, the only judgement made of
    one: its pointer is to go, the Job to stay held (:func:`lift_stale_pin`); a stale pin
    whose pods cannot be placed; a gang stranded on a stale pin, where stopping it loses no
    work (else ``blocked``)."""
    spec = job.get("spec") or {}
    if ((job.get("metadata") or {}).get("labels") or {}).get(QUEUE_LABEL) or spec.get(
        "managedBy", JOB_CONTROLLER
    ) != JOB_CONTROLLER:
        return Judged()  # Kueue or another controller owns its spec.suspend
    lost = lost_images_node(job, known_nodes)
    if spec.get("suspend"):
        # Held: only a pointer to images gone with their node is to go (it stays held).
        return Judged(None if lost is None else f"{IMAGES_LOST}{lost}")
    if lost is not None:
        return Judged(f"{IMAGES_LOST}{lost}" if pods_stranded(pods) else None)
    pin = read_pin((job.get("metadata") or {}).get("annotations"))
    if pin is None or not pin.stale(job):
        return Judged()
    if pods_stranded(pods):
        return Judged("true")
    if not gang_stranded(job, pods, pin, for_s=gang_stranded_s, now=now):
        return Judged()
    blocker = gang_blocker(job, pods)
    if blocker is not None:
        return Judged(blocked=blocker)
    running = sum(1 for p in pods if pod_active(p) and pod_node(p))
    return Judged(f"{GANG_STOPPED}{running} running pod(s) of its gang, which lost a pod")


# The start of ``shaper.io/lifting-pin``'s value when a lift takes off a pin to checkpoint
# images whose node left the cluster (lost_images_node); the node follows.
IMAGES_LOST = "images lost with node "


def lost_images_node(job: Mapping[str, Any], known_nodes: Collection[str] | None) -> str | None:
    """The node holding the checkpoint images a Job's template resumes from
    (connectors.kubernetes.restore_webhook), when that node is no longer in the cluster:
    the images went with it, so a pin to it can never be met (``job``: JSON;
    ``known_nodes``: the name of every node; None or empty when not known, and then
    nothing is judged). None otherwise. A node that is down but still there may come back
    with its images: its pin stays."""
    if not known_nodes:
        return None
    node = images_node((job.get("spec") or {}).get("template") or {})
    return node if node is not None and node not in known_nodes else None


def node_exists(api: client.ApiClient, name: str) -> bool:
    """Whether the API server has node ``name`` (a 404 says it has not; other errors
    raise)."""
    try:
        call(
            "get",
            f"node {name}",
            lambda: _core(api).read_node(name, _request_timeout=REQUEST_TIMEOUT_S),
        )
    except ObjectGone:
        return False
    return True


# The start of ``shaper.io/lifting-pin``'s value when a lift stopped a gang's running pods.
GANG_STOPPED = "stopped "


def gang_blocker(job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> str | None:
    """Why stopping the running pods of a part-stranded gang (``job`` and its ``pods``,
    JSON) would lose their work; None when it would not: an elastic training job as the
    telemetry reports one (:func:`connectors.kubernetes.pods.training_range`: Shaper
    restarts it at other sizes too), whose pods resume from its own checkpoint — its
    runtime restarts them on any change of members anyway — and can resume
    (:func:`connectors.kubernetes.pods.resume_blocker`). Any other Job's pods resume from
    the pointer its template carries, which the move that pinned it left, older than the
    work they did since: only a step that checkpoints first would stop them safely, and
    Shaper moves no gang on Kubernetes yet (app.actions.schedulers)."""
    metadata = job.get("metadata") or {}
    owner = OwnerRef("Job", metadata.get("namespace") or "default", metadata.get("name") or "")
    group = JobGroup(owner=owner, obj=dict(job), pods=sorted((dict(p) for p in pods), key=_name))
    blocker = resume_blocker((job.get("spec") or {}).get("template") or {})
    if blocker is not None:
        return blocker
    if training_range(group, group.meta("annotations")) is None:
        return (
            "its pods would resume from the checkpoint of the move that pinned it, older than "
            "the work they did since (only an elastic training job resumes from its own)"
        )
    return None


def _lift_ops(job: Mapping[str, Any], pin: Pin) -> list[dict[str, Any]]:
    """The JSON patch that restores a stopped Job's own affinity (and takes an elastic
    restart's pod placement off: a move's does the same) and its stamp off, testing first
    that both are as read."""
    spec = job["spec"]["template"]["spec"]
    annotations = job["metadata"].get("annotations") or {}
    affinity_path = "/spec/template/spec/affinity"
    ops: list[dict[str, Any]] = [
        {
            "op": "test",
            "path": annotation_path(PIN_ANNOTATION),
            "value": annotations[PIN_ANNOTATION],
        },
        {"op": "test", "path": affinity_path, "value": spec.get("affinity")},
        {"op": "remove", "path": annotation_path(PIN_ANNOTATION)},
        {"op": "remove", "path": affinity_path}
        if pin.affinity is None
        else {"op": "replace", "path": affinity_path, "value": pin.affinity},
    ]
    if pod_placement.has_gate(spec):
        gates = pod_placement.template_gates(spec, gated=False)
        ops.append({"op": "replace", "path": "/spec/template/spec/schedulingGates", "value": gates})
        if POD_NODES_ANNOTATION in annotations:
            ops.append({"op": "remove", "path": annotation_path(POD_NODES_ANNOTATION)})
    return ops
