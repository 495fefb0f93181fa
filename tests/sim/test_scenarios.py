"""Built-in scenarios: they load, are seeded, and a run is reproducible from the seed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from sim.metrics import summarize
from sim.run import simulate, write_results
from sim.scenario import ScenarioError, build_workload, builtin_scenarios, load_scenario

SEVEN = {
    "training-heavy",
    "mixed",
    "contended-hetero",
    "contended-burst",
    "contended-failures",
    "scale-64",
    "equal-priorities",
}


def test_the_seven_settings_are_there() -> None:
    assert SEVEN <= set(builtin_scenarios())


@pytest.mark.parametrize("name", builtin_scenarios())
def test_scenario_loads_and_is_consistent(name: str) -> None:
    wl = load_scenario(name)
    wl.validate()
    assert wl.description and wl.jobs
    assert all(0 <= j.submit_time <= wl.horizon for j in wl.jobs)
    # Every job fits somewhere: enough GPUs of an allowed model in the cluster.
    for j in wl.jobs:
        allowed = [n for n in wl.nodes if j.can_run_on(n.gpu_model)]
        assert sum(n.gpus for n in allowed) >= j.gpus, j.id


def test_study_shapes() -> None:
    assert load_scenario("training-heavy").total_gpus == 8
    scale = load_scenario("scale-64")
    assert scale.total_gpus == 64 and len(scale.jobs) == 30
    equal = load_scenario("equal-priorities")
    assert {j.priority for j in equal.jobs} == {1.0}
    mixed = load_scenario("mixed")
    assert [j.submit_time for j in equal.jobs] == [j.submit_time for j in mixed.jobs]


def test_seed_changes_the_generated_jobs() -> None:
    a = load_scenario("mixed", seed=1)
    b = load_scenario("mixed", seed=1)
    c = load_scenario("mixed", seed=2)
    assert a.jobs == b.jobs
    assert a.jobs != c.jobs


@pytest.mark.parametrize("policy", ["backfill", "shaper"])
def test_same_seed_same_results(policy: str, tmp_path: Path) -> None:
    wl = load_scenario("training-heavy")
    first = write_results(summarize(simulate(wl, policy)), tmp_path / "a.json")
    again = write_results(
        summarize(simulate(load_scenario("training-heavy"), policy)), tmp_path / "b.json"
    )
    payload = json.loads(first.read_text())
    repeat = json.loads(again.read_text())
    payload.pop("timing"), repeat.pop("timing")
    assert payload == repeat
    assert payload["policy"] == policy and payload["seed"] == wl.seed
    assert len(payload["timeseries"]["t_h"]) == len(payload["timeseries"]["utilization"])


def test_scenario_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="no such file"):
        load_scenario("does-not-exist")
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"name": "bad", "gpu_models": {"X": {}}, "cluster": []}))
    data = yaml.safe_load(bad.read_text())
    data["jobs"] = [{"id": "j", "gpus": 1, "hours": 1, "gpu_models": ["Y"]}]
    bad.write_text(yaml.safe_dump(data))
    with pytest.raises(ScenarioError, match="bad.yaml"):
        load_scenario(str(bad))


def _generated(generate: dict[str, Any], *, seed: int = 0, nodes: int = 1) -> dict[str, Any]:
    """A scenario of ``nodes`` 8-GPU nodes of one model whose jobs come from ``generate``."""
    return {
        "name": "g",
        "seed": seed,
        "gpu_models": {"A": {}},
        "cluster": [{"prefix": "n", "count": nodes, "gpus": 8, "model": "A"}],
        "generate": generate,
    }


def test_generator_respects_bounds() -> None:
    data = _generated(
        {
            "count": 200,
            "arrival": {"process": "poisson", "mean_gap_h": 0.5},
            "mix": [
                {"gpus": {1: 1, 4: 1}, "hours": {"median": 3, "sigma": 1.5, "min": 1, "max": 5}}
            ],
        },
        seed=5,
        nodes=2,
    )
    wl = build_workload(data)
    assert len(wl.jobs) == 200
    assert {j.gpus for j in wl.jobs} == {1, 4}
    assert all(3600 <= j.work <= 5 * 3600 for j in wl.jobs)
    gaps = [b.submit_time - a.submit_time for a, b in zip(wl.jobs, wl.jobs[1:], strict=False)]
    assert all(g >= 0 for g in gaps)
    assert 0.3 * 3600 < sum(gaps) / len(gaps) < 0.7 * 3600


def test_timeseries_integrates_to_the_totals() -> None:
    wl = load_scenario("contended-failures")
    result = summarize(simulate(wl, "shaper", drain=False))  # the series spans the window
    series = result.timeseries
    width_h = wl.horizon / 3600 / len(series["t_h"])
    busy_hours = sum(series["busy_gpus"]) * width_h
    m = result.metrics
    assert busy_hours == pytest.approx(m["utilization"] * m["available_gpu_hours"], rel=1e-6)
    # GPUs are available in every bin (one node at most is down), so no bin reads zero busy.
    assert min(series["utilization"]) > 0


def test_fragmentation_heavy_is_one_priority_with_small_jobs_and_whole_node_gangs() -> None:
    wl = load_scenario("fragmentation-heavy")
    sizes = {j.gpus for j in wl.jobs}
    assert sizes == {1, 2, 8} and {j.priority for j in wl.jobs} == {1.0}
    assert {n.gpus for n in wl.nodes} == {8} and not wl.services


def test_log_uniform_hours_and_a_weighted_list_of_them() -> None:
    data = _generated(
        {
            "count": 400,
            "mix": [
                {
                    "gpus": {1: 1},
                    "hours": [
                        {"weight": 0.8, "log_uniform": [0.5, 2]},
                        {"weight": 0.2, "log_uniform": [10, 20]},
                    ],
                }
            ],
        },
        seed=3,
    )
    hours = [j.work / 3600 for j in build_workload(data).jobs]
    short = [h for h in hours if 0.5 <= h <= 2]
    long = [h for h in hours if 10 <= h <= 20]
    assert len(short) + len(long) == 400  # nothing between or outside the two ranges
    assert 0.7 < len(short) / 400 < 0.9
    # Log-uniform: as many short runs below the range's geometric middle (1 h) as above.
    assert 0.4 < sum(h < 1.0 for h in short) / len(short) < 0.6


def test_gavel_job_types_carry_their_measured_speeds() -> None:
    from sim.traces.gavel import SPEED
    from sim.traces.gavel_throughputs import STEPS_PER_SECOND

    wl = load_scenario("heterogeneous-throughput")
    # The models' speeds are the loader's geometric means, as the YAML states them.
    assert {m: round(g.speed, 4) for m, g in wl.gpu_models.items()} == {
        m: round(s, 4) for m, s in SPEED.items()
    }
    families = {name.split(" (")[0] for name, _ in STEPS_PER_SECOND}
    assert {j.team for j in wl.jobs} <= families and len({j.team for j in wl.jobs}) >= 5
    for job in wl.jobs:
        speeds = dict(job.speeds)
        assert speeds["V100"] == 1.0  # speeds are over the type's V100 throughput
        rows = [
            row
            for (name, scale), row in STEPS_PER_SECOND.items()
            if scale == 1
            and name.split(" (")[0] == job.team
            and row[0] > 0
            and abs(row[1] / row[0] - speeds["P100"]) < 1e-12
        ]
        assert rows, job.id  # its P100 speed is one of its family's measured ratios
        if rows[0][2] == 0:  # does not fit a K80 (ResNet-50, batch size 128)
            assert "K80" not in speeds and job.gpu_models == ("V100", "P100")
        else:
            assert speeds["K80"] == pytest.approx(rows[0][2] / rows[0][0]) and not job.gpu_models
    assert {j.gpus for j in wl.jobs} <= {1, 2, 4, 8} and {j.priority for j in wl.jobs} == {1, 5}
    assert all(j.checkpointable for j in wl.jobs)


def test_unknown_job_types_are_refused() -> None:
    data = _generated({"count": 1, "mix": [{"gpus": {1: 1}, "hours": 1, "job_types": "philly"}]})
    with pytest.raises(ValueError, match="job_types: unknown 'philly' \\(known: gavel\\)"):
        build_workload(data)
