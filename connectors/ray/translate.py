"""Ray's REST answers → Shaper's wire types (pure functions: no I/O, no Ray SDK).

**Nodes** (``/api/v0/nodes``): named by the ``node_name_label`` label, else by Ray's node
id; GPUs are ``resources_total[gpu_resource]`` (exact resource names: the state API's, not
the dashboard summary's renamed ones); the model is the ``gpu_model_label`` label, else
Ray's ``accelerator_type:<model>`` resource. ALIVE is up (draining when the GCS says the
node drains), DEAD is down; a dead node whose name a live one now carries is left out.

**Jobs** (the Jobs API) are what a submission runs. A Shaper job may span several
submissions — each requeue submits the job again — so its id is the ``shaper.io/job``
metadata the connector puts on resubmissions, else the first submission's id; the latest
attempt stands for it. A job's GPUs are what its driver created, by Ray job id: its
placement groups' bundles (the nodes they were placed on), plus GPU actors and running GPU
tasks outside a placement group. What Shaper should know of a job that Ray does not
(priority, kind, team, a checkpoint directory) is its submission metadata:

=====================  ========================================================
``shaper.io/priority``  0 … 1,000,000
``shaper.io/kind``      a ``JobKind`` (training, batch_inference …)
``shaper.io/team``, ``shaper.io/queue``, ``shaper.io/sla``
``shaper.io/gpus``      GPUs the job asks for, before its placement groups exist
                        (a requeue sets it on the resubmission)
``shaper.io/checkpoint-dir``  the job checkpoints there itself and resumes from
                        ``SHAPER_RESUME_FROM``: a requeue resubmits it with that
                        variable set to this directory (or to the saga's image)
``shaper.io/checkpointable``  "true": node agents run on the Ray nodes and can
                        checkpoint the job's processes (the saga's checkpoint step)
``shaper.io/cluster-selector``, ``shaper.io/allowed-clusters``  the job's residency
                        (``region=eu``, ``alpha,beta``: wire.residency)
``shaper.io/speeds``    the job's own speed on GPU models (``A100=1,T4=0.3``:
                        wire.speeds; models as the nodes' ``accelerator_type``)
=====================  ========================================================

**Serve deployments** are elastic services, ``serve:<application>/<deployment>``: their
replicas and the nodes those run on come from Serve's REST API.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from connectors.ray.config import RayConnectorConfig
from wire.residency import read_residency
from wire.speeds import SPEEDS_KEY, read_speeds
from wire.telemetry import (
    NAME_PATTERN,
    AllocationReport,
    JobKind,
    JobReport,
    JobShape,
    JobState,
    NodeReport,
    NodeState,
)

JOB_KEY = "shaper.io/job"
GPUS_KEY = "shaper.io/gpus"
ATTEMPT_KEY = "shaper.io/attempt"
STEP_KEY = "shaper.io/step"
RESUME_KEY = "shaper.io/resume-from"
CHECKPOINT_DIR_KEY = "shaper.io/checkpoint-dir"
CHECKPOINTABLE_KEY = "shaper.io/checkpointable"
RESUME_ENV = "SHAPER_RESUME_FROM"
SERVE_PREFIX = "serve:"
# The namespace Ray Serve runs its controller and replicas in.
SERVE_NAMESPACE = "serve"
HELD_REASON = "held by Shaper until a plan starts it"
RESUBMITTING_REASON = "stopped by Shaper; being submitted again"

RAY_JOB_STATES = {
    "PENDING": JobState.pending,
    "RUNNING": JobState.running,
    "STOPPED": JobState.cancelled,
    "SUCCEEDED": JobState.finished,
    "FAILED": JobState.failed,
}
_NAME = re.compile(NAME_PATTERN)
_ACCELERATOR = "accelerator_type:"
# Labels Ray sets on every node that say nothing a plan can use; kept: everything else.
_MAX_LABEL_KEY, _MAX_LABEL_VALUE = 317, 255


@dataclass(frozen=True)
class RayNode:
    node_id: str
    report: NodeReport


@dataclass(frozen=True)
class Submission:
    """One Jobs API entry, with the Shaper job it belongs to."""

    external_id: str
    submission_id: str
    attempt: int
    raw: dict[str, Any]

    @property
    def metadata(self) -> dict[str, str]:
        return dict(self.raw.get("metadata") or {})

    @property
    def state(self) -> JobState:
        return RAY_JOB_STATES.get(str(self.raw.get("status")), JobState.pending)

    @property
    def ray_job_id(self) -> str | None:
        job_id = self.raw.get("job_id")
        return str(job_id) if job_id else None


@dataclass
class GpuUse:
    """GPUs a Ray job holds per node, and those it asked for (held or not yet)."""

    held: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    asked: float = 0.0


# --- nodes ---------------------------------------------------------------------------------


def node_reports(
    nodes: Iterable[Mapping[str, Any]],
    config: RayConnectorConfig,
    *,
    draining: frozenset[str] = frozenset(),
) -> list[RayNode]:
    """``draining``: the node ids the GCS reports draining."""
    by_name: dict[str, RayNode] = {}
    for node in nodes:
        node_id = str(node["node_id"])
        resources = node.get("resources_total") or {}
        labels = {str(k): str(v) for k, v in (node.get("labels") or {}).items()}
        name = labels.get(config.node_name_label, "")
        if not _NAME.match(name):
            name = node_id
        gpus = int(resources.get(config.gpu_resource, 0))
        alive = node.get("state") == "ALIVE"
        state = NodeState.down
        if alive:
            state = NodeState.draining if node_id in draining else NodeState.up
        report = NodeReport(
            name=name,
            gpu_model=gpu_model(labels, resources, config) if gpus else None,
            gpu_count=gpus,
            cpu_cores=int(resources.get("CPU", 0)),
            memory_mib=int(resources.get("memory", 0)) // 2**20,
            labels={
                key: value
                for key, value in sorted(labels.items())
                if len(key) <= _MAX_LABEL_KEY and len(value) <= _MAX_LABEL_VALUE
            },
            state=state,
        )
        known = by_name.get(name)
        # A node restarted under the same label: the live one is the node now.
        if known is None or (known.report.state is NodeState.down and alive):
            by_name[name] = RayNode(node_id=node_id, report=report)
    return sorted(by_name.values(), key=lambda node: node.report.name)


def gpu_model(
    labels: Mapping[str, str], resources: Mapping[str, Any], config: RayConnectorConfig
) -> str:
    if labels.get(config.gpu_model_label):
        return labels[config.gpu_model_label][:64]
    accelerators = sorted(k[len(_ACCELERATOR) :] for k in resources if k.startswith(_ACCELERATOR))
    return accelerators[0][:64] if accelerators else config.default_gpu_model


# --- jobs ----------------------------------------------------------------------------------


def submissions(jobs: Iterable[Mapping[str, Any]]) -> dict[str, list[Submission]]:
    """Jobs API entries grouped by Shaper job, each group oldest attempt first. Drivers
    that were not submitted (``ray.init`` in a script) have no submission id: Shaper
    cannot stop or resubmit them, so they are left out here (their GPUs still count on
    their nodes through the placement groups and actors, see :func:`job_reports`)."""
    grouped: dict[str, list[Submission]] = defaultdict(list)
    for raw in jobs:
        submission_id = raw.get("submission_id")
        if not submission_id:
            continue
        metadata = raw.get("metadata") or {}
        external_id = str(metadata.get(JOB_KEY) or submission_id)
        attempt = _int(metadata.get(ATTEMPT_KEY), 0)
        grouped[external_id].append(Submission(external_id, str(submission_id), attempt, dict(raw)))
    for group in grouped.values():
        group.sort(key=lambda s: (s.attempt, s.raw.get("start_time") or 0))
    return dict(grouped)


def gpu_use(
    placement_groups: Iterable[Mapping[str, Any]],
    actors: Iterable[Mapping[str, Any]],
    tasks: Iterable[Mapping[str, Any]],
    node_names: Mapping[str, str],
    gpu_resource: str,
) -> dict[str, GpuUse]:
    """By Ray job id: GPUs held per node name (placement groups' placed bundles, then
    actors and running tasks outside a placement group) and asked for in all."""
    use: dict[str, GpuUse] = defaultdict(GpuUse)
    for group in placement_groups:
        job_id = group.get("creator_job_id")
        if not job_id or group.get("state") == "REMOVED":
            continue
        for bundle in group.get("bundles") or []:
            gpus = float((bundle.get("unit_resources") or {}).get(gpu_resource, 0))
            if not gpus:
                continue
            use[job_id].asked += gpus
            node = node_names.get(bundle.get("node_id") or "")
            if group.get("state") == "CREATED" and node:
                use[job_id].held[node] += gpus
    for item in [*actors, *tasks]:
        job_id = item.get("job_id")
        if not job_id or item.get("placement_group_id"):
            continue  # a placement group's GPUs are counted once, above
        if item.get("ray_namespace") == SERVE_NAMESPACE:
            continue  # Serve's replicas are their deployment's (serve_reports), not a job's
        gpus = float((item.get("required_resources") or {}).get(gpu_resource, 0))
        node = node_names.get(item.get("node_id") or "")
        if gpus and node:
            use[job_id].asked += gpus
            use[job_id].held[node] += gpus
    return use


def job_report(
    submission: Submission,
    use: GpuUse | None,
    config: RayConnectorConfig,
    *,
    node_gpus: Mapping[str, int],
    held: bool = False,
    held_reason: str = HELD_REASON,
    restarts: int = 0,
) -> JobReport:
    """The Shaper job a submission stands for. ``held``: Shaper stopped it and will submit
    it again (connectors.ray.held), so it is pending, not cancelled."""
    metadata = submission.metadata
    state = JobState.pending if held else submission.state
    allocations: list[AllocationReport] = []
    if state is JobState.running and use is not None:
        for node, gpus in sorted(use.held.items()):
            # Ray hands out fractions of a GPU; Shaper counts whole ones, and a node
            # never holds more than it has.
            whole = min(math.ceil(gpus - 1e-9), node_gpus.get(node, 0))
            if whole > 0:
                allocations.append(AllocationReport(node=node, gpu_count=whole))
    asked = math.ceil((use.asked if use else 0) - 1e-9)
    requested = max(_int(metadata.get(GPUS_KEY), asked), sum(a.gpus for a in allocations))
    start = _ms(submission.raw.get("start_time"))
    end = _ms(submission.raw.get("end_time")) if not held else None
    return JobReport(
        external_id=submission.external_id,
        name=str(submission.raw.get("entrypoint") or "")[:255],
        team=metadata.get("shaper.io/team", "default")[:128],
        queue=metadata.get("shaper.io/queue", "default")[:128],
        kind=_kind(metadata.get("shaper.io/kind"), config.default_kind),
        priority=min(
            max(_int(metadata.get("shaper.io/priority"), config.default_priority), 0), 1_000_000
        ),
        sla_class=metadata.get("shaper.io/sla", config.default_sla_class)[:64],
        gpus_requested=requested,
        # Shaper's "checkpointable" means a node agent can checkpoint the job (the saga's
        # checkpoint step). A Ray job with a checkpoint directory checkpoints itself and
        # resumes from it when the connector resubmits it; say so only when agents run
        # on the Ray nodes too.
        checkpointable=metadata.get(CHECKPOINTABLE_KEY, "").lower() == "true",
        submit_time=start,
        start_time=start if state is not JobState.pending else None,
        end_time=end if end is not None and start is not None and end >= start else None,
        state=state,
        reason=held_reason if held else str(submission.raw.get("message") or "")[:255],
        restart_count=restarts,
        allocations=allocations,
        residency=read_residency(metadata, job=submission.external_id),
        speeds=read_speeds(metadata.get(SPEEDS_KEY), job=submission.external_id),
    )


# --- Serve ---------------------------------------------------------------------------------


def serve_external_id(application: str, deployment: str) -> str:
    return f"{SERVE_PREFIX}{application}/{deployment}"


def parse_serve_id(external_id: str) -> tuple[str, str] | None:
    """``serve:<application>/<deployment>`` → its two names; None for other ids."""
    if not external_id.startswith(SERVE_PREFIX):
        return None
    application, slash, deployment = external_id[len(SERVE_PREFIX) :].partition("/")
    if not slash or not application or not deployment or "/" in deployment:
        return None
    return application, deployment


def serve_reports(
    applications: Mapping[str, Mapping[str, Any]],
    config: RayConnectorConfig,
    *,
    node_names: Mapping[str, str],
    node_gpus: Mapping[str, int],
) -> list[JobReport]:
    reports = []
    for application_name, application in sorted(applications.items()):
        for deployment_name, deployment in sorted((application.get("deployments") or {}).items()):
            external_id = serve_external_id(application_name, deployment_name)
            if not _NAME.match(external_id):
                continue  # a name Shaper cannot carry: not reported rather than mangled
            per_replica = float(
                (deployment.get("required_resources") or {}).get(config.gpu_resource, 0)
            )
            running: dict[str, int] = defaultdict(int)
            for replica in deployment.get("replicas") or []:
                node = node_names.get(replica.get("node_id") or "")
                if replica.get("state") == "RUNNING" and node:
                    running[node] += 1
            replicas = sum(running.values())
            deployment_config = deployment.get("deployment_config") or {}
            target = _int(deployment.get("target_num_replicas"), replicas)
            autoscaling = deployment_config.get("autoscaling_config") or {}
            low = _int(autoscaling.get("min_replicas"), config.serve_min_replicas)
            high = max(
                _int(autoscaling.get("max_replicas"), config.serve_max_replicas), target, low
            )
            allocations = []
            for node, count in sorted(running.items()):
                whole = min(math.ceil(count * per_replica - 1e-9), node_gpus.get(node, 0))
                if whole > 0:
                    allocations.append(AllocationReport(node=node, gpu_count=whole))
            reports.append(
                JobReport(
                    external_id=external_id,
                    name=f"{application_name}/{deployment_name}"[:255],
                    kind=JobKind.realtime_inference,
                    shape=JobShape.elastic,
                    priority=config.serve_priority,
                    gpus_requested=max(
                        math.ceil(target * per_replica - 1e-9), sum(a.gpus for a in allocations)
                    ),
                    min_replicas=low,
                    max_replicas=high,
                    replicas=replicas,
                    state=JobState.running if replicas else JobState.pending,
                    reason=str(deployment.get("message") or deployment.get("status") or "")[:255],
                    allocations=allocations,
                )
            )
    return reports


# --- helpers -------------------------------------------------------------------------------


def _int(value: Any, default: int) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return default


def _kind(value: str | None, default: JobKind) -> JobKind:
    try:
        return JobKind(value) if value else default
    except ValueError:
        return default


def _ms(value: Any) -> datetime | None:
    if not value:
        return None
    return datetime.fromtimestamp(int(value) / 1000, tz=UTC)


def fit_to_nodes(jobs: list[JobReport], node_gpus: Mapping[str, int]) -> list[JobReport]:
    """The jobs with their GPUs per node cut to what each node has. Ray hands out
    fractions of a GPU and Shaper counts whole ones: four jobs holding half a GPU each on a
    two-GPU node would count four, and the control plane refuses a push that holds more
    GPUs on a node than it has. Earlier jobs in the list keep theirs first."""
    left = dict(node_gpus)
    fitted = []
    for job in jobs:
        allocations = []
        for allocation in job.allocations:
            whole = min(allocation.gpus, left.get(allocation.node, 0))
            left[allocation.node] = left.get(allocation.node, 0) - whole
            if whole > 0:
                allocations.append(AllocationReport(node=allocation.node, gpu_count=whole))
        if allocations != job.allocations:
            job = job.model_copy(update={"allocations": allocations})
        fitted.append(job)
    return fitted
