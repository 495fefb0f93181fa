"""The saga step messages between the control plane and the node agent (wire form: JSON).

The control plane sends a StepRequest as the one keyword argument ``step`` of the task
``shaper.agent.<step>`` on queue ``agent.<cluster>.<node>``; the agent answers with a
StepReport as the keyword argument ``report`` of ``request.reply_task`` on
``request.reply_queue``. Neither side imports the other: app/actions/saga.py builds the
same dicts, and tests/actions checks that both agree.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class AgentStep(StrEnum):
    checkpoint = "checkpoint"  # checkpoint the workload into this node's image store
    transfer = "transfer"  # copy a checkpoint image here, verifying every checksum
    restore = "restore"  # start the workload from an image (a no-op if it runs here)
    # resume from an image here when the scheduler next starts the workload on this node
    stage = "stage"
    confirm = "confirm"  # the workload runs here and keeps running
    release = "release"  # stop it here (if it runs) and drop its images


class Outcome(StrEnum):
    executed = "executed"
    duplicate = "duplicate"  # answered from the journal: the step ran before
    refused = "refused"  # stale generation: the step must not run


class StepRequest(BaseModel):
    model_config = ConfigDict(extra="ignore")

    action_id: int
    key: str = Field(min_length=1, max_length=200)
    step: AgentStep
    phase: str = "forward"
    workload_id: str = Field(min_length=1, max_length=128)
    generation: int = Field(ge=0)
    args: dict[str, Any] = Field(default_factory=dict)
    reply_task: str = "app.actions.tasks.report"
    reply_queue: str = "control"


class StepReport(BaseModel):
    action_id: int
    key: str
    ok: bool
    outcome: Outcome = Outcome.executed
    result: dict[str, Any] = Field(default_factory=dict)
    error: str | None = None
    retryable: bool = False
    # Who answered: "agent.<cluster>.<node>".
    executor: str = ""
    generation: int = 0
