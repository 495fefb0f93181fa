"""A batch/v1 Job as a ``wire.telemetry.SubmitSpec``, and such a spec as a Job here.

**What travels.** A pending or running Job (Kubernetes connector; Kueue's reports only
pending ones, connectors.kueue.workloads says why) carries ``SubmitSpec(scheduler=
kubernetes|kueue, native={"job": …})``, where ``job`` is the Job object as the API server
serves it (``apiVersion``, ``kind``, ``metadata``, ``spec``), cleaned of what only the
cluster it runs in means:

* ``status`` and every ``metadata`` field but ``name``, ``namespace``, ``labels`` and
  ``annotations`` (uid, resourceVersion, creationTimestamp, managedFields, ownerReferences,
  generation, finalizers …);
* the selector the API server generated (``spec.selector`` unless ``manualSelector``) and
  the labels it generated with it, on the Job and its template (``controller-uid``,
  ``job-name`` and their ``batch.kubernetes.io/`` forms);
* ``spec.suspend`` (the target decides: held or not, and Kueue's own) and
  ``spec.managedBy`` (MultiKueue's: a moved Job is run by the target's controllers);
* Shaper's marks: the move's (``shaper.io/move``), a step's stamp
  (``shaper.io/stopped-by-step``) and the resume pointer (``shaper.io/resume-from``: a
  checkpoint of the source cluster), with the label that sends the pods to the restore
  webhook for it (``shaper.io/restore``: without the pointer, the webhook refuses them);
* node pins: the template's ``nodeName``, a ``kubernetes.io/hostname`` node selector and
  hostname requirements of required node affinity (Shaper's pin, or the user's: they name
  the source's nodes);
* what Kueue adds: every ``kueue.x-k8s.io/`` label and annotation of the template (Kueue
  writes them at admission), and of the Job's own those not in :data:`KUEUE_KEPT` (which
  the user sets: the LocalQueue, the WorkloadPriorityClass …).

Everything else is kept: namespace, name, labels (``kueue.x-k8s.io/queue-name`` too),
annotations and the whole pod template. Above the wire's 64 Ki characters the Job carries
no spec (logged): it stays where it was submitted. Bare pods, Deployments and other owners
carry none either: only a Job's controller keeps a template that can be created again.

**Submitting it** (``SupportsSubmit``, connectors.kubernetes.moves): the target creates the
Job in the same namespace, named :func:`moved_job_name` of the move (deterministic, a
DNS-1123 label), labelled ``shaper.io/move: <that name>`` (a label value cannot hold every
move name) and annotated ``shaper.io/move: <move name>``: a resent submit finds it by
both and creates nothing.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import re
from collections.abc import Mapping
from typing import Any

from connectors.base import ConnectorError
from connectors.kubernetes.pins import LIFTING_PIN, PIN_ANNOTATION, RESTORE_LABEL, Pin, node_set
from connectors.kubernetes.pods import HOSTNAME_LABEL, RESUME_FROM, STOPPED_BY_STEP
from wire.telemetry import MAX_SUBMIT_SPEC, PortableSpec, SchedulerKind, SubmitSpec

logger = logging.getLogger(__name__)

MOVE_MARK = "shaper.io/move"
# Labels the API server derives from the Job's uid and name when it generates the selector.
GENERATED_LABELS = frozenset(
    {
        "controller-uid",
        "batch.kubernetes.io/controller-uid",
        "job-name",
        "batch.kubernetes.io/job-name",
    }
)
KUEUE_PREFIX = "kueue.x-k8s.io/"
# Kueue labels and annotations on a Job that its user sets, and that mean the same in
# another cluster with Kueue; any other is Kueue's own about this cluster (a prebuilt
# Workload's name, MultiKueue's origin) and is left out.
KUEUE_KEPT = frozenset(
    {
        "kueue.x-k8s.io/queue-name",
        "kueue.x-k8s.io/priority-class",
        "kueue.x-k8s.io/max-exec-time-seconds",
        "kueue.x-k8s.io/job-min-parallelism",
        "kueue.x-k8s.io/job-completions-equal-parallelism",
    }
)
SHAPER_MARKS = frozenset(
    {MOVE_MARK, STOPPED_BY_STEP, RESUME_FROM, RESTORE_LABEL, PIN_ANNOTATION, LIFTING_PIN}
)
# A Job's name is also its pods' ``job-name`` label value: at most 63 characters.
MAX_JOB_NAME = 63
_DIGEST = 10


def moved_job_name(move: str) -> str:
    """The Job's name for move ``move``: the move's words in DNS-1123 form, cut to fit, and
    a digest of the whole name so that two moves never share one."""
    digest = hashlib.sha256(move.encode()).hexdigest()[:_DIGEST]
    words = re.sub(r"[^a-z0-9]+", "-", move.lower()).strip("-")
    head = words[: MAX_JOB_NAME - _DIGEST - 1].rstrip("-")
    return f"{head}-{digest}" if head else f"moved-{digest}"


# --- telemetry: a Job as a spec -----------------------------------------------------------


def job_submit_spec(job: Mapping[str, Any], scheduler: SchedulerKind) -> SubmitSpec | None:
    """The spec a Job carries in telemetry; None when it is above the wire's bound."""
    native = {"job": clean_job(job)}
    size = len(json.dumps({"scheduler": scheduler.value, "native": native, "portable": None}))
    if size > MAX_SUBMIT_SPEC:
        metadata = job.get("metadata") or {}
        logger.warning(
            "job %s/%s carries no submit spec: %d characters, above the %d a spec may "
            "carry; it cannot move to another cluster",
            metadata.get("namespace"),
            metadata.get("name"),
            size,
            MAX_SUBMIT_SPEC,
        )
        return None
    return SubmitSpec(scheduler=scheduler, native=native)


def clean_job(job: Mapping[str, Any]) -> dict[str, Any]:
    """The Job without what only its own cluster means (module docstring)."""
    metadata = job.get("metadata") or {}
    spec = copy.deepcopy(dict(job.get("spec") or {}))
    for key in ("suspend", "managedBy"):
        spec.pop(key, None)
    if not spec.get("manualSelector"):
        spec.pop("selector", None)
    template = dict(spec.get("template") or {})
    template_meta = dict(template.get("metadata") or {})
    template["metadata"] = {
        key: value
        for key, value in {
            "labels": _clean_map(template_meta.get("labels"), kueue_kept=frozenset()),
            "annotations": _clean_map(template_meta.get("annotations"), kueue_kept=frozenset()),
        }.items()
        if value
    }
    template["spec"] = unpinned(template.get("spec") or {})
    spec["template"] = template
    cleaned_meta: dict[str, Any] = {
        "name": metadata.get("name"),
        "namespace": metadata.get("namespace") or "default",
    }
    for which in ("labels", "annotations"):
        kept = _clean_map(metadata.get(which), kueue_kept=KUEUE_KEPT)
        if kept:
            cleaned_meta[which] = kept
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": cleaned_meta, "spec": spec}


def _clean_map(values: Mapping[str, Any] | None, *, kueue_kept: frozenset[str]) -> dict[str, Any]:
    return {
        key: value
        for key, value in (values or {}).items()
        if key not in GENERATED_LABELS
        and key not in SHAPER_MARKS
        and (not key.startswith(KUEUE_PREFIX) or key in kueue_kept)
    }


def unpinned(pod_spec: Mapping[str, Any]) -> dict[str, Any]:
    """A pod spec without what binds it to named nodes (their names are the source's)."""
    spec = copy.deepcopy(dict(pod_spec))
    spec.pop("nodeName", None)
    selector = {k: v for k, v in (spec.get("nodeSelector") or {}).items() if k != HOSTNAME_LABEL}
    if selector:
        spec["nodeSelector"] = selector
    else:
        spec.pop("nodeSelector", None)
    affinity = spec.get("affinity") or {}
    node_affinity = affinity.get("nodeAffinity") or {}
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    if required:
        terms = []
        for term in required.get("nodeSelectorTerms") or []:
            expressions = [
                e for e in term.get("matchExpressions") or [] if e.get("key") != HOSTNAME_LABEL
            ]
            kept = {**term, "matchExpressions": expressions}
            if not expressions:
                kept.pop("matchExpressions")
            if kept:
                terms.append(kept)
        if terms:
            required["nodeSelectorTerms"] = terms
        else:
            node_affinity.pop("requiredDuringSchedulingIgnoredDuringExecution")
        if not node_affinity:
            affinity.pop("nodeAffinity")
        if not affinity:
            spec.pop("affinity")
    return spec


def pinned_affinity(affinity: Mapping[str, Any] | None, nodes: list[str]) -> dict[str, Any]:
    """``affinity`` (as JSON) with every required node-selector term also requiring a node
    in ``nodes`` (terms are ORed, expressions in a term ANDed); an earlier pin is replaced.
    The one pin Shaper writes: a moved Job's (connectors.kubernetes.actions) and a
    submitted one's."""
    affinity = copy.deepcopy(dict(affinity or {}))
    node_affinity = dict(affinity.get("nodeAffinity") or {})
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    terms = list(required.get("nodeSelectorTerms") or []) or [{"matchExpressions": []}]
    pin = {"key": HOSTNAME_LABEL, "operator": "In", "values": sorted(nodes)}
    pinned_terms = []
    for term in terms:
        expressions = [
            e for e in term.get("matchExpressions") or [] if e.get("key") != HOSTNAME_LABEL
        ]
        pinned = {"matchExpressions": [*expressions, pin]}
        if term.get("matchFields"):
            pinned["matchFields"] = term["matchFields"]
        pinned_terms.append(pinned)
    node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {
        "nodeSelectorTerms": pinned_terms
    }
    affinity["nodeAffinity"] = node_affinity
    return affinity


# --- submit: a spec as a Job here --------------------------------------------------------


def job_from_spec(
    spec: SubmitSpec,
    *,
    move: str,
    scheduler: SchedulerKind,
    cluster: str,
    nodes: list[str] | None,
    suspend: bool,
    portable_namespace: str,
) -> dict[str, Any]:
    """The Job to create for move ``move``; a spec this cluster cannot run raises a
    non-retryable :class:`ConnectorError` saying why."""
    what = f"submit {move} to {cluster}"
    if spec.scheduler is scheduler:
        job = _native_job(spec.native, what=what)
    elif spec.portable is not None:
        job = portable_job(spec.portable, namespace=portable_namespace, what=what)
    else:
        raise ConnectorError(
            f"{what}: a {spec.scheduler.value} job cannot run on {scheduler.value}: its spec "
            "has no portable form",
            retryable=False,
        )
    job_name = moved_job_name(move)
    metadata = job["metadata"]
    metadata["name"] = job_name
    metadata["labels"] = {**(metadata.get("labels") or {}), MOVE_MARK: job_name}
    metadata["annotations"] = {**(metadata.get("annotations") or {}), MOVE_MARK: move}
    job["spec"]["suspend"] = suspend
    if nodes:
        pod_spec = job["spec"]["template"].setdefault("spec", {})
        # Pinned for its first run here (connectors.kubernetes.pins), as a move's pin is.
        pin = Pin(0, node_set(nodes), pod_spec.get("affinity"))
        metadata["annotations"][PIN_ANNOTATION] = pin.encode()
        pod_spec["affinity"] = pinned_affinity(pod_spec.get("affinity"), nodes)
    return job


def _native_job(native: Mapping[str, Any], *, what: str) -> dict[str, Any]:
    job = native.get("job")
    if not isinstance(job, Mapping):
        raise ConnectorError(f"{what}: native has no Job (native.job)", retryable=False)
    if job.get("kind") != "Job" or job.get("apiVersion") != "batch/v1":
        raise ConnectorError(
            f"{what}: native.job is a {job.get('apiVersion')} {job.get('kind')}, not a batch/v1 "
            "Job",
            retryable=False,
        )
    metadata = job.get("metadata")
    spec = job.get("spec")
    template = spec.get("template") if isinstance(spec, Mapping) else None
    if not isinstance(metadata, Mapping) or not isinstance(template, Mapping):
        raise ConnectorError(
            f"{what}: native.job has no metadata or no spec.template", retryable=False
        )
    # Cleaned again: a spec may come from an older connector, or be written by hand.
    return clean_job(job)


def portable_job(portable: PortableSpec, *, namespace: str, what: str) -> dict[str, Any]:
    """A one-pod Job that runs the portable form's image and command; a form without an
    image cannot run here (Kubernetes runs containers only)."""
    if portable.image is None:
        raise ConnectorError(
            f"{what}: its portable form names no container image, and Kubernetes runs "
            "containers only",
            retryable=False,
        )
    resources: dict[str, str] = {}
    if portable.gpus:
        resources["nvidia.com/gpu"] = str(portable.gpus)
    if portable.cpus:
        resources["cpu"] = f"{round(portable.cpus * 1000)}m"
    if portable.memory_mib:
        resources["memory"] = f"{portable.memory_mib}Mi"
    container: dict[str, Any] = {"name": "main", "image": portable.image}
    if portable.command:
        container["command"] = list(portable.command)
    if portable.env:
        container["env"] = [{"name": k, "value": v} for k, v in sorted(portable.env.items())]
    if resources:
        container["resources"] = {"requests": resources, "limits": resources}
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"namespace": namespace},
        "spec": {
            "backoffLimit": 0,
            "template": {"spec": {"restartPolicy": "Never", "containers": [container]}},
        },
    }
