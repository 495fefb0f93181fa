"""Ray jobs Shaper stopped and will submit again: ``<state_dir>/held-jobs.json``.

Ray has no held or requeued job: a stopped submission stays stopped. So a requeue is
stop-then-submit, and the connector keeps what it will submit (entrypoint, runtime
environment, metadata with the next attempt and the resume pointer) in this file before
it stops anything. A job held for a plan (``requeue(hold=True)``, ``hold``) stays here
until ``start``/``release`` submits it, as does a job another cluster's move submitted
here held (``submit(hold=True)``); a plain requeue's record lives only between the
stop and the submission, so that a connector that died in between (or a step resent
after a timeout) submits it on the next try instead of losing the job. Records are
written with an atomic replace under a lock: the telemetry and action threads share them.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict


class HeldJob(BaseModel):
    model_config = ConfigDict(extra="forbid")

    external_id: str
    # The Jobs API body of the submission to make (submission_id included: a resend
    # submits the same id, which Ray refuses as a duplicate, so it never runs twice).
    submission: dict[str, Any]
    # The submission this record replaces, to stop before submitting; None for a job
    # that moved in from another cluster held (``submit(hold=True)``): none ran here.
    replaces: str | None
    attempt: int
    # Held for a plan (pending until start/release), or only in flight between the stop
    # and the submission of a requeue.
    hold: bool
    step_key: str | None = None
    # The last Jobs API entry of the job, for telemetry while it is not in Ray.
    last_seen: dict[str, Any]


class HeldJobs:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()

    def all(self) -> dict[str, HeldJob]:
        with self._lock:
            return self._load()

    def get(self, external_id: str) -> HeldJob | None:
        return self.all().get(external_id)

    def put(self, job: HeldJob) -> None:
        with self._lock:
            jobs = self._load()
            jobs[job.external_id] = job
            self._save(jobs)

    def drop(self, external_id: str) -> None:
        with self._lock:
            jobs = self._load()
            if jobs.pop(external_id, None) is not None:
                self._save(jobs)

    def _load(self) -> dict[str, HeldJob]:
        try:
            document = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        return {key: HeldJob.model_validate(value) for key, value in document.items()}

    def _save(self, jobs: dict[str, HeldJob]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        temporary = self.path.with_suffix(".json.tmp")
        with open(temporary, "w") as stream:
            json.dump({key: job.model_dump(mode="json") for key, job in jobs.items()}, stream)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, self.path)
