"""The simulated backend: same rules as the real ones, no processes, no files."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from agent.backends.base import CheckpointImage, RestoreFailed, WorkloadNotRunning
from agent.backends.sim import SimBackend
from agent.workload import WorkloadSpec, WorkloadState

FIXED_NOW = datetime(2026, 1, 1, tzinfo=UTC)


def test_checkpoint_and_restore_follow_memory_and_bandwidth(tmp_path: Path) -> None:
    sim = SimBackend(bandwidth_bytes_per_s=100_000_000, now=lambda: FIXED_NOW)
    workload = sim.start(workload_id="train-1", memory_bytes=2_000_000_000)

    image = sim.checkpoint(workload, tmp_path / "image")

    assert image.size_bytes == 2_000_000_000
    assert image.duration_s == pytest.approx(20.0)
    assert image.created_at == FIXED_NOW
    assert workload.state is WorkloadState.checkpointed
    assert sim.running() == []
    assert not (tmp_path / "image").exists()

    restored = sim.restore(image)
    assert restored.id == "train-1" and restored.pid is None
    assert restored.resumed_from == str(tmp_path / "image")
    assert sim.running() == [restored]


def test_a_workload_never_runs_twice(tmp_path: Path) -> None:
    sim = SimBackend()
    image = sim.checkpoint(sim.start(workload_id="w", memory_bytes=1), tmp_path)
    sim.restore(image)

    with pytest.raises(RestoreFailed, match="would run it twice"):
        sim.restore(image)
    with pytest.raises(RestoreFailed, match="already runs"):
        sim.start(workload_id="w", memory_bytes=1)


def test_only_running_workloads_checkpoint(tmp_path: Path) -> None:
    sim = SimBackend()
    workload = sim.start(workload_id="w", memory_bytes=1)
    sim.release(workload)
    sim.release(workload)  # releasing twice is harmless

    assert workload.state is WorkloadState.released
    with pytest.raises(WorkloadNotRunning):
        sim.checkpoint(workload, tmp_path)


def test_another_backends_image_is_refused(tmp_path: Path) -> None:
    image = CheckpointImage(
        workload=WorkloadSpec(id="w", command=["x"], env={}, cwd="/", log_path="/dev/null"),
        backend="criu",
        image_dir=str(tmp_path),
        files={},
        size_bytes=0,
        duration_s=0.0,
        created_at=FIXED_NOW,
    )
    with pytest.raises(RestoreFailed, match="a 'criu' image cannot be restored by the sim"):
        SimBackend().restore(image)


def test_bandwidth_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        SimBackend(bandwidth_bytes_per_s=0)
