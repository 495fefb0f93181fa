"""The example counter (agent/examples/counter.py), the workload the agent, action and
Slurm migration tests run: its command line, starting it, reading its count."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from agent import procs
from agent.workload import RunningWorkload, WorkloadStore, start_workload
from tests.support.processes import Reaper

COUNTER = Path(__file__).resolve().parents[2] / "agent" / "examples" / "counter.py"
WAIT_S = 30.0


def counter_command(count_file: Path, state_mb: float) -> list[str]:
    """The example counter's command line."""
    return [
        sys.executable,
        str(COUNTER),
        "--count-file",
        str(count_file),
        "--state-mb",
        str(state_mb),
    ]


def start_counter(
    *,
    store: WorkloadStore,
    reaper: Reaper,
    count_file: Path,
    backend: str,
    state_mb: float,
    workload_id: str = "counter",
) -> RunningWorkload:
    """Start the example counter and wait until it has counted a little."""
    workload = reaper.track(
        start_workload(
            store=store,
            command=counter_command(count_file, state_mb),
            backend=backend,
            workload_id=workload_id,
        )
    )
    assert procs.wait_until(lambda: count_of(count_file) >= 10, timeout=WAIT_S), (
        f"counter did not start counting; log:\n{procs.read_tail(Path(workload.spec.log_path))}"
    )
    return workload


def progress_of(count_file: Path) -> dict[str, object]:
    try:
        return json.loads(count_file.read_text())
    except FileNotFoundError:
        return {}


def count_of(count_file: Path) -> int:
    return int(progress_of(count_file).get("count", -1))  # type: ignore[call-overload]


def next_count(count_file: Path, after: int) -> int:
    """The first count written after `after` was: a continuing counter writes after + k."""
    assert procs.wait_until(lambda: count_of(count_file) != after, timeout=WAIT_S), (
        f"the count stayed at {after}: the workload does not run"
    )
    return count_of(count_file)
