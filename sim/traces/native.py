"""Shaper's own trace format, for a site to export its history: CSV or JSON.

CSV, one job per row (header required; only the first four columns are mandatory)::

    id,submit_s,gpus,duration_s,priority,kind,gpu_models,checkpointable,checkpoint_interval_s,image_gb,team,preemptible
    j1,0,4,7200,3,training,H100|A100,true,3600,40,research,true

* ``submit_s``: submission time in seconds (any origin; re-based to the first job);
* ``duration_s``: run time on the reference GPU model (speed 1.0);
* ``gpu_models``: ``|``-separated allowed models, empty = any;
* booleans: ``true``/``false``/``1``/``0``/``yes``/``no``.

JSON: either a list of job objects with the same keys, or an object with ``jobs`` and
optionally ``nodes`` (``name``, ``gpus``, ``gpu_model``, ``cluster``), ``gpu_models``
(``name → {memory_gb, speed, fp8}``) and ``services`` (``id``, ``hourly_demand``,
``gpus_per_replica``, ``min_replicas``, ``max_replicas``, ``priority``, ``gpu_models``).
Without ``nodes`` the trace is replayed on a homogeneous cluster of ``TraceOptions.gpus``
GPUs in nodes of ``gpus_per_node`` (default :data:`CLUSTER`: 64 GPUs in nodes of 8,
Shaper's own choice, as a site's export names no replay setup); with ``nodes`` it replays
on them, and asking for a cluster size as well is an error rather than silently ignored.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from sim.traces.cluster import PublishedCluster, choose_cluster
from sim.traces.common import (
    TraceError,
    TraceInput,
    TraceOptions,
    homogeneous_cluster,
    make_workload,
    require_header,
    shape_jobs,
)
from sim.workload import BlockJob, GpuModel, JobKind, Node, Service, Workload, service_from_record

REQUIRED = ("id", "submit_s", "gpus", "duration_s")
TRUE = {"1", "true", "yes", "y", "t"}
CLUSTER = PublishedCluster(gpus=64, gpus_per_node=8, source="Shaper's default for its own format")


def has_node_list(path: str | Path) -> bool:
    """Whether the trace brings its own nodes (a JSON object with ``nodes``)."""
    path = Path(path)
    if path.suffix != ".json":
        return False
    data = json.loads(path.read_text())
    return isinstance(data, dict) and bool(data.get("nodes"))


def _bool(value: Any, default: bool) -> bool:
    if value is None or value == "":
        return default
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() in TRUE


def _models(value: Any) -> tuple[str, ...]:
    if not value:
        return ()
    if isinstance(value, list | tuple):
        return tuple(str(v) for v in value)
    return tuple(m for m in str(value).split("|") if m)


def job_from_record(record: dict[str, Any], options: TraceOptions, where: str) -> BlockJob:
    missing = [key for key in REQUIRED if record.get(key) in (None, "")]
    if missing:
        raise TraceError(f"{where}: missing {missing}")
    try:
        return BlockJob(
            id=str(record["id"]),
            submit_time=float(record["submit_s"]),
            gpus=int(record["gpus"]),
            work=float(record["duration_s"]),
            priority=float(record.get("priority") or 1.0),
            kind=JobKind(record.get("kind") or "training"),
            gpu_models=_models(record.get("gpu_models")),
            checkpointable=_bool(record.get("checkpointable"), options.checkpointable),
            checkpoint_interval=float(
                record.get("checkpoint_interval_s") or options.checkpoint_interval_h * 3600
            ),
            image_gb=float(record.get("image_gb") or options.image_gb),
            team=str(record.get("team") or "default"),
            preemptible=_bool(record.get("preemptible"), True),
        )
    except ValueError as exc:
        raise TraceError(f"{where}: {exc}") from exc


def load_native(path: str | Path, options: TraceOptions | None = None) -> Workload:
    options = options or TraceOptions()
    path = Path(path)
    models: dict[str, GpuModel] | None = None
    nodes: list[Node] | None = None
    services: list[Service] = []
    if path.suffix == ".json":
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise TraceError(f"{path}: not JSON ({exc})") from exc
        records = data if isinstance(data, list) else data.get("jobs", [])
        if isinstance(data, dict) and data.get("nodes"):
            if options.gpus is not None or options.gpus_per_node is not None:
                raise TraceError(
                    f"{path} lists its nodes: the replay runs on them, so --gpus and "
                    "--gpus-per-node do not apply; leave them out",
                    about=TraceInput.cluster,
                )
            nodes = [
                Node(
                    name=str(n["name"]),
                    gpus=int(n["gpus"]),
                    gpu_model=str(n.get("gpu_model", options.gpu_model)),
                    cluster=str(n.get("cluster", "default")),
                )
                for n in data["nodes"]
            ]
            declared = data.get("gpu_models", {})
            models = {
                name: GpuModel(
                    name=name,
                    memory_gb=int(declared.get(name, {}).get("memory_gb", 80)),
                    speed=float(declared.get(name, {}).get("speed", 1.0)),
                    fp8=bool(declared.get(name, {}).get("fp8", False)),
                )
                for name in sorted({n.gpu_model for n in nodes} | set(declared))
            }
        if isinstance(data, dict):
            services = [service_from_record(s) for s in data.get("services", [])]
        jobs = [job_from_record(r, options, f"{path}: job {i}") for i, r in enumerate(records)]
    else:
        with open(path, newline="") as handle:
            reader = csv.DictReader(handle)
            require_header(path, reader.fieldnames, REQUIRED)
            jobs = [
                job_from_record(row, options, f"{path}:{line}")
                for line, row in enumerate(reader, start=2)
            ]
    shaped = shape_jobs(jobs, options)
    if services:
        options = options.with_(services=tuple(services))
    if nodes is None or models is None:
        cluster = choose_cluster(options, CLUSTER)
        models, nodes = homogeneous_cluster(
            gpus=cluster.gpus, gpus_per_node=cluster.gpus_per_node, gpu_model=options.gpu_model
        )
    return make_workload(
        f"trace:{path.name}",
        shaped,
        options,
        gpu_models=models,
        nodes=nodes,
        description=f"trace {path}, {len(shaped)} jobs",
    )
