"""Kueue Workloads → the job reports of their owners (a Job, JobSet …).

A Workload is Kueue's record of one job: its pod sets (``count`` pods of a template each),
``priority`` (from its WorkloadPriorityClass or the pods' PriorityClass), ``queueName``
(a LocalQueue), ``active``, and in its status the admission (ClusterQueue and the
ResourceFlavor of each resource) and conditions. The Kubernetes connector's report of the
owner (connectors.kubernetes.pods) gives the pods, allocations and times; the Workload
overrides what Kueue decides:

* **state and reason**, first that holds:

  1. the owner finished or failed (its own conditions), or the Workload is Finished →
     that;
  2. pods still hold GPUs → ``running`` (also while an evicted or deactivated job's pods
     stop; the reason then says so);
  3. ``spec.active: false`` → ``pending``, reason ``deactivated`` (held: Shaper's hold);
  4. Evicted or Preempted True → ``pending``, reason ``evicted: <message>`` /
     ``preempted: <message>``;
  5. Admitted True → ``pending``, reason ``admitted, pods starting`` (until a pod binds);
  6. QuotaReserved True → ``pending``, the Admitted condition's message (admission checks);
  7. else ``pending`` with QuotaReserved's message: Kueue's "couldn't assign flavors to
     pod set main: insufficient unused quota …".

* **size**: ``gang_size`` = the pods of all pod sets; ``gpus_requested`` = their GPUs
  (never less than what the pods hold).
* **priority**: ``spec.priority``, clamped to 0 … 1,000,000.
* **queue** = the LocalQueue; **team** = label ``shaper.io/team`` if set, else the
  ClusterQueue the LocalQueue points to (Kueue's unit of tenancy and quota), else the
  namespace.
* **allowed_gpu_models**: admitted — the model of the ResourceFlavor assigned to
  ``nvidia.com/gpu``; waiting — the models of the ClusterQueue's GPU flavors; from each
  flavor's ``nodeLabels["nvidia.com/gpu.product"]`` (no restriction if one has none).

* **submit** (a federated move's spec, connectors.kubernetes.submission): only while the
  job waits for admission; an admitted or running Job's template carries its flavor's
  node selectors, and a Kueue cluster cannot take a running job's move (it cannot pin).

A Workload whose owner is not seen (no pods, owner kind not watched) is reported from the
Workload alone, with its owner's external id.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from connectors.kubernetes.nodes import GPU_RESOURCE, PRODUCT_LABEL, gpu_model_name
from connectors.kubernetes.pods import (
    MAX_GANG,
    MAX_PRIORITY,
    TEAM_LABEL,
    JobGroup,
    OwnerRef,
    TranslationContext,
    job_report,
    parse_time,
    pod_spec_gpus,
)
from wire.telemetry import MAX_TIME_LIMIT_S, JobReport, JobShape, JobState

Object = dict[str, Any]


@dataclass(frozen=True)
class KueueQueues:
    """LocalQueue → ClusterQueue, ClusterQueue → its GPU flavors, flavor → GPU product."""

    cluster_queue_of: Mapping[tuple[str, str], str] = field(default_factory=dict)
    gpu_flavors: Mapping[str, list[str]] = field(default_factory=dict)
    flavor_products: Mapping[str, str | None] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        *,
        local_queues: Iterable[Object],
        cluster_queues: Iterable[Object],
        flavors: Iterable[Object],
    ) -> KueueQueues:
        cluster_queue_of = {
            (lq["metadata"].get("namespace", ""), lq["metadata"]["name"]): str(
                (lq.get("spec") or {}).get("clusterQueue", "")
            )
            for lq in local_queues
        }
        gpu_flavors: dict[str, list[str]] = {}
        for cq in cluster_queues:
            names: list[str] = []
            for group in (cq.get("spec") or {}).get("resourceGroups") or []:
                if GPU_RESOURCE in (group.get("coveredResources") or []):
                    names.extend(f["name"] for f in group.get("flavors") or [])
            gpu_flavors[cq["metadata"]["name"]] = names
        flavor_products = {
            f["metadata"]["name"]: ((f.get("spec") or {}).get("nodeLabels") or {}).get(
                PRODUCT_LABEL
            )
            for f in flavors
        }
        return cls(cluster_queue_of, gpu_flavors, flavor_products)

    def models(self, flavors: Iterable[str], aliases: Mapping[str, str]) -> list[str]:
        models: set[str] = set()
        for flavor in flavors:
            product = self.flavor_products.get(flavor)
            if not product:
                return []  # a flavor that does not name its GPU: any model may do
            models.add(gpu_model_name(product, None, aliases=aliases))
        return sorted(models)


def workload_owner(workload: Mapping[str, Any]) -> OwnerRef | None:
    metadata = workload.get("metadata") or {}
    for ref in metadata.get("ownerReferences") or []:
        if ref.get("controller"):
            return OwnerRef(ref["kind"], metadata.get("namespace", "default"), ref["name"])
    return None


def _condition(workload: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for condition in (workload.get("status") or {}).get("conditions") or []:
        if condition.get("type") == kind:
            return dict(condition)
    return None


def _true(workload: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    condition = _condition(workload, kind)
    return condition if condition and condition.get("status") == "True" else None


def workload_state(workload: Mapping[str, Any], base: JobReport | None) -> tuple[JobState, str]:
    """State and reason by the rules of the module docstring."""
    if base is not None and base.state in (JobState.finished, JobState.failed):
        return base.state, base.reason
    finished = _true(workload, "Finished")
    if finished:
        failed = str(finished.get("reason", "")).lower() == "failed"
        return (JobState.failed if failed else JobState.finished), str(
            finished.get("message") or ""
        )
    spec = workload.get("spec") or {}
    evicted = _true(workload, "Evicted")
    preempted = _true(workload, "Preempted")
    if base is not None and base.state is JobState.running:
        if spec.get("active") is False:
            return JobState.running, "deactivated, pods stopping"
        if evicted:
            return JobState.running, f"evicted, pods stopping: {evicted.get('message', '')}"
        return JobState.running, ""
    if spec.get("active") is False:
        return JobState.pending, "deactivated"
    if preempted:
        return JobState.pending, f"preempted: {preempted.get('message', '')}"
    if evicted:
        return JobState.pending, f"evicted: {evicted.get('message', '')}"
    if _true(workload, "Admitted"):
        return JobState.pending, "admitted, pods starting"
    if _true(workload, "QuotaReserved"):
        admitted = _condition(workload, "Admitted")
        message = admitted.get("message") if admitted else None
        return JobState.pending, str(message or "quota reserved, waiting for admission checks")
    reserved = _condition(workload, "QuotaReserved")
    return JobState.pending, str((reserved or {}).get("message") or "waiting in the queue")


def workload_gpus(workload: Mapping[str, Any]) -> tuple[int, int]:
    """(pods, GPUs) of all pod sets."""
    pods = gpus = 0
    for pod_set in (workload.get("spec") or {}).get("podSets") or []:
        count = int(pod_set.get("count") or 0)
        spec = (pod_set.get("template") or {}).get("spec") or {}
        pods += count
        gpus += count * pod_spec_gpus(spec)
    return pods, gpus


def workload_report(
    workload: Mapping[str, Any],
    group: JobGroup,
    context: TranslationContext,
    queues: KueueQueues,
) -> JobReport | None:
    """The owner's report with what Kueue decides; None for a CPU-only job left out."""
    pods, gpus = workload_gpus(workload)
    if gpus == 0 and not context.include_cpu_only:
        return None
    base = job_report(group, _with_cpu_only(context))
    state, reason = workload_state(workload, base)
    metadata = workload.get("metadata") or {}
    spec = workload.get("spec") or {}
    namespace = metadata.get("namespace", "default")
    local_queue = str(spec.get("queueName") or "")
    admission = (workload.get("status") or {}).get("admission") or {}
    cluster_queue = admission.get("clusterQueue") or queues.cluster_queue_of.get(
        (namespace, local_queue)
    )
    team = group.meta("labels").get(TEAM_LABEL) or cluster_queue or namespace
    if admission:
        flavors = {
            a.get("flavors", {}).get(GPU_RESOURCE) for a in admission.get("podSetAssignments") or []
        }
        models = queues.models(sorted(f for f in flavors if f), context.gpu_model_aliases)
    else:
        models = queues.models(
            queues.gpu_flavors.get(cluster_queue or "", []), context.gpu_model_aliases
        )
    held = base.allocations if base is not None and state is JobState.running else []
    held_gpus = sum(a.gpus for a in held)
    fields: dict[str, Any] = (
        base.model_dump()
        if base is not None
        else {
            "external_id": group.external_id,
            "name": group.owner.name[:255],
            "submit_time": parse_time(metadata.get("creationTimestamp")),
        }
    )
    fields.update(
        team=str(team)[:128],
        queue=(local_queue or "default")[:128],
        priority=max(0, min(MAX_PRIORITY, int(spec.get("priority") or 0))),
        state=state,
        reason=reason[:255],
        allocations=held,
        allowed_gpu_models=models,
    )
    if state is not JobState.running:
        fields["allocations"] = []
        fields["start_time"] = fields.get("start_time") if state is not JobState.pending else None
    if fields.get("shape", JobShape.block) is JobShape.block:
        fields.update(
            gang_size=max(1, min(MAX_GANG, pods or 1)),
            gpus_requested=min(100_000, max(gpus, held_gpus)),
        )
    # Kueue deactivates a Workload of any shape once it has run that long.
    limits = [
        limit
        for limit in (fields.get("time_limit_s"), max_execution_s(workload))
        if limit is not None
    ]
    fields["time_limit_s"] = min(limits) if limits else None
    if state is JobState.running:
        fields.pop("required_nodes", None)
    if state is not JobState.pending or admission:
        # An admitted Job's template carries the node selectors and tolerations of the
        # flavor Kueue admitted it to, and Kueue cannot pin a moved Job to a node anyway
        # (connectors.kueue.capabilities): only a job still waiting for admission moves.
        fields["submit"] = None
    return JobReport(**fields)


def max_execution_s(workload: Mapping[str, Any]) -> float | None:
    """Kueue's own time limit: ``spec.maximumExecutionTimeSeconds`` (Kueue deactivates a
    Workload admitted that long, over all its admissions) less what earlier admissions
    ran (``status.accumulatedPastExecutionTimeSeconds``): what this admission may run,
    at least a second. None when not set, or beyond what the wire takes."""
    limit = (workload.get("spec") or {}).get("maximumExecutionTimeSeconds")
    if isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0:
        return None
    past = (workload.get("status") or {}).get("accumulatedPastExecutionTimeSeconds")
    ran = past if isinstance(past, int) and not isinstance(past, bool) and past > 0 else 0
    left = float(max(1, limit - ran))
    return left if left <= MAX_TIME_LIMIT_S else None


def _with_cpu_only(context: TranslationContext) -> TranslationContext:
    # The Workload says whether the job asks for GPUs; the owner's report is needed anyway.
    return replace(context, include_cpu_only=True)
