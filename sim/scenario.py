"""Scenario YAML files → :class:`~sim.workload.Workload`.

A scenario names a cluster, services, explicit jobs and/or a seeded generator of jobs.
Times in YAML are hours (``*_h``) unless the key says otherwise. Example::

    name: tiny
    seed: 7
    horizon_h: 24
    replan_interval_min: 30
    gpu_models: {H100: {memory_gb: 80, speed: 1.0, fp8: true}}
    cluster:
      - {prefix: h100, count: 1, gpus: 8, model: H100}
    transfer: {bandwidth_mib_per_s: 1000, overhead_s: 30}
    sla_policies: {research: {priority_weight: 1.0}}
    services:
      - {id: chat, hourly_demand: [2, 2, 1, 1, 2, 4], priority: 8}
    jobs:
      - {id: llm, submit_h: 0, gpus: 4, hours: 10, priority: 5, checkpointable: true}
    generate:
      count: 12
      arrival: {process: poisson, mean_gap_h: 2.0}   # or {process: batch, at_h: 0}
      mix:
        - kind: training
          weight: 3
          gpus: {1: 2, 2: 2, 4: 1}                   # value: relative weight
          hours: {median: 6, sigma: 0.6, min: 1, max: 30}   # log-normal
          # or {log_uniform: [0.5, 16]}, or a list of either with a ``weight`` each
          priority: {1: 3, 5: 1}
          checkpointable: 0.8                        # probability
          checkpoint_interval_h: 1
          image_gb: 20
          gpu_models: [H100]
    node_events:
      - {at_h: 10, node: h100-0, kind: fail}

Several clusters: each ``cluster`` entry names its ``cluster``; a job, a ``generate``
block (a list of them for several streams) or a service names the ``cluster`` it is
submitted to; ``transfer`` takes ``inter_cluster_bandwidth_mib_per_s`` and
``inter_cluster_overhead_s`` for what crossing between clusters costs, and
``inter_cluster_egress_gpu_s_per_gib`` (default 0, not negative) for what the data that
leaves a site is billed, in GPU-seconds a GiB ($/GiB ÷ $/GPU-hour × 3600). Data residency:
``cluster_labels`` gives each cluster its labels (``{east: {region: us}}``), and a job or a
``generate`` block may take ``cluster_selector`` (``{region: eu}``) and
``allowed_clusters`` (a list of names): a federated planner starts it only there or where
it was submitted.

Per-job speeds: a job or a ``mix`` entry may give ``speeds`` (``{V100: 1.0, K80: 0.3}``:
its own speed on those models, ``BlockJob.speeds``); a ``mix`` entry with
``job_types: gavel`` draws each job's type uniformly from Gavel's measured throughputs
(``sim.traces.gavel_throughputs``, the 26 one-GPU types): its speeds are the type's
throughput on each model over its V100 throughput, the models where it does not fit are
left out of its ``gpu_models``, and its ``team`` is the model family (``ResNet-50``); the
scenario's models are then V100, P100 and K80.

Elastic training: a job may give ``min_gpus``, ``max_gpus`` and ``scaling`` (see
``BlockJob``); a ``mix`` entry may give ``elastic: {share: 0.7, min: 0.5, max: 2.0,
scaling: 0.8}``: each of its jobs is elastic with probability ``share`` (default 1), with
``min_gpus = max(1, floor(gpus × min))``, ``max_gpus = ceil(gpus × max)`` (``min`` ≤ 1 ≤
``max``, both default 1) and that ``scaling`` (default 1: linear). Without the key no
draw is made, so the other jobs of a scenario stay as they were.

The generator uses ``numpy.random.default_rng(seed)``: the same seed gives the same jobs.

A scenario file is checked before it is built (:func:`check_scenario`): an unknown key (a
typo would otherwise be ignored), a missing required one, a value of the wrong type, a
negative count or time, a NaN or infinite number, a ``mix`` (or a ``{value: weight}``
table) whose weights sum to 0, an explicit job submitted after the horizon, and a job or
``mix`` size larger than the GPUs it may use (it could never run) are refused with the
file and the field, e.g. ``jobs[2].hours``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import fields
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from sim.traces.common import number, whole
from sim.traces.gavel_throughputs import MODELS as GAVEL_MODELS
from sim.traces.gavel_throughputs import STEPS_PER_SECOND
from sim.workload import (
    BlockJob,
    GpuModel,
    JobKind,
    Node,
    NodeEvent,
    Transfer,
    Workload,
    service_from_record,
)

HOUR = 3600.0


class ScenarioError(ValueError):
    """A scenario file is malformed; the message names the file and the field."""


def scenario_dir() -> Path:
    return Path(str(resources.files("sim") / "scenarios"))


# The study's seven settings, in its order; any other built-in scenario follows, sorted.
STUDY_ORDER = (
    "training-heavy",
    "mixed",
    "contended-hetero",
    "contended-burst",
    "contended-failures",
    "scale-64",
    "equal-priorities",
)


def builtin_scenarios() -> list[str]:
    """The one-cluster scenarios (``shaper sim table``'s rows)."""
    names = {p.stem for p in scenario_dir().glob("*.yaml")}
    return [n for n in STUDY_ORDER if n in names] + sorted(names - set(STUDY_ORDER))


def federation_scenarios() -> list[str]:
    """The multi-cluster scenarios (``shaper sim federation``'s), in ``federation/``."""
    return sorted(p.stem for p in (scenario_dir() / "federation").glob("*.yaml"))


def resolve(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.is_dir():
        raise ScenarioError(f"scenario {name_or_path!r} is a directory; pass a .yaml file")
    if path.suffix in (".yaml", ".yml") and path.exists():
        return path
    for folder in (scenario_dir(), scenario_dir() / "federation"):
        candidate = folder / f"{name_or_path}.yaml"
        if candidate.exists():
            return candidate
    raise ScenarioError(
        f"scenario {name_or_path!r}: no such file, and not one of "
        f"{builtin_scenarios() + federation_scenarios()}"
    )


def read_yaml(path: Path) -> dict[str, Any]:
    """A scenario file's top-level mapping; YAML that does not parse names its line."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise ScenarioError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{path}: not valid YAML ({exc})") from exc
    if not isinstance(data, dict):
        raise ScenarioError(f"{path}: expected a mapping at the top level")
    return data


def load_scenario(name_or_path: str, *, seed: int | None = None) -> Workload:
    path = resolve(name_or_path)
    data = read_yaml(path)
    try:
        check_scenario(data)
        workload = build_workload(data, seed=seed)
        check_built(workload)
    except KeyError as exc:
        raise ScenarioError(f"{path}: missing key {exc.args[0]!r}") from exc
    except (TypeError, ValueError) as exc:
        raise ScenarioError(f"{path}: {exc}") from exc
    return workload


# The keys each part of a scenario may have (see the module docstring).
TOP_KEYS = {
    "name", "description", "seed", "horizon_h", "replan_interval_min", "gpu_models",
    "cluster", "transfer", "sla_policies", "services", "jobs", "generate", "node_events",
    "solver", "cluster_labels",
}  # fmt: skip
MODEL_KEYS = {"memory_gb", "speed", "fp8"}
NODE_GROUP_KEYS = {"prefix", "count", "gpus", "model", "cluster"}
JOB_KEYS = {
    "id", "submit_h", "gpus", "hours", "priority", "kind", "gpu_models", "checkpointable",
    "checkpoint_interval_h", "image_gb", "team", "preemptible", "cluster",
    "cluster_selector", "allowed_clusters", "speeds", "min_gpus", "max_gpus", "scaling",
}  # fmt: skip
GENERATE_KEYS = {"count", "arrival", "mix", "cluster", "cluster_selector", "allowed_clusters"}
ARRIVAL_KEYS = {"process", "mean_gap_h", "at_h", "start_h", "end_h"}
MIX_KEYS = {
    "kind", "weight", "gpus", "hours", "priority", "checkpointable", "checkpoint_interval_h",
    "image_gb", "team", "gpu_models", "speeds", "elastic", "job_types",
}  # fmt: skip
SERVICE_KEYS = {
    "id", "hourly_demand", "gpus_per_replica", "min_replicas", "max_replicas", "priority",
    "gpu_models", "sla_target", "start_h", "team", "demand_noise", "noise_seed", "cluster",
}  # fmt: skip
EVENT_KEYS = {"at_h", "node", "kind"}
TRANSFER_KEYS = {f.name for f in fields(Transfer)}
KINDS = [kind.value for kind in JobKind]


def _mapping(
    value: Any, field: str, keys: set[str], required: Iterable[str] = ()
) -> dict[str, Any]:
    """``value`` as a mapping with only ``keys`` and all of ``required``."""
    if not isinstance(value, dict):
        raise ValueError(f"{field}: expected a mapping, not {value!r}")
    unknown = sorted(set(map(str, value)) - keys)
    if unknown:
        raise ValueError(f"{field}: unknown keys {unknown}; known: {sorted(keys)}")
    missing = [key for key in required if key not in value]
    if missing:
        raise ValueError(f"{field}: missing {missing}")
    return value


def _list(value: Any, field: str, *, empty: bool = True) -> list[Any]:
    if not isinstance(value, list):
        raise ValueError(f"{field}: expected a list, not {value!r}")
    if not value and not empty:
        raise ValueError(f"{field}: expected at least one entry")
    return value


def _numbers(entry: dict[str, Any], field: str, bounds: dict[str, tuple[str, float]]) -> None:
    """Check each key of ``bounds`` the entry has: ``(">=", 0)`` or ``(">", 0)``."""
    for key, (sign, bound) in bounds.items():
        if key in entry:
            if sign == ">=":
                number(entry[key], f"{field}.{key}", at_least=bound)
            else:
                number(entry[key], f"{field}.{key}", above=bound)


def _flag(entry: dict[str, Any], key: str, field: str) -> None:
    """A true/false key: YAML's booleans only (``bool("no")`` is true)."""
    if key in entry and not isinstance(entry[key], bool):
        raise ValueError(f"{field}.{key} must be true or false, not {entry[key]!r}")


def _kind(entry: dict[str, Any], field: str) -> None:
    if entry.get("kind", "training") not in KINDS:
        raise ValueError(f"{field}.kind must be one of {KINDS}, not {entry['kind']!r}")


def _weights(table: Any, field: str, value_check: Any = None) -> None:
    """A ``{value: weight}`` table (or a list, or one value): weights >= 0, sum > 0."""
    if isinstance(table, dict):
        if not table:
            raise ValueError(f"{field}: expected at least one value")
        weights = [number(w, f"{field}[{k}] (a weight)", at_least=0) for k, w in table.items()]
        if sum(weights) == 0:
            raise ValueError(f"{field}: the weights sum to 0, so no value can be drawn")
        values = list(table)
    elif isinstance(table, list):
        if not table:
            raise ValueError(f"{field}: expected at least one value")
        values = table
    else:
        values = [table]
    if value_check is not None:
        for value in values:
            value_check(value, field)


def _gpus_value(value: Any, field: str) -> None:
    whole(value, f"{field} (a GPU count)", at_least=1)


def _priority_value(value: Any, field: str) -> None:
    number(value, f"{field} (a priority)", at_least=0)


def _check_hours(spec: Any, field: str) -> None:
    """A mix entry's ``hours``: see :func:`_hours`."""
    if isinstance(spec, list):
        _list(spec, field, empty=False)
        _weights(
            {i: e.get("weight", 1.0) if isinstance(e, dict) else 1.0 for i, e in enumerate(spec)},
            field,
        )
        for index, entry in enumerate(spec):
            _check_hours(entry, f"{field}[{index}]")
        return
    if not isinstance(spec, dict):
        number(spec, field, above=0)
        return
    if "log_uniform" in spec:
        _mapping(spec, field, {"log_uniform", "weight"})
        bounds = _list(spec["log_uniform"], f"{field}.log_uniform")
        if len(bounds) != 2:
            raise ValueError(f"{field}.log_uniform: expected [low, high], not {bounds!r}")
        low = number(bounds[0], f"{field}.log_uniform low", above=0)
        if number(bounds[1], f"{field}.log_uniform high", above=0) < low:
            raise ValueError(f"{field}.log_uniform: high is below low ({bounds!r})")
        return
    _mapping(spec, field, {"median", "sigma", "min", "max", "weight"}, ("median", "sigma", "min"))
    _numbers(
        spec, field, {"median": (">", 0), "sigma": (">=", 0), "min": (">", 0), "max": (">", 0)}
    )
    if "max" in spec and float(spec["max"]) < float(spec["min"]):
        raise ValueError(f"{field}: max is below min")


def _check_arrival(arrival: Any, field: str) -> None:
    _mapping(arrival, field, ARRIVAL_KEYS)
    _numbers(arrival, field, {"at_h": (">=", 0), "start_h": (">=", 0), "mean_gap_h": (">", 0)})
    process = arrival.get("process", "batch")
    if process not in ("batch", "poisson", "uniform"):
        raise ValueError(f"{field}.process must be batch, poisson or uniform, not {process!r}")
    if process == "poisson" and "mean_gap_h" not in arrival:
        raise ValueError(f"{field}: a poisson arrival needs mean_gap_h")
    if process == "uniform":
        if "end_h" not in arrival:
            raise ValueError(f"{field}: a uniform arrival needs end_h")
        start = float(arrival.get("start_h", 0))
        if number(arrival["end_h"], f"{field}.end_h") <= start:
            raise ValueError(f"{field}.end_h must be after start_h ({start:g})")


def _check_mix_entry(entry: Any, field: str) -> None:
    _mapping(entry, field, MIX_KEYS, ("gpus", "hours"))
    _kind(entry, field)
    _weights(entry["gpus"], f"{field}.gpus", _gpus_value)
    _check_hours(entry["hours"], f"{field}.hours")
    if "priority" in entry:
        _weights(entry["priority"], f"{field}.priority", _priority_value)
    if "team" in entry:
        _weights(entry["team"], f"{field}.team")
    probability = entry.get("checkpointable", 0.0)
    if (
        isinstance(probability, bool)
        or not 0 <= number(probability, f"{field}.checkpointable") <= 1
    ):
        raise ValueError(f"{field}.checkpointable is a probability in [0, 1], not {probability!r}")
    _numbers(
        entry,
        field,
        {"weight": (">=", 0), "checkpoint_interval_h": (">=", 0), "image_gb": (">=", 0)},
    )


def _check_generate(block: Any, field: str) -> None:
    _mapping(block, field, GENERATE_KEYS, ("count", "mix"))
    whole(block["count"], f"{field}.count")
    _check_arrival(block.get("arrival", {}), f"{field}.arrival")
    mix = _list(block["mix"], f"{field}.mix", empty=False)
    for index, entry in enumerate(mix):
        _check_mix_entry(entry, f"{field}.mix[{index}]")
    weights = [
        number(m.get("weight", 1.0), f"{field}.mix[{i}].weight", at_least=0)
        for i, m in enumerate(mix)
    ]
    if sum(weights) == 0:
        raise ValueError(f"{field}.mix: the weights sum to 0, so no job kind can be drawn")


def _check_job(entry: Any, field: str, horizon_h: float) -> None:
    _mapping(entry, field, JOB_KEYS, ("gpus", "hours"))
    _kind(entry, field)
    whole(entry["gpus"], f"{field}.gpus", at_least=1)
    number(entry["hours"], f"{field}.hours", above=0)
    _numbers(
        entry,
        field,
        {"submit_h": (">=", 0), "priority": (">=", 0), "checkpoint_interval_h": (">=", 0),
         "image_gb": (">=", 0), "scaling": (">", 0)},
    )  # fmt: skip
    for key in ("checkpointable", "preemptible"):
        _flag(entry, key, field)
    if float(entry.get("submit_h", 0.0)) > horizon_h:
        raise ValueError(
            f"{field}.submit_h {entry['submit_h']} is after the horizon ({horizon_h:g} h): "
            "the job would never arrive; raise horizon_h or submit it earlier"
        )


def _check_cluster(data: dict[str, Any]) -> None:
    groups = _list(data["cluster"], "cluster", empty=False)
    nodes = 0
    for index, group in enumerate(groups):
        field = f"cluster[{index}]"
        _mapping(group, field, NODE_GROUP_KEYS, ("prefix", "gpus", "model"))
        whole(group["gpus"], f"{field}.gpus", at_least=1)
        nodes += whole(group.get("count", 1), f"{field}.count")
    if nodes == 0:
        raise ValueError("cluster: every group has count 0, so the cluster has no node")


def _check_services(data: dict[str, Any]) -> None:
    for index, entry in enumerate(_list(data.get("services", []), "services")):
        field = f"services[{index}]"
        _mapping(entry, field, SERVICE_KEYS, ("id", "hourly_demand"))
        demand = _list(entry["hourly_demand"], f"{field}.hourly_demand", empty=False)
        for hour, value in enumerate(demand):
            number(value, f"{field}.hourly_demand[{hour}]", at_least=0)
        for key in ("gpus_per_replica", "min_replicas", "max_replicas"):
            if key in entry:
                whole(entry[key], f"{field}.{key}", at_least=1 if key == "gpus_per_replica" else 0)
        _numbers(
            entry, field, {"priority": (">=", 0), "start_h": (">=", 0), "demand_noise": (">=", 0)}
        )
        if int(entry.get("min_replicas", 0)) > int(entry.get("max_replicas", 64)):
            raise ValueError(f"{field}: min_replicas is above max_replicas")


def _check_top(data: dict[str, Any]) -> float:
    """The top-level keys and numbers; returns the horizon in hours."""
    _mapping(data, "scenario", TOP_KEYS, ("name", "gpu_models", "cluster"))
    if "seed" in data:
        whole(data["seed"], "seed")
    _numbers(data, "scenario", {"horizon_h": (">", 0), "replan_interval_min": (">", 0)})
    models = data["gpu_models"]
    if not isinstance(models, dict) or not models:
        raise ValueError(f"gpu_models: expected a mapping of model names, not {models!r}")
    for name, model in models.items():
        entry = _mapping(model if model is not None else {}, f"gpu_models.{name}", MODEL_KEYS)
        _numbers(entry, f"gpu_models.{name}", {"speed": (">", 0), "memory_gb": (">", 0)})
        _flag(entry, "fp8", f"gpu_models.{name}")
    transfer = _mapping(data.get("transfer", {}), "transfer", TRANSFER_KEYS)
    _numbers(
        transfer,
        "transfer",
        {k: (">", 0) if "bandwidth" in k else (">=", 0) for k in TRANSFER_KEYS},
    )
    for key in ("sla_policies", "solver", "cluster_labels"):
        if not isinstance(data.get(key) or {}, dict):
            raise ValueError(f"{key}: expected a mapping, not {data[key]!r}")
    return float(data.get("horizon_h", 24.0))


def check_scenario(data: dict[str, Any]) -> None:
    """Refuse a scenario mapping that :func:`build_workload` would build into garbage or
    fail on with a bare ``KeyError``/``IndexError``; the ``ValueError`` names the field."""
    horizon_h = _check_top(data)
    _check_cluster(data)
    first: dict[str, int] = {}
    for index, entry in enumerate(_list(data.get("jobs", []), "jobs")):
        _check_job(entry, f"jobs[{index}]", horizon_h)
        job_id = str(entry.get("id", f"job-{index}"))
        if job_id in first:
            raise ValueError(f"jobs[{index}].id {job_id!r} is also that of jobs[{first[job_id]}]")
        first[job_id] = index
    generated = data.get("generate")
    if generated is not None:
        blocks = generated if isinstance(generated, list) else [generated]
        for index, block in enumerate(blocks):
            _check_generate(block, "generate" if block is generated else f"generate[{index}]")
    _check_services(data)
    for index, event in enumerate(_list(data.get("node_events", []), "node_events")):
        field = f"node_events[{index}]"
        _mapping(event, field, EVENT_KEYS, ("at_h", "node", "kind"))
        number(event["at_h"], f"{field}.at_h", at_least=0)


def check_built(workload: Workload) -> None:
    """Refuse a built scenario with nothing to run, or a job (or a service replica) larger
    than all the GPUs of the models it may use: it would wait forever."""
    if not workload.jobs and not workload.services:
        raise ValueError("no jobs, no generated jobs and no services: nothing to simulate")
    for job in workload.jobs:
        usable = sum(n.gpus for n in workload.nodes if job.can_run_on(n.gpu_model))
        if job.min_size > usable:
            raise ValueError(
                f"job {job.id} needs {job.min_size} GPUs and the cluster has {usable} it may "
                "use (of its gpu_models): it could never run"
            )
    for service in workload.services:
        usable = sum(n.gpus for n in workload.nodes if service.can_run_on(n.gpu_model))
        if service.gpus_per_replica > usable:
            raise ValueError(
                f"service {service.id}: a replica needs {service.gpus_per_replica} GPUs and "
                f"the cluster has {usable} it may use: it could never run"
            )


def _weighted_choice(rng: np.random.Generator, table: Any) -> Any:
    """Pick from ``{value: weight}``, a list (uniform) or a scalar (itself).

    Always exactly one draw, so that changing one field's table (say, every priority to 1)
    leaves every other field of every job as it was.
    """
    draw = float(rng.random())
    if isinstance(table, dict):
        keys = list(table)
        weights = [float(table[k]) for k in keys]
    elif isinstance(table, list):
        keys, weights = table, [1.0] * len(table)
    else:
        return table
    threshold = draw * sum(weights)
    for key, weight in zip(keys, weights, strict=True):
        threshold -= weight
        if threshold < 0:
            return key
    return keys[-1]


def _nodes(data: dict[str, Any]) -> list[Node]:
    nodes: list[Node] = []
    for group in data["cluster"]:
        for index in range(int(group.get("count", 1))):
            nodes.append(
                Node(
                    name=f"{group['prefix']}-{index}",
                    gpu_model=str(group["model"]),
                    gpus=int(group["gpus"]),
                    cluster=str(group.get("cluster", "default")),
                )
            )
    return nodes


def _job(entry: dict[str, Any], index: int) -> BlockJob:
    return BlockJob(
        id=str(entry.get("id", f"job-{index}")),
        submit_time=float(entry.get("submit_h", 0.0)) * HOUR,
        gpus=int(entry["gpus"]),
        work=float(entry["hours"]) * HOUR,
        priority=float(entry.get("priority", 1.0)),
        kind=JobKind(entry.get("kind", "training")),
        gpu_models=tuple(entry.get("gpu_models", ())),
        checkpointable=bool(entry.get("checkpointable", False)),
        checkpoint_interval=float(entry.get("checkpoint_interval_h", 0.0)) * HOUR,
        image_gb=float(entry.get("image_gb", 10.0)),
        team=str(entry.get("team", "default")),
        preemptible=bool(entry.get("preemptible", True)),
        cluster=str(entry["cluster"]) if entry.get("cluster") is not None else None,
        cluster_selector=tuple(
            (str(k), str(v)) for k, v in (entry.get("cluster_selector") or {}).items()
        ),
        allowed_clusters=(
            tuple(str(c) for c in entry["allowed_clusters"])
            if entry.get("allowed_clusters") is not None
            else None
        ),
        speeds=tuple((str(m), float(v)) for m, v in (entry.get("speeds") or {}).items()),
        min_gpus=int(entry["min_gpus"]) if entry.get("min_gpus") is not None else None,
        max_gpus=int(entry["max_gpus"]) if entry.get("max_gpus") is not None else None,
        scaling=float(entry.get("scaling", 1.0)),
    )


def _hours(rng: np.random.Generator, spec: Any) -> float:
    """A run time in hours from ``spec``: a number, ``{median, sigma, min, max}``
    (log-normal, clamped), ``{log_uniform: [low, high]}``, or a list of those, each with a
    ``weight`` (one draw picks the entry)."""
    if isinstance(spec, list):
        index = _weighted_choice(rng, {i: float(e.get("weight", 1.0)) for i, e in enumerate(spec)})
        return _hours(rng, spec[index])
    if not isinstance(spec, dict):
        return float(spec)
    if "log_uniform" in spec:
        low, high = (float(v) for v in spec["log_uniform"])
        return float(math.exp(rng.uniform(math.log(low), math.log(high))))
    hours = float(rng.lognormal(math.log(float(spec["median"])), float(spec["sigma"])))
    return min(float(spec.get("max", hours)), max(float(spec["min"]), hours))


GAVEL_TYPES = sorted(name for name, scale in STEPS_PER_SECOND if scale == 1)


def _gavel_type(rng: np.random.Generator) -> dict[str, Any]:
    """One of Gavel's job types, uniformly (Gavel's generator), as job fields."""
    name = _weighted_choice(rng, GAVEL_TYPES)
    row = STEPS_PER_SECOND[(name, 1)]
    fits = {m: v / row[0] for m, v in zip(GAVEL_MODELS, row, strict=True) if v > 0}
    return {
        "speeds": fits,
        "gpu_models": tuple(fits) if len(fits) < len(GAVEL_MODELS) else (),
        "team": name.split(" (")[0],
    }


def _elastic(rng: np.random.Generator, spec: Any, gpus: int) -> dict[str, Any]:
    """The elastic-training fields of a generated job of ``gpus`` GPUs (none for a rigid
    one): ``spec`` is ``{share, min, max, scaling}``; one draw decides."""
    if not isinstance(spec, dict):
        raise ValueError(f"generate.mix.elastic: expected a mapping, got {spec!r}")
    unknown = set(spec) - {"share", "min", "max", "scaling"}
    if unknown:
        raise ValueError(f"generate.mix.elastic: unknown keys {sorted(unknown)}")
    if not rng.random() < float(spec.get("share", 1.0)):
        return {}
    low, high = float(spec.get("min", 1.0)), float(spec.get("max", 1.0))
    if not 0 < low <= 1 <= high:
        raise ValueError(f"generate.mix.elastic: needs 0 < min <= 1 <= max, got {low}, {high}")
    return {
        "min_gpus": max(1, math.floor(gpus * low)),
        "max_gpus": math.ceil(gpus * high),
        "scaling": float(spec.get("scaling", 1.0)),
    }


def _generate(spec: dict[str, Any], rng: np.random.Generator, first: int) -> list[BlockJob]:
    count = int(spec["count"])
    arrival = spec.get("arrival", {"process": "batch", "at_h": 0})
    mix = spec["mix"]
    weights = np.array([float(m.get("weight", 1.0)) for m in mix])
    jobs: list[BlockJob] = []
    t = float(arrival.get("start_h", arrival.get("at_h", 0.0)))
    for n in range(count):
        process = arrival.get("process", "batch")
        if process == "poisson" and n > 0:
            t += float(rng.exponential(float(arrival["mean_gap_h"])))
        elif process == "uniform":
            t = float(rng.uniform(float(arrival.get("start_h", 0)), float(arrival["end_h"])))
        elif process not in ("batch", "poisson"):
            raise ValueError(f"generate.arrival.process: unknown {process!r}")
        kind = mix[_weighted_choice(rng, dict(enumerate(weights.tolist())))]
        hours = _hours(rng, kind["hours"])
        entry = {
            "id": f"{kind.get('kind', 'training')}-{first + n}",
            "submit_h": round(t, 4),
            "gpus": int(_weighted_choice(rng, kind["gpus"])),
            "hours": round(hours, 3),
            "priority": float(_weighted_choice(rng, kind.get("priority", 1))),
            "kind": kind.get("kind", "training"),
            "gpu_models": kind.get("gpu_models", ()),
            "checkpointable": bool(rng.random() < float(kind.get("checkpointable", 0.0))),
            "checkpoint_interval_h": kind.get("checkpoint_interval_h", 0.0),
            "image_gb": kind.get("image_gb", 10.0),
            "team": _weighted_choice(rng, kind.get("team", "default")),
            "cluster": spec.get("cluster"),
            "cluster_selector": spec.get("cluster_selector"),
            "allowed_clusters": spec.get("allowed_clusters"),
            "speeds": kind.get("speeds"),
        }
        if "elastic" in kind:  # draws only when asked: other scenarios keep their jobs
            entry.update(_elastic(rng, kind["elastic"], entry["gpus"]))
        job_types = kind.get("job_types")
        if job_types == "gavel":
            entry.update(_gavel_type(rng))
        elif job_types is not None:
            raise ValueError(f"generate.mix.job_types: unknown {job_types!r} (known: gavel)")
        jobs.append(_job(entry, first + n))
    return jobs


def build_workload(data: dict[str, Any], *, seed: int | None = None) -> Workload:
    seed = int(data.get("seed", 0)) if seed is None else seed
    rng = np.random.default_rng(seed)
    models = {
        name: GpuModel(
            name=name,
            memory_gb=int(m.get("memory_gb", 80)),
            speed=float(m.get("speed", 1.0)),
            fp8=bool(m.get("fp8", False)),
        )
        for name, m in data["gpu_models"].items()
    }
    jobs = [_job(entry, i) for i, entry in enumerate(data.get("jobs", []))]
    if "generate" in data:
        generated = data["generate"]
        for block in generated if isinstance(generated, list) else [generated]:
            jobs += _generate(block, rng, len(jobs))
    services = [service_from_record(s) for s in data.get("services", [])]
    events = [
        NodeEvent(time=float(e["at_h"]) * HOUR, node=str(e["node"]), kind=str(e["kind"]))
        for e in data.get("node_events", [])
    ]
    transfer = Transfer(**data.get("transfer", {}))
    workload = Workload(
        name=str(data["name"]),
        gpu_models=models,
        nodes=_nodes(data),
        jobs=sorted(jobs, key=lambda j: (j.submit_time, j.id)),
        services=services,
        node_events=sorted(events, key=lambda e: e.time),
        horizon=float(data.get("horizon_h", 24.0)) * HOUR,
        transfer=transfer,
        replan_interval=float(data.get("replan_interval_min", 30.0)) * 60.0,
        description=str(data.get("description", "")).strip(),
        seed=seed,
        sla_policies={k: dict(v) for k, v in data.get("sla_policies", {}).items()},
        solver_config=dict(data.get("solver", {})),
        cluster_labels={
            str(c): {str(k): str(v) for k, v in labels.items()}
            for c, labels in (data.get("cluster_labels") or {}).items()
        },
    )
    workload.validate()
    return workload
