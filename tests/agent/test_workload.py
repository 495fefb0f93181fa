"""Starting workloads under management and recording them in the agent's state directory."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from agent import procs
from agent.workload import (
    CHECKPOINT_PATH_ENV,
    WORKLOAD_ID_ENV,
    WorkloadStartFailed,
    WorkloadStore,
    kill_workload,
    start_workload,
)
from tests.support.processes import Reaper


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)


def test_start_records_the_workload_and_detaches_it(
    tmp_path: Path, store: WorkloadStore, reaper: Reaper
) -> None:
    workload = reaper.track(
        start_workload(
            store=store,
            command=["sh", "-c", "echo hello from $GREETING; exec sleep 600"],
            env={"GREETING": "shaper", "PATH": os.environ["PATH"]},
            cwd=tmp_path,
            workload_id="greeter",
        )
    )

    recorded = store.load("greeter")
    assert recorded == workload
    assert recorded.spec.command[:2] == ["sh", "-c"]
    assert recorded.spec.env == {"GREETING": "shaper", "PATH": os.environ["PATH"]}
    assert recorded.spec.cwd == str(tmp_path)
    assert (store.state_dir / "workloads" / "greeter.json").is_file()
    assert workload.is_running()
    # Its own session, no terminal, stdin from /dev/null: what CRIU needs to dump it.
    assert os.getsid(workload.pid) == workload.pid
    assert os.readlink(f"/proc/{workload.pid}/fd/0") == "/dev/null"
    # /proc/PID/environ shows the parent's environment until the child has exec'd, and
    # nothing while it execs: read it once the shell has exec'd its last program (CI once
    # read it empty between the shell and `exec sleep`).
    cmdline = Path(f"/proc/{workload.pid}/cmdline")
    assert procs.wait_until(lambda: cmdline.read_bytes() == b"sleep\x00600\x00", timeout=10)
    environ = _environ(workload.pid)
    assert environ[WORKLOAD_ID_ENV] == "greeter"
    assert environ[CHECKPOINT_PATH_ENV] == workload.checkpoint_path
    log = Path(workload.spec.log_path)
    assert procs.wait_until(lambda: log.read_text() == "hello from shaper\n", timeout=10)
    assert [w.id for w in store.all()] == ["greeter"]


def test_kill_takes_the_whole_process_group(store: WorkloadStore, reaper: Reaper) -> None:
    workload = reaper.track(
        start_workload(store=store, command=["sh", "-c", "sleep 600 & sleep 600 & wait"])
    )
    assert procs.wait_until(lambda: len(procs.children_of(workload.pid)) == 2, timeout=10)
    children = procs.children_of(workload.pid)

    assert kill_workload(workload, timeout=10)

    assert not workload.is_running()
    assert not any(procs.is_running(child) for child in children)


def test_a_reused_pid_is_not_taken_for_the_workload(store: WorkloadStore, reaper: Reaper) -> None:
    workload = reaper.track(start_workload(store=store, command=["sleep", "600"]))
    impostor = workload.model_copy(update={"pid_started": (workload.pid_started or 0) + 1})

    assert workload.is_running()
    assert not impostor.is_running()
    assert kill_workload(impostor, timeout=1)  # nothing to kill: it is not that process
    assert workload.is_running()


def test_bad_commands_and_ids_are_refused(store: WorkloadStore) -> None:
    with pytest.raises(WorkloadStartFailed, match="cannot start '/no/such/program'"):
        start_workload(store=store, command=["/no/such/program"])
    with pytest.raises(ValueError, match="workload id '../escape' must match"):
        start_workload(store=store, command=["true"], workload_id="../escape")
    with pytest.raises(ValueError, match="command must not be empty"):
        start_workload(store=store, command=[])
    with pytest.raises(KeyError, match="no state file"):
        store.load("never-started")


def test_agent_exec_starts_a_managed_workload(tmp_path: Path, reaper: Reaper) -> None:
    from typer.testing import CliRunner

    from agent.cli import agent_cli

    state_dir = tmp_path / "state"
    runner = CliRunner()
    started = runner.invoke(
        agent_cli,
        ["exec", "--state-dir", str(state_dir), "--id", "job-7", "--", "sleep", "600"],
    )
    assert started.exit_code == 0, started.output
    workload = reaper.track(WorkloadStore(state_dir).load("job-7"))
    assert f'"pid": {workload.pid}' in started.output
    assert workload.spec.command == ["sleep", "600"]
    assert workload.is_running()

    listed = runner.invoke(agent_cli, ["ps", "--state-dir", str(state_dir)])
    assert listed.exit_code == 0
    assert listed.output.split("\t")[:5] == ["job-7", "criu", "running", str(workload.pid), "alive"]

    refused = runner.invoke(
        agent_cli, ["exec", "--state-dir", str(state_dir), "--", "/no/such/program"]
    )
    assert refused.exit_code == 1
    assert "cannot start '/no/such/program'" in refused.output
