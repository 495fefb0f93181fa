"""The node agent's side of the saga step contract (connectors.base: StepRequest/Report).

The control plane sends task ``shaper.agent.<step>`` on queue ``agent.<cluster>.<node>``;
the steps an agent runs are AgentStep's, always about one workload.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from connectors.base import Outcome, StepReport
from connectors.base import StepRequest as BaseStepRequest


class AgentStep(StrEnum):
    checkpoint = "checkpoint"  # checkpoint the workload into this node's image store
    transfer = "transfer"  # copy a checkpoint image here, verifying every checksum
    restore = "restore"  # start the workload from an image (a no-op if it runs here)
    # resume from an image here when the scheduler next starts the workload on this node
    stage = "stage"
    confirm = "confirm"  # the workload runs here and keeps running
    release = "release"  # stop it here (if it runs) and drop its images


class StepRequest(BaseStepRequest):
    """A step for a node agent: one of AgentStep, always about one workload."""

    step: AgentStep  # type: ignore[assignment]
    workload_id: str = Field(min_length=1, max_length=128)


__all__ = ["AgentStep", "Outcome", "StepReport", "StepRequest"]
