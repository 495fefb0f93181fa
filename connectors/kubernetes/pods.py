"""Pods grouped by their top-level owner → ``JobReport``: the conventions of this connector.

**Which owner.** A pod belongs to the first that applies of:

1. a JobSet — label ``jobset.sigs.k8s.io/jobset-name`` (its pods' Jobs are parts of it);
2. a LeaderWorkerSet — label ``leaderworkerset.sigs.k8s.io/name``;
3. a RayCluster — label ``ray.io/cluster``;
4. its controller (``ownerReferences[controller=true]``): a ReplicaSet whose name is
   ``<deployment>-<pod-template-hash>`` stands for that Deployment; a Job, StatefulSet or
   any other kind stands for itself;
5. else the pod alone (kind ``pod``).

**external_id** is ``<namespace>/<kind>/<name>`` with the kind in lower case
(``ml/job/train-7``, ``serve/deployment/llm``), cut to 255 characters with a digest when
longer; :func:`parse_external_id` reads it back for the actions. Jobs, Deployments and
StatefulSets are also watched themselves, so a Job that has no pods yet (suspended, or
held by Kueue) is reported too, pending, with what its template asks for.

**Shape and size.** Deployments and StatefulSets are elastic services: ``gpus_requested``
per replica (from the pod template), ``replicas`` = ``spec.replicas`` or the pods holding
GPUs now, whichever is more (a rolling update's surge holds GPUs too), and the range from
the owner's annotations ``shaper.io/min-replicas`` / ``shaper.io/max-replicas`` — without
them both are ``spec.replicas``: Shaper does not resize a service nobody declared elastic.
A Deployment declared elastic (either annotation) has ``replicas_movable`` replicas when
the connector's ``pod_placement`` is on (it may then choose which leave a node:
connectors.kubernetes.capabilities ``resize_off``); a StatefulSet's never, nor those of a
Deployment nobody declared elastic (a move shrinks it first).
Everything else is a block job: ``gang_size`` = a Job's parallelism (capped by its
completions) or the pods of the group; ``gpus_requested`` = GPUs per pod × gang size, never
less than what the pods hold. An **elastic training job** is an Indexed Job whose
``completions`` equal its ``parallelism`` (Kubernetes lets the two change together while
it runs: elastic Indexed Jobs, GA in 1.31) and that declares ``shaper.io/max-replicas``
(and ``shaper.io/min-replicas``, default 1) above its floor: a block job with
``min_replicas``/``max_replicas`` (a replica is a pod), asking for the most
(:func:`training_range`; connectors.kubernetes.capabilities resizes it). Not one that
Kueue (or any other controller, ``spec.managedBy``) manages: it owns its size as well as
its suspension; nor one with per-index limits, a success policy, or an index that ended.
A pod's GPUs are its effective ``nvidia.com/gpu`` request (containers and sidecars
summed, init containers' largest if more; limits when no request).

**State.** A Job with condition Complete (or SuccessCriteriaMet) is ``finished``, Failed
(or FailureTarget) ``failed``. Otherwise a group with a live pod bound to a node is
``running`` (it holds those GPUs, even while its containers start). A suspended Job
(``spec.suspend``, Kueue's way of holding one) is ``pending`` with reason ``suspended``;
a pod-only group whose pods all ended is ``finished`` (or ``failed`` if one failed); the
rest is ``pending`` with the scheduler's reason (PodScheduled=False's message).

**Allocations** per node: the GPU requests of the group's live bound pods, only while
running, and only on nodes that are known and not ``down`` (a NotReady node's pods are
lost to the plan until Kubernetes evicts them).

**Submit spec.** A pending or running Job (one whose object is watched) carries the spec
that moves it to another cluster when the context asks for specs
(connectors.kubernetes.submission says what is in it); other owners carry none.

**Fields from labels and annotations** (on the owner object, its pod template or its first
pod, in that order of precedence; "first" is by name, as are a group's pods wherever
their order matters, so that a report depends on the objects and not on the order the
watch delivered them in):

* ``shaper.io/team`` label → team (default: the namespace);
* ``kueue.x-k8s.io/queue-name`` label → queue (default ``default``);
* ``shaper.io/kind`` label → kind (a ``JobKind`` value); default ``training`` for Jobs,
  JobSets and RayClusters, ``realtime_inference`` for Deployments, StatefulSets and
  LeaderWorkerSets, ``other`` for bare pods;
* ``shaper.io/sla-class`` label → sla_class;
* checkpointable: a Job whose pod template (its first pod's, while the Job itself is not
  seen) passes :func:`resume_blocker` — the very test the actions make before they stop
  it (``shaper.io/checkpointable: "true"`` and ``SHAPER_RESUME_FROM`` declared from the
  annotation ``shaper.io/resume-from``), so the solver never plans a move the connector
  refuses; a bare pod is never checkpointable (no step moves one: nothing would recreate
  it, connectors.kubernetes.capabilities); other owners: the annotation
  ``shaper.io/checkpointable: "true"``;
* ``spec.priority`` of the pods (the admission plugin's value of their PriorityClass), or
  the template's ``priorityClassName`` looked up, clamped to 0 … 1,000,000;
* ``nvidia.com/gpu.product`` in the node selector → ``allowed_gpu_models``; a pending
  job pinned to nodes (``kubernetes.io/hostname`` in its node selector or required
  affinity, or ``metadata.name`` match fields) → ``required_nodes``; a pending Job whose
  template resumes from checkpoint images (connectors.kubernetes.restore_webhook) → the
  images' node, where the webhook holds its pods — also when it is suspended and has no
  pod yet, so that no plan starts it elsewhere (the start would be refused);
* the annotations ``shaper.io/cluster-selector`` (``region=eu,site=ams1``) and
  ``shaper.io/allowed-clusters`` (``alpha,beta``) → ``residency`` (wire.residency):
  annotations, not labels, because a label value cannot hold ``=`` or ``,``;
* the annotation ``shaper.io/speeds`` (``H100=2.5,A100-80G=1``: a catalogue name, a GPU
  product label as the nodes carry it, ``NVIDIA-H100-80GB-HBM3``, or a name
  ``gpu_model_aliases`` maps: :func:`speed_model`) → a block job's ``speeds``
  (wire.speeds).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from connectors.base import ConnectorError
from connectors.kubernetes.nodes import (
    GPU_RESOURCE,
    PRODUCT_LABEL,
    PRODUCT_PREFIX,
    gpu_model_name,
    whole,
)
from connectors.kubernetes.pins import HOSTNAME_LABEL as HOSTNAME_LABEL
from connectors.kubernetes.pins import RESUME_FROM as RESUME_FROM
from connectors.kubernetes.pins import images_node, stale_pin_nodes
from connectors.kubernetes.pins import pinned_nodes as pinned_nodes
from wire.residency import read_residency
from wire.speeds import SPEEDS_KEY, read_speeds
from wire.telemetry import (
    MAX_REPLICAS,
    MAX_TIME_LIMIT_S,
    AllocationReport,
    JobKind,
    JobReport,
    JobShape,
    JobState,
    NodeState,
    SubmitSpec,
)

Object = dict[str, Any]

TEAM_LABEL = "shaper.io/team"
KIND_LABEL = "shaper.io/kind"
SLA_LABEL = "shaper.io/sla-class"
# Kueue marks the Jobs it manages with this label; it owns their spec.suspend.
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
# The contract of work that can move (connectors.kubernetes.actions' docstring): the pod
# template says it is checkpointable and reads where to resume from an annotation.
CHECKPOINTABLE_ANNOTATION = "shaper.io/checkpointable"
RESUME_FROM_ENV = "SHAPER_RESUME_FROM"
RESUME_FROM_FIELD = f"metadata.annotations['{RESUME_FROM}']"
# The idempotency key of the saga step that last stopped a Job (Kubernetes) or a Workload
# (Kueue), written in the same patch as the stop: a resent step finds it and does not stop
# the work a second time (connectors.base.SupportsResumePointer).
STOPPED_BY_STEP = "shaper.io/stopped-by-step"
# On a Workload while Shaper holds it inactive (written with every deactivation, taken off
# with the reactivation): one inactive without it was deactivated by Kueue itself (an
# admission check rejected it, its requeuing limit was reached) or by someone else.
DEACTIVATED_BY_SHAPER = "shaper.io/deactivated"
MIN_REPLICAS_ANNOTATION = "shaper.io/min-replicas"
MAX_REPLICAS_ANNOTATION = "shaper.io/max-replicas"
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
LWS_LABEL = "leaderworkerset.sigs.k8s.io/name"
RAY_LABEL = "ray.io/cluster"
MAX_PRIORITY = 1_000_000
MAX_GANG = 10_000

# Lower-case kind in an external id → the Kubernetes kind.
KINDS = {
    kind.lower(): kind
    for kind in (
        "Job",
        "JobSet",
        "Deployment",
        "StatefulSet",
        "LeaderWorkerSet",
        "RayCluster",
        "ReplicaSet",
        "Pod",
    )
}
ELASTIC_KINDS = frozenset({"Deployment", "StatefulSet"})
_DEFAULT_KIND = {
    "Job": JobKind.training,
    "JobSet": JobKind.training,
    "RayCluster": JobKind.training,
    "Deployment": JobKind.realtime_inference,
    "StatefulSet": JobKind.realtime_inference,
    "LeaderWorkerSet": JobKind.realtime_inference,
}
_TERMINAL_PHASES = frozenset({"Succeeded", "Failed"})
_MAX_ID = 255


@dataclass(frozen=True)
class OwnerRef:
    """The top-level object a job stands for."""

    kind: str  # as Kubernetes spells it: "Job", "Deployment" …
    namespace: str
    name: str

    @property
    def external_id(self) -> str:
        external_id = f"{self.namespace}/{self.kind.lower()}/{self.name}"
        if len(external_id) <= _MAX_ID:
            return external_id
        digest = hashlib.sha256(external_id.encode()).hexdigest()[:16]
        return f"{external_id[: _MAX_ID - 17]}+{digest}"


def parse_external_id(external_id: str) -> OwnerRef:
    """The owner an external id names; a non-retryable ConnectorError when it names none."""
    parts = external_id.split("/")
    if len(parts) != 3 or not all(parts):
        raise ConnectorError(
            f"not a Kubernetes job id (namespace/kind/name): {external_id!r}", retryable=False
        )
    namespace, kind, name = parts
    return OwnerRef(KINDS.get(kind, kind), namespace, name)


def owner_of(pod: Mapping[str, Any]) -> OwnerRef:
    metadata = pod.get("metadata") or {}
    namespace = metadata.get("namespace") or "default"
    labels = metadata.get("labels") or {}
    for label, kind in ((JOBSET_LABEL, "JobSet"), (LWS_LABEL, "LeaderWorkerSet")):
        if labels.get(label):
            return OwnerRef(kind, namespace, labels[label])
    if labels.get(RAY_LABEL):
        return OwnerRef("RayCluster", namespace, labels[RAY_LABEL])
    controller = next(
        (ref for ref in metadata.get("ownerReferences") or [] if ref.get("controller")),
        None,
    )
    if controller is None:
        return OwnerRef("Pod", namespace, metadata["name"])
    kind, name = controller.get("kind", "Pod"), controller.get("name", metadata["name"])
    template_hash = labels.get("pod-template-hash")
    if kind == "ReplicaSet" and template_hash and name.endswith(f"-{template_hash}"):
        return OwnerRef("Deployment", namespace, name[: -len(template_hash) - 1])
    return OwnerRef(kind, namespace, name)


# --- pods ------------------------------------------------------------------------------------


def _requested(container: Mapping[str, Any]) -> int:
    resources = container.get("resources") or {}
    for source in ("requests", "limits"):  # a limit alone is also the request
        amounts = resources.get(source) or {}
        if GPU_RESOURCE in amounts:
            return whole(amounts[GPU_RESOURCE])
    return 0


def pod_spec_gpus(spec: Mapping[str, Any]) -> int:
    """The GPUs a pod with this spec asks for (its effective request)."""
    containers = sum(_requested(c) for c in spec.get("containers") or [])
    sidecars = 0
    largest_init = 0
    for init in spec.get("initContainers") or []:
        if init.get("restartPolicy") == "Always":
            sidecars += _requested(init)
        else:
            largest_init = max(largest_init, sidecars + _requested(init))
    return max(containers + sidecars, largest_init)


def pod_gpus(pod: Mapping[str, Any]) -> int:
    return pod_spec_gpus(pod.get("spec") or {})


def pod_live(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") not in _TERMINAL_PHASES


def pod_node(pod: Mapping[str, Any]) -> str | None:
    node = (pod.get("spec") or {}).get("nodeName")
    return str(node) if node else None


def declares_resume_env(template: Mapping[str, Any]) -> bool:
    """Whether every container of a pod template (or pod; the API's JSON form) reads
    ``SHAPER_RESUME_FROM`` from the ``shaper.io/resume-from`` annotation (the Downward API),
    the one way a Job's pods can see a pointer set after the Job was created."""
    containers = (template.get("spec") or {}).get("containers") or []
    for container in containers:
        declared = next(
            (e for e in container.get("env") or [] if e.get("name") == RESUME_FROM_ENV), None
        )
        field_ref = ((declared or {}).get("valueFrom") or {}).get("fieldRef") or {}
        if field_ref.get("fieldPath") != RESUME_FROM_FIELD:
            return False
    return bool(containers)


def resume_blocker(template: Mapping[str, Any]) -> str | None:
    """Why a Job's new pods, made from this pod template (the API's JSON form), would
    restart from scratch rather than resume; None if they would resume: checkpointable, and
    reading the resume pointer. The actions' test before they stop work, and telemetry's
    ``checkpointable``."""
    annotations = (template.get("metadata") or {}).get("annotations") or {}
    if annotations.get(CHECKPOINTABLE_ANNOTATION) != "true":
        return (
            f'its pods are not checkpointable (no {CHECKPOINTABLE_ANNOTATION}: "true" on the '
            "pod template)"
        )
    if not declares_resume_env(template):
        return (
            f"its pod template does not declare env {RESUME_FROM_ENV} from fieldRef "
            f"{RESUME_FROM_FIELD}, so new pods could not resume (a Job's containers cannot "
            "change after creation)"
        )
    return None


def allowed_models(spec: Mapping[str, Any], aliases: Mapping[str, str]) -> list[str]:
    product = (spec.get("nodeSelector") or {}).get(PRODUCT_LABEL)
    return [gpu_model_name(product, None, aliases=aliases)] if product else []


def speed_model(name: str, aliases: Mapping[str, str]) -> str:
    """The catalogue name a ``shaper.io/speeds`` entry means: an alias's, a GPU product
    label's as the nodes' is read (``NVIDIA-H100-80GB-HBM3`` → ``H100``), else the name as
    written (a catalogue name: ``A100-80G`` is no product label, and its family read would
    be the 40 GB one)."""
    if name in aliases or name.upper().startswith(PRODUCT_PREFIX):
        return gpu_model_name(name, None, aliases=aliases)
    return name


def parse_time(value: object) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else None


def _condition(obj: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for condition in (obj.get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind and condition.get("status") == "True":
            return dict(condition)
    return None


def _unschedulable_reason(pods: Iterable[Mapping[str, Any]]) -> str:
    for pod in pods:
        for condition in (pod.get("status") or {}).get("conditions") or []:
            if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
                reason = condition.get("message") or condition.get("reason") or "unschedulable"
                return str(reason)
    return ""


# --- groups ----------------------------------------------------------------------------------


@dataclass
class JobGroup:
    """One job: its owner, the owner's object when watched, and its pods (in name order,
    see :func:`arrange`)."""

    owner: OwnerRef
    obj: Object | None = None
    pods: list[Object] = field(default_factory=list)

    @property
    def external_id(self) -> str:
        return self.owner.external_id

    def template_spec(self) -> Mapping[str, Any]:
        """The pod spec the owner makes pods from, else its first pod's."""
        if self.obj is not None:
            spec = ((self.obj.get("spec") or {}).get("template") or {}).get("spec")
            if spec:
                return dict(spec)
        return (self.pods[0].get("spec") or {}) if self.pods else {}

    def meta(self, which: str) -> Mapping[str, Any]:
        """Labels or annotations (``which``) of the owner object, its pod template and its
        first pod, in that order of precedence."""
        merged: dict[str, Any] = {}
        template = ((self.obj or {}).get("spec") or {}).get("template") or {}
        sources = [self.pods[0] if self.pods else {}, template, self.obj or {}]
        for source in sources:
            merged.update(((source.get("metadata") or {}).get(which)) or {})
        return merged


def group_pods(
    pods: Iterable[Object],
    owners: Mapping[str, Iterable[Object]],
    *,
    namespaces: Iterable[str] = (),
) -> dict[str, JobGroup]:
    """Pods by owner, plus every watched owner object (``owners``: kind → objects) even
    without pods; only the given namespaces when any are."""
    wanted = set(namespaces)
    groups: dict[str, JobGroup] = {}
    for kind, objects in owners.items():
        for obj in objects:
            metadata = obj.get("metadata") or {}
            namespace = metadata.get("namespace") or "default"
            if wanted and namespace not in wanted:
                continue
            owner = OwnerRef(kind, namespace, metadata["name"])
            groups[owner.external_id] = JobGroup(owner, obj)
    for pod in pods:
        owner = owner_of(pod)
        if wanted and owner.namespace not in wanted:
            continue
        group = groups.get(owner.external_id)
        if group is None:
            group = groups[owner.external_id] = JobGroup(owner)
        group.pods.append(pod)
    for group in groups.values():
        arrange(group)
    return groups


def pod_order(pod: Mapping[str, Any]) -> tuple[str, str]:
    metadata = pod.get("metadata") or {}
    return str(metadata.get("name") or ""), str(metadata.get("namespace") or "")


def arrange(group: JobGroup) -> JobGroup:
    """A group's pods in name order, and a group without an owner object owned as its
    first pod says: a report must not depend on the order the watch saw its pods in."""
    group.pods.sort(key=pod_order)
    if group.obj is None and group.pods:
        group.owner = owner_of(group.pods[0])
    return group


@dataclass(frozen=True)
class TranslationContext:
    """What translating a group needs beyond the group itself."""

    node_states: Mapping[str, NodeState]
    priority_classes: Mapping[str, int] = field(default_factory=dict)
    default_priority: int = 0
    gpu_model_aliases: Mapping[str, str] = field(default_factory=dict)
    include_cpu_only: bool = False
    # A pending or running Job's spec for a move to another cluster
    # (connectors.kubernetes.submission); None: the connector reports none.
    submit_spec: Callable[[Mapping[str, Any]], SubmitSpec | None] | None = None
    # Whether the connector can choose which of a Deployment's replicas leave a node (its
    # ``pod_placement``: connectors.kubernetes.capabilities ``resize_off``).
    replica_moves: bool = False


def priorities(priority_classes: Iterable[Mapping[str, Any]]) -> tuple[dict[str, int], int]:
    """PriorityClass name → value, and the value of the global default (0 without one)."""
    values: dict[str, int] = {}
    default = 0
    for priority_class in priority_classes:
        value = int(priority_class.get("value") or 0)
        values[priority_class["metadata"]["name"]] = value
        if priority_class.get("globalDefault"):
            default = value
    return values, default


def _clamp_priority(value: int) -> int:
    return max(0, min(MAX_PRIORITY, value))


def group_priority(group: JobGroup, context: TranslationContext) -> int:
    values = [
        int(p["spec"]["priority"])
        for p in group.pods
        if isinstance((p.get("spec") or {}).get("priority"), int)
    ]
    if values:
        return _clamp_priority(max(values))
    class_name = group.template_spec().get("priorityClassName")
    if class_name:
        return _clamp_priority(context.priority_classes.get(class_name, 0))
    return _clamp_priority(context.default_priority)


def allocations(
    pods: Iterable[Mapping[str, Any]], node_states: Mapping[str, NodeState]
) -> list[AllocationReport]:
    per_node: dict[str, int] = {}
    for pod in pods:
        node = pod_node(pod)
        if node is None or not pod_live(pod):
            continue
        state = node_states.get(node)
        gpus = pod_gpus(pod)
        if state is None or state is NodeState.down or gpus == 0:
            continue
        per_node[node] = per_node.get(node, 0) + gpus
    return [AllocationReport(node=node, gpu_count=n) for node, n in sorted(per_node.items())]


def _int_annotation(annotations: Mapping[str, Any], key: str) -> int | None:
    value = annotations.get(key)
    try:
        return max(0, min(MAX_REPLICAS, int(str(value)))) if value is not None else None
    except ValueError:
        return None


def _job_kind(group: JobGroup) -> JobKind:
    label = group.meta("labels").get(KIND_LABEL)
    try:
        return JobKind(label) if label else _DEFAULT_KIND.get(group.owner.kind, JobKind.other)
    except ValueError:
        return _DEFAULT_KIND.get(group.owner.kind, JobKind.other)


def _gang_size(group: JobGroup, live_pods: list[Object]) -> int:
    if group.owner.kind == "Job" and group.obj is not None:
        spec = group.obj.get("spec") or {}
        parallelism = spec.get("parallelism", 1)
        completions = spec.get("completions")
        size = min(parallelism, completions) if isinstance(completions, int) else parallelism
        return max(1, min(MAX_GANG, int(size or 1)))
    return max(1, min(MAX_GANG, len(live_pods) or len(group.pods)))


def elastic_size(spec: Mapping[str, Any]) -> int | None:
    """The size of an elastic Indexed Job (``completionMode: Indexed``, ``completions`` =
    ``parallelism``): its pods; None for any other Job spec."""
    completions, parallelism = spec.get("completions"), spec.get("parallelism", 1)
    if spec.get("completionMode") != "Indexed" or not isinstance(completions, int):
        return None
    return completions if completions == parallelism and completions >= 1 else None


# Job fields a change of completions must respect (the API server refuses it otherwise, or
# the Job would not run the pods a resize plans): such Jobs are planned rigid.
_FIXED_BY = ("backoffLimitPerIndex", "maxFailedIndexes", "successPolicy")
JOB_CONTROLLER = "kubernetes.io/job-controller"


def training_range(group: JobGroup, annotations: Mapping[str, Any]) -> tuple[int, int] | None:
    """An elastic training job's replica range (module docstring); None for a rigid job,
    and for one whose annotations give no range above a floor of at least 1. Rigid too: a
    Job another controller manages (Kueue's label, or ``spec.managedBy``), one with
    per-index limits or a success policy (``_FIXED_BY``), and one with an index already
    ended (``status.succeeded``, ``failedIndexes``: a restart does not run it again)."""
    if group.owner.kind != "Job" or group.obj is None or group.meta("labels").get(QUEUE_LABEL):
        return None
    spec, status = group.obj.get("spec") or {}, group.obj.get("status") or {}
    if elastic_size(spec) is None or spec.get("managedBy", JOB_CONTROLLER) != JOB_CONTROLLER:
        return None
    if any(spec.get(name) is not None for name in _FIXED_BY):
        return None
    if status.get("succeeded") or status.get("completedIndexes") or status.get("failedIndexes"):
        return None
    high = _int_annotation(annotations, MAX_REPLICAS_ANNOTATION)
    low = _int_annotation(annotations, MIN_REPLICAS_ANNOTATION)
    low = 1 if low is None else low
    if high is None or not 1 <= low < high:
        return None
    return low, high


def _checkpointable(group: JobGroup, annotations: Mapping[str, Any]) -> bool:
    """By the rules of the module docstring: for Jobs and bare pods, what the actions
    accept."""
    if group.owner.kind == "Pod":
        return False
    if group.owner.kind == "Job":
        if group.obj is not None:
            return resume_blocker((group.obj.get("spec") or {}).get("template") or {}) is None
        return bool(group.pods) and resume_blocker(group.pods[0]) is None
    return str(annotations.get(CHECKPOINTABLE_ANNOTATION, "")).lower() == "true"


def job_state(group: JobGroup, live_bound: list[Object]) -> tuple[JobState, str]:
    """State and reason, by the rules of the module docstring."""
    if group.obj is not None and group.owner.kind == "Job":
        if _condition(group.obj, "Complete") or _condition(group.obj, "SuccessCriteriaMet"):
            return JobState.finished, ""
        failed = _condition(group.obj, "Failed") or _condition(group.obj, "FailureTarget")
        if failed:
            return JobState.failed, str(failed.get("message") or failed.get("reason") or "")
    if live_bound:
        return JobState.running, ""
    if group.obj is not None and (group.obj.get("spec") or {}).get("suspend"):
        return JobState.pending, "suspended"
    if group.pods and group.obj is None and not any(pod_live(p) for p in group.pods):
        phases = {(p.get("status") or {}).get("phase") for p in group.pods}
        return (JobState.failed if "Failed" in phases else JobState.finished), ""
    return JobState.pending, _unschedulable_reason(group.pods)


def _times(group: JobGroup, state: JobState) -> dict[str, datetime | None]:
    obj_meta = (group.obj or {}).get("metadata") or {}
    obj_status = (group.obj or {}).get("status") or {}
    created = [parse_time((p.get("metadata") or {}).get("creationTimestamp")) for p in group.pods]
    started = [parse_time((p.get("status") or {}).get("startTime")) for p in group.pods]
    submit = parse_time(obj_meta.get("creationTimestamp")) or min(
        (t for t in created if t), default=None
    )
    start = parse_time(obj_status.get("startTime")) or min((t for t in started if t), default=None)
    end = None
    if state in (JobState.finished, JobState.failed):
        end = parse_time(obj_status.get("completionTime"))
        for kind in ("Failed", "Complete"):
            condition = _condition(group.obj or {}, kind)
            if end is None and condition is not None:
                end = parse_time(condition.get("lastTransitionTime"))
    # Physics wants submit ≤ start ≤ end; a later time that is out of order is dropped.
    if submit and start and start < submit:
        start = None
    if end and ((start and end < start) or (submit and end < submit)):
        end = None
    if state is JobState.pending:
        start = None
    return {"submit_time": submit, "start_time": start, "end_time": end}


def job_report(group: JobGroup, context: TranslationContext) -> JobReport | None:
    """The group as a ``JobReport``; None when it asks for no GPU and those are left out."""
    spec = group.template_spec()
    per_pod = pod_spec_gpus(spec)
    live = [p for p in group.pods if pod_live(p)]
    live_bound = [p for p in live if pod_node(p)]
    held = allocations(live_bound, context.node_states)
    held_gpus = sum(a.gpus for a in held)
    if not context.include_cpu_only and per_pod == 0 and not any(pod_gpus(p) for p in live):
        return None
    state, reason = job_state(group, live_bound)
    if state is not JobState.running:
        held, held_gpus = [], 0
    labels = group.meta("labels")
    annotations = group.meta("annotations")
    fields: dict[str, Any] = {
        "external_id": group.external_id,
        "name": group.owner.name[:255],
        "team": str(labels.get(TEAM_LABEL) or group.owner.namespace)[:128],
        "queue": str(labels.get(QUEUE_LABEL) or "default")[:128],
        "kind": _job_kind(group),
        "priority": group_priority(group, context),
        "checkpointable": _checkpointable(group, annotations),
        "state": state,
        "reason": reason[:255],
        "restart_count": min(
            1_000_000,
            sum(
                int(s.get("restartCount") or 0)
                for p in group.pods
                for s in (p.get("status") or {}).get("containerStatuses") or []
            ),
        ),
        "allocations": held,
        "allowed_gpu_models": allowed_models(spec, context.gpu_model_aliases),
        "residency": read_residency(annotations, job=group.external_id),
        **_times(group, state),
    }
    if labels.get(SLA_LABEL):
        fields["sla_class"] = str(labels[SLA_LABEL])[:64]
    if state is JobState.pending:
        pinned = pinned_nodes(live[0].get("spec") or {}) if live else pinned_nodes(spec)
        # A pin of Shaper's whose run is over is reported as the Job's own placement
        # (connectors.kubernetes.pins); the connector's upkeep gives that back to it.
        job = group.obj if group.owner.kind == "Job" and group.obj else None
        own = stale_pin_nodes(job) if job is not None else None
        # A Job to resume from checkpoint images runs where they are, whatever else its
        # template says: the restore webhook holds each pod it makes to that node (also a
        # Job suspended to resume so, which has no pod yet and no pin of Shaper's).
        images = images_node((job.get("spec") or {}).get("template") or {}) if job else None
        fields["required_nodes"] = [images] if images else pinned if own is None else own
    if group.owner.kind in ELASTIC_KINDS:
        desired = int(((group.obj or {}).get("spec") or {}).get("replicas", 1) or 0)
        holding = len({p["metadata"]["name"] for p in live_bound})
        replicas = min(MAX_REPLICAS, max(desired, holding))
        low = _int_annotation(annotations, MIN_REPLICAS_ANNOTATION)
        high = _int_annotation(annotations, MAX_REPLICAS_ANNOTATION)
        declared = low is not None or high is not None
        low = desired if low is None else low
        high = max(desired if high is None else high, low)
        fields.update(
            shape=JobShape.elastic,
            # A rolling update's old pods may ask for more than the new template.
            gpus_requested=max([per_pod, *(pod_gpus(p) for p in live_bound)]),
            replicas=replicas,
            min_replicas=min(low, MAX_REPLICAS),
            max_replicas=min(high, MAX_REPLICAS),
            # A StatefulSet drops its highest ordinals: nobody chooses which replicas go.
            # A move shrinks the service first: only one declared elastic may dip.
            replicas_movable=context.replica_moves
            and group.owner.kind == "Deployment"
            and declared,
        )
        if holding == 0 and desired > 0 and state is JobState.pending and not reason:
            fields["reason"] = _unschedulable_reason(group.pods)[:255]
    else:
        gang = _gang_size(group, live)
        requested = (
            per_pod * gang
            if group.obj is not None
            else sum(pod_gpus(p) for p in (live or group.pods))
        )
        fields.update(gang_size=gang, gpus_requested=min(100_000, max(requested, held_gpus)))
        elastic = training_range(group, annotations)
        if elastic is not None:
            fields.update(min_replicas=elastic[0], max_replicas=elastic[1], replicas=elastic[1])
        fields["time_limit_s"] = _deadline(group, spec)
        fields["speeds"] = read_speeds(
            annotations.get(SPEEDS_KEY),
            job=group.external_id,
            model_name=lambda name: speed_model(name, context.gpu_model_aliases),
        )
    if (
        context.submit_spec is not None
        and group.owner.kind == "Job"
        and group.obj is not None
        and state in (JobState.pending, JobState.running)
    ):
        fields["submit"] = context.submit_spec(group.obj)
    return JobReport(**fields)


def _deadline(group: JobGroup, spec: Mapping[str, Any]) -> float | None:
    """How long the job may run once started: a Job's ``activeDeadlineSeconds`` (counted
    from its start, over all its pods and retries; a suspension restarts the count); a
    pod's own (``spec.activeDeadlineSeconds``, from the pod's start) for a bare pod and
    for a Job that retries no pod (``backoffLimit: 0``: a pod past its deadline ends the
    Job; with retries, a new pod starts a new count); the smaller when both hold. None
    when neither does, or beyond what the wire takes."""
    job_spec = ((group.obj or {}).get("spec") or {}) if group.owner.kind == "Job" else {}
    per_pod = group.owner.kind == "Pod" or job_spec.get("backoffLimit") == 0
    limits = [
        value
        for value in (
            job_spec.get("activeDeadlineSeconds"),
            spec.get("activeDeadlineSeconds") if per_pod else None,
        )
        if isinstance(value, int) and not isinstance(value, bool) and value > 0
    ]
    limit = float(min(limits)) if limits else None
    return limit if limit is not None and limit <= MAX_TIME_LIMIT_S else None


def job_reports(groups: Iterable[JobGroup], context: TranslationContext) -> list[JobReport]:
    reports = (job_report(group, context) for group in groups)
    return sorted((r for r in reports if r is not None), key=lambda r: r.external_id)
