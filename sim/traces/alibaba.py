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
  the fractional-GPU experiment is ``sim.inflation``;
* ``gpu_spec`` (``A|B``, empty = any) → allowed GPU models;
* ``qos`` → priority and preemptibility: ``Guaranteed`` 4, ``LS`` (latency-sensitive) 3,
  ``Burstable`` 2, ``BE`` (best effort) 1; only BE pods are preemptible and checkpointable
  (a latency-sensitive pod is not something to stop);
* ``cpu_milli`` / ``memory_mib`` → per-pod CPU and memory;
* pods with ``num_gpu = 0`` are CPU-only and left out; ``pod_phase`` is ignored (a Failed or
  Pending pod still asked for the resources).
"""

from __future__ import annotations

import csv
from collections.abc import Sequence
from pathlib import Path

from sim.traces.common import TraceOptions, make_workload, shape_jobs
from sim.workload import BlockJob, GpuModel, JobKind, Node, Workload

QOS_PRIORITY = {"Guaranteed": 4.0, "LS": 3.0, "Burstable": 2.0, "BE": 1.0}
NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
POD_COLUMNS = (
    "name",
    "cpu_milli",
    "memory_mib",
    "num_gpu",
    "gpu_milli",
    "gpu_spec",
    "qos",
    "creation_time",
    "deletion_time",
    "scheduled_time",
)


def _check(path: str | Path, fieldnames: Sequence[str] | None, needed: tuple[str, ...]) -> None:
    missing = set(needed) - set(fieldnames or ())
    if missing:
        raise ValueError(f"{path}: missing columns {sorted(missing)}")


def read_alibaba_nodes(path: str | Path) -> tuple[dict[str, GpuModel], list[Node]]:
    nodes: list[Node] = []
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        _check(path, reader.fieldnames, NODE_COLUMNS)
        for line, row in enumerate(reader, start=2):
            try:
                gpus = int(row["gpu"] or 0)
                cpu = int(row["cpu_milli"] or 0)
                memory = int(row["memory_mib"] or 0)
            except ValueError as exc:
                raise ValueError(f"{path}:{line}: {exc}") from exc
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
    rows: list[dict[str, str]] = []
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        _check(path, reader.fieldnames, POD_COLUMNS)
        rows = list(reader)
    trace_end = max((float(r["deletion_time"] or 0) for r in rows), default=0.0)
    jobs: list[BlockJob] = []
    for line, row in enumerate(rows, start=2):
        try:
            gpus = int(row["num_gpu"] or 0)
            milli = int(row["gpu_milli"] or 0)
            created = float(row["creation_time"] or 0)
            scheduled = float(row["scheduled_time"] or 0) or created
            deleted = float(row["deletion_time"] or 0) or trace_end
        except ValueError as exc:
            raise ValueError(f"{path}:{line}: {exc}") from exc
        if gpus <= 0:
            continue
        qos = row["qos"] or "BE"
        best_effort = qos == "BE"
        models = tuple(m for m in (row["gpu_spec"] or "").split("|") if m)
        jobs.append(
            BlockJob(
                id=row["name"] or f"pod-{line - 2}",
                submit_time=created,
                gpus=gpus,
                work=max(1.0, deleted - max(scheduled, created)),
                priority=QOS_PRIORITY.get(qos, 1.0),
                kind=JobKind.BATCH_INFERENCE if not best_effort else JobKind.TRAINING,
                gpu_models=models,
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
                from dataclasses import replace

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
