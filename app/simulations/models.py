"""Simulation results as the API shows them: read from the JSON files ``shaper sim`` writes."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field


class SimulationSummary(BaseModel):
    name: str = Field(description="the file's name without .json; the id in the URL")
    scenario: str
    seed: int | None
    policies: list[str]
    modified_at: datetime


class PolicyRun(BaseModel):
    metrics: dict[str, float | int | None]
    # Down-sampled: hours since the start, and busy / available GPUs at each point.
    t_h: list[float]
    utilization: list[float]


class SimulationResult(SimulationSummary):
    runs: dict[str, PolicyRun]


# What-if runs started from the dashboard (``app.simulations.runs``).
RunState = Literal["queued", "running", "done", "failed"]


class WhatIfCreate(BaseModel):
    scenario: str = Field(max_length=128, description="a built-in scenario (`shaper sim list`)")
    policies: list[str] = Field(
        min_length=1, max_length=8, description="fifo, backfill, priority and/or shaper"
    )
    seed: int | None = Field(
        default=None, ge=0, le=2**31 - 1, description="unset: the scenario's own seed"
    )


# The trace kinds an upload may name (``sim.traces.KINDS`` but Alibaba's pod lists, which
# replay on a node list, a second file an upload does not carry). A test keeps them in step.
TraceKind = Literal["auto", "philly", "pollux", "native", "gavel"]
TRACE_KINDS: tuple[TraceKind, ...] = ("auto", "philly", "pollux", "native", "gavel")


class TraceReplay(BaseModel):
    """How an uploaded trace is replayed: ``shaper sim replay``'s options of those names."""

    kind: TraceKind = Field(default="auto", description="auto: told from the file")
    gpus: int | None = Field(
        default=None, ge=1, le=1_000_000, description="unset: the trace's source's setup"
    )
    gpus_per_node: int | None = Field(
        default=None, ge=1, le=1024, description="unset: as the trace's source published"
    )
    window_start_h: float = Field(
        default=0.0, ge=0, allow_inf_nan=False, description="hours from the first submission"
    )
    window_end_h: float | None = Field(
        default=None, gt=0, allow_inf_nan=False, description="unset: to the trace's end"
    )


class WhatIfUpload(TraceReplay):
    """POST /simulations as multipart/form-data: these fields beside the ``trace`` file."""

    policies: list[str] = Field(
        min_length=1, max_length=8, description="fifo, backfill, priority and/or shaper"
    )
    seed: int | None = Field(
        default=None, ge=0, le=2**31 - 1, description="unset: 0, as `shaper sim replay`"
    )


class WhatIfOptions(BaseModel):
    scenarios: list[str]
    policies: list[str]
    trace_kinds: list[str] = Field(description="what an uploaded trace's `kind` may be")
    upload_max_mb: float = Field(description="the largest trace an upload may send")


class WhatIfRun(BaseModel):
    id: str
    scenario: str
    policies: list[str]
    seed: int | None
    state: RunState
    policies_done: int = 0
    current_policy: str | None = None
    # Of the whole run: finished policies plus the simulated-time share of the current one.
    progress: float = 0.0
    error: str | None = None
    trace: str | None = Field(
        default=None, description="an uploaded trace's file name as sent (shown only)"
    )
    replay: TraceReplay | None = None
    result: str | None = Field(
        default=None, description="when done: the name under GET /simulations/{name}"
    )
    created_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None


class WhatIfRecord(WhatIfRun):
    """What the run's state file holds: the public state and the process that runs it,
    which tells a live run from one its process left behind (a restart, a kill)."""

    pid: int | None = None
    host: str
    # An uploaded trace: its file in ``runs.UPLOADS_DIR``, named by the server.
    upload: str | None = None
