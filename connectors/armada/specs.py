"""An Armada job as a ``wire.telemetry.SubmitSpec``, and such a spec as an Armada submission.

**What travels.** A queued, held or running job (``submit_specs`` on, the default) carries
``SubmitSpec(scheduler="armada", native={"queue", "job_set", "job"})``: the queue it
belongs to (a held job's home queue), its job set, and ``job``, the submission item it was
made from (``JobSubmitRequestItem`` as protobuf JSON: priority, namespace, labels,
annotations, pod specs, scheduler), cleaned of what only its cluster means:

* Shaper's marks of the job's lineage there (``shaper.io/workload``, ``attempt``,
  ``home-queue``, ``first-submitted``, ``own-priority``, ``stopped-by-step``, ``move``) and
  its resume pointer (``shaper.io/resume-from`` and ``SHAPER_RESUME_FROM``: a checkpoint of
  the source). Its priority is the workload's own (``shaper.io/own-priority``), not one a
  start lowered it to;
* node selector keys that name the source's nodes or executors (``node_label``,
  ``executor_label``); the GPU model and other labels stay.

Above the wire's 64 Ki characters a job carries no spec (logged once): it stays where it
was submitted. Armada jobs have no portable form here.

**Submitting it** (connectors.armada.moves): an Armada spec is submitted as it came; a spec
of another scheduler only through its portable form with a container image (one container
running the image and command with its environment, its GPUs, CPUs and memory as requests
equal to limits, as Armada requires, in ``portable_namespace``). Anything else is refused
for good, saying why.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from armada_client.armada import submit_pb2
from google.protobuf import json_format
from pydantic import ValidationError

from connectors.armada.config import ArmadaConnectorConfig
from connectors.armada.jobs import (
    ATTEMPT_ANNOTATION,
    FIRST_SUBMITTED_ANNOTATION,
    HOME_QUEUE_ANNOTATION,
    OWN_PRIORITY_ANNOTATION,
    RESUME_FROM,
    RESUME_FROM_ENV,
    STOPPED_BY_STEP,
    WORKLOAD_ANNOTATION,
    ArmadaJob,
)
from connectors.armada.submission import NewJob, new_job_item
from connectors.base import ConnectorError
from wire.telemetry import PortableSpec, SchedulerKind, SubmitSpec

logger = logging.getLogger(__name__)

# The move a job was submitted for, on the job (annotation): a resent submit finds it.
MOVE_MARK = "shaper.io/move"
# Annotations that belong to the job's lineage in its own cluster.
_LINEAGE = frozenset(
    {
        WORKLOAD_ANNOTATION,
        ATTEMPT_ANNOTATION,
        HOME_QUEUE_ANNOTATION,
        FIRST_SUBMITTED_ANNOTATION,
        OWN_PRIORITY_ANNOTATION,
        STOPPED_BY_STEP,
        RESUME_FROM,
        MOVE_MARK,
    }
)


def submit_spec(job: ArmadaJob, config: ArmadaConnectorConfig) -> SubmitSpec | None:
    """The spec ``job`` carries in telemetry; None when it is above the wire's bound."""
    original = submit_pb2.Job.FromString(job.spec.encoded)
    pods = list(original.pod_specs) or (
        [original.pod_spec] if original.HasField("pod_spec") else []
    )
    placement = {config.node_label, config.executor_label}
    for pod in pods:
        for key in placement:
            pod.nodeSelector.pop(key, None)
        for container in pod.containers:
            kept = [env for env in container.env if env.name != RESUME_FROM_ENV]
            del container.env[:]
            container.env.extend(kept)
    item = submit_pb2.JobSubmitRequestItem(
        priority=job.own_priority,
        namespace=original.namespace,
        labels=dict(original.labels),
        annotations={k: v for k, v in original.annotations.items() if k not in _LINEAGE},
        pod_specs=pods,
        scheduler=original.scheduler,
    )
    native = {
        "queue": job.spec.annotations.get(HOME_QUEUE_ANNOTATION, job.queue),
        "job_set": job.job_set,
        "job": json_format.MessageToDict(item, preserving_proto_field_name=True),
    }
    try:
        return SubmitSpec(scheduler=SchedulerKind.armada, native=native)
    except ValidationError as error:
        logger.warning("armada job %s carries no submit spec: %s", job.job_id, error)
        return None


def native_item(native: Mapping[str, Any], *, what: str) -> submit_pb2.JobSubmitRequestItem:
    """The submission item of an Armada spec's ``native``; a malformed one is refused."""
    raw = native.get("job")
    if not isinstance(raw, Mapping):
        raise ConnectorError(f"{what}: native has no Armada job (native.job)", retryable=False)
    try:
        item = json_format.ParseDict(dict(raw), submit_pb2.JobSubmitRequestItem())
    except json_format.ParseError as error:
        raise ConnectorError(
            f"{what}: native.job is not an Armada job submission: {error}", retryable=False
        ) from None
    if not item.pod_specs or not all(pod.containers for pod in item.pod_specs):
        raise ConnectorError(
            f"{what}: native.job has no pod spec with a container", retryable=False
        )
    # Cleaned again: a spec may come from an older connector, or be written by hand.
    for key in _LINEAGE:
        item.annotations.pop(key, None)
    item.client_id = ""
    return item


def portable_item(
    portable: PortableSpec, *, namespace: str, what: str
) -> submit_pb2.JobSubmitRequestItem:
    """One container running the portable form's image and command; a form without an
    image cannot run here (Armada runs containers only)."""
    if portable.image is None:
        raise ConnectorError(
            f"{what}: its portable form names no container image, and Armada runs containers only",
            retryable=False,
        )
    fields: dict[str, Any] = {
        "image": portable.image,
        "command": list(portable.command),
        "gpus": portable.gpus,
        "env": dict(portable.env),
        "namespace": namespace,
    }
    if portable.cpus:
        fields["cpu"] = f"{round(portable.cpus * 1000)}m"
    if portable.memory_mib:
        fields["memory"] = f"{portable.memory_mib}Mi"
    try:
        return new_job_item(NewJob(**fields))
    except ValidationError as error:
        raise ConnectorError(
            f"{what}: its portable form is not an Armada job: {error}", retryable=False
        ) from None


def spec_item(
    spec: SubmitSpec, *, portable_namespace: str, what: str
) -> submit_pb2.JobSubmitRequestItem:
    """The submission ``spec`` describes here; one Armada cannot run raises a
    non-retryable :class:`ConnectorError` saying why."""
    if spec.scheduler is SchedulerKind.armada:
        return native_item(spec.native, what=what)
    if spec.portable is not None:
        return portable_item(spec.portable, namespace=portable_namespace, what=what)
    raise ConnectorError(
        f"{what}: a {spec.scheduler.value} job cannot run on Armada: its spec has no portable form",
        retryable=False,
    )


def spec_queue(spec: SubmitSpec) -> tuple[str | None, str | None]:
    """The queue and job set an Armada spec names (None for either it does not)."""
    if spec.scheduler is not SchedulerKind.armada:
        return None, None
    queue, job_set = spec.native.get("queue"), spec.native.get("job_set")
    return (
        queue if isinstance(queue, str) and queue else None,
        job_set if isinstance(job_set, str) and job_set else None,
    )
