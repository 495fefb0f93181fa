"""What-if runs started from the dashboard: ``shaper sim compare``'s work in its own process.

A run is a file, ``<results dir>/.runs/<id>.json`` (``WhatIfRecord``), not a table row:
the process that simulates (``app.simulations.runner``) writes its progress there and
needs no database connection, and every API worker on the host reads the same file.
Every read-modify-write of these files holds ``.runs/.lock`` (``flock``), so counting the
active runs and adding one is a single step for all the workers. The simulating processes
take ``.runs/.exec.lock`` in turn: one run simulates at a time (it is CPU-bound; two would
only halve each other's speed), the others wait queued, in no promised order.

A run's own process writes its end, done or failed. One that dies first (a restart that
took it along, a kill, the kernel's OOM killer) leaves its file queued or running: each
read and each app start (``create_app``) mark such a run failed once its process is gone.
Only processes on this host can be checked: for another host's run (a results directory
shared between hosts, or kept across a redeploy that changed the hostname) the sign of
life is its file's modification time, which the run's process touches every
``HEARTBEAT_EVERY`` while queued and running; one untouched for ``HEARTBEAT_STALE`` is
marked failed, or it would hold its place among ``MAX_ACTIVE`` for ever.

A run may replay an uploaded trace (``start_replay``) rather than a built-in scenario: the
file (``UPLOADS_DIR``, named by the server) is read once by its loader before the run is
queued, and is removed when the run ends, however it ends: by its process, or here when
the run is marked failed.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from importlib import resources
from pathlib import Path
from typing import Any

from app.core.errors import Internal, Invalid, NotFound, TooManyRequests
from app.simulations.models import (
    TraceReplay,
    WhatIfCreate,
    WhatIfRecord,
    WhatIfRun,
    WhatIfUpload,
)
from solver.policies import POLICY_NAMES

log = logging.getLogger(__name__)

RUNS_DIR = ".runs"
# One simulating and three waiting: enough to line up a comparison, few enough that a
# queue of heavy scenarios cannot keep the machine busy for a day.
MAX_ACTIVE = 4
# Between the file's creation and the API writing the new process's id.
SPAWN_GRACE = timedelta(seconds=30)
ACTIVE = ("queued", "running")
# How often a run's process touches its file, and how long another host's run may go
# untouched before it is taken for dead: many beats, so that a loaded machine missing a
# few is not failed, and short enough that a redeploy's orphans free their places soon.
HEARTBEAT_EVERY = timedelta(seconds=10)
HEARTBEAT_STALE = timedelta(minutes=5)
# The directory holding the ``app`` package: the runner's working directory, as
# ``python -m`` puts that first on sys.path and the API's own (wherever it was started)
# could hold another ``app`` or ``sim`` that would be imported instead.
PACKAGE_ROOT = Path(__file__).resolve().parents[2]
# Finished runs' files kept (their results stay: they are the results directory's).
KEEP_FINISHED = 100
# Uploaded traces (``app.simulations.uploads``), each kept until its run ends: beside
# RUNS_DIR, whose every ``*.json`` is a run.
UPLOADS_DIR = ".uploads"
# How long reading an uploaded trace before it is queued may take (a full load, as the
# run will do: a trace the loader refuses is refused to the caller, not left to fail).
CHECK_TIMEOUT_S = 120
# An upload no active run holds, untouched this long, was left by a process that died
# between receiving it and queueing its run; removed on an app start and every
# UPLOAD_SWEEP_EVERY after (``sweep_uploads``).
UPLOAD_STALE = timedelta(hours=1)
UPLOAD_SWEEP_EVERY = timedelta(minutes=10)
# When a refused upload may come back: an upload and its check take seconds to minutes.
UPLOAD_RETRY_AFTER_S = 10


def known_scenarios() -> list[str]:
    """The built-in scenarios (``sim.scenario.builtin_scenarios``), read from the YAML files
    the simulator ships: the service itself does not import the simulator."""
    folder = Path(str(resources.files("sim") / "scenarios"))
    return sorted(p.stem for p in folder.glob("*.yaml"))


def _runs_dir(directory: Path) -> Path:
    return directory / RUNS_DIR


def uploads_dir(directory: Path) -> Path:
    return directory / UPLOADS_DIR


def upload_path(directory: Path, record: WhatIfRecord) -> Path | None:
    return None if record.upload is None else uploads_dir(directory) / record.upload


def remove_upload(directory: Path, record: WhatIfRecord) -> None:
    """The run's uploaded trace, once it has ended: replayed, or never to be."""
    path = upload_path(directory, record)
    if path is not None:
        path.unlink(missing_ok=True)


@contextmanager
def _locked(directory: Path, name: str = ".lock") -> Iterator[None]:
    folder = _runs_dir(directory)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / name, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextmanager
def simulating(directory: Path) -> Iterator[None]:
    """Held by a run's process while it simulates: waits for the run before it."""
    with _locked(directory, ".exec.lock"):
        yield


def _path(directory: Path, run_id: str) -> Path:
    return _runs_dir(directory) / f"{run_id}.json"


def _read(path: Path) -> WhatIfRecord:
    return WhatIfRecord.model_validate_json(path.read_text())


def _write(directory: Path, record: WhatIfRecord) -> None:
    # Whole or not at all: a reader never sees half a file.
    path = _path(directory, record.id)
    partial = path.with_suffix(".tmp")
    partial.write_text(record.model_dump_json())
    os.replace(partial, path)


def _public(record: WhatIfRecord) -> WhatIfRun:
    return WhatIfRun.model_validate(record.model_dump(exclude={"pid", "host", "upload"}))


def beat(*, directory: Path, run_id: str) -> None:
    """For the run's own process, while queued and running: a sign of life that another
    host can read (``HEARTBEAT_STALE``)."""
    try:
        os.utime(_path(directory, run_id))
    except OSError:
        pass  # replaced by a write this moment, which touched it as well


def _gone(directory: Path, record: WhatIfRecord, now: datetime) -> str | None:
    """Why an active run's process is taken for gone; ``None`` while it may be alive."""
    if record.host != socket.gethostname():
        touched = datetime.fromtimestamp(_path(directory, record.id).stat().st_mtime, UTC)
        if now - touched < HEARTBEAT_STALE:
            return None
        return (
            f"no heartbeat from host {record.host} since {touched.isoformat(timespec='seconds')}"
            ": its process ended without finishing it, e.g. in a redeploy"
        )
    if record.pid is None:
        alive = now - record.created_at < SPAWN_GRACE
    else:
        try:
            # The process id may have been reused: it must still be this run's process.
            alive = record.id.encode() in Path(f"/proc/{record.pid}/cmdline").read_bytes()
        except OSError:
            alive = False
    if alive:
        return None
    return f"its process (pid {record.pid}) ended without finishing it, e.g. in a restart"


def _settle(directory: Path, record: WhatIfRecord, now: datetime) -> WhatIfRecord:
    """The record, marked failed if it is active but its process is gone."""
    why = _gone(directory, record, now) if record.state in ACTIVE else None
    if why is None:
        return record
    record = record.model_copy(
        update={
            "state": "failed",
            "finished_at": now,
            "error": f"interrupted while {record.state}: {why}; start it again",
        }
    )
    _write(directory, record)
    remove_upload(directory, record)
    return record


def _records(directory: Path, now: datetime) -> list[WhatIfRecord]:
    found = []
    for path in _runs_dir(directory).glob("*.json"):
        try:
            found.append(_settle(directory, _read(path), now))
        except (OSError, ValueError):
            continue  # a stray or unreadable file is not a run
    return found


def fail_interrupted(*, directory: Path, now: datetime) -> list[str]:
    """Mark failed every run whose process is gone; the ids marked. Run on each app start,
    which a stray or unreadable file must not stop: it is skipped, and said once here."""
    if not (_runs_dir(directory).is_dir() or uploads_dir(directory).is_dir()):
        return []
    marked = []
    with _locked(directory):
        for path in _runs_dir(directory).glob("*.json"):
            try:
                record = _read(path)
                if _settle(directory, record, now).state != record.state:
                    marked.append(record.id)
            except (OSError, ValueError) as exc:
                log.warning("what-if run file %s skipped: not readable as a run (%s)", path, exc)
        _remove_stale_uploads(directory, now)
    return marked


def sweep_uploads(*, directory: Path, now: datetime) -> None:
    """What an app start does (``fail_interrupted``), for a process that has been up a
    while: the runs whose process is gone marked failed (their uploads removed), and the
    uploads no active run holds that are older than UPLOAD_STALE removed. Every API
    process runs it every UPLOAD_SWEEP_EVERY (``app.main``): the uploads are on its host."""
    fail_interrupted(directory=directory, now=now)


@contextmanager
def upload_slot(*, directory: Path, limit: int) -> Iterator[None]:
    """Held while an upload is received, checked and queued: one of ``limit`` places
    (``SHAPER_SIM_UPLOAD_MAX_CONCURRENT``) shared by every API process on the host, each a
    lock file taken without waiting (``flock``, let go by the kernel when its holder
    ends, however it ends). None free: 429, before anything of the upload is read."""
    folder = _runs_dir(directory)
    folder.mkdir(parents=True, exist_ok=True)
    for index in range(limit):
        handle = open(folder / f".upload-{index}.lock", "a")  # noqa: SIM115 (closed below)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
            handle.close()
        return
    raise TooManyRequests(
        f"{limit} trace uploads are being received, the most at once "
        "(SHAPER_SIM_UPLOAD_MAX_CONCURRENT); send this one when one of them has finished",
        field="trace",
        details={"limit": limit, "setting": "SHAPER_SIM_UPLOAD_MAX_CONCURRENT"},
        retry_after_s=UPLOAD_RETRY_AFTER_S,
    )


def _remove_stale_uploads(directory: Path, now: datetime) -> None:
    """Uploads no active run holds, left by an API process that died with them."""
    held = set()
    for path in _runs_dir(directory).glob("*.json"):
        try:
            record = _read(path)
        except (OSError, ValueError):
            continue
        if record.state in ACTIVE and record.upload is not None:
            held.add(record.upload)
    for path in uploads_dir(directory).glob("*"):
        try:
            touched = datetime.fromtimestamp(path.stat().st_mtime, UTC)
            if path.name not in held and now - touched > UPLOAD_STALE:
                path.unlink()
        except OSError:
            continue  # gone meanwhile


def _check(run_in: WhatIfCreate) -> None:
    scenarios = known_scenarios()
    if run_in.scenario not in scenarios:
        raise Invalid(
            f"unknown scenario {run_in.scenario!r}; one of {', '.join(scenarios)}",
            field="scenario",
        )
    _check_policies(run_in.policies)


def _check_policies(policies: list[str]) -> None:
    for policy in policies:
        if policy not in POLICY_NAMES:
            raise Invalid(
                f"unknown policy {policy!r}; one of {', '.join(POLICY_NAMES)}",
                field="policies",
            )
    if len(set(policies)) != len(policies):
        raise Invalid("a policy is listed twice", field="policies")


def _refuse_when_full(records: list[WhatIfRecord]) -> None:
    active = [r for r in records if r.state in ACTIVE]
    if len(active) >= MAX_ACTIVE:
        raise TooManyRequests(
            f"{len(active)} what-if runs are queued or running, the most at once; "
            "start this one when one of them has finished",
            retry_after_s=30,
        )


def refuse_when_full(*, directory: Path, now: datetime) -> None:
    """429 before an upload is read, while MAX_ACTIVE runs are active (``start_replay``
    asks again when it queues the run)."""
    if _runs_dir(directory).is_dir():
        with _locked(directory):
            _refuse_when_full(_records(directory, now))


def _prune(directory: Path, records: list[WhatIfRecord]) -> None:
    """Forget all but the KEEP_FINISHED latest finished runs."""
    finished = sorted(
        (r for r in records if r.state not in ACTIVE), key=lambda r: r.created_at, reverse=True
    )
    for record in finished[KEEP_FINISHED:]:
        for suffix in (".json", ".log"):
            _path(directory, record.id).with_suffix(suffix).unlink(missing_ok=True)


def _spawn(directory: Path, run_id: str) -> subprocess.Popen[bytes]:
    # The child writes its traceback here if it fails; it keeps its own copy of the file.
    with open(_runs_dir(directory) / f"{run_id}.log", "ab") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "app.simulations.runner", str(directory.resolve()), run_id],
            cwd=PACKAGE_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=output,
            close_fds=True,
        )
    # Reaped when it ends, so that it does not linger as a zombie of this process.
    threading.Thread(target=process.wait, daemon=True, name=f"whatif-{run_id}").start()
    return process


def start_run(*, directory: Path, run_in: WhatIfCreate, now: datetime) -> WhatIfRun:
    """Queue a run and start its process; refused while MAX_ACTIVE runs are active."""
    _check(run_in)
    return _queue(
        directory,
        WhatIfRecord(
            id=uuid.uuid4().hex[:12],
            scenario=run_in.scenario,
            policies=run_in.policies,
            seed=run_in.seed,
            state="queued",
            created_at=now,
            host=socket.gethostname(),
        ),
        now,
    )


def start_replay(
    *,
    directory: Path,
    trace: Path,
    trace_name: str,
    sent_as: str,
    replay_in: WhatIfUpload,
    now: datetime,
) -> WhatIfRun:
    """Queue the replay of an uploaded ``trace`` (in ``uploads_dir``), as ``shaper sim
    replay`` does it, once its loader has read it; the run owns the file from then on and
    removes it when it ends. Refused, the file is removed here."""
    try:
        _check_policies(replay_in.policies)
        end = replay_in.window_end_h
        if end is not None and end <= replay_in.window_start_h:
            raise Invalid("must be after window_start_h", field="window_end_h")
        replay = TraceReplay.model_validate(
            replay_in.model_dump(include=set(TraceReplay.model_fields))
        )
        kind = check_trace(trace, replay=replay, seed=replay_in.seed or 0, shown=sent_as)
        return _queue(
            directory,
            WhatIfRecord(
                id=uuid.uuid4().hex[:12],
                scenario=f"{kind}:{trace_name}",
                policies=replay_in.policies,
                seed=replay_in.seed,
                state="queued",
                created_at=now,
                host=socket.gethostname(),
                trace=trace_name,
                replay=replay,
                upload=trace.name,
            ),
            now,
        )
    except BaseException:
        trace.unlink(missing_ok=True)
        raise


def _queue(directory: Path, record: WhatIfRecord, now: datetime) -> WhatIfRun:
    with _locked(directory):
        records = _records(directory, now)
        _refuse_when_full(records)
        _prune(directory, records)
        _write(directory, record)
        record.pid = _spawn(directory, record.id).pid
        _write(directory, record)
    return _public(record)


# The input a loader's refusal (``sim.traces.TraceInput``) is about → the form's field.
TRACE_FIELDS = {
    "trace": "trace",
    "nodes": "trace",
    "kind": "trace",
    "cluster": "gpus",
    "options": "window_start_h",  # the form's only shaping options are the window's
}


def check_trace(trace: Path, *, replay: TraceReplay, seed: int, shown: str) -> str:
    """The kind of trace the replay's loader reads ``trace`` as, having read it all, in a
    process of its own (the service does not import the simulator); a refusal is a 422
    with the loader's message, naming the field to fix."""
    options = json.dumps({**replay.model_dump(), "seed": seed})
    try:
        done = subprocess.run(
            [sys.executable, "-m", "app.simulations.runner", "--check", str(trace), options],
            cwd=PACKAGE_ROOT,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=CHECK_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise Invalid(
            f"reading the trace took over {CHECK_TIMEOUT_S} s; cut it (a window, fewer "
            "jobs) or replay it with `shaper sim replay`",
            field="trace",
        ) from exc
    try:
        answer = json.loads(done.stdout.decode().strip().splitlines()[-1])
    except (IndexError, ValueError) as exc:
        log.error("trace check failed (exit %s): %s", done.returncode, done.stderr.decode())
        raise Internal("the trace could not be checked") from exc
    if "error" in answer:
        # The loader names the server's copy; the caller knows the file by its own name.
        message = str(answer["error"]).replace(str(trace), shown)
        about = str(answer.get("about", "trace"))
        field = (
            "kind"
            if about == "kind" and replay.kind != "auto"
            else TRACE_FIELDS.get(about, "trace")
        )
        raise Invalid(message, field=field)
    return str(answer["kind"])


def get_run(*, directory: Path, run_id: str, now: datetime) -> WhatIfRun:
    path = _path(directory, run_id)
    if not (run_id.isalnum() and path.is_file()):
        raise NotFound(f"no what-if run {run_id!r}", resource="simulation_run", resource_id=run_id)
    with _locked(directory):
        record = _settle(directory, _read(path), now)
    return _public(record)


def list_runs(*, directory: Path, now: datetime, limit: int = 20) -> list[WhatIfRun]:
    """The latest runs, newest first: what a page opened mid-run follows."""
    if not _runs_dir(directory).is_dir():
        return []
    with _locked(directory):
        records = sorted(_records(directory, now), key=lambda r: r.created_at, reverse=True)
    return [_public(r) for r in records[:limit]]


def update_run(*, directory: Path, run_id: str, **changes: Any) -> WhatIfRecord:
    """For the run's own process: its state, progress, end."""
    with _locked(directory):
        record = _read(_path(directory, run_id)).model_copy(update=changes)
        _write(directory, record)
    return record


def result_name(record: WhatIfRun) -> str:
    """A file per run, so that a run never replaces an earlier result of its scenario; in
    the characters a result's name may have (a replay's scenario is ``kind:name``)."""
    return re.sub(r"[^A-Za-z0-9._-]", "-", f"{record.scenario}-{record.id}")
