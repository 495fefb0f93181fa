"""Simulation results as the API shows them: read from the JSON files ``shaper sim`` writes."""

from __future__ import annotations

from datetime import datetime

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
