"""Checkpoint backends behind one interface (agent.backends.base.CheckpointBackend)."""

from __future__ import annotations

from typing import Any

from agent.backends.base import (
    BackendError,
    BackendUnavailable,
    CheckpointBackend,
    CheckpointFailed,
    CheckpointImage,
    CheckpointLost,
    ImageCorrupt,
    RestoreFailed,
    WorkloadNotRunning,
)
from agent.workload import WorkloadStore

BACKEND_NAMES = ("criu", "signal", "sim")


def create_backend(name: str, *, store: WorkloadStore, **options: Any) -> CheckpointBackend:
    """The backend called `name`; options go to its constructor."""
    if name == "criu":
        from agent.backends.criu import CriuBackend

        return CriuBackend(store=store, **options)
    if name == "signal":
        from agent.backends.signal import SignalBackend

        return SignalBackend(store=store, **options)
    if name == "sim":
        from agent.backends.sim import SimBackend

        return SimBackend(**options)
    raise ValueError(f"unknown checkpoint backend {name!r}; known: {', '.join(BACKEND_NAMES)}")


__all__ = [
    "BACKEND_NAMES",
    "BackendError",
    "BackendUnavailable",
    "CheckpointBackend",
    "CheckpointFailed",
    "CheckpointImage",
    "CheckpointLost",
    "ImageCorrupt",
    "RestoreFailed",
    "WorkloadNotRunning",
    "create_backend",
]
