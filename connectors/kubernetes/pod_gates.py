"""Letting the pods of a placed elastic Job go, each to its node
(connectors.kubernetes.pod_placement says what to write; this module writes it).

Three things keep a pod from waiting on the gate for ever or the right to lift it from
being more than that:

* **Before gating**, :func:`may_patch_pods` asks the API server (a
  SelfSubjectAccessReview, which any authenticated user may make) whether the connector
  may patch pods in the Job's namespace; if not, the restart pins by node set only.
* **The guard**: the right to patch pods is only safe with the admission policy of
  deploy/kubernetes/components/pod-placement holding it to lifting the gate. Before it
  first gates, the connector checks that the policy holds *this* connector (a site that
  renamed its ServiceAccount would leave the policy matching nobody): :func:`check_guard`,
  a server-side dry run of a change the policy refuses (a label) on a pod of the
  namespace. Held, it is taken as held for the life of the process; missing (the change
  accepted), the connector logs an error and gates nothing until it restarts; with no
  pod to try it on, it gates nothing this time.
* **Lifting never waits on the flag**: the connector's upkeep lets go any pod carrying
  the gate in the namespaces it watches, ``pod_placement`` on or off, so turning it off
  strands nothing.
"""

from __future__ import annotations

import logging
import re
import time
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError as TransportError

from connectors.base import ConnectorError
from connectors.kubernetes import pod_placement
from connectors.kubernetes.actions import (
    POLL_S,
    REQUEST_TIMEOUT_S,
    ObjectGone,
    api_error,
    call,
    live_job_pods,
    read_job,
)
from connectors.kubernetes.pod_placement import POD_NODES_ANNOTATION
from connectors.kubernetes.pods import pinned_nodes

logger = logging.getLogger(__name__)

JSON_PATCH = "application/json-patch+json"
POLICY = "shaper-pod-placement"
# The label the guard's dry run tries to add: a change the policy refuses.
PROBE_LABEL = "shaper.io/placement-guard-probe"
_REFUSED_BY_POLICY = re.compile(r"ValidatingAdmissionPolicy '[^']*" + POLICY + "'")


class Guard(Enum):
    """What the dry run found: the policy refuses the connector's other changes to a pod
    (held), accepts them (missing), or the answer said neither (unknown: asked again)."""

    held = "held"
    missing = "missing"
    unknown = "unknown"


@dataclass
class Ungated:
    """What one :func:`ungate_pods` call found and did."""

    let_go: list[str] = field(default_factory=list)  # "namespace/pod → node"
    waiting: int = 0  # pods still behind the gate after the call
    pods: int = 0  # the Job's live pods not being deleted


def may_patch_pods(api: client.ApiClient, namespace: str) -> bool:
    """Whether the API server lets this connector patch pods in ``namespace``."""
    review = client.V1SelfSubjectAccessReview(
        spec=client.V1SelfSubjectAccessReviewSpec(
            resource_attributes=client.V1ResourceAttributes(
                namespace=namespace, verb="patch", resource="pods"
            )
        )
    )
    answer = call(
        "create",
        "selfsubjectaccessreviews",
        lambda: client.AuthorizationV1Api(api).create_self_subject_access_review(
            review, _request_timeout=REQUEST_TIMEOUT_S
        ),
    )
    return bool(answer.status and answer.status.allowed)


def ungate_pods(
    api: client.ApiClient, current: client.V1Job, *, usable_nodes: set[str] | None = None
) -> Ungated:
    """Let the pods of a Job that wait on the placement gate be scheduled, each on the
    node the Job's annotation gives its index — when that node is still among those the
    template is pinned to and, given ``usable_nodes``, among those (a node gone or
    cordoned since: wherever the template allows instead). A pod gone or changed since
    it was read is read again once, then left for the next call."""
    placement = pod_placement.decode((current.metadata.annotations or {}).get(POD_NODES_ANNOTATION))
    pinned = pinned_nodes(api.sanitize_for_serialization(current.spec.template.spec))
    namespace = current.metadata.namespace
    found = Ungated()
    for item in live_job_pods(api, current):
        found.pods += 1
        pod = api.sanitize_for_serialization(item)
        if not pod_placement.has_gate(pod.get("spec") or {}):
            continue
        node = pod_placement.planned_node(pod, placement, pinned)
        if node is not None and usable_nodes is not None and node not in usable_nodes:
            node = None
        if _lift(api, namespace, pod, node):
            found.let_go.append(f"{namespace}/{item.metadata.name} → {node or 'its nodes'}")
        else:
            found.waiting += 1
    return found


def let_pods_go(
    api: client.ApiClient,
    *,
    namespace: str,
    job: str,
    replicas: int,
    timeout_s: float,
) -> None:
    """:func:`ungate_pods` until the Job has its ``replicas`` pods and none waits on the
    gate (whoever lifted it: the upkeep may lift some first), for at most ``timeout_s``
    (the Job controller creates pods in batches); any it creates later, the connector's
    upkeep lets go."""
    deadline = time.monotonic() + timeout_s
    while True:
        once = ungate_pods(api, read_job(api, namespace=namespace, job=job))
        if (once.pods >= replicas and once.waiting == 0) or time.monotonic() >= deadline:
            return
        time.sleep(POLL_S)


def _lift(api: client.ApiClient, namespace: str, pod: dict[str, Any], node: str | None) -> bool:
    """Patch one pod: the gate off, its node named. False when it could not be done now
    (gone, changed twice since read, or refused as invalid: logged); a refusal (403)
    raises, saying who refused."""
    name = pod["metadata"]["name"]
    what = f"patch pods {name} in {namespace}"
    for attempt in (1, 2):
        patch = pod_placement.ungate_patch(pod, node)
        if patch is None:
            return False  # someone else lifted it
        try:
            _patch_pod(api, namespace, name, patch)
            return True
        except ApiException as error:
            status = error.status
            failed = api_error(error, what)
        except (TransportError, OSError) as error:
            raise ConnectorError(
                f"{what}: API server unreachable: {error}", retryable=True
            ) from error
        if status == 404:
            return False
        if status in (409, 422) and attempt == 1:
            # Changed since it was read (the patch's test failed): read it again.
            try:
                fresh = call(
                    "get",
                    f"pods {name} in {namespace}",
                    lambda: client.CoreV1Api(api).read_namespaced_pod(
                        name, namespace, _request_timeout=REQUEST_TIMEOUT_S
                    ),
                )
            except ObjectGone:
                return False
            pod = api.sanitize_for_serialization(fresh)
            continue
        if status == 403:
            raise ConnectorError(
                f"{what}: refused ({failed}) — the pod waits on the gate "
                f"{pod_placement.PLACEMENT_GATE} until it is lifted (by the connector once "
                "deploy/kubernetes/components/pod-placement lets it, or by an operator); "
                "this connector gates no more Jobs",
                retryable=False,
            )
        if status in (409, 422):
            logger.warning("%s; again next round", failed)
            return False
        raise failed
    return False


def _patch_pod(
    api: client.ApiClient, namespace: str, name: str, patch: Any, **options: Any
) -> None:
    client.CoreV1Api(api).patch_namespaced_pod(
        name,
        namespace,
        patch,
        _content_type=JSON_PATCH,
        _request_timeout=REQUEST_TIMEOUT_S,
        **options,
    )


def check_guard(api: client.ApiClient, namespace: str) -> Guard:
    """Whether the admission policy holds this connector: a server-side dry run of a label
    added to a pod of ``namespace`` (the policy refuses any change but lifting the gate and
    a ReplicaSet pod's deletion cost). Unknown without a pod to try it on, or on any other
    answer."""
    found = call(
        "list",
        f"pods in {namespace}",
        lambda: client.CoreV1Api(api).list_namespaced_pod(
            namespace, limit=1, _request_timeout=REQUEST_TIMEOUT_S
        ),
    )
    if not found.items:
        return Guard.unknown
    pod = api.sanitize_for_serialization(found.items[0])
    name = pod["metadata"]["name"]
    if (pod["metadata"].get("labels")) is None:
        probe = [{"op": "add", "path": "/metadata/labels", "value": {PROBE_LABEL: "1"}}]
    else:
        path = f"/metadata/labels/{PROBE_LABEL.replace('~', '~0').replace('/', '~1')}"
        probe = [{"op": "add", "path": path, "value": "1"}]
    try:
        _patch_pod(api, namespace, name, probe, dry_run="All")
    except ApiException as error:
        # The admission plugin's words, the policy named (a site's namePrefix kept).
        held = error.status == 403 and _REFUSED_BY_POLICY.search(str(error.body or ""))
        return Guard.held if held else Guard.unknown
    except (TransportError, OSError):
        return Guard.unknown
    logger.error(
        "the admission policy %s does not hold this connector: it could change any pod it "
        "may patch (its ServiceAccount renamed without the policy?); no pod is gated until "
        "the connector restarts",
        POLICY,
    )
    return Guard.missing
