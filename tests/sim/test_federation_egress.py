"""Cloud egress in the federated simulator (issue 16): a price a GiB of image that crosses.

On two one-node clusters a job waits in its full home cluster beside an idle one. Without
an egress price the federated planners start it in the idle cluster (its 10 GiB image
crosses, counted in ``gib_crossed``); at 130 GPU-seconds a GiB (≈ $0.09 a GiB at $2.50 a
GPU-hour) it still goes and the run reports the egress; at 4,096 a GiB the 10 GiB cost
more than waiting, and it stays home. The price comes from the scenario's ``transfer``
(YAML key) or the ``federation`` command's flag; a negative one is refused by name.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from sim.cli import sim_app
from sim.federation import with_egress
from sim.metrics import summarize
from sim.run import simulate
from sim.scenario import ScenarioError, load_scenario
from sim.workload import Workload
from tests.sim.test_federation import _job as job
from tests.sim.test_federation import _two_clusters as two_clusters

HOUR = 3600.0
# The same two clusters and jobs as a scenario file, for the YAML key and the command.
SCENARIO = {
    "name": "two",
    "horizon_h": 12,
    "gpu_models": {"H100": {}},
    "cluster": [
        {"prefix": name, "count": 1, "gpus": 8, "model": "H100", "cluster": name}
        for name in ("east", "west")
    ],
    "jobs": [
        {"id": name, "gpus": 8, "hours": hours, "cluster": "east", "image_gb": 10}
        for name, hours in (("long", 10), ("short", 1))
    ],
}


def _scenario(path: Path, **transfer: float) -> Path:
    path.write_text(yaml.safe_dump({**SCENARIO, "transfer": transfer}))
    return path


def _two_clusters(egress: float) -> Workload:
    """Two 8-GPU clusters, an 8-GPU 10-hour and 1-hour job both submitted to east, each
    with a 10 GiB image; egress priced at ``egress`` GPU-seconds a GiB."""
    return with_egress(two_clusters([job("long", 10), job("short", 1)]), egress)


@pytest.mark.parametrize("policy", ["federated-priority", "federated-shaper"])
@pytest.mark.parametrize("egress", [0.0, 130.0])
def test_without_a_prohibitive_price_one_job_crosses_and_its_egress_is_reported(
    policy: str, egress: float
) -> None:
    sim = simulate(_two_clusters(egress), policy, check_invariants=True)
    assert sorted(str(state.location) for state in sim.jobs.values()) == ["east", "west"]
    metrics = summarize(sim).metrics
    assert metrics["remote_starts"] == 1
    assert metrics["gib_crossed"] == pytest.approx(10.0)  # the one image, 10 GiB
    assert metrics["egress_gpu_hours"] == pytest.approx(10.0 * egress / HOUR)
    assert abs(metrics["unaccounted_gpu_hours"] or 0.0) < 0.01  # egress is money, not GPU time


@pytest.mark.parametrize("policy", ["federated-priority", "federated-shaper"])
def test_at_a_high_egress_price_the_job_that_would_cross_stays_home(policy: str) -> None:
    # 10 GiB × 4,096 GPU-s = 11.4 GPU-hours shared over 8 GPUs: more than the wait.
    sim = simulate(_two_clusters(4096.0), policy, check_invariants=True)
    assert {state.location for state in sim.jobs.values()} == {"east"}
    metrics = summarize(sim).metrics
    assert metrics["remote_starts"] == 0
    assert metrics["gib_crossed"] == 0.0 and metrics["egress_gpu_hours"] == 0.0


def test_with_egress_refuses_a_negative_price_by_name() -> None:
    assert with_egress(_two_clusters(0.0), 130.0).transfer.inter_cluster_egress_gpu_s_per_gib == 130
    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="inter_cluster_egress_gpu_s_per_gib must be >= 0"):
            with_egress(_two_clusters(0.0), bad)


def test_the_scenario_yaml_takes_the_price_and_refuses_a_negative_one(tmp_path: Path) -> None:
    good = _scenario(tmp_path / "priced.yaml", inter_cluster_egress_gpu_s_per_gib=4096)
    workload = load_scenario(str(good))
    assert workload.transfer.inter_cluster_egress_gpu_s_per_gib == 4096.0
    assert {s.location for s in simulate(workload, "federated-shaper").jobs.values()} == {"east"}
    bad = _scenario(tmp_path / "negative.yaml", inter_cluster_egress_gpu_s_per_gib=-5)
    with pytest.raises(ScenarioError, match="transfer.inter_cluster_egress_gpu_s_per_gib"):
        load_scenario(str(bad))


def test_the_federation_command_prices_egress_by_flag_and_refuses_a_negative_one(
    tmp_path: Path,
) -> None:
    scenario = _scenario(tmp_path / "two.yaml")
    runner = CliRunner()
    args = ["federation", "--scenarios", str(scenario), "--no-progress"]
    args += ["--policies", "federated-shaper", "--out-dir", str(tmp_path / "out")]
    free = runner.invoke(sim_app, args)
    priced = runner.invoke(sim_app, [*args, "--egress-gpu-s-per-gib", "4096"])
    for result in (free, priced):
        assert result.exit_code == 0, result.output
    head = next(line for line in free.output.splitlines() if line.startswith("| scenario"))
    titles = [title.strip() for title in head.split("|")[1:-1]]
    crossed, egress = titles.index("GiB crossed"), titles.index("egress GPU-h")

    def row(output: str) -> list[str]:
        line = next(line for line in output.splitlines() if line.startswith("| two |"))
        return [value.strip() for value in line.split("|")[1:-1]]

    assert row(free.output)[crossed] != "0" and row(free.output)[egress] in ("0", "0.0", "0.00")
    assert row(priced.output)[crossed] in ("0", "0.0", "0.00")
    assert "egress: 4096 GPU-seconds a GiB" in priced.output
    assert (tmp_path / "out" / "two.json").exists()
    assert (tmp_path / "out" / "two-egress4096.json").exists()
    refused = runner.invoke(sim_app, [*args, "--egress-gpu-s-per-gib", "-1"])
    assert refused.exit_code == 2
    assert "--egress-gpu-s-per-gib" in refused.output and "must be >= 0" in refused.output
