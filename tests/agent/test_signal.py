"""The cooperative backend: SIGUSR1 -> the workload saves and exits -> SHAPER_RESUME_FROM."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from agent import procs
from agent.backends.base import CheckpointFailed, ImageCorrupt, WorkloadNotRunning
from agent.backends.signal import CHECKPOINT_NAME, SignalBackend
from agent.workload import WorkloadState, WorkloadStore, start_workload
from tests.support.counter import count_of, next_count, progress_of, start_counter
from tests.support.processes import Reaper, processes_mentioning

MiB = 1 << 20


@pytest.fixture
def signal_backend(store: WorkloadStore) -> SignalBackend:
    return SignalBackend(store=store)


def test_round_trip_resumes_from_the_saved_count(
    tmp_path: Path, store: WorkloadStore, signal_backend: SignalBackend, reaper: Reaper
) -> None:
    count_file = tmp_path / "count.json"
    workload = start_counter(
        store=store, reaper=reaper, count_file=count_file, backend="signal", state_mb=100
    )
    first_start = progress_of(count_file)["started_at"]

    image = signal_backend.checkpoint(workload, tmp_path / "image")

    assert not procs.is_running(workload.pid)
    assert procs.exit_code(workload.pid) == 0
    assert set(image.files) == {CHECKPOINT_NAME}
    assert image.size_bytes > 100 * MiB
    assert not Path(workload.checkpoint_path).exists()  # moved into the image
    at_checkpoint = count_of(count_file)

    resumed = reaper.track(signal_backend.restore(image))

    assert next_count(count_file, at_checkpoint) > at_checkpoint
    progress = progress_of(count_file)
    assert progress["resumed_from"] == str(tmp_path / "image" / CHECKPOINT_NAME)
    assert progress["started_at"] != first_start  # a new process, resumed by the workload
    assert progress["state_bytes"] == 100 * MiB
    assert resumed.resumed_from == progress["resumed_from"]
    assert store.load(workload.id).pid == resumed.pid

    # And it can checkpoint again from where it is now.
    again = signal_backend.checkpoint(resumed, tmp_path / "again")
    assert again.size_bytes == image.size_bytes
    assert count_of(count_file) > at_checkpoint


def test_a_workload_that_dies_without_saving_fails_the_checkpoint(
    tmp_path: Path, store: WorkloadStore, signal_backend: SignalBackend, reaper: Reaper
) -> None:
    # sleep does not handle SIGUSR1: its default action ends it, with no checkpoint.
    workload = reaper.track(start_workload(store=store, command=["sleep", "600"], backend="signal"))

    with pytest.raises(CheckpointFailed, match="killed by SIGUSR1.*without writing"):
        signal_backend.checkpoint(workload, tmp_path / "image")
    assert not list((tmp_path / "image").iterdir())


def test_a_workload_that_ignores_the_signal_keeps_running(
    tmp_path: Path, store: WorkloadStore, reaper: Reaper
) -> None:
    workload = reaper.track(
        start_workload(
            store=store,
            command=["sh", "-c", "trap '' USR1; while :; do sleep 1; done"],
            backend="signal",
        )
    )
    impatient = SignalBackend(store=store, checkpoint_timeout=0.5)
    # Wait until the shell has set its trap, or SIGUSR1 would still end it.
    assert procs.wait_until(lambda: _ignores_sigusr1(workload.pid), timeout=10), (
        "the shell never ignored SIGUSR1"
    )

    with pytest.raises(CheckpointFailed, match="did not save and exit.*keeps running"):
        impatient.checkpoint(workload, tmp_path / "image")
    assert workload.is_running()
    assert store.load(workload.id).state is WorkloadState.running


def _ignores_sigusr1(pid: int) -> bool:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) & (1 << (10 - 1)))
    return False


def test_a_corrupted_checkpoint_is_refused_and_nothing_starts(
    tmp_path: Path, store: WorkloadStore, signal_backend: SignalBackend, reaper: Reaper
) -> None:
    count_file = tmp_path / "count.json"
    workload = start_counter(
        store=store, reaper=reaper, count_file=count_file, backend="signal", state_mb=2
    )
    image = signal_backend.checkpoint(workload, tmp_path / "image")
    saved = tmp_path / "image" / CHECKPOINT_NAME
    data = bytearray(saved.read_bytes())
    data[-1] ^= 0xFF
    saved.write_bytes(bytes(data))

    with pytest.raises(ImageCorrupt, match="fails its SHA-256 check"):
        signal_backend.restore(image)

    assert processes_mentioning(str(count_file)) == []
    assert store.load(workload.id).state is WorkloadState.checkpointed


def test_checkpointing_a_gone_workload_is_refused(
    tmp_path: Path, store: WorkloadStore, signal_backend: SignalBackend, reaper: Reaper
) -> None:
    workload = reaper.track(start_workload(store=store, command=["sleep", "600"], backend="signal"))
    signal_backend.release(workload)

    with pytest.raises(WorkloadNotRunning):
        signal_backend.checkpoint(workload, tmp_path / "image")
    assert store.load(workload.id).state is WorkloadState.released


def test_migrate_between_two_agents_with_a_copied_checkpoint(
    tmp_path: Path, reaper: Reaper
) -> None:
    node_a = WorkloadStore(tmp_path / "node-a")
    node_b = WorkloadStore(tmp_path / "node-b")
    count_file = tmp_path / "count.json"
    workload = start_counter(
        store=node_a, reaper=reaper, count_file=count_file, backend="signal", state_mb=5
    )
    image = SignalBackend(store=node_a).checkpoint(workload, tmp_path / "a-img")
    at_checkpoint = count_of(count_file)
    moved = tmp_path / "b-img"
    shutil.copytree(tmp_path / "a-img", moved)
    shutil.rmtree(tmp_path / "a-img")

    resumed = reaper.track(SignalBackend(store=node_b).restore(image, image_dir=moved))

    assert next_count(count_file, at_checkpoint) > at_checkpoint
    assert progress_of(count_file)["resumed_from"] == str(moved / CHECKPOINT_NAME)
    assert resumed.checkpoint_path == str(node_b.workload_dir(workload.id) / "checkpoint")
    assert node_b.load(workload.id).pid == resumed.pid
