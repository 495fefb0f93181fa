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
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from sim.traces.common import TraceError, TraceInput, TraceOptions, make_workload, shape_jobs
from sim.workload import BlockJob, GpuModel, JobKind, Node, Workload

QOS_PRIORITY = {"Guaranteed": 4.0, "LS": 3.0, "Burstable": 2.0, "BE": 1.0}
DEFAULT_QOS = "BE"
NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_REQUIRED = ("cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
POD_OPTIONAL = ("name", "gpu_spec", "qos", "creation_time", "scheduled_time", "deletion_time")
# A replay needs each pod's run time; the inflation experiment needs only its request.
REPLAY_REQUIRED = (*POD_REQUIRED, "deletion_time")


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


def read_alibaba_nodes(path: str | Path) -> tuple[dict[str, GpuModel], list[Node]]:
    nodes: list[Node] = []
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        require_columns(
            path, reader.fieldnames, NODE_COLUMNS, what="node list", about=TraceInput.nodes
        )
        for line, row in enumerate(reader, start=2):
            try:
                gpus = int(row["gpu"] or 0)
                cpu = int(row["cpu_milli"] or 0)
                memory = int(row["memory_mib"] or 0)
            except ValueError as exc:
                raise TraceError(f"{path}:{line}: {exc}", about=TraceInput.nodes) from exc
            if gpus <= 0 or not row["model"]:
                continue
            nodes.append(
                Node(
                    name=row["sn"],
                    gpu_model=row["model"],
                    gpus=gpus,
                    cpu_milli=cpu,
                    memory_mib=memory,
                )
            )
    models = {name: GpuModel(name=name) for name in sorted({n.gpu_model for n in nodes})}
    return models, nodes


def read_alibaba_pods(
    path: str | Path, options: TraceOptions, *, shape: bool = True
) -> list[BlockJob]:
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        require_columns(path, reader.fieldnames, REPLAY_REQUIRED, what="pod list")
        has_creation = "creation_time" in (reader.fieldnames or ())
        rows = list(reader)
    parsed = []
    for index, row in enumerate(rows):
        try:
            # Without creation times the file's order is the arrival order.
            created = float(row["creation_time"] or 0) if has_creation else float(index)
            parsed.append(
                (
                    row,
                    int(row["num_gpu"] or 0),
                    int(row["gpu_milli"] or 0),
                    created,
                    float(row.get("scheduled_time") or 0) or created,
                    float(row["deletion_time"] or 0),
                )
            )
        except ValueError as exc:
            raise TraceError(f"{path}:{index + 2}: {exc}") from exc
    trace_end = max((deleted for *_, deleted in parsed), default=0.0)
    jobs: list[BlockJob] = []
    for index, (row, gpus, milli, created, scheduled, deleted) in enumerate(parsed):
        if gpus <= 0:
            continue
        qos = pod_qos(row)
        best_effort = qos == "BE"
        jobs.append(
            BlockJob(
                id=row.get("name") or f"pod-{index}",
                submit_time=created,
                gpus=gpus,
                work=max(1.0, (deleted or trace_end) - max(scheduled, created)),
                priority=QOS_PRIORITY.get(qos, 1.0),
                kind=JobKind.batch_inference if not best_effort else JobKind.training,
                gpu_models=pod_models(row),
                checkpointable=best_effort and options.checkpointable,
                preemptible=best_effort,
                image_gb=options.image_gb,
                team=qos,
                gpu_milli=milli if gpus == 1 else 1000,
                cpu_milli=int(row["cpu_milli"] or 0),
                memory_mib=int(row["memory_mib"] or 0),
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
