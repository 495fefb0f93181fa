"""The boundary with armada-client's protobuf messages: events in, submissions out.

Nothing else in the connector touches a protobuf object: events become
:class:`connectors.armada.jobs.JobEvent`, queues :class:`QueueInfo`, and a job is
submitted again from the bytes of its own ``submitted`` event (:func:`resubmission`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from armada_client.armada import event_pb2, submit_pb2
from armada_client.k8s.io.api.core.v1 import generated_pb2 as core_v1
from google.protobuf.timestamp_pb2 import Timestamp

from connectors.armada.jobs import RESUME_FROM_ENV, EventKind, JobEvent, JobSpec


@dataclass(frozen=True)
class QueueInfo:
    name: str
    cordoned: bool
    priority_factor: float


def queue_info(queue: submit_pb2.Queue) -> QueueInfo:
    return QueueInfo(
        name=queue.name, cordoned=queue.cordoned, priority_factor=queue.priority_factor
    )


def _time(stamp: Timestamp) -> datetime | None:
    if stamp.seconds == 0 and stamp.nanos == 0:
        return None
    return datetime.fromtimestamp(stamp.seconds + stamp.nanos / 1e9, tz=UTC)


def job_event(
    message: event_pb2.EventStreamMessage, gpu_resources: tuple[str, ...]
) -> JobEvent | None:
    """The event in a stream message; None for kinds the connector does not fold.
    ``gpu_resources``: the extended resources that count as GPUs."""
    which = message.message.WhichOneof("events")
    if which is None:
        return None
    try:
        kind = EventKind(which)
    except ValueError:
        return None  # utilisation, ingress_info: nothing a job's state depends on
    body: Any = getattr(message.message, which)
    fields = {f.name for f in body.DESCRIPTOR.fields}
    spec = job_spec(body.job, gpu_resources) if kind is EventKind.submitted else None
    priority = body.new_priority if "new_priority" in fields else None
    reason = body.reason if "reason" in fields else ""
    if kind is EventKind.failed and body.cause == event_pb2.Rejected:
        # Armada's scheduler refused the job (it can never run as it stands). The event API
        # has no rejected event: a failed one with this cause (REJECTED in GetJobStatus).
        reason = f"rejected by Armada: {reason}" if reason else "rejected by Armada"
    return JobEvent(
        message_id=message.id,
        kind=kind,
        job_id=body.job_id,
        queue=body.queue,
        job_set=body.job_set_id,
        at=_time(body.created),
        executor=body.cluster_id if "cluster_id" in fields else "",
        node=body.node_name if "node_name" in fields else "",
        reason=reason,
        priority=priority,
        spec=spec,
    )


def _pod_specs(job: submit_pb2.Job | submit_pb2.JobSubmitRequestItem) -> list[core_v1.PodSpec]:
    # pod_spec is deprecated for pod_specs; older clients still send it.
    if len(job.pod_specs):
        return list(job.pod_specs)
    return [job.pod_spec] if job.HasField("pod_spec") else []


def gpus_of(pod: core_v1.PodSpec, gpu_resources: tuple[str, ...]) -> int:
    """GPUs a pod asks for: per container the request (else the limit, which Kubernetes
    then takes as the request for extended resources), summed; init containers run one
    at a time, so the largest of them counts if it is larger."""

    def of(container: core_v1.Container) -> int:
        found = 0
        for resource in gpu_resources:
            quantity = container.resources.requests.get(resource)
            if quantity is None:
                quantity = container.resources.limits.get(resource)
            if quantity is not None:
                found += _whole(quantity.string, resource)
        return found

    main = sum(of(container) for container in pod.containers)
    init = max((of(container) for container in pod.initContainers), default=0)
    return max(main, init)


def _whole(quantity: str, resource: str) -> int:
    try:
        value = float(quantity)
    except ValueError:
        raise ValueError(f"{resource} quantity {quantity!r} is not a whole number") from None
    if not math.isfinite(value) or value < 0 or value != int(value):
        raise ValueError(f"{resource} quantity {quantity!r} is not a whole number")
    return int(value)


def job_spec(job: submit_pb2.Job, gpu_resources: tuple[str, ...]) -> JobSpec:
    pods = _pod_specs(job)
    first = pods[0] if pods else core_v1.PodSpec()
    return JobSpec(
        priority=job.priority,
        namespace=job.namespace,
        labels=dict(job.labels),
        annotations=dict(job.annotations),
        node_selector=dict(first.nodeSelector),
        gpus=sum(gpus_of(pod, gpu_resources) for pod in pods),
        encoded=job.SerializeToString(),
    )


def resubmission(
    spec: JobSpec,
    *,
    client_id: str,
    priority: float,
    annotations: dict[str, str | None],
    node_selector: dict[str, str | None],
    resume_from: str | None,
) -> submit_pb2.JobSubmitRequestItem:
    """The job of ``spec`` as a new submission: its pods and labels, at ``priority`` (its
    current one: a reprioritization since it was submitted counts), with
    ``annotations`` and ``node_selector`` merged in (None removes a key) and, with a
    ``resume_from``, ``SHAPER_RESUME_FROM`` set on every container so the new pod resumes
    from that checkpoint. ``client_id`` makes Armada answer a resend with the job it
    already made (its submit deduplication) instead of a second job."""
    job = submit_pb2.Job.FromString(spec.encoded)
    pods = []
    for original in _pod_specs(job):
        pod = core_v1.PodSpec()
        pod.CopyFrom(original)
        for key, value in node_selector.items():
            if value is None:
                pod.nodeSelector.pop(key, None)
            else:
                pod.nodeSelector[key] = value
        for container in pod.containers:
            kept = [env for env in container.env if env.name != RESUME_FROM_ENV]
            del container.env[:]
            container.env.extend(kept)
            if resume_from is not None:
                container.env.append(core_v1.EnvVar(name=RESUME_FROM_ENV, value=resume_from))
        pods.append(pod)
    merged = dict(job.annotations)
    for key, value in annotations.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    return submit_pb2.JobSubmitRequestItem(
        priority=priority,
        namespace=job.namespace,
        client_id=client_id,
        labels=dict(job.labels),
        annotations=merged,
        pod_specs=pods,
        scheduler=job.scheduler,
    )
