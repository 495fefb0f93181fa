"""Fencing tokens and the step journal: what keeps a workload from ever running twice.

Per workload, the agent keeps (``<state>/fences/<workload>.json``, under an flock):

* ``generation`` — the highest fencing token any step for the workload has carried here.
  A step with a lower one is refused: it belongs to a saga that has since been superseded.
  The new generation is written *before* the step runs, so a crash mid-step still fences.
* ``left_at`` — the generation at which the workload left this node (checkpointed or
  released). A restore needs a newer generation: the saga that took the workload away
  cannot also bring it back here, however late or often its messages arrive.
* ``steps`` — the answers of finished steps by idempotency key, so a duplicate is answered
  from the journal instead of running again. Failures that may pass on a retry are not
  kept: a retry with the same key runs again.

Every step received is also appended to ``<state>/journal.jsonl`` with its outcome.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

# Answers kept per workload; older keys are dropped (their sagas finished long ago).
MAX_REMEMBERED_STEPS = 512


class Fence(BaseModel):
    workload_id: str
    generation: int = 0
    left_at: int | None = None
    steps: dict[str, dict[str, Any]] = Field(default_factory=dict)

    def remember(self, key: str, report: dict[str, Any]) -> None:
        self.steps[key] = report
        while len(self.steps) > MAX_REMEMBERED_STEPS:
            del self.steps[next(iter(self.steps))]


class FenceStore:
    def __init__(self, state_dir: Path) -> None:
        self.state_dir = Path(state_dir)
        self.fences_dir = self.state_dir / "fences"
        self.fences_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.journal_path = self.state_dir / "journal.jsonl"

    def _path(self, workload_id: str) -> Path:
        return self.fences_dir / f"{workload_id}.json"

    def load(self, workload_id: str) -> Fence:
        try:
            return Fence.model_validate_json(self._path(workload_id).read_text())
        except FileNotFoundError:
            return Fence(workload_id=workload_id)

    def save(self, fence: Fence) -> None:
        path = self._path(fence.workload_id)
        temporary = path.with_suffix(".json.tmp")
        with open(temporary, "w") as stream:
            stream.write(fence.model_dump_json())
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)

    @contextmanager
    def hold(self, workload_id: str) -> Iterator[Fence]:
        """The workload's fence, locked against other processes of this agent."""
        with open(self.fences_dir / f"{workload_id}.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield self.load(workload_id)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def journal(self, entry: dict[str, Any]) -> None:
        line = json.dumps({"at": datetime.now(UTC).isoformat(), **entry})
        with open(self.journal_path, "a") as stream:
            stream.write(line + "\n")

    def read_journal(self) -> list[dict[str, Any]]:
        try:
            lines = self.journal_path.read_text().splitlines()
        except FileNotFoundError:
            return []
        return [json.loads(line) for line in lines if line]
