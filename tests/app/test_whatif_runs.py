"""POST /simulations: what-if runs in their own process, their state, limits and restarts."""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import anyio.to_thread
import httpx
import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError
from sqlalchemy.engine import Engine
from sqlmodel import Session

from app.api.deps import get_clock
from app.core import migrate
from app.core.clock import FrozenClock
from app.core.config import Settings
from app.core.db import get_session, make_engine
from app.core.errors import PayloadTooLarge
from app.main import create_app
from app.simulations import runner, runs, uploads
from app.simulations.models import TRACE_KINDS, WhatIfCreate, WhatIfRecord
from app.tokens import service as token_service
from app.tokens.models import ApiTokenCreate
from sim.metrics import RunResult
from sim.run import compare
from sim.scenario import ScenarioError, builtin_scenarios, load_scenario
from sim.traces import KINDS, TraceOptions, open_trace

# A small trace to upload (tests/app/data/README.md).
TRACE = Path(__file__).parent / "data" / "pollux-workload-1.csv"


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
    expected = compare(load_scenario("mixed", seed=5), ["fifo", "priority"])
    _assert_result(client, auth["viewer"], run["result"], expected)


def _assert_result(
    client: TestClient, headers: dict[str, str], name: str, expected: dict[str, RunResult]
) -> None:
    """The result GET /simulations/{name} serves has ``expected``'s policies and metrics."""
    body = client.get(f"/api/v1/simulations/{name}", headers=headers).json()
    assert body["policies"] == list(expected)
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


def _upload(
    client: TestClient,
    headers: dict[str, str],
    content: bytes,
    filename: str = "pollux-workload-1.csv",
    **fields: str | list[str],
) -> Any:
    return client.post(
        "/api/v1/simulations",
        files={"trace": (filename, content, "text/csv")},
        data=fields,
        headers=headers,
    )


def _wait(client: TestClient, headers: dict[str, str], run: dict[str, Any]) -> dict[str, Any]:
    deadline = time.monotonic() + 180
    while run["state"] in runs.ACTIVE and time.monotonic() < deadline:
        time.sleep(0.3)
        run = client.get(f"/api/v1/simulations/runs/{run['id']}", headers=headers).json()
    return run


def test_an_uploaded_trace_is_replayed_as_shaper_sim_replay_would(
    client: TestClient, auth: dict[str, dict[str, str]], results_dir: Path
) -> None:
    started = _upload(
        client,
        auth["operator"],
        TRACE.read_bytes(),
        filename="../../etc/my trace.csv",
        policies=["fifo", "backfill"],
        gpus="32",
        gpus_per_node="4",
        window_end_h="6",
        seed="3",
    )
    assert started.status_code == 202, started.text
    run = started.json()
    assert run["state"] == "queued" and run["trace"] == "my_trace"
    assert run["scenario"] == "pollux:my_trace" and run["policies"] == ["fifo", "backfill"]
    assert run["replay"]["gpus"] == 32 and run["replay"]["window_end_h"] == 6
    # Stored under a name of the server's, beside the runs, until the run ends.
    stored = list((results_dir / runs.UPLOADS_DIR).iterdir())
    assert len(stored) == 1 and stored[0].read_bytes() == TRACE.read_bytes()
    assert "trace" not in stored[0].name and not (results_dir.parent / "etc").exists()

    run = _wait(client, auth["viewer"], run)
    assert run["state"] == "done", run
    assert run["policies_done"] == 2 and run["error"] is None
    assert run["result"] == f"pollux-my_trace-{run['id']}"
    assert list((results_dir / runs.UPLOADS_DIR).iterdir()) == []
    listed = client.get("/api/v1/simulations", headers=auth["viewer"]).json()
    assert [(r["name"], r["scenario"]) for r in listed] == [(run["result"], "pollux:my_trace")]

    options = TraceOptions(gpus=32, gpus_per_node=4, window_end_h=6, seed=3)
    loaded = open_trace(TRACE, options=options)
    assert loaded.kind == "pollux" and loaded.workload.total_gpus == 32
    expected = compare(
        loaded.workload, ["fifo", "backfill"], replan_on_events=False, validate_plans=False
    )
    _assert_result(client, auth["viewer"], run["result"], expected)


def test_a_trace_its_loader_cannot_read_is_422_naming_the_trace(
    client: TestClient, auth: dict[str, dict[str, str]], results_dir: Path
) -> None:
    bad = _upload(client, auth["operator"], b"job,gpus\n1,2\n", "x.csv", policies="fifo")
    assert bad.status_code == 422, bad.text
    error = bad.json()["error"]
    assert error["field"] == "trace"
    # The loader's message, naming the formats it knows and the file as the caller named it.
    assert "cannot tell the trace format of x.csv" in error["message"]
    assert all(kind in error["message"] for kind in ("philly", "pollux", "gavel", "native"))
    assert str(results_dir) not in error["message"]
    binary = _upload(client, auth["operator"], bytes(range(256)) * 4, policies="fifo")
    assert binary.status_code == 422 and binary.json()["error"]["field"] == "trace"
    pods = Path(__file__).parents[1] / "sim" / "data" / "alibaba-pods-sample.csv"
    alibaba = _upload(client, auth["operator"], pods.read_bytes(), "pods.csv", policies="fifo")
    assert alibaba.status_code == 422 and alibaba.json()["error"]["field"] == "trace"
    assert "pods.csv is an Alibaba pod list" in alibaba.json()["error"]["message"]
    forced = _upload(client, auth["operator"], TRACE.read_bytes(), kind="gavel", policies="fifo")
    assert forced.status_code == 422 and forced.json()["error"]["field"] == "trace"

    def field(response: Any) -> str:
        assert response.status_code == 422, response.text
        return str(response.json()["error"]["field"])

    trace = TRACE.read_bytes()
    assert field(_upload(client, auth["operator"], trace, policies="fifo,lottery")) == "policies"
    assert field(_upload(client, auth["operator"], trace)) == "policies"
    assert field(_upload(client, auth["operator"], trace, policies="fifo", seed="-1")) == "seed"
    assert field(_upload(client, auth["operator"], trace, policies="fifo", gpus="0")) == "gpus"
    assert field(_upload(client, auth["operator"], trace, policies="fifo", kind="x")) == "kind"
    window = _upload(
        client, auth["operator"], trace, policies="fifo", window_start_h="5", window_end_h="2"
    )
    assert field(window) == "window_end_h"
    # A window that keeps no job of the trace: the loader's refusal is about the trace's
    # options, which on this form are the window's.
    empty = _upload(client, auth["operator"], trace, policies="fifo", window_start_h="100000")
    assert field(empty) == "window_start_h"
    assert "no job is left of the trace's" in empty.json()["error"]["message"]
    assert field(_upload(client, auth["operator"], trace, policies="fifo", nodes="a")) == "nodes"
    missing = client.post(
        "/api/v1/simulations",
        data={"policies": "fifo"},
        files={"other": ("a", b"")},
        headers=auth["operator"],
    )
    assert field(missing) == "other"
    assert not list((results_dir / runs.RUNS_DIR).glob("*.json"))
    assert list((results_dir / runs.UPLOADS_DIR).iterdir()) == []


def _multipart(boundary: str, trace: bytes, chunk: int = 4096) -> Iterator[bytes]:
    """A form with policies and a trace, sent in chunks with no Content-Length."""
    yield (
        f'--{boundary}\r\nContent-Disposition: form-data; name="policies"\r\n\r\nfifo\r\n'
        f'--{boundary}\r\nContent-Disposition: form-data; name="trace"; '
        f'filename="t.csv"\r\nContent-Type: text/csv\r\n\r\n'
    ).encode()
    for start in range(0, len(trace), chunk):
        yield trace[start : start + chunk]
    yield f"\r\n--{boundary}--\r\n".encode()


def test_a_trace_over_the_limit_is_413_counted_as_it_arrives(
    client: TestClient,
    auth: dict[str, dict[str, str]],
    results_dir: Path,
    settings: Settings,
) -> None:
    settings.sim_upload_max_mb = 0.01  # 10 KiB: the trace has 4.7, twice it 9.5
    trace = TRACE.read_bytes() * 3
    declared = _upload(client, auth["operator"], trace * 4, policies="fifo")
    assert declared.status_code == 413, declared.text
    assert declared.json()["error"]["field"] == "trace"
    # Streamed without a length: refused once the count passes the limit.
    streamed = client.post(
        "/api/v1/simulations",
        content=_multipart("b0undary", trace),
        headers={**auth["operator"], "Content-Type": "multipart/form-data; boundary=b0undary"},
    )
    assert streamed.status_code == 413, streamed.text
    assert "SHAPER_SIM_UPLOAD_MAX_MB" in streamed.json()["error"]["message"]
    assert list((results_dir / runs.UPLOADS_DIR).iterdir()) == []
    # Within it, the same body is taken (and its run waits on nothing here).
    settings.sim_upload_max_mb = 1
    taken = client.post(
        "/api/v1/simulations",
        content=_multipart("b0undary", TRACE.read_bytes()),
        headers={**auth["operator"], "Content-Type": "multipart/form-data; boundary=b0undary"},
    )
    assert taken.status_code == 202, taken.text
    assert _wait(client, auth["viewer"], taken.json())["state"] == "done"


def test_an_upload_streams_past_the_buffered_body_limit(
    session: Any, clock: FrozenClock, tokens: dict[str, str], results_dir: Path
) -> None:
    # SHAPER_MAX_BODY_BYTES buffers and caps every other body; an upload has its own limit.
    app = create_app(Settings(environment="test", sim_results_dir=results_dir, max_body_bytes=1024))
    app.dependency_overrides[get_session] = lambda: session
    app.dependency_overrides[get_clock] = lambda: clock
    operator = {"Authorization": f"Bearer {tokens['operator']}"}
    with TestClient(app) as client:
        response = _upload(client, operator, TRACE.read_bytes(), policies="lottery")
        assert response.status_code == 422 and response.json()["error"]["field"] == "policies"
        json_body = {"scenario": "mixed", "policies": ["fifo"] * 300}
        assert (
            client.post("/api/v1/simulations", json=json_body, headers=operator).status_code == 413
        )
        # Two Content-Types, JSON first (what the route reads) and multipart last: the JSON
        # body is still held to the buffered limit, not let through as an upload.
        two_types = [
            *operator.items(),
            ("Content-Type", "application/json"),
            ("Content-Type", "multipart/form-data; boundary=x"),
        ]
        sneaked = client.post(
            "/api/v1/simulations", content=json.dumps(json_body).encode(), headers=two_types
        )
        assert sneaked.status_code == 413, sneaked.text


def test_a_viewer_cannot_upload_a_trace(
    client: TestClient, auth: dict[str, dict[str, str]], results_dir: Path
) -> None:
    refused = _upload(client, auth["viewer"], TRACE.read_bytes(), policies="fifo")
    assert refused.status_code == 403, refused.text
    anonymous = client.post(
        "/api/v1/simulations",
        files={"trace": ("t.csv", TRACE.read_bytes())},
        data={"policies": "fifo"},
    )
    assert anonymous.status_code == 401
    assert not (results_dir / runs.UPLOADS_DIR).exists() or not list(
        (results_dir / runs.UPLOADS_DIR).iterdir()
    )


def test_an_upload_left_by_a_dead_process_is_removed_on_an_app_start(
    settings: Settings, results_dir: Path, clock: FrozenClock
) -> None:
    folder = results_dir / runs.UPLOADS_DIR
    folder.mkdir(parents=True)
    left, fresh = folder / "left.csv.part", folder / "fresh.csv"
    for path in (left, fresh):
        path.write_bytes(TRACE.read_bytes())
    long_ago = (datetime.now(UTC) - 2 * runs.UPLOAD_STALE).timestamp()
    os.utime(left, (long_ago, long_ago))
    create_app(settings)
    assert not left.exists() and fresh.exists()


def test_the_trace_kinds_offered_are_the_replays_but_alibaba() -> None:
    assert set(TRACE_KINDS) == set(KINDS) - {"alibaba"}


def _until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, f"never {what}"
        time.sleep(0.02)


def test_uploads_left_behind_are_swept_while_the_app_serves(
    settings: Settings,
    results_dir: Path,
    clock: FrozenClock,
    holders: list[subprocess.Popen[bytes]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    app = create_app(settings)  # its start finds nothing to sweep: all of it comes after
    folder = results_dir / runs.UPLOADS_DIR
    folder.mkdir(parents=True)
    left, fresh, held, orphan = (folder / f"{n}.csv" for n in ("left", "fresh", "held", "orphan"))
    for path in (left, fresh, held, orphan):
        path.write_bytes(TRACE.read_bytes())
    long_ago = (datetime.now(UTC) - 2 * runs.UPLOAD_STALE).timestamp()
    for path in (left, held):
        os.utime(path, (long_ago, long_ago))
    now = FrozenClock(datetime.now(UTC))
    # A run still replaying its old upload keeps it; one whose process is gone does not.
    for run_id, path, pid in (("held1", held, _hold(holders, "held1")), ("gone1", orphan, None)):
        record = _record(results_dir, run_id, "running", pid or _dead_pid(), now)
        upload = WhatIfRecord.model_validate_json(record.read_text())
        record.write_text(upload.model_copy(update={"upload": path.name}).model_dump_json())
    monkeypatch.setattr(runs, "UPLOAD_SWEEP_EVERY", timedelta(milliseconds=20))

    with TestClient(app):
        _until(lambda: not (left.exists() or orphan.exists()), "swept")

    assert fresh.exists() and held.exists()
    gone = runs.get_run(directory=results_dir, run_id="gone1", now=now.now())
    assert gone.state == "failed"


def _part(boundary: str, name: str, value: str, *headers: str) -> str:
    extra = "".join(f"{h}\r\n" for h in headers)
    return (
        f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"\r\n{extra}\r\n{value}\r\n'
    )


def _trace_part(boundary: str, filename: str = "t.csv", *headers: str) -> str:
    extra = "".join(f"{h}\r\n" for h in headers)
    return (
        f'--{boundary}\r\nContent-Disposition: form-data; name="trace"; '
        f'filename="{filename}"\r\nContent-Type: text/csv\r\n{extra}\r\n'
        f"{TRACE.read_text()}\r\n"
    )


def _send_form(client: TestClient, headers: dict[str, str], boundary: str, parts: list[str]) -> Any:
    return client.post(
        "/api/v1/simulations",
        content=("".join(parts) + f"--{boundary}--\r\n").encode(),
        headers={**headers, "Content-Type": f"multipart/form-data; boundary={boundary}"},
    )


def test_a_forms_parts_and_their_headers_are_bounded(
    client: TestClient, auth: dict[str, dict[str, str]], results_dir: Path
) -> None:
    b, operator = "b0undary", auth["operator"]
    folder = results_dir / runs.UPLOADS_DIR
    header_limit = uploads.MAX_PART_HEADER_BYTES

    def refused(parts: list[str], too_large: str, limit: int = header_limit) -> None:
        response = _send_form(client, operator, b, parts)
        assert response.status_code == 413, response.text
        error = response.json()["error"]
        assert error["field"] == "body" and error["details"]["too_large"] == too_large
        assert error["details"]["limit"] == limit and str(limit) in error["message"]
        assert not folder.exists() or list(folder.iterdir()) == []

    # One header too long, on a field or on the trace (refused before its file is made).
    pad = f"X-Pad: {'a' * header_limit}"
    refused([_part(b, "policies", "fifo", pad)], "part_headers")
    refused([_trace_part(b, "t.csv", pad)], "part_headers")
    refused([_trace_part(b, "t" * header_limit + ".csv")], "part_headers")
    # Headers each under the limit that add up over it; more headers than a part has.
    long = [f"X-{i}: {'a' * (header_limit // 5)}" for i in range(uploads.MAX_PART_HEADERS - 1)]
    refused([_part(b, "seed", "1", *long)], "part_headers")
    many = [f"X-{i}: {i}" for i in range(uploads.MAX_PART_HEADERS)]
    refused([_part(b, "seed", "1", *many)], "part_headers")
    # More parts than the trace and its fields: refused as the one too many begins (the
    # trace written before it removed).
    fields = [_part(b, "policies", "fifo")] * uploads.MAX_FIELDS
    refused([*fields, _trace_part(b), _part(b, "seed", "1")], "parts", uploads.MAX_PARTS)
    # Within the limits (the most headers, a long file name, the most parts) the form is
    # read: here a field of it is refused, which only a form read whole gets to.
    most = [_part(b, "policies", "fifo"), _part(b, "seed", "x", *many[:-1]), _trace_part(b)]
    within = _send_form(client, operator, b, most)
    assert within.status_code == 422 and within.json()["error"]["field"] == "seed", within.text
    name = "t" * 255 + ".csv"
    fields = [_part(b, "policies", "lottery")] * (uploads.MAX_PARTS - 1)
    within = _send_form(client, operator, b, [*fields, _trace_part(b, name)])
    assert within.status_code == 422 and within.json()["error"]["field"] == "policies"
    assert list(folder.iterdir()) == []


# A form whose policies no run takes: read whole, it ends in a 422 and starts nothing.
_UNQUEUED_FORM = b"".join(_multipart("b0undary", TRACE.read_bytes())).replace(b"fifo", b"lottery")
_FORM_TYPE = {"Content-Type": "multipart/form-data; boundary=b0undary"}


class _HeldUploads:
    """Uploads sent through the ASGI app that stop halfway through their trace (its file
    begun) until ``release``; their answers in ``answers``."""

    def __init__(self, client: httpx.AsyncClient, headers: dict[str, str], folder: Path) -> None:
        self.client, self.headers, self.folder = client, headers, folder
        self.release = anyio.Event()
        self.answers: list[httpx.Response] = []

    async def _body(self) -> AsyncIterator[bytes]:
        half = len(_UNQUEUED_FORM) // 2
        yield _UNQUEUED_FORM[:half]
        await self.release.wait()
        yield _UNQUEUED_FORM[half:]

    async def _post(self) -> None:
        answer = await self.client.post(
            "/api/v1/simulations", content=self._body(), headers=self.headers
        )
        self.answers.append(answer)

    async def start(self, streaming: anyio.abc.TaskGroup) -> None:
        """One more, once it is streaming: its file is on disk."""
        count = len(list(self.folder.glob("*.part"))) + 1
        streaming.start_soon(self._post)
        with anyio.fail_after(60):
            while len(list(self.folder.glob("*.part"))) < count:
                await anyio.sleep(0.01)


def test_uploads_beyond_the_concurrent_limit_are_429_until_one_ends(
    session: Any, clock: FrozenClock, tokens: dict[str, str], results_dir: Path
) -> None:
    settings = Settings(
        environment="test", sim_results_dir=results_dir, sim_upload_max_concurrent=2
    )
    app = create_app(settings)
    app.dependency_overrides[get_session] = lambda: session
    app.dependency_overrides[get_clock] = lambda: clock
    headers = {"Authorization": f"Bearer {tokens['operator']}", **_FORM_TYPE}
    folder = results_dir / runs.UPLOADS_DIR

    async def uploads_at_once() -> tuple[list[httpx.Response], httpx.Response, httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://shaper") as client:
            held = _HeldUploads(client, headers, folder)
            async with anyio.create_task_group() as streaming:
                await held.start(streaming)
                await held.start(streaming)
                third = await client.post(
                    "/api/v1/simulations", content=_UNQUEUED_FORM, headers=headers
                )
                # The refused one left nothing: only the two streaming have files.
                assert len(list(folder.iterdir())) == 2
                held.release.set()
            after = await client.post(
                "/api/v1/simulations", content=_UNQUEUED_FORM, headers=headers
            )
            return held.answers, third, after

    answers, third, after = anyio.run(uploads_at_once)

    assert third.status_code == 429, third.text
    assert int(third.headers["Retry-After"]) > 0
    error = third.json()["error"]
    assert error["retryable"] and error["details"]["limit"] == 2
    assert "SHAPER_SIM_UPLOAD_MAX_CONCURRENT" in error["message"]
    for answer in answers:
        assert answer.status_code == 422, answer.text
        assert answer.json()["error"]["field"] == "policies"
    # Once they have ended, their places are free again.
    assert after.status_code == 422 and after.json()["error"]["field"] == "policies"
    assert list(folder.iterdir()) == []


def test_an_upload_that_stops_sending_is_408_and_frees_its_place(
    session: Any, clock: FrozenClock, tokens: dict[str, str], results_dir: Path
) -> None:
    # One place only: a client stalled halfway through its trace would hold it for ever
    # (and its file, untouched, would reach the sweep's hour while still open).
    settings = Settings(
        environment="test",
        sim_results_dir=results_dir,
        sim_upload_max_concurrent=1,
        sim_upload_idle_timeout_s=0.5,
    )
    app = create_app(settings)
    app.dependency_overrides[get_session] = lambda: session
    app.dependency_overrides[get_clock] = lambda: clock
    headers = {"Authorization": f"Bearer {tokens['operator']}", **_FORM_TYPE}
    folder = results_dir / runs.UPLOADS_DIR

    async def stall_then_send() -> tuple[list[httpx.Response], httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://shaper") as client:
            held = _HeldUploads(client, headers, folder)
            # Without the timeout it waits for ever: failed here instead.
            with anyio.fail_after(30):
                async with anyio.create_task_group() as streaming:
                    await held.start(streaming)  # never released: it stops sending
            after = await client.post(
                "/api/v1/simulations", content=_UNQUEUED_FORM, headers=headers
            )
            return held.answers, after

    (stalled,), after = anyio.run(stall_then_send)

    assert stalled.status_code == 408, stalled.text
    error = stalled.json()["error"]
    assert error["field"] == "body" and error["retryable"]
    assert error["details"]["idle_timeout_s"] == 0.5
    assert "SHAPER_SIM_UPLOAD_IDLE_TIMEOUT_S" in error["message"]
    assert stalled.headers["Connection"] == "close"
    # Its place is free again and what it had sent is gone.
    assert after.status_code == 422 and after.json()["error"]["field"] == "policies"
    assert list(folder.iterdir()) == []


def test_settings_keep_an_idle_upload_younger_than_the_sweeps_hour() -> None:
    limit = Settings.model_fields["sim_upload_idle_timeout_s"].metadata
    most = next(m.le for m in limit if getattr(m, "le", None) is not None)
    assert timedelta(seconds=most + runs.CHECK_TIMEOUT_S) < runs.UPLOAD_STALE
    with pytest.raises(ValidationError):
        Settings(environment="test", sim_upload_idle_timeout_s=0)


def test_an_upload_holds_no_database_lock_while_it_streams(
    tmp_path: Path, results_dir: Path, clock: FrozenClock
) -> None:
    # SQLite as the embedded default runs it, each request with its own session: a POST's
    # transaction takes the write lock, which an upload streaming for minutes must not keep.
    url = f"sqlite:///{tmp_path / 'shaper.db'}"
    migrate.upgrade(url)
    engine = make_engine(url, sqlite_busy_timeout_ms=2000)
    with Session(engine) as session:
        token_in = ApiTokenCreate(name="operator", scopes=["operator"])
        token = token_service.create_token(session=session, now=clock.now(), token_in=token_in)
    app = create_app(Settings(environment="test", sim_results_dir=results_dir))

    def session_per_request() -> Iterator[Session]:
        with Session(engine, expire_on_commit=False) as session:
            yield session

    app.dependency_overrides[get_session] = session_per_request
    app.dependency_overrides[get_clock] = lambda: clock
    headers = {"Authorization": f"Bearer {token.token}", **_FORM_TYPE}

    def write() -> None:
        with engine.begin() as connection:  # BEGIN IMMEDIATE: the write lock, or 2 s then out
            connection.exec_driver_sql("UPDATE alembic_version SET version_num = version_num")

    async def write_while_uploading() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://shaper") as client:
            held = _HeldUploads(client, headers, results_dir / runs.UPLOADS_DIR)
            async with anyio.create_task_group() as streaming:
                await held.start(streaming)
                await anyio.to_thread.run_sync(write)
                held.release.set()
            return held.answers

    try:
        (answer,) = anyio.run(write_while_uploading)
    finally:
        engine.dispose()
    assert answer.status_code == 422 and answer.json()["error"]["field"] == "policies"


def test_a_parts_headers_are_counted_whatever_pieces_they_arrive_in(tmp_path: Path) -> None:
    b = "b0undary"
    most = [f"X-{i}: {'a' * 40}" for i in range(uploads.MAX_PART_HEADERS - 1)]
    form = (
        _part(b, "policies", "fifo", *most) + _trace_part(b, "t.csv", *most[:-1]) + f"--{b}--\r\n"
    ).encode()

    async def receive(body: bytes, piece: int) -> uploads.ReceivedForm:
        async def chunks() -> AsyncIterator[bytes]:
            for start in range(0, len(body), piece):
                yield body[start : start + piece]

        return await uploads.receive(
            chunks(),
            content_type=f"multipart/form-data; boundary={b}",
            folder=tmp_path,
            max_bytes=2**20,
            idle_timeout_s=60,
        )

    for piece in (1, 3, 64, len(form)):
        received = anyio.run(receive, form, piece)
        assert received.fields == {"policies": ["fifo"]}, piece
        assert received.trace is not None and received.trace.read_bytes() == TRACE.read_bytes()
        received.trace.unlink()
    one_more = form.replace(b"X-0:", b"X-y: 1\r\nX-0:", 1)
    for piece in (1, 3, len(form)):
        with pytest.raises(PayloadTooLarge, match="headers of part 1"):
            anyio.run(receive, one_more, piece)
    assert list(tmp_path.iterdir()) == []
