"""Shaper's own trace format, for a site to export its history: CSV or JSON.

CSV, one job per row (header required; only the first four columns are mandatory)::

    id,submit_s,gpus,duration_s,priority,kind,gpu_models,checkpointable,checkpoint_interval_s,image_gb,team,preemptible,speeds
    j1,0,4,7200,3,training,H100|A100,true,3600,40,research,true,H100=2.5|A100=1

* ``submit_s``: submission time in seconds (any origin; re-based to the first job);
* ``duration_s``: run time on the reference GPU model (speed 1.0);
* ``gpu_models``: ``|``-separated allowed models, empty = any;
* ``speeds``: the job's own speed on GPU models, ``MODEL=SPEED`` entries ``|``-separated
  (in JSON also an object, ``{"H100": 2.5}``), each in [0.01, 100] on the models' scale
  (as a live job's ``shaper.io/speeds``, wire.speeds): it runs ``duration_s / SPEED``
  there, and the models it names no speed for at theirs; empty = its models' speeds;
* booleans: ``true``/``false``/``1``/``0``/``yes``/``no``.

JSON: either a list of job objects with the same keys, or an object with ``jobs`` and
optionally ``nodes`` (``name``, ``gpus``, ``gpu_model``, ``cluster``), ``gpu_models``
(``name → {memory_gb, speed, fp8}``) and ``services`` (``id``, ``hourly_demand``,
``gpus_per_replica``, ``min_replicas``, ``max_replicas``, ``priority``, ``gpu_models``).
Without ``nodes`` the trace is replayed on a homogeneous cluster of ``TraceOptions.gpus``
GPUs in nodes of ``gpus_per_node`` (default :data:`CLUSTER`: 64 GPUs in nodes of 8,
Shaper's own choice, as a site's export names no replay setup); with ``nodes`` it replays
on them, and asking for a cluster size as well is an error rather than silently ignored.

Refused, naming the row or the entry: a missing required value; ``gpus`` that is not a whole
number of at least 1; a ``duration_s`` that is not a positive finite number; a NaN or
infinite number anywhere; a boolean that is not one of the spellings above; an unknown
``kind``; two jobs of one ``id``; a job none of whose ``gpu_models`` the replay cluster
has (it could never run); a speed that is not ``MODEL=SPEED`` in [0.01, 100], or on a
model the replay cluster does not have; in JSON, a key other than ``jobs``, ``nodes``,
``gpu_models`` and ``services``, ``gpu_models`` without ``nodes``, and a file with
neither jobs nor services.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sim.traces.cluster import PublishedCluster, choose_cluster
from sim.traces.common import (
    TraceError,
    TraceInput,
    TraceOptions,
    csv_rows,
    homogeneous_cluster,
    make_workload,
    number,
    read_text,
    refuse_duplicate_ids,
    refuse_no_rows,
    require_header,
    shape_jobs,
    whole,
)
from sim.workload import BlockJob, GpuModel, JobKind, Node, Service, Workload, service_from_record
from wire.telemetry import MAX_JOB_SPEED, MIN_JOB_SPEED

REQUIRED = ("id", "submit_s", "gpus", "duration_s")
TRUE = {"1", "true", "yes", "y", "t"}
FALSE = {"0", "false", "no", "n", "f"}
KINDS = tuple(kind.value for kind in JobKind)
# The keys of a JSON trace object.
JSON_KEYS = ("jobs", "nodes", "gpu_models", "services")
CLUSTER = PublishedCluster(gpus=64, gpus_per_node=8, source="Shaper's default for its own format")


def read_json(path: str | Path) -> Any:
    try:
        return json.loads(read_text(path))
    except json.JSONDecodeError as exc:
        raise TraceError(f"{path}: not JSON ({exc})") from exc


def has_node_list(path: str | Path) -> bool:
    """Whether the trace brings its own nodes (a JSON object with ``nodes``)."""
    path = Path(path)
    if path.suffix != ".json":
        return False
    data = read_json(path)
    return isinstance(data, dict) and bool(data.get("nodes"))


def _given(record: dict[str, Any], key: str) -> Any:
    """A record's value, ``None`` where it is missing or empty (an empty CSV cell); a JSON
    ``0`` or ``false`` is a value, not a missing one."""
    value = record.get(key)
    return None if value is None or value == "" else value


def _bool(value: Any, default: bool, field: str) -> bool:
    if value is None or value == "":
        return default
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in TRUE or text in FALSE:
        return text in TRUE
    raise ValueError(f"{field} must be true or false (yes/no, 1/0), not {value!r}")


def _models(value: Any) -> tuple[str, ...]:
    if not value:
        return ()
    if isinstance(value, list | tuple):
        return tuple(str(v) for v in value)
    if isinstance(value, str):
        return tuple(m for m in value.split("|") if m)
    raise ValueError(f"gpu_models must be a list or A|B, not {value!r}")


def _speeds(value: Any) -> tuple[tuple[str, float], ...]:
    """``H100=2.5|A100=1`` (or, in JSON, ``{"H100": 2.5}``) → ``(("H100", 2.5), …)``."""
    if value is None or value == "":
        return ()
    if isinstance(value, dict):
        pairs = [(str(model), speed) for model, speed in value.items()]
    elif isinstance(value, str):
        pairs = []
        for entry in value.split("|"):
            model, equals, speed = (part.strip() for part in entry.partition("="))
            if not (equals and model):
                raise ValueError(f"speeds must be MODEL=SPEED|MODEL=SPEED, not {value!r}")
            pairs.append((model, speed))
    else:
        raise ValueError(f"speeds must be MODEL=SPEED|… or an object, not {value!r}")
    speeds = {}
    for model, speed in pairs:
        number_ = number(speed, f"speeds {model}", at_least=MIN_JOB_SPEED)
        if number_ > MAX_JOB_SPEED:
            raise ValueError(f"speeds {model} must be at most {MAX_JOB_SPEED:g}, not {speed!r}")
        speeds[model] = number_
    return tuple(speeds.items())


def _kind(value: Any) -> JobKind:
    kind = value or "training"
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, not {kind!r}")
    return JobKind(kind)


def job_from_record(record: Any, options: TraceOptions, where: str) -> BlockJob:
    if not isinstance(record, dict):
        raise TraceError(f"{where}: a job must be an object with {list(REQUIRED)}, not {record!r}")
    missing = [key for key in REQUIRED if _given(record, key) is None]
    if missing:
        raise TraceError(f"{where}: missing {missing}")
    priority = _given(record, "priority")
    interval = _given(record, "checkpoint_interval_s")
    image_gb = _given(record, "image_gb")
    try:
        return BlockJob(
            id=str(record["id"]),
            submit_time=number(record["submit_s"], "submit_s (seconds)"),
            gpus=whole(record["gpus"], "gpus", at_least=1),
            work=number(record["duration_s"], "duration_s (seconds)", above=0),
            priority=1.0 if priority is None else number(priority, "priority", at_least=0),
            kind=_kind(_given(record, "kind")),
            gpu_models=_models(record.get("gpu_models")),
            checkpointable=_bool(
                record.get("checkpointable"), options.checkpointable, "checkpointable"
            ),
            checkpoint_interval=options.checkpoint_interval_h * 3600
            if interval is None
            else number(interval, "checkpoint_interval_s", at_least=0),
            image_gb=options.image_gb
            if image_gb is None
            else number(image_gb, "image_gb", at_least=0),
            team=str(record.get("team") or "default"),
            preemptible=_bool(record.get("preemptible"), True, "preemptible"),
            speeds=_speeds(_given(record, "speeds")),
        )
    except ValueError as exc:
        raise TraceError(f"{where}: {exc}") from exc


def _entries(path: Path, data: dict[str, Any], key: str) -> list[Any]:
    value = data.get(key, [])
    if not isinstance(value, list):
        raise TraceError(f"{path}: {key} must be a list, not {type(value).__name__}")
    return value


def _node(path: Path, index: int, entry: Any, options: TraceOptions) -> Node:
    where = f"{path}: nodes[{index}]"
    if not isinstance(entry, dict):
        raise TraceError(f"{where}: a node must be an object with name and gpus, not {entry!r}")
    if _given(entry, "name") is None:
        raise TraceError(f"{where}: missing name")
    try:
        gpus = whole(entry.get("gpus"), "gpus", at_least=1)
    except ValueError as exc:
        raise TraceError(f"{where}: {exc}") from exc
    return Node(
        name=str(entry["name"]),
        gpus=gpus,
        gpu_model=str(entry.get("gpu_model", options.gpu_model)),
        cluster=str(entry.get("cluster", "default")),
    )


def _gpu_model(path: Path, name: str, entry: Any) -> GpuModel:
    where = f"{path}: gpu_models.{name}"
    if not isinstance(entry, dict):
        raise TraceError(f"{where}: expected an object (memory_gb, speed, fp8), not {entry!r}")
    try:
        return GpuModel(
            name=name,
            memory_gb=whole(entry.get("memory_gb", 80), "memory_gb", at_least=1),
            speed=number(entry.get("speed", 1.0), "speed", above=0),
            fp8=_bool(entry.get("fp8"), False, "fp8"),
        )
    except ValueError as exc:
        raise TraceError(f"{where}: {exc}") from exc


def _cluster_of(
    path: Path, data: dict[str, Any], options: TraceOptions
) -> tuple[dict[str, GpuModel], list[Node]]:
    """The nodes and GPU models a JSON trace lists."""
    if options.gpus is not None or options.gpus_per_node is not None:
        raise TraceError(
            f"{path} lists its nodes: the replay runs on them, so --gpus and "
            "--gpus-per-node do not apply; leave them out",
            about=TraceInput.cluster,
        )
    nodes = [
        _node(path, i, entry, options) for i, entry in enumerate(_entries(path, data, "nodes"))
    ]
    refuse_duplicate_ids(
        path, ((n.name, i) for i, n in enumerate(nodes)), what="node name", unit="nodes entry"
    )
    declared = data.get("gpu_models", {})
    if not isinstance(declared, dict):
        raise TraceError(f"{path}: gpu_models must be an object (name: {{speed, ...}})")
    names = sorted({n.gpu_model for n in nodes} | set(declared))
    return {name: _gpu_model(path, name, declared.get(name, {})) for name in names}, nodes


def _services(path: Path, data: dict[str, Any]) -> list[Service]:
    services = []
    for index, record in enumerate(_entries(path, data, "services")):
        where = f"{path}: services[{index}]"
        if not isinstance(record, dict):
            raise TraceError(f"{where}: a service must be an object, not {record!r}")
        try:
            services.append(service_from_record(record))
        except KeyError as exc:
            raise TraceError(f"{where}: missing {exc.args[0]!r}") from exc
        except (TypeError, ValueError) as exc:
            raise TraceError(f"{where}: {exc}") from exc
    return services


def refuse_unrunnable(
    jobs: Sequence[BlockJob], wheres: Sequence[str], models: dict[str, GpuModel], listed: bool
) -> None:
    """Refuse a job none of whose GPU models the replay cluster has: it could never run;
    and speeds on a model the cluster lacks (a typo the replay would otherwise ignore)."""
    for job, where in zip(jobs, wheres, strict=True):
        unknown = sorted({model for model, _ in job.speeds} - set(models))
        if unknown:
            raise TraceError(
                f"{where}: job {job.id} names speeds on {unknown}, which the replay cluster "
                f"does not have (it has {sorted(models)})"
            )
        if job.gpu_models and not set(job.gpu_models) & set(models):
            fix = (
                "name a model of its nodes"
                if listed
                else "a CSV names no nodes, so the cluster is homogeneous; give the trace as "
                "JSON with its nodes, or leave gpu_models empty"
            )
            raise TraceError(
                f"{where}: job {job.id} asks for gpu_models {list(job.gpu_models)} and the "
                f"replay cluster has only {sorted(models)}: it could never run; {fix}"
            )


def _read_json_trace(
    path: Path, options: TraceOptions
) -> tuple[list[BlockJob], list[str], list[Service], dict[str, Any]]:
    """A JSON trace's jobs (with where each is), services and, as an object, its body."""
    data = read_json(path)
    if isinstance(data, list):
        data = {"jobs": data}
    if not isinstance(data, dict):
        raise TraceError(
            f"{path}: expected a list of jobs or an object with {', '.join(JSON_KEYS)}, "
            f"not a {type(data).__name__}"
        )
    unknown = sorted(set(data) - set(JSON_KEYS))
    if unknown:
        raise TraceError(f"{path}: unknown keys {unknown}; a trace object has {list(JSON_KEYS)}")
    if data.get("gpu_models") and not data.get("nodes"):
        raise TraceError(
            f"{path}: gpu_models describes the models of nodes, and the trace lists none; "
            "add nodes, or leave gpu_models out"
        )
    records = _entries(path, data, "jobs")
    wheres = [f"{path}: job {i}" for i in range(len(records))]
    jobs = [job_from_record(r, options, w) for r, w in zip(records, wheres, strict=True)]
    services = _services(path, data)
    if not jobs and not services:
        raise TraceError(f"{path}: no jobs and no services")
    refuse_duplicate_ids(path, ((j.id, i) for i, j in enumerate(jobs)), unit="job")
    return jobs, wheres, services, data


def _read_csv_trace(path: Path, options: TraceOptions) -> tuple[list[BlockJob], list[str]]:
    header, rows = csv_rows(path)
    require_header(path, header, REQUIRED)
    jobs: list[BlockJob] = []
    lines: list[int] = []
    for line, row in rows:
        jobs.append(job_from_record(row, options, f"{path}:{line}"))
        lines.append(line)
    refuse_no_rows(path, len(jobs))
    refuse_duplicate_ids(path, zip((j.id for j in jobs), lines, strict=True))
    return jobs, [f"{path}:{line}" for line in lines]


def load_native(path: str | Path, options: TraceOptions | None = None) -> Workload:
    options = options or TraceOptions()
    path = Path(path)
    models: dict[str, GpuModel] | None = None
    nodes: list[Node] | None = None
    services: list[Service] = []
    if path.suffix == ".json":
        jobs, wheres, services, data = _read_json_trace(path, options)
        if data.get("nodes"):
            models, nodes = _cluster_of(path, data, options)
    else:
        jobs, wheres = _read_csv_trace(path, options)
    listed = nodes is not None
    if models is None or nodes is None:
        cluster = choose_cluster(options, CLUSTER)
        models, nodes = homogeneous_cluster(
            gpus=cluster.gpus, gpus_per_node=cluster.gpus_per_node, gpu_model=options.gpu_model
        )
    refuse_unrunnable(jobs, wheres, models, listed)
    shaped = shape_jobs(jobs, options)
    if services:
        options = options.with_(services=tuple(services))
    return make_workload(
        f"trace:{path.name}",
        shaped,
        options,
        gpu_models=models,
        nodes=nodes,
        description=f"trace {path}, {len(shaped)} jobs",
    )
