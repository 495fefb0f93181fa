"""Checks a push against what can be true of a cluster, before anything is written.

The wire schema (wire/telemetry.py) checks each value alone: types, ranges, finite
numbers. What needs the rest of the push, the stored state or the clock is checked here,
in one place, for snapshots and deltas (``check_push``) and for a node agent's samples
(``check_sample``). The first violation raises ``Invalid`` (HTTP 422) naming the field
(``jobs[3].allocations[0].gpu_indices[2]``); the caller then writes nothing.

Rules and bounds:

* **References.** GPU models (nodes', a job's allowed ones, those it names a speed on) are
  in the catalogue (a name that differs from one of its names only in case was taken as
  that one before: app.telemetry.model_names); node and job names appear once; an
  allocation or a sample names a node of the cluster and a GPU index below its
  ``gpu_count``; a sample's job is a job of the cluster.
* **Times.** Every time (``sent_at``, a job's ``submit_time``/``start_time``/``end_time``,
  a sample's ``at``) lies in [``EARLIEST`` = 2000-01-01, now + ``FUTURE_SLACK`` = 1 day]:
  earlier is a zeroed clock or a default value, later a broken clock; the slack absorbs
  clock skew between a site and the control plane. A job's times are ordered:
  ``submit_time`` ≤ ``start_time`` ≤ ``end_time`` (each pair checked when both are given).
* **Who holds GPUs.** Only ``running`` and ``suspended`` jobs have allocations (Slurm keeps
  a suspended job's GPUs; every other state has none). Allocations sit on ``up`` or
  ``draining`` nodes — a draining node still runs what it has — never on ``down`` ones.
  A job holds at most what it asked for: ``gpus_requested`` for a block job;
  ``gpus_requested`` (per replica) × max(``replicas``, ``max_replicas``) for an elastic
  service, since a scale-down holds the old replicas until they stop.
* **Occupancy.** Per node, the GPUs held by all jobs together are at most its
  ``gpu_count``, and no GPU index is held by two jobs. A delta is judged merged with the
  stored state: the stored open allocations of jobs it does not mention, on the nodes it
  touches, count too. Conflicts among stored rows alone are not the push's doing and are
  left to the next snapshot, which is judged on its own.
* **Numbers.** ``gpu_util`` and ``cpu_util`` are fractions in [0, 1];
  ``gpu_mem_used_gib`` is at most ``MAX_GPU_MEMORY_GIB`` per GPU the sample covers (one
  with ``gpu_index``, else the node's GPUs); ``mem_used_mib`` at most
  ``MAX_NODE_MEMORY_MIB``; ``demand_replicas`` at most ``MAX_REPLICAS``. Absolute bounds,
  not the catalogue's memory: a catalogue entry a little off must not stop all telemetry.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from app.core.errors import Invalid
from wire.telemetry import (
    MAX_GPU_MEMORY_GIB,
    MAX_NODE_MEMORY_MIB,
    MAX_REPLICAS,
    JobReport,
    JobShape,
    JobState,
    Metric,
    NodeState,
    SampleReport,
    TelemetryDelta,
    TelemetrySnapshot,
)

EARLIEST = datetime(2000, 1, 1, tzinfo=UTC)
FUTURE_SLACK = timedelta(days=1)
HOLDING_STATES = frozenset({JobState.running, JobState.suspended})
_FRACTIONS = frozenset({Metric.gpu_util, Metric.cpu_util})


@dataclass(frozen=True)
class StoredHolding:
    """An open allocation row, as the merged view of a delta needs it."""

    job: str  # external id
    node: str
    gpu_indices: tuple[int, ...]
    gpus: int


@dataclass(frozen=True)
class _Node:
    gpu_count: int
    state: str
    field: str | None  # "nodes[3]" when this push reports it; None when only stored


@dataclass(frozen=True)
class _Holding:
    job: str
    node: str
    gpu_indices: Sequence[int]
    gpus: int
    field: str | None  # "jobs[2].allocations[0]" when from this push; None when stored


def check_push(
    push: TelemetrySnapshot | TelemetryDelta,
    *,
    now: datetime,
    catalogue: Collection[str],
    stored_nodes: Mapping[str, tuple[int, str]],
    stored_jobs: Collection[str],
    stored_holdings: Sequence[StoredHolding],
) -> None:
    """Raise ``Invalid`` at the first rule ``push`` breaks. ``stored_nodes`` maps a node's
    name to (gpu_count, state); the stored arguments matter for deltas only."""
    _check_time(push.sent_at, "sent_at", now)
    nodes, removed = _node_view(push, catalogue, stored_nodes)
    job_names: set[str] = set()
    if isinstance(push, TelemetryDelta):
        job_names = set(stored_jobs) - set(push.removed_jobs)
    reported: list[_Holding] = []
    seen_jobs: set[str] = set()
    for i, job in enumerate(push.jobs):
        where = f"jobs[{i}]"
        if job.external_id in seen_jobs:
            raise Invalid(f"job {job.external_id!r} appears twice", field=f"{where}.external_id")
        seen_jobs.add(job.external_id)
        for k, model in enumerate(job.allowed_gpu_models):
            if model not in catalogue:
                raise Invalid(unknown_model(model), field=f"{where}.allowed_gpu_models[{k}]")
        for model in job.speeds:
            if model not in catalogue:
                raise Invalid(unknown_model(model), field=f"{where}.speeds.{model}")
        _check_job_times(job, where, now)
        if job.allocations:
            reported += _check_allocations(job, nodes, where)
    job_names |= seen_jobs

    merged = reported
    if isinstance(push, TelemetryDelta):
        replaced = seen_jobs | set(push.removed_jobs)
        stored = [
            _Holding(h.job, h.node, h.gpu_indices, h.gpus, None)
            for h in stored_holdings
            if h.job not in replaced
        ]
        merged = stored + reported
    _check_occupancy(merged, nodes, removed)

    node_gpus = {name: node.gpu_count for name, node in nodes.items()}
    for i, sample in enumerate(push.samples):
        check_sample(sample, f"samples[{i}]", now=now, node_gpus=node_gpus, job_names=job_names)


def check_sample(
    sample: SampleReport,
    where: str,
    *,
    now: datetime,
    node_gpus: Mapping[str, int],
    job_names: Collection[str] | None,
) -> None:
    """One sample, ``where`` its path (``samples[4]``); ``job_names`` None: no jobs here."""
    _check_time(sample.at, f"{where}.at", now)
    gpus_covered = 1
    if sample.node is not None:
        if sample.node not in node_gpus:
            raise Invalid(f"sample for unknown node {sample.node!r}", field=f"{where}.node")
        if sample.gpu_index is not None and sample.gpu_index >= node_gpus[sample.node]:
            raise Invalid(
                f"GPU index {sample.gpu_index} does not exist on {sample.node!r}",
                field=f"{where}.gpu_index",
            )
        if sample.gpu_index is None:
            gpus_covered = max(node_gpus[sample.node], 1)
    if sample.job is not None and (job_names is None or sample.job not in job_names):
        raise Invalid(f"sample for unknown job {sample.job!r}", field=f"{where}.job")
    bound = _bound(sample.metric, gpus_covered)
    if sample.value > bound:
        raise Invalid(
            f"{sample.metric.value} = {sample.value} is above its bound {bound:g}",
            field=f"{where}.value",
        )


def _bound(metric: Metric, gpus_covered: int) -> float:
    if metric in _FRACTIONS:
        return 1.0
    if metric is Metric.gpu_mem_used_gib:
        return float(MAX_GPU_MEMORY_GIB * gpus_covered)
    if metric is Metric.mem_used_mib:
        return float(MAX_NODE_MEMORY_MIB)
    return float(MAX_REPLICAS)  # demand_replicas


def _check_time(at: datetime | None, field: str, now: datetime) -> None:
    if at is None:
        return
    if at < EARLIEST:
        raise Invalid(f"{at.isoformat()} is before {EARLIEST.date().isoformat()}", field=field)
    if at > now + FUTURE_SLACK:
        raise Invalid(
            f"{at.isoformat()} is more than {FUTURE_SLACK} after now ({now.isoformat()})",
            field=field,
        )


def _check_job_times(job: JobReport, where: str, now: datetime) -> None:
    _check_time(job.submit_time, f"{where}.submit_time", now)
    _check_time(job.start_time, f"{where}.start_time", now)
    _check_time(job.end_time, f"{where}.end_time", now)
    if job.submit_time and job.start_time and job.start_time < job.submit_time:
        raise Invalid("start_time is before submit_time", field=f"{where}.start_time")
    if job.end_time:
        if job.start_time and job.end_time < job.start_time:
            raise Invalid("end_time is before start_time", field=f"{where}.end_time")
        if job.submit_time and job.end_time < job.submit_time:
            raise Invalid("end_time is before submit_time", field=f"{where}.end_time")


def _node_view(
    push: TelemetrySnapshot | TelemetryDelta,
    catalogue: Collection[str],
    stored_nodes: Mapping[str, tuple[int, str]],
) -> tuple[dict[str, _Node], dict[str, str]]:
    """The cluster's nodes after this push, and the removed ones by name → field path."""
    nodes: dict[str, _Node] = {}
    removed: dict[str, str] = {}
    if isinstance(push, TelemetryDelta):
        removed = {name: f"removed_nodes[{k}]" for k, name in enumerate(push.removed_nodes)}
        nodes = {
            name: _Node(gpu_count, state, None)
            for name, (gpu_count, state) in stored_nodes.items()
            if name not in removed
        }
    seen: set[str] = set()
    for i, node in enumerate(push.nodes):
        if node.name in seen:
            raise Invalid(f"node {node.name!r} appears twice", field=f"nodes[{i}].name")
        seen.add(node.name)
        if node.gpu_model is not None and node.gpu_model not in catalogue:
            raise Invalid(unknown_model(node.gpu_model), field=f"nodes[{i}].gpu_model")
        nodes[node.name] = _Node(node.gpu_count, node.state, f"nodes[{i}]")
    return nodes, removed


def unknown_model(model: str) -> str:
    """What to do about a GPU model name the catalogue lacks (names that differ from one
    of its own only in case are taken as that one before the check: model_names)."""
    return (
        f"unknown GPU model {model!r}: not in the catalogue (GET /api/v1/gpu-models); add "
        "it there (POST /api/v1/gpu-models) or map the scheduler's name onto a catalogue "
        "name with the connector's gpu_model_aliases"
    )


def _gpu_cap(job: JobReport) -> int:
    if job.shape is JobShape.elastic:
        return job.gpus_requested * max(job.replicas, job.max_replicas)
    return job.gpus_requested


def _check_allocations(job: JobReport, nodes: Mapping[str, _Node], where: str) -> list[_Holding]:
    """One job's allocations on their own; returns them for the occupancy check."""
    if job.state not in HOLDING_STATES:
        raise Invalid(
            f"a {job.state.value} job holds no GPUs: only running or suspended jobs have "
            "allocations",
            field=f"{where}.allocations",
        )
    holdings: list[_Holding] = []
    seen_nodes: set[str] = set()
    for k, allocation in enumerate(job.allocations):
        here = f"{where}.allocations[{k}]"
        name = allocation.node
        node = nodes.get(name)
        if node is None:
            raise Invalid(f"allocation on unknown node {name!r}", field=f"{here}.node")
        if name in seen_nodes:
            raise Invalid(f"node {name!r} listed twice for one job", field=f"{here}.node")
        seen_nodes.add(name)
        if node.state == NodeState.down:
            raise Invalid(
                f"node {name!r} is down: a down node holds no allocations", field=f"{here}.node"
            )
        if allocation.gpus > node.gpu_count:
            raise Invalid(
                f"{allocation.gpus} GPUs allocated on a node with {node.gpu_count}",
                field=f"{here}.gpu_count",
            )
        for m, index in enumerate(allocation.gpu_indices):
            if index >= node.gpu_count:
                raise Invalid(
                    f"GPU index {index} does not exist on {name!r} ({node.gpu_count} GPUs)",
                    field=f"{here}.gpu_indices[{m}]",
                )
        holdings.append(
            _Holding(job.external_id, name, allocation.gpu_indices, allocation.gpus, here)
        )
    held = sum(h.gpus for h in holdings)
    cap = _gpu_cap(job)
    if held > cap:
        raise Invalid(
            f"job {job.external_id!r} holds {held} GPUs but requested {cap}",
            field=f"{where}.allocations",
        )
    return holdings


def _check_occupancy(
    holdings: Sequence[_Holding], nodes: Mapping[str, _Node], removed: Mapping[str, str]
) -> None:
    """No node over-committed, no GPU index held twice. Stored holdings come first, so a
    conflict is reported at the reported allocation (or node) that caused it."""
    held: dict[str, int] = {}
    holder: dict[tuple[str, int], str] = {}
    for holding in holdings:
        node = nodes.get(holding.node)
        # The push's field to blame: the allocation it reports, else the node it changed.
        # None: stored rows on a stored node; they still occupy GPUs, but a conflict among
        # them alone is not this push's doing.
        blame = holding.field or (node.field if node else removed.get(holding.node))
        if node is None:
            if blame is not None:
                raise Invalid(
                    f"node {holding.node!r} is removed while job {holding.job!r} holds GPUs on it",
                    field=blame,
                )
            continue
        if blame is not None and holding.field is None and node.state == NodeState.down:
            raise Invalid(
                f"node {holding.node!r} is reported down while job {holding.job!r} holds "
                "GPUs on it",
                field=f"{blame}.state",
            )
        for m, index in enumerate(holding.gpu_indices):
            if blame is not None and index >= node.gpu_count:
                raise Invalid(
                    f"job {holding.job!r} holds GPU {index} on {holding.node!r}, which now "
                    f"has {node.gpu_count}",
                    field=f"{blame}.gpu_count",
                )
            other = holder.setdefault((holding.node, index), holding.job)
            if other != holding.job and blame is not None:
                field = f"{holding.field}.gpu_indices[{m}]" if holding.field else blame
                raise Invalid(
                    f"GPU {index} on {holding.node!r} is already held by job {other!r}",
                    field=field,
                )
        total = held.get(holding.node, 0) + holding.gpus
        held[holding.node] = total
        if total > node.gpu_count and blame is not None:
            raise Invalid(
                f"jobs hold {total} GPUs on {holding.node!r}, which has {node.gpu_count}",
                field=holding.field or f"{blame}.gpu_count",
            )
