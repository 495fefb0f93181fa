"""One what-if run, in its own process: ``python -m app.simulations.runner DIRECTORY RUN_ID``.

Started by ``app.simulations.runs.start_run``. This process is an entry point like
``shaper sim`` (which the CLI mounts) and ``shaper demo``: it imports the simulator, which
the API process never does, and does ``shaper sim compare``'s work — ``run_policy`` under
each policy in turn, ``write_results`` into the results directory — reporting its progress
in the run's file as it goes.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

from app.simulations import runs

# Progress is written at most this often: a file rename per simulated event would cost
# more than the simulation.
PROGRESS_EVERY_S = 0.5


def _reporter(
    directory: Path, run_id: str, done: int, total: int
) -> Callable[[float, float], None]:
    last = [0.0]

    def report(now: float, horizon: float) -> None:
        if time.monotonic() - last[0] < PROGRESS_EVERY_S:
            return
        last[0] = time.monotonic()
        # Past the horizon the queue drains for an unknown while: hold at its end.
        share = min(1.0, now / horizon) if horizon else 1.0
        runs.update_run(directory=directory, run_id=run_id, progress=(done + share) / total)

    return report


@contextmanager
def _heartbeat(directory: Path, run_id: str) -> Iterator[None]:
    """Touches the run's file while queued and running: how an API on another host tells
    this run from one a redeploy took along (``runs.HEARTBEAT_STALE``). A thread, as the
    simulation does not return to this code while it runs a policy."""
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(runs.HEARTBEAT_EVERY.total_seconds()):
            runs.beat(directory=directory, run_id=run_id)

    thread = threading.Thread(target=beat, daemon=True, name=f"heartbeat-{run_id}")
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def run(directory: Path, run_id: str) -> None:
    with _heartbeat(directory, run_id), runs.simulating(directory):
        record = runs.update_run(
            directory=directory,
            run_id=run_id,
            state="running",
            pid=os.getpid(),
            started_at=datetime.now(UTC),
        )
        try:
            # Imported here so that a simulator that cannot load fails the run, with why.
            from sim.run import run_policy, write_results
            from sim.scenario import load_scenario

            workload = load_scenario(record.scenario, seed=record.seed)
            results = {}
            total = len(record.policies)
            for done, policy in enumerate(record.policies):
                runs.update_run(directory=directory, run_id=run_id, current_policy=policy)
                results[policy] = run_policy(
                    workload, policy, progress=_reporter(directory, run_id, done, total)
                )
                runs.update_run(
                    directory=directory,
                    run_id=run_id,
                    policies_done=done + 1,
                    progress=(done + 1) / total,
                )
            name = runs.result_name(record)
            write_results(results, directory / f"{name}.json")
        except Exception as exc:
            runs.update_run(
                directory=directory,
                run_id=run_id,
                state="failed",
                error=f"{type(exc).__name__}: {exc}",
                finished_at=datetime.now(UTC),
            )
            raise
        runs.update_run(
            directory=directory,
            run_id=run_id,
            state="done",
            result=name,
            current_policy=None,
            seed=workload.seed,
            finished_at=datetime.now(UTC),
        )


if __name__ == "__main__":
    run(Path(sys.argv[1]), sys.argv[2])
