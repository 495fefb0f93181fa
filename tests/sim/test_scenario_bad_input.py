"""Scenario files users write: every mistake is a :class:`ScenarioError` that names the file
and the field (``jobs[0].hours``), never a bare ``KeyError``/``IndexError``/YAML traceback,
and never a scenario built into garbage (NaN run times, a mix that cannot be drawn from, a
job that can never run, a typo'd key silently ignored)."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from sim.cli import sim_app
from sim.scenario import ScenarioError, load_scenario

BASE: dict[str, Any] = {
    "name": "t",
    "horizon_h": 24,
    "gpu_models": {"A100": {"memory_gb": 80}},
    "cluster": [{"prefix": "a", "count": 2, "gpus": 8, "model": "A100"}],
    "jobs": [{"id": "j", "gpus": 1, "hours": 2}],
}
MIX = {"gpus": {1: 1, 2: 1}, "hours": 1}


def scenario(tmp_path: Path, **changes: Any) -> Path:
    """``BASE`` with ``changes`` (a value of ``None`` removes the key), as a file."""
    data = copy.deepcopy(BASE)
    for key, value in changes.items():
        if value is None:
            data.pop(key)
        else:
            data[key] = value
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def refused(path: Path) -> str:
    with pytest.raises(ScenarioError) as caught:
        load_scenario(str(path))
    message = str(caught.value)
    assert message.startswith(f"{path}: "), message
    return message


def job(**fields: Any) -> list[dict[str, Any]]:
    return [{"id": "j", "gpus": 1, "hours": 2, **fields}]


def generate(**fields: Any) -> dict[str, Any]:
    return {"count": 3, "mix": [MIX], **fields}


CASES: list[tuple[str, dict[str, Any], str]] = [
    ("no name", {"name": None}, r"scenario: missing \['name'\]"),
    ("no cluster", {"cluster": None}, r"scenario: missing \['cluster'\]"),
    ("typo at the top", {"jbos": []}, r"scenario: unknown keys \['jbos'\]"),
    ("models a list", {"gpu_models": ["A100"]}, r"gpu_models: expected a mapping"),
    ("model speed 0", {"gpu_models": {"A100": {"speed": 0}}}, r"gpu_models.A100.speed"),
    ("cluster a mapping", {"cluster": {"prefix": "a"}}, r"cluster: expected a list"),
    (
        "negative count",
        {"cluster": [{"prefix": "a", "count": -2, "gpus": 8, "model": "A100"}]},
        r"cluster\[0\].count must be a whole number >= 0",
    ),
    (
        "no node",
        {"cluster": [{"prefix": "a", "count": 0, "gpus": 8, "model": "A100"}]},
        r"the cluster has no node",
    ),
    (
        "node gpus a word",
        {"cluster": [{"prefix": "a", "gpus": "eight", "model": "A100"}]},
        r"cluster\[0\].gpus must be a whole number >= 1, not 'eight'",
    ),
    ("job typo", {"jobs": job(priorty=3)}, r"jobs\[0\]: unknown keys \['priorty'\]"),
    ("job no gpus", {"jobs": [{"id": "j", "hours": 2}]}, r"jobs\[0\]: missing \['gpus'\]"),
    ("job nan hours", {"jobs": job(hours=float("nan"))}, r"jobs\[0\].hours .*> 0, not nan"),
    ("job inf hours", {"jobs": job(hours=float("inf"))}, r"jobs\[0\].hours .*not inf"),
    ("job negative submit", {"jobs": job(submit_h=-5)}, r"jobs\[0\].submit_h .*>= 0"),
    ("job after the horizon", {"jobs": job(submit_h=50)}, r"after the horizon \(24 h\)"),
    ("job half a GPU", {"jobs": job(gpus=1.5)}, r"jobs\[0\].gpus must be a whole number"),
    ("job 'no' as a string", {"jobs": job(checkpointable="no")}, r"checkpointable must be true"),
    ("job negative priority", {"jobs": job(priority=-1)}, r"jobs\[0\].priority"),
    ("job kind", {"jobs": job(kind="train")}, r"jobs\[0\].kind must be one of"),
    ("jobs an int", {"jobs": 3}, r"jobs: expected a list, not 3"),
    ("job a string", {"jobs": ["j"]}, r"jobs\[0\]: expected a mapping, not 'j'"),
    ("repeated id", {"jobs": job() + job()}, r"jobs\[1\].id 'j' is also that of jobs\[0\]"),
    ("job larger than the cluster", {"jobs": job(gpus=32)}, r"job j needs 32 GPUs .* never run"),
    (
        "mix weights sum to 0",
        {"generate": generate(mix=[{**MIX, "weight": 0}])},
        r"generate.mix: the weights sum to 0",
    ),
    (
        "negative mix weight",
        {"generate": generate(mix=[{**MIX, "weight": -1}, MIX])},
        r"generate.mix\[0\].weight",
    ),
    (
        "gpus weights sum to 0",
        {"generate": generate(mix=[{"gpus": {1: 0, 2: 0}, "hours": 1}])},
        r"generate.mix\[0\].gpus: the weights sum to 0",
    ),
    ("empty mix", {"generate": generate(mix=[])}, r"generate.mix: expected at least one entry"),
    ("mix a string", {"generate": generate(mix="training")}, r"generate.mix: expected a list"),
    ("negative count to draw", {"generate": generate(count=-3)}, r"generate.count"),
    (
        "mix typo",
        {"generate": generate(mix=[{**MIX, "prio": 3}])},
        r"generate.mix\[0\]: unknown keys \['prio'\]",
    ),
    (
        "mix larger than the cluster",
        {"generate": generate(mix=[{"gpus": 64, "hours": 1}])},
        r"needs 64 GPUs and the cluster has 16",
    ),
    (
        "poisson without a gap",
        {"generate": generate(arrival={"process": "poisson"})},
        r"generate.arrival: a poisson arrival needs mean_gap_h",
    ),
    (
        "hours without sigma",
        {"generate": generate(mix=[{"gpus": 1, "hours": {"median": 5}}])},
        r"generate.mix\[0\].hours: missing \['sigma', 'min'\]",
    ),
    (
        "log-uniform below 0",
        {"generate": generate(mix=[{"gpus": 1, "hours": {"log_uniform": [-1, 5]}}])},
        r"log_uniform low must be a finite number > 0",
    ),
    ("transfer typo", {"transfer": {"bandwith": 3}}, r"transfer: unknown keys \['bandwith'\]"),
    ("no bandwidth", {"transfer": {"bandwidth_mib_per_s": 0}}, r"transfer.bandwidth_mib_per_s"),
    ("negative horizon", {"horizon_h": -1}, r"horizon_h must be a finite number > 0"),
    ("replan every 0 min", {"replan_interval_min": 0}, r"replan_interval_min"),
    ("seed a word", {"seed": "abc"}, r"seed must be a whole number"),
    ("service without demand", {"services": [{"id": "s"}]}, r"services\[0\]: missing"),
    (
        "service replica too large",
        {"services": [{"id": "s", "hourly_demand": [1], "gpus_per_replica": 32}]},
        r"service s: a replica needs 32 GPUs",
    ),
    (
        "event without time",
        {"node_events": [{"node": "a-0", "kind": "fail"}]},
        r"node_events\[0\]: missing \[.at_h.\]",
    ),
    ("nothing to run", {"jobs": None}, r"nothing to simulate"),
]


@pytest.mark.parametrize(("changes", "says"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_bad_scenario_names_the_file_and_the_field(
    tmp_path: Path, changes: dict[str, Any], says: str
) -> None:
    message = refused(scenario(tmp_path, **changes))
    assert re.search(says, message), message


def test_yaml_that_does_not_parse_and_a_directory_are_scenario_errors(tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [\n")
    assert "not valid YAML" in refused(broken) and "line 2" in refused(broken)
    folder = tmp_path / "folder.yaml"
    folder.mkdir()
    with pytest.raises(ScenarioError, match="is a directory; pass a .yaml file"):
        load_scenario(str(folder))
    latin = tmp_path / "latin.yaml"
    latin.write_bytes("name: caf\xe9\n".encode("latin-1"))
    assert "not UTF-8 text" in refused(latin)


def test_crlf_and_a_byte_order_mark_load_as_the_plain_file(tmp_path: Path) -> None:
    plain = load_scenario(str(scenario(tmp_path)))
    text = (tmp_path / "s.yaml").read_text()
    odd = tmp_path / "odd.yaml"
    odd.write_bytes(("\ufeff" + text.replace("\n", "\r\n")).encode())
    assert load_scenario(str(odd)).jobs == plain.jobs


def test_a_job_larger_than_one_node_but_not_the_cluster_loads(tmp_path: Path) -> None:
    # A gang may span nodes: 12 GPUs on two nodes of 8 can run.
    assert load_scenario(str(scenario(tmp_path, jobs=job(gpus=12)))).jobs[0].gpus == 12


def test_the_cli_reports_a_bad_scenario_as_a_usage_error(tmp_path: Path) -> None:
    path = scenario(tmp_path, generate=generate(mix=[{**MIX, "weight": 0}]), jobs=None)
    result = CliRunner().invoke(sim_app, ["run", str(path), "--policy", "fifo"])
    assert result.exit_code == 2, (result.output, result.exception)
    assert "weights sum to 0" in " ".join(result.output.split())
