"""Armada jobs and executor nodes as Shaper's wire types (the one mapping, tested).

Per workload (connectors.armada.jobs: the newest job of its lineage):

* ``external_id``: the workload id (its first job's id), stable across resubmissions;
  ``restart_count``: the attempt number; ``submit_time``: when its first job was submitted;
* ``state``: queued, leased and pending → pending (``reason`` says which, and on which
  executor cluster); running → running; succeeded → finished; failed and preempted →
  failed; cancelled → cancelled; a job waiting in the hold queue is pending with the
  reason "held by Shaper";
* ``queue``: the Armada queue (a held job's home queue); ``team``, ``kind``,
  ``sla_class``, ``priority`` from the job's ``shaper.io/*`` labels, else the mapping;
* ``gpus_requested``: the GPUs its pod asks for; ``allowed_gpu_models``: the
  ``gpu_model_label`` of its node selector; ``required_nodes``: the declared nodes the
  rest of it selects (a node pin, ``node_label``; an executor cluster, ``executor_label``;
  any other label), so that a plan starts a job only where Armada could run it;
* ``checkpointable``: the annotation ``shaper.io/checkpointable: "true"`` (its pod reads
  ``SHAPER_RESUME_FROM``, which the connector sets when it submits the job again);
* ``residency``: the annotations ``shaper.io/cluster-selector`` (``region=eu``) and
  ``shaper.io/allowed-clusters`` (``alpha,beta``), as wire.residency reads them;
* ``speeds``: the annotation ``shaper.io/speeds`` (``H100=2.5,A100-80G=1``, models as the
  ``gpu_model_label`` names them), as wire.speeds reads it;
* ``allocations``: a running job's GPUs on the node the ``running`` event named;
* ``submit``: the job's ``SubmitSpec`` (connectors.armada.specs) while it can move
  (queued, held or running), when ``submit_specs`` is on.

A gang (connectors.armada.gangs) is one job: :func:`gang_report`.

Nodes: the configured inventory, labelled with their executor cluster; a node that only
the events name gets the GPUs its running jobs hold (nothing else is known of it).
"""

from __future__ import annotations

from collections import defaultdict

from pydantic import ValidationError

from connectors.armada.config import ArmadaConnectorConfig
from connectors.armada.gangs import Gang
from connectors.armada.jobs import (
    CHECKPOINTABLE_ANNOTATION,
    HOME_QUEUE_ANNOTATION,
    TERMINAL_PHASES,
    ArmadaJob,
    Phase,
)
from connectors.base import ConnectorError
from wire.residency import read_residency
from wire.speeds import SPEEDS_KEY, read_speeds
from wire.telemetry import (
    AllocationReport,
    JobKind,
    JobReport,
    JobState,
    NodeReport,
    SubmitSpec,
)

TEAM_LABEL = "shaper.io/team"
KIND_LABEL = "shaper.io/kind"
SLA_LABEL = "shaper.io/sla-class"
PRIORITY_LABEL = "shaper.io/priority"
# Where a node's executor cluster shows in its Shaper labels.
EXECUTOR_NODE_LABEL = "armadaproject.io/executor"

_STATES = {
    Phase.queued: JobState.pending,
    Phase.leased: JobState.pending,
    Phase.pending: JobState.pending,
    Phase.running: JobState.running,
    Phase.succeeded: JobState.finished,
    Phase.failed: JobState.failed,
    Phase.preempted: JobState.failed,
    Phase.cancelled: JobState.cancelled,
}


def job_state(phase: Phase) -> JobState:
    return _STATES[phase]


def _reason(job: ArmadaJob, config: ArmadaConnectorConfig, cordoned: frozenset[str]) -> str:
    if job.queue == config.hold_queue and not job.terminal:
        return "held by Shaper until a plan starts it"
    if job.phase is Phase.queued and job.queue in cordoned:
        return f"queue {job.queue} is cordoned"
    if job.phase is Phase.leased:
        return f"leased to executor {job.executor}"
    if job.phase is Phase.pending:
        return f"pod starting on executor {job.executor}"
    return job.reason


def job_report(
    job: ArmadaJob,
    config: ArmadaConnectorConfig,
    *,
    cordoned: frozenset[str] = frozenset(),
    submit: SubmitSpec | None = None,
) -> JobReport:
    mapping = config.mapping
    labels, annotations = job.spec.labels, job.spec.annotations
    home_queue = annotations.get(HOME_QUEUE_ANNOTATION, job.queue)
    priority = mapping.queue_priorities.get(home_queue, mapping.default_priority)
    if labels.get(PRIORITY_LABEL, "").isdigit():
        priority = min(int(labels[PRIORITY_LABEL]), 1_000_000)
    kind = mapping.default_kind
    if labels.get(KIND_LABEL) in JobKind.__members__:
        kind = JobKind(labels[KIND_LABEL])
    selector = job.spec.node_selector
    model = selector.get(mapping.gpu_model_label)
    state = job_state(job.phase)
    allocations = []
    if state is JobState.running and job.node:
        allocations = [AllocationReport(node=job.node, gpu_count=job.spec.gpus)]
    try:
        return JobReport(
            external_id=job.workload_id,
            name=labels.get("app.kubernetes.io/name", job.job_set)[:255],
            team=labels.get(TEAM_LABEL, home_queue)[:128],
            queue=home_queue,
            kind=kind,
            priority=priority,
            sla_class=labels.get(SLA_LABEL, mapping.default_sla_class)[:64],
            gpus_requested=job.spec.gpus,
            allowed_gpu_models=[model] if model else [],
            required_nodes=required_nodes(job, config),
            checkpointable=annotations.get(CHECKPOINTABLE_ANNOTATION) == "true",
            submit_time=job.first_submitted_at,
            start_time=job.started_at if state is not JobState.pending else None,
            end_time=job.ended_at,
            state=state,
            reason=_reason(job, config, cordoned)[:255],
            restart_count=job.spec.attempt,
            allocations=allocations,
            submit=submit,
            residency=read_residency(annotations, job=job.workload_id),
            speeds=read_speeds(annotations.get(SPEEDS_KEY), job=job.workload_id),
        )
    except ValidationError as error:
        raise ConnectorError(
            f"armada job {job.job_id} (job set {job.job_set}, queue {job.queue}) cannot be "
            f"reported: {error}",
            retryable=False,
        ) from error


def gang_report(
    gang: Gang, config: ArmadaConnectorConfig, *, cordoned: frozenset[str] = frozenset()
) -> JobReport:
    """A gang as one job (connectors.armada.gangs): its first member's labels, queue and
    node selector; the whole gang's size, GPUs, state and allocations; no submit spec and
    not checkpointable (it moves and stops only whole, with no checkpoint)."""
    first = gang.members[0]
    report = job_report(first, config, cordoned=cordoned)
    phase = gang.phase
    state = job_state(phase)
    held: dict[str, int] = defaultdict(int)
    for job in gang.members:
        if job.phase is Phase.running and job.node:
            held[job.node] += job.spec.gpus
    started = [job.started_at for job in gang.members if job.started_at is not None]
    ended = [job.ended_at for job in gang.members if job.ended_at is not None]
    submitted = [t for job in gang.members if (t := job.first_submitted_at) is not None]
    why = _reason(first, config, cordoned) if phase is not Phase.running else ""
    fields = {
        **report.model_dump(),
        "external_id": gang.external_id,
        "gang_size": gang.cardinality,
        "gpus_requested": min(gang.gpus, 100_000),
        "checkpointable": False,
        "submit_time": min(submitted, default=None),
        "start_time": min(started, default=None) if state is not JobState.pending else None,
        "end_time": max(ended, default=None) if phase in TERMINAL_PHASES else None,
        "state": state,
        "reason": "; ".join(filter(None, [gang.reason, why]))[:255],
        "restart_count": max(job.spec.attempt for job in gang.members),
        "allocations": [
            AllocationReport(node=node, gpu_count=gpus) for node, gpus in sorted(held.items())
        ]
        if state is JobState.running
        else [],
        "submit": None,
    }
    try:
        return JobReport.model_validate(fields)
    except ValidationError as error:
        raise ConnectorError(
            f"armada gang {gang.gang_id} (job set {first.job_set}, queue {first.queue}) "
            f"cannot be reported: {error}",
            retryable=False,
        ) from error


def required_nodes(job: ArmadaJob, config: ArmadaConnectorConfig) -> list[str]:
    """The only nodes the job may run on, by its node selector: the declared nodes that
    meet it (a pin to one node, or to an executor cluster: ``executor_label``; the GPU
    model alone is ``allowed_gpu_models``, not this). A pin to a node nobody declared is
    that node; a selector no declared node meets, or no inventory, says nothing."""
    selector = job.spec.node_selector
    pinned = selector.get(config.node_label)
    if not set(selector) - {config.mapping.gpu_model_label}:
        return []
    eligible = [node.name for node in config.selected_nodes(selector)]
    if eligible:
        return eligible
    return [pinned] if pinned else []


def node_reports(config: ArmadaConnectorConfig, jobs: list[ArmadaJob]) -> list[NodeReport]:
    held: dict[str, int] = defaultdict(int)
    executor_of: dict[str, str] = {}
    for job in jobs:
        if job.phase is Phase.running and job.node:
            held[job.node] += job.spec.gpus
            executor_of[job.node] = job.executor
    reports = []
    declared = set()
    for node in config.nodes:
        declared.add(node.name)
        reports.append(
            NodeReport(
                name=node.name,
                gpu_model=node.gpu_model,
                gpu_count=node.gpu_count,
                cpu_cores=node.cpu_cores,
                memory_mib=node.memory_mib,
                labels={**node.labels, EXECUTOR_NODE_LABEL: node.executor},
            )
        )
    for name in sorted(set(held) - declared):
        gpus = held[name]
        reports.append(
            NodeReport(
                name=name,
                gpu_model=config.mapping.default_gpu_model if gpus else None,
                gpu_count=gpus,
                labels={EXECUTOR_NODE_LABEL: executor_of[name]},
            )
        )
    return reports
