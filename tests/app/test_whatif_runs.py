"""POST /simulations: what-if runs in their own process, their state, limits and restarts."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from sqlalchemy.engine import Engine

from app.core.clock import FrozenClock
from app.core.config import Settings
from app.main import create_app
from app.simulations import runner, runs
from app.simulations.models import WhatIfCreate, WhatIfRecord
from sim.run import compare
from sim.scenario import ScenarioError, builtin_scenarios, load_scenario


@pytest.fixture
def engine(sqlite_engine: Engine) -> Engine:
    # A run lives in files, not in the database: one backend is enough.
    return sqlite_engine


@pytest.fixture
def results_dir(tmp_path: Path) -> Path:
    return tmp_path / "sim-results"


@pytest.fixture
def settings(results_dir: Path) -> Settings:
    return Settings(environment="test", sim_results_dir=results_dir)


@pytest.fixture
def holders() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Idle processes that stand for a run's process (their command line names the run)."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for process in started:
        process.kill()
        process.wait()


def _hold(holders: list[subprocess.Popen[bytes]], run_id: str) -> int:
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", run_id])
    holders.append(process)
    return process.pid


def _record(
    results_dir: Path,
    run_id: str,
    state: str,
    pid: int | None,
    clock: FrozenClock,
    age: timedelta = timedelta(minutes=5),
    host: str | None = None,
) -> Path:
    folder = results_dir / runs.RUNS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    record = WhatIfRecord(
        id=run_id,
        scenario="mixed",
        policies=["fifo"],
        seed=None,
        state=state,
        created_at=clock.now() - age,
        pid=pid,
        host=host or socket.gethostname(),
    )
    path = folder / f"{run_id}.json"
    path.write_text(record.model_dump_json())
    return path


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_a_run_writes_the_result_compare_gives_and_reports_progress(
    client: TestClient, auth: dict[str, dict[str, str]], results_dir: Path, clock: FrozenClock
) -> None:
    # More finished runs than are kept: starting one forgets the oldest.
    old = [
        _record(results_dir, f"old{k}", "done", None, clock, age=timedelta(hours=1 + k))
        for k in range(runs.KEEP_FINISHED + 2)
    ]
    started = client.post(
        "/api/v1/simulations",
        json={"scenario": "mixed", "policies": ["fifo", "priority"], "seed": 5},
        headers=auth["operator"],
    )
    assert started.status_code == 202, started.text
    run = started.json()
    assert run["state"] == "queued" and run["policies"] == ["fifo", "priority"]
    seen = set()
    deadline = time.monotonic() + 180
    while run["state"] in ("queued", "running") and time.monotonic() < deadline:
        time.sleep(0.3)
        response = client.get(f"/api/v1/simulations/runs/{run['id']}", headers=auth["viewer"])
        assert response.status_code == 200, response.text
        run = response.json()
        seen.add(run["state"])
        assert 0 <= run["progress"] <= 1 and run["policies_done"] <= 2
    assert run["state"] == "done", run
    assert "running" in seen
    assert run["policies_done"] == 2 and run["progress"] == 1 and run["error"] is None
    assert run["result"] == f"mixed-{run['id']}" and run["finished_at"] is not None

    latest = client.get("/api/v1/simulations/runs", headers=auth["viewer"]).json()
    assert latest[0] == run and [r["id"] for r in latest[1:3]] == ["old0", "old1"]
    assert [path.exists() for path in old[-3:]] == [True, False, False]
    listed = client.get("/api/v1/simulations", headers=auth["viewer"]).json()
    assert [(r["name"], r["scenario"], r["seed"]) for r in listed] == [(run["result"], "mixed", 5)]
    body = client.get(f"/api/v1/simulations/{run['result']}", headers=auth["viewer"]).json()
    expected = compare(load_scenario("mixed", seed=5), ["fifo", "priority"])
    assert body["policies"] == ["fifo", "priority"]
    for policy, result in expected.items():
        got = body["runs"][policy]["metrics"]
        assert len(got) > 10
        for key, value in got.items():
            assert value == pytest.approx(result.metrics[key]), (policy, key)


def test_bad_requests_name_their_field_and_list_what_is_known(
    client: TestClient, auth: dict[str, dict[str, str]], results_dir: Path
) -> None:
    def post(body: dict[str, object]) -> dict[str, str]:
        response = client.post("/api/v1/simulations", json=body, headers=auth["operator"])
        assert response.status_code == 422, response.text
        error: dict[str, str] = response.json()["error"]
        return error

    scenario = post({"scenario": "nowhere", "policies": ["fifo"]})
    assert scenario["field"] == "scenario" and "'nowhere'" in scenario["message"]
    assert all(name in scenario["message"] for name in builtin_scenarios())
    policy = post({"scenario": "mixed", "policies": ["fifo", "lottery"]})
    assert policy["field"] == "policies" and "fifo, backfill, priority, shaper" in policy["message"]
    assert post({"scenario": "mixed", "policies": []})["field"] == "policies"
    assert post({"scenario": "mixed", "policies": ["fifo", "fifo"]})["field"] == "policies"
    assert post({"scenario": "mixed", "policies": ["fifo"], "seed": -1})["field"] == "seed"
    assert post({"policies": ["fifo"]})["field"] == "scenario"

    upload = client.post(
        "/api/v1/simulations",
        files={"trace": ("philly.csv", b"job,gpus\n", "text/csv")},
        headers=auth["operator"],
    )
    assert upload.status_code == 422
    assert upload.json()["error"]["field"] == "trace"
    assert "shaper sim replay" in upload.json()["error"]["message"]
    assert not list((results_dir / runs.RUNS_DIR).glob("*.json"))


def test_a_viewer_cannot_start_a_run_and_an_unknown_run_is_404(
    client: TestClient, auth: dict[str, dict[str, str]], results_dir: Path
) -> None:
    body = {"scenario": "mixed", "policies": ["fifo"]}
    refused = client.post("/api/v1/simulations", json=body, headers=auth["viewer"])
    assert refused.status_code == 403
    assert client.post("/api/v1/simulations", json=body).status_code == 401
    assert client.get("/api/v1/simulations/runs", headers=auth["viewer"]).json() == []
    missing = client.get("/api/v1/simulations/runs/abc123", headers=auth["viewer"])
    assert missing.status_code == 404 and missing.json()["error"]["id"] == "abc123"
    assert client.get("/api/v1/simulations/runs/abc123").status_code == 401
    assert not results_dir.exists() or not list((results_dir / runs.RUNS_DIR).glob("*.json"))


def test_runs_beyond_the_limit_are_refused_until_one_ends(
    client: TestClient,
    auth: dict[str, dict[str, str]],
    results_dir: Path,
    clock: FrozenClock,
    holders: list[subprocess.Popen[bytes]],
) -> None:
    ids = [f"busy{k}" for k in range(runs.MAX_ACTIVE)]
    for k, run_id in enumerate(ids):
        _record(
            results_dir, run_id, "running" if k == 0 else "queued", _hold(holders, run_id), clock
        )
    body = {"scenario": "mixed", "policies": ["fifo"]}
    refused = client.post("/api/v1/simulations", json=body, headers=auth["operator"])
    assert refused.status_code == 429, refused.text
    assert "4 what-if runs are queued or running" in refused.json()["error"]["message"]
    assert refused.headers["Retry-After"] == "30"

    # The running one's process dies without a word: it is failed, and room is made.
    holders[0].kill()
    holders[0].wait()
    gone = client.get("/api/v1/simulations/runs/busy0", headers=auth["viewer"]).json()
    assert gone["state"] == "failed" and "interrupted while running" in gone["error"]
    still = client.get("/api/v1/simulations/runs/busy1", headers=auth["viewer"]).json()
    assert still["state"] == "queued"
    latest = client.get("/api/v1/simulations/runs", headers=auth["viewer"]).json()
    assert sorted((r["id"], r["state"]) for r in latest) == [
        ("busy0", "failed"),
        *((run_id, "queued") for run_id in ids[1:]),
    ]


def test_an_app_start_fails_the_runs_whose_process_is_gone(
    settings: Settings,
    results_dir: Path,
    clock: FrozenClock,
    holders: list[subprocess.Popen[bytes]],
) -> None:
    orphan = _record(results_dir, "orphan1", "running", _dead_pid(), clock)
    unspawned = _record(results_dir, "unspawned1", "queued", None, clock)
    live = _record(results_dir, "live1", "running", _hold(holders, "live1"), clock)
    # A live process that is not the run's (its id was reused) does not keep it alive.
    reused = _record(results_dir, "reused1", "running", holders[0].pid, clock)
    finished = _record(results_dir, "done1", "done", _dead_pid(), clock)

    create_app(settings)

    def state(path: Path) -> WhatIfRecord:
        return WhatIfRecord.model_validate_json(path.read_text())

    for path in (orphan, unspawned, reused):
        assert state(path).state == "failed", path
        assert "start it again" in (state(path).error or "")
        assert state(path).finished_at is not None
    assert state(live).state == "running"
    assert state(finished).state == "done" and state(finished).error is None


def test_the_scenarios_offered_are_the_simulators_built_in_ones() -> None:
    assert runs.known_scenarios() == sorted(builtin_scenarios())


def test_runs_take_turns_and_each_keeps_its_own_result(
    client: TestClient, auth: dict[str, dict[str, str]]
) -> None:
    body = {"scenario": "mixed", "policies": ["fifo"], "seed": 3}
    ids = []
    for _ in range(2):
        started = client.post("/api/v1/simulations", json=body, headers=auth["operator"])
        assert started.status_code == 202, started.text
        ids.append(started.json()["id"])
    deadline = time.monotonic() + 180
    finished: dict[str, dict[str, str]] = {}
    while len(finished) < 2 and time.monotonic() < deadline:
        time.sleep(0.3)
        for run_id in ids:
            run = client.get(f"/api/v1/simulations/runs/{run_id}", headers=auth["viewer"]).json()
            if run["state"] not in ("queued", "running"):
                finished[run_id] = run
    assert [finished[i]["state"] for i in ids] == ["done", "done"], finished
    first, second = sorted(finished.values(), key=lambda r: r["started_at"])
    assert second["started_at"] >= first["finished_at"]  # one simulates at a time
    listed = client.get("/api/v1/simulations", headers=auth["viewer"]).json()
    assert sorted(r["name"] for r in listed) == sorted(f"mixed-{i}" for i in ids)


def test_a_run_that_fails_says_why(results_dir: Path, clock: FrozenClock) -> None:
    # A scenario file removed between the request and the run: the run's process ends
    # with the simulator's own error in the run's state, not a bare "failed".
    _record(results_dir, "vanished1", "queued", None, clock)
    path = results_dir / runs.RUNS_DIR / "vanished1.json"
    path.write_text(path.read_text().replace('"mixed"', '"no-such-scenario"'))
    with pytest.raises(ScenarioError):
        runner.run(results_dir, "vanished1")
    record = WhatIfRecord.model_validate_json(path.read_text())
    assert record.state == "failed" and record.finished_at is not None
    assert record.error and record.error.startswith("ScenarioError: ")
    assert "no-such-scenario" in record.error
    assert not list(results_dir.glob("*.json"))


def _touch(path: Path, at: datetime) -> None:
    os.utime(path, (at.timestamp(), at.timestamp()))


def test_another_hosts_run_without_a_heartbeat_is_failed_and_frees_its_place(
    client: TestClient, auth: dict[str, dict[str, str]], results_dir: Path, clock: FrozenClock
) -> None:
    # Runs of a host a redeploy replaced (its hostname is gone for ever): their processes
    # cannot be checked from here, and kept as active they would refuse every new run.
    stale = [f"stale{k}" for k in range(runs.MAX_ACTIVE)]
    last_beat = clock.now() - runs.HEARTBEAT_STALE - timedelta(seconds=1)
    for run_id in stale:
        _touch(_record(results_dir, run_id, "running", 4242, clock, host="old-pod-1"), last_beat)
    # One that beat a minute ago is another host's live run: left as it is.
    fresh = _record(results_dir, "fresh1", "queued", 4243, clock, host="new-pod-2")
    _touch(fresh, clock.now() - timedelta(minutes=1))

    latest = client.get("/api/v1/simulations/runs", headers=auth["viewer"]).json()
    states = {r["id"]: (r["state"], r["error"]) for r in latest}
    assert states.pop("fresh1") == ("queued", None)
    since = last_beat.isoformat(timespec="seconds")
    for state, error in states.values():
        assert state == "failed"
        assert error.startswith(
            f"interrupted while running: no heartbeat from host old-pod-1 since {since}"
        )
        assert error.endswith("start it again")
    assert sorted(states) == stale
    # Their places are free: a new run starts (it was a 429 for ever).
    body = {"scenario": "mixed", "policies": ["fifo"], "seed": 1}
    started = client.post("/api/v1/simulations", json=body, headers=auth["operator"])
    assert started.status_code == 202, started.text
    run = started.json()
    deadline = time.monotonic() + 120
    while run["state"] in runs.ACTIVE and time.monotonic() < deadline:
        time.sleep(0.2)
        run = client.get(f"/api/v1/simulations/runs/{run['id']}", headers=auth["viewer"]).json()
    assert run["state"] == "done", run


def test_an_unreadable_run_file_does_not_stop_an_app_start(
    settings: Settings, results_dir: Path, clock: FrozenClock, caplog: pytest.LogCaptureFixture
) -> None:
    orphan = _record(results_dir, "orphan2", "running", _dead_pid(), clock)
    (results_dir / runs.RUNS_DIR / "garbled.json").write_text('{"id": "garbled", "sta')
    (results_dir / runs.RUNS_DIR / "folder.json").mkdir()

    with caplog.at_level(logging.WARNING, logger="app.simulations.runs"):
        create_app(settings)

    assert WhatIfRecord.model_validate_json(orphan.read_text()).state == "failed"
    skipped = sorted(r.getMessage().split()[3] for r in caplog.records)
    assert [Path(name).name for name in skipped] == ["folder.json", "garbled.json"]


def test_a_run_beats_while_it_waits_its_turn(
    results_dir: Path, clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every 50 ms rather than 10 s, so that beats are seen in a test's time.
    monkeypatch.setattr(runs, "HEARTBEAT_EVERY", timedelta(milliseconds=50))
    path = _record(results_dir, "waiting1", "queued", None, clock)
    path.write_text(path.read_text().replace('"mixed"', '"no-such-scenario"'))
    long_ago = datetime.now(UTC) - timedelta(hours=1)
    _touch(path, long_ago)
    failures: list[BaseException] = []

    def run() -> None:
        try:
            runner.run(results_dir, "waiting1")
        except ScenarioError as exc:  # the scenario is gone: its end is quick, and failed
            failures.append(exc)

    with runs.simulating(results_dir):  # another run simulates: this one waits queued
        thread = threading.Thread(target=run)
        thread.start()
        deadline = time.monotonic() + 10
        while path.stat().st_mtime <= long_ago.timestamp() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert path.stat().st_mtime > long_ago.timestamp()
        assert WhatIfRecord.model_validate_json(path.read_text()).state == "queued"
    thread.join(timeout=30)
    assert not thread.is_alive() and len(failures) == 1
    assert WhatIfRecord.model_validate_json(path.read_text()).state == "failed"


def test_a_run_imports_the_service_whatever_directory_the_api_started_in(
    tmp_path: Path, clock: FrozenClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # ``python -m`` puts its working directory first on sys.path: an ``app`` package there
    # would be imported in place of the service's. The results directory is relative.
    started_in = tmp_path / "elsewhere"
    (started_in / "app").mkdir(parents=True)
    (started_in / "app" / "__init__.py").write_text("raise SystemExit('the wrong app')\n")
    monkeypatch.chdir(started_in)
    run_in = WhatIfCreate(scenario="mixed", policies=["fifo"], seed=2)
    run = runs.start_run(directory=Path("results"), run_in=run_in, now=datetime.now(UTC))
    deadline = time.monotonic() + 120
    while run.state in runs.ACTIVE and time.monotonic() < deadline:
        time.sleep(0.2)
        run = runs.get_run(directory=Path("results"), run_id=run.id, now=datetime.now(UTC))
    assert run.state == "done", run
    assert (started_in / "results" / f"{runs.result_name(run)}.json").is_file()
