"""/simulations: the results `shaper sim` wrote, as the dashboard reads them."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from app.core.config import Settings
from sim.run import compare, run_policy, write_results
from sim.scenario import load_scenario


@pytest.fixture
def results_dir(tmp_path: Path) -> Path:
    return tmp_path / "sim-results"


@pytest.fixture
def settings(results_dir: Path) -> Settings:
    return Settings(environment="test", sim_results_dir=results_dir)


@pytest.fixture(scope="module")
def compared() -> dict[str, object]:
    return compare(load_scenario("training-heavy"), ["fifo", "shaper"])


def test_lists_compare_and_run_results_newest_first_and_skips_the_rest(
    client: TestClient, auth: dict[str, dict[str, str]], results_dir: Path, compared: dict
) -> None:
    write_results(compared, results_dir / "training-heavy.json")
    single = write_results(
        run_policy(load_scenario("mixed"), "backfill"), results_dir / "mixed-backfill.json"
    )
    os.utime(single, (single.stat().st_atime, single.stat().st_mtime + 60))
    (results_dir / "sweep.json").write_text(json.dumps({"rows": [], "summary": []}))
    (results_dir / "broken.json").write_text("{not json")
    (results_dir / "notes.txt").write_text("not a result")

    response = client.get("/api/v1/simulations", headers=auth["viewer"])
    assert response.status_code == 200, response.text
    listed = response.json()
    assert [r["name"] for r in listed] == ["mixed-backfill", "training-heavy"]
    assert listed[0]["policies"] == ["backfill"] and listed[0]["scenario"] == "mixed"
    assert listed[1]["policies"] == ["fifo", "shaper"] and listed[1]["seed"] == 11


def test_one_result_carries_metrics_and_the_utilization_series(
    client: TestClient, auth: dict[str, dict[str, str]], results_dir: Path, compared: dict
) -> None:
    write_results(compared, results_dir / "training-heavy.json")
    response = client.get("/api/v1/simulations/training-heavy", headers=auth["viewer"])
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["scenario"] == "training-heavy"
    for policy in ("fifo", "shaper"):
        run = body["runs"][policy]
        expected = compared[policy].metrics  # type: ignore[attr-defined]
        assert run["metrics"]["utilization"] == pytest.approx(expected["utilization"])
        assert run["metrics"]["weighted_output"] == pytest.approx(expected["weighted_output"])
        assert len(run["t_h"]) == len(run["utilization"]) > 10
        assert all(0 <= u <= 1 for u in run["utilization"])


def test_bad_names_and_files_get_clear_errors(
    client: TestClient, auth: dict[str, dict[str, str]], results_dir: Path
) -> None:
    results_dir.mkdir(parents=True)
    (results_dir / "sweep.json").write_text(json.dumps({"rows": []}))
    (results_dir / "broken.json").write_text("{not json")
    headers = auth["viewer"]

    missing = client.get("/api/v1/simulations/nothing-here", headers=headers)
    assert missing.status_code == 404 and missing.json()["error"]["id"] == "nothing-here"
    dotted = client.get("/api/v1/simulations/..hidden", headers=headers)
    assert dotted.status_code == 422 and dotted.json()["error"]["field"] == "name"
    sweep = client.get("/api/v1/simulations/sweep", headers=headers).json()["error"]
    assert sweep["field"] == "name" and "not a `shaper sim run`" in sweep["message"]
    broken = client.get("/api/v1/simulations/broken", headers=headers).json()["error"]
    assert "not readable JSON" in broken["message"]
    # Metrics but a series that is not one: not listed, and a 422 rather than a 500.
    odd = {"runs": {"fifo": {"metrics": {"utilization": 0.5}, "timeseries": [1, 2]}}}
    (results_dir / "odd.json").write_text(json.dumps(odd))
    (results_dir / "odd-t.json").write_text(
        json.dumps({"runs": {"fifo": {"metrics": {}, "timeseries": {"t_h": ["x"]}}}})
    )
    for name in ("odd", "odd-t"):
        response = client.get(f"/api/v1/simulations/{name}", headers=headers)
        assert (
            response.status_code == 422 and "malformed run" in response.json()["error"]["message"]
        )
    assert client.get("/api/v1/simulations", headers=headers).json() == []


def test_no_directory_is_an_empty_list_and_a_token_is_needed(
    client: TestClient, auth: dict[str, dict[str, str]]
) -> None:
    assert client.get("/api/v1/simulations", headers=auth["viewer"]).json() == []
    assert client.get("/api/v1/simulations").status_code == 401
    refused = client.get("/api/v1/simulations", headers=auth["connector_alpha"])
    assert refused.status_code == 403


def test_a_rewritten_file_is_read_again(
    client: TestClient, auth: dict[str, dict[str, str]], results_dir: Path, compared: dict
) -> None:
    path = write_results(compared, results_dir / "again.json")
    listed = client.get("/api/v1/simulations", headers=auth["viewer"]).json()
    assert listed[0]["policies"] == ["fifo", "shaper"]
    write_results(run_policy(load_scenario("mixed"), "backfill"), path)
    os.utime(path, (path.stat().st_atime, path.stat().st_mtime + 5))
    listed = client.get("/api/v1/simulations", headers=auth["viewer"]).json()
    assert [(r["name"], r["policies"]) for r in listed] == [("again", ["backfill"])]
