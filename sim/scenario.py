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
"""

from __future__ import annotations

import math
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import yaml

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


def load_scenario(name_or_path: str, *, seed: int | None = None) -> Workload:
    path = resolve(name_or_path)
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict):
        raise ScenarioError(f"{path}: expected a mapping at the top level")
    try:
        return build_workload(data, seed=seed)
    except (KeyError, TypeError, ValueError) as exc:
        raise ScenarioError(f"{path}: {exc}") from exc


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
