"""Alibaba GPU cluster trace 2023 (``openb``, FGD ATC'23): node list and pod list.

Nodes (``openb_node_list_all_node.csv``) → :class:`~sim.workload.Node`:
``sn`` → name, ``gpu`` → GPUs, ``model`` → GPU model, ``cpu_milli`` and ``memory_mib`` kept.
Nodes without GPUs are left out (they cannot host GPU work). GPU models G1/G2/G3 are
undisclosed; every model gets speed 1.0 (the trace gives no throughput).

Pods (``openb_pod_list_*.csv``) → :class:`~sim.workload.BlockJob`:

* ``creation_time`` → ``submit_time``; ``deletion_time − scheduled_time`` → run time
  (pods never scheduled or with no deletion time use ``creation_time`` and the trace end);
* ``num_gpu`` → ``gpus``; ``gpu_milli`` (share of one GPU for a GPU-sharing pod) is kept
  on the job; the replay engine allocates whole GPUs, so a 460-milli pod holds one GPU —
  the fractional-GPU experiment is ``sim.fgd``;
* ``gpu_spec`` (``A|B``, empty = any) → allowed GPU models;
* ``qos`` → priority and preemptibility: ``Guaranteed`` 4, ``LS`` (latency-sensitive) 3,
  ``Burstable`` 2, ``BE`` (best effort) 1; only BE pods are preemptible and checkpointable
  (a latency-sensitive pod is not something to stop);
* ``cpu_milli`` / ``memory_mib`` → per-pod CPU and memory;
* pods with ``num_gpu = 0`` are CPU-only and left out; ``pod_phase`` is ignored (a Failed or
  Pending pod still asked for the resources).

A pod list must have the resource columns (:data:`POD_REQUIRED`); the others may be left
out, as in a list exported from another cluster, and then mean what an empty value means:
no ``name`` → ``pod-<row>``; no ``gpu_spec`` → any GPU model; no ``qos`` → ``BE``
(:data:`DEFAULT_QOS`); no ``scheduled_time`` → scheduled at creation; no
``creation_time`` → the pods arrive in the file's order, one second apart. A replay also
needs ``deletion_time`` (a pod's run time); the inflation experiment does not (its pods
never leave). A missing required column is an error that names it and the columns found.

Refused, naming the line: a negative, NaN or infinite number; ``gpu_milli`` above 1000; a
pod deleted before it was created or scheduled; two pods or two nodes of one name; a GPU
node without a model; a replay's pod list where no pod has a ``deletion_time``; a pod list
without a GPU pod, and a node list without a GPU node.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from sim.traces.common import (
    TraceError,
    TraceInput,
    TraceOptions,
    csv_rows,
    make_workload,
    number,
    refuse_duplicate_ids,
    refuse_no_rows,
    shape_jobs,
    whole,
)
from sim.workload import BlockJob, GpuModel, JobKind, Node, Workload

QOS_PRIORITY = {"Guaranteed": 4.0, "LS": 3.0, "Burstable": 2.0, "BE": 1.0}
DEFAULT_QOS = "BE"
NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_REQUIRED = ("cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
POD_OPTIONAL = ("name", "gpu_spec", "qos", "creation_time", "scheduled_time", "deletion_time")
# A replay needs each pod's run time; the inflation experiment needs only its request.
REPLAY_REQUIRED = (*POD_REQUIRED, "deletion_time")
# gpu_milli is the share of one GPU in thousandths.
FULL_GPU_MILLI = 1000


def require_columns(
    path: str | Path,
    fieldnames: Sequence[str] | None,
    needed: Sequence[str],
    *,
    what: str,
    about: TraceInput = TraceInput.trace,
) -> None:
    """Refuse a CSV without the ``needed`` columns, naming them and the columns it has."""
    found = list(fieldnames or ())
    missing = [column for column in needed if column not in found]
    if missing:
        raise TraceError(
            f"{path}: the {what} has no column {', '.join(missing)}; "
            f"its columns are {found}, and a {what} needs {list(needed)}",
            about=about,
        )


def pod_models(row: dict[str, str]) -> tuple[str, ...]:
    """Allowed GPU models of a pod: ``gpu_spec`` split on ``|``; none (or no column) = any."""
    return tuple(model for model in (row.get("gpu_spec") or "").split("|") if model)


def pod_qos(row: dict[str, str]) -> str:
    return row.get("qos") or DEFAULT_QOS


def node_from_row(path: str | Path, line: int, row: dict[str, str]) -> Node | None:
    """One node-list row; ``None`` for a node without GPUs (it cannot host GPU work)."""
    try:
        gpus = whole(row["gpu"] or 0, "gpu")
        cpu = whole(row["cpu_milli"] or 0, "cpu_milli")
        memory = whole(row["memory_mib"] or 0, "memory_mib")
        if not row["sn"].strip():
            raise ValueError("sn (the node's name) is empty")
        if gpus > 0 and not row["model"].strip():
            raise ValueError(f"the node has {gpus} GPUs and no model; give its GPU model")
    except ValueError as exc:
        raise TraceError(f"{path}:{line}: {exc}", about=TraceInput.nodes) from exc
    if gpus == 0:
        return None
    return Node(name=row["sn"], gpu_model=row["model"], gpus=gpus, cpu_milli=cpu, memory_mib=memory)


def read_alibaba_nodes(path: str | Path) -> tuple[dict[str, GpuModel], list[Node]]:
    header, rows = csv_rows(path, about=TraceInput.nodes)
    require_columns(path, header, NODE_COLUMNS, what="node list", about=TraceInput.nodes)
    nodes: list[Node] = []
    lines: list[int] = []
    for line, row in rows:
        node = node_from_row(path, line, row)
        if node is not None:
            nodes.append(node)
            lines.append(line)
    refuse_duplicate_ids(
        path, zip((n.name for n in nodes), lines, strict=True), what="node", about=TraceInput.nodes
    )
    if not nodes:
        raise TraceError(
            f"{path}: the node list has no node with GPUs (gpu above 0), so no pod could run",
            about=TraceInput.nodes,
        )
    models = {name: GpuModel(name=name) for name in sorted({n.gpu_model for n in nodes})}
    return models, nodes


@dataclass(frozen=True, slots=True)
class PodRow:
    """One pod-list row's numbers, checked; ``deleted`` is 0 where the row has none."""

    line: int
    row: dict[str, str]
    gpus: int
    milli: int
    cpu: int
    memory: int
    created: float
    scheduled: float
    deleted: float


def parse_pod(line: int, row: dict[str, str], created: float | None) -> PodRow:
    """A row's numbers; ``created`` is its arrival where the list has no creation times."""
    if created is None:
        created = number(row["creation_time"] or 0, "creation_time (seconds)", at_least=0)
    milli = whole(row["gpu_milli"] or 0, "gpu_milli")
    if milli > FULL_GPU_MILLI:
        raise ValueError(
            f"gpu_milli is a share of one GPU in thousandths, at most {FULL_GPU_MILLI}, not {milli}"
        )
    scheduled = number(row.get("scheduled_time") or 0, "scheduled_time (seconds)", at_least=0)
    return PodRow(
        line=line,
        row=row,
        gpus=whole(row["num_gpu"] or 0, "num_gpu"),
        milli=milli,
        cpu=whole(row["cpu_milli"] or 0, "cpu_milli"),
        memory=whole(row["memory_mib"] or 0, "memory_mib"),
        created=created,
        scheduled=scheduled or created,
        deleted=number(row["deletion_time"] or 0, "deletion_time (seconds)", at_least=0),
    )


def check_run_times(path: str | Path, pods: list[PodRow], trace_end: float) -> None:
    """Refuse a GPU pod (of ``pods``) deleted before it started, or a list where no pod
    has a deletion time (``trace_end`` 0: no run times to replay)."""
    if trace_end == 0:
        raise TraceError(
            f"{path}: no pod has a deletion_time, so no pod has a run time to replay; "
            "fill deletion_time (shaper sim inflation needs no run times)"
        )
    for pod in pods:
        start = max(pod.scheduled, pod.created)
        end = pod.deleted or trace_end
        if end < start:
            deleted = f"deletion_time {pod.deleted:g}" if pod.deleted else "the trace's end"
            raise TraceError(
                f"{path}:{pod.line}: the pod ends ({deleted}) before it starts "
                f"(creation_time {pod.created:g}, scheduled_time {pod.scheduled:g})"
            )


def read_alibaba_pods(
    path: str | Path, options: TraceOptions, *, shape: bool = True
) -> list[BlockJob]:
    header, rows = csv_rows(path)
    require_columns(path, header, REPLAY_REQUIRED, what="pod list")
    has_creation = "creation_time" in header
    parsed: list[PodRow] = []
    for index, (line, row) in enumerate(rows):
        try:
            # Without creation times the file's order is the arrival order.
            parsed.append(parse_pod(line, row, None if has_creation else float(index)))
        except ValueError as exc:
            raise TraceError(f"{path}:{line}: {exc}") from exc
    refuse_no_rows(path, len(parsed))
    named = [(pod.row["name"], pod.line) for pod in parsed if pod.row.get("name")]
    refuse_duplicate_ids(path, named, what="pod name")
    gpu_pods = [pod for pod in parsed if pod.gpus > 0]
    if not gpu_pods:
        raise TraceError(f"{path}: none of its {len(parsed)} pods asks for a GPU (num_gpu 0)")
    trace_end = max(pod.deleted for pod in parsed)
    check_run_times(path, gpu_pods, trace_end)
    jobs: list[BlockJob] = []
    for index, pod in enumerate(parsed):
        if pod.gpus == 0:
            continue
        qos = pod_qos(pod.row)
        best_effort = qos == "BE"
        jobs.append(
            BlockJob(
                id=pod.row.get("name") or f"pod-{index}",
                submit_time=pod.created,
                gpus=pod.gpus,
                work=max(1.0, (pod.deleted or trace_end) - max(pod.scheduled, pod.created)),
                priority=QOS_PRIORITY.get(qos, 1.0),
                kind=JobKind.batch_inference if not best_effort else JobKind.training,
                gpu_models=pod_models(pod.row),
                checkpointable=best_effort and options.checkpointable,
                preemptible=best_effort,
                image_gb=options.image_gb,
                team=qos,
                gpu_milli=pod.milli if pod.gpus == 1 else FULL_GPU_MILLI,
                cpu_milli=pod.cpu,
                memory_mib=pod.memory,
            )
        )
    return shape_jobs(jobs, options) if shape else jobs


def load_alibaba(
    nodes_path: str | Path, pods_path: str | Path, options: TraceOptions | None = None
) -> Workload:
    options = options or TraceOptions()
    models, nodes = read_alibaba_nodes(nodes_path)
    jobs = read_alibaba_pods(pods_path, options)
    # Pods that name a model the node list lacks could never run: drop the constraint's
    # unknown names (the validator refuses unknown models) and the pod if none remain.
    known = set(models)
    cleaned = []
    for job in jobs:
        if job.gpu_models:
            allowed = tuple(m for m in job.gpu_models if m in known)
            if not allowed:
                continue
            if allowed != job.gpu_models:
                job = replace(job, gpu_models=allowed)
        cleaned.append(job)
    return make_workload(
        f"alibaba:{Path(pods_path).stem}",
        cleaned,
        options,
        gpu_models=models,
        nodes=nodes,
        description=f"Alibaba 2023 trace {pods_path}, {len(cleaned)} GPU pods, {len(nodes)} nodes",
    )
