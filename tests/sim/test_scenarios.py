"""Built-in scenarios: they load, are seeded, and a run is reproducible from the seed."""

from __future__ import annotations

import json
from pathlib import Path

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


def test_generator_respects_bounds() -> None:
    data = {
        "name": "g",
        "seed": 5,
        "gpu_models": {"A": {}},
        "cluster": [{"prefix": "n", "count": 2, "gpus": 8, "model": "A"}],
        "generate": {
            "count": 200,
            "arrival": {"process": "poisson", "mean_gap_h": 0.5},
            "mix": [
                {"gpus": {1: 1, 4: 1}, "hours": {"median": 3, "sigma": 1.5, "min": 1, "max": 5}}
            ],
        },
    }
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
