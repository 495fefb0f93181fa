"""``shaper sim sweep --ray``: the seeds of a sweep as tasks on a real Ray cluster (the
head and two workers of tests/support/ray_cluster.py) give the rows a local sweep gives."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sim.cli import sim_app
from sim.ray_sweep import RayUnavailable, sweep_on_ray
from sim.sweep import sweep
from tests.support.ray_cluster import RayCluster, ray_cluster_fixture

__all__ = ["ray_cluster_fixture"]  # the fixture, found by pytest where it is imported


def test_a_sweep_on_ray_gives_the_rows_of_a_local_sweep(ray_cluster: RayCluster) -> None:
    ended: list[int] = []
    on_ray = sweep_on_ray(
        ray_cluster.gcs_address,
        "training-heavy-peak4",
        [3, 4, 5],
        ["backfill"],
        on_seed=ended.append,
        drain=True,
    )
    local = sweep("training-heavy-peak4", [3, 4, 5], ["backfill"], drain=True)
    assert on_ray == local
    assert [(r.seed, r.policy) for r in on_ray][:2] == [(3, "fifo"), (3, "backfill")]
    assert sorted(ended) == [3, 4, 5]  # the progress callback saw every seed end


def test_the_cli_sweep_on_ray_writes_what_a_local_one_writes(
    ray_cluster: RayCluster, tmp_path: Path
) -> None:
    common = ["sweep", "training-heavy-peak4", "--seeds", "3-4", "--policies", "priority"]
    runner = CliRunner()
    on_ray = runner.invoke(
        sim_app,
        [*common, "--ray", ray_cluster.gcs_address, "--out", str(tmp_path / "ray.json")],
    )
    assert on_ray.exit_code == 0, on_ray.output
    local = runner.invoke(
        sim_app, [*common, "--no-progress", "--out", str(tmp_path / "local.json")]
    )
    assert local.exit_code == 0, local.output
    assert json.loads((tmp_path / "ray.json").read_text()) == json.loads(
        (tmp_path / "local.json").read_text()
    )
    tables = [line for line in on_ray.output.splitlines() if line.startswith("| ")]
    assert tables == [line for line in local.output.splitlines() if line.startswith("| ")]


def test_an_unreachable_cluster_is_refused_at_once() -> None:
    with pytest.raises(RayUnavailable, match="nothing answers at 127.0.0.1:9"):
        sweep_on_ray("127.0.0.1:9", "training-heavy-peak4", [3], [])
    refused = CliRunner().invoke(
        sim_app, ["sweep", "training-heavy-peak4", "--seeds", "3", "--ray", "somewhere"]
    )
    assert refused.exit_code == 2 and "host:port" in refused.output
