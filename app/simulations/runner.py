"""One what-if run, in its own process: ``python -m app.simulations.runner DIRECTORY RUN_ID``.

Started by ``app.simulations.runs.start_run`` and ``start_replay``. This process is an
entry point like ``shaper sim`` (which the CLI mounts) and ``shaper demo``: it imports the
simulator, which the API process never does, and does ``shaper sim compare``'s work on a
built-in scenario, or ``shaper sim replay``'s on an uploaded trace — ``run_policy`` under
each policy in turn, ``write_results`` into the results directory — reporting its progress
in the run's file as it goes. A replay removes its uploaded trace when it ends.

``python -m app.simulations.runner --check TRACE OPTIONS`` reads an uploaded trace as the
replay will, before it is queued, and prints a line of JSON: its kind, or the loader's
refusal and the input it is about (``runs.check_trace``).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.simulations import runs
from app.simulations.models import TraceReplay, WhatIfRecord

if TYPE_CHECKING:
    from sim.traces import LoadedTrace
    from sim.workload import Workload

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


def _open_trace(path: Path, replay: TraceReplay, seed: int) -> LoadedTrace:
    """``shaper sim replay``'s loading, with its options of the same names."""
    from sim.traces import TraceOptions, open_trace

    options = TraceOptions(
        window_start_h=replay.window_start_h,
        window_end_h=replay.window_end_h,
        gpus=replay.gpus,
        gpus_per_node=replay.gpus_per_node,
        seed=seed,
    )
    return open_trace(path, kind=replay.kind, options=options)


def _workload(directory: Path, record: WhatIfRecord) -> tuple[Workload, dict[str, Any]]:
    """The run's workload, and how ``run_policy`` runs it: a replay as ``shaper sim
    replay`` does (re-plan on its cadence only, plans not validated)."""
    from sim.scenario import load_scenario

    path = runs.upload_path(directory, record)
    if path is None or record.replay is None:
        return load_scenario(record.scenario, seed=record.seed), {}
    loaded = _open_trace(path, record.replay, record.seed or 0)
    # Named as the caller named the file, not as the server stored it.
    workload = replace(loaded.workload, name=record.scenario)
    return workload, {"replan_on_events": False, "validate_plans": False}


def check(path: Path, options: str) -> dict[str, Any]:
    """What ``runs.check_trace`` is told about an uploaded trace."""
    from sim.traces import TraceError

    given = json.loads(options)
    seed = int(given.pop("seed"))
    try:
        loaded = _open_trace(path, TraceReplay.model_validate(given), seed)
    except TraceError as exc:
        about = str(exc.about)
        if about == "nodes":
            return {
                "error": f"{path} is an Alibaba pod list: it replays on its node list, a "
                "second file an upload does not carry; replay it with `shaper sim replay "
                "PODS --nodes NODES`",
                "about": about,
            }
        return {"error": str(exc), "about": about}
    except Exception as exc:  # a trace its loader cannot read, whatever the reason
        return {"error": f"the trace cannot be read: {type(exc).__name__}: {exc}"}
    if not loaded.workload.jobs:
        return {"error": "the trace has no jobs (in the window chosen)", "about": "trace"}
    return {"kind": loaded.kind, "jobs": len(loaded.workload.jobs), "cluster": loaded.cluster}


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

            workload, how = _workload(directory, record)
            results = {}
            total = len(record.policies)
            for done, policy in enumerate(record.policies):
                runs.update_run(directory=directory, run_id=run_id, current_policy=policy)
                results[policy] = run_policy(
                    workload, policy, progress=_reporter(directory, run_id, done, total), **how
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
        finally:
            runs.remove_upload(directory, record)
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
    if sys.argv[1] == "--check":
        print(json.dumps(check(Path(sys.argv[2]), sys.argv[3])))
    else:
        run(Path(sys.argv[1]), sys.argv[2])
