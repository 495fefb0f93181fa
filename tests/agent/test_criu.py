"""The CRIU backend against the real CRIU: dump, checksum, restore in a new PID namespace."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from agent import procs
from agent.backends import CheckpointBackend, create_backend
from agent.backends.base import (
    MANIFEST_NAME,
    BackendUnavailable,
    CheckpointFailed,
    ImageCorrupt,
    ImageManifest,
    RestoreFailed,
    WorkloadNotRunning,
)
from agent.backends.criu import CriuBackend, find_criu
from agent.workload import WorkloadState, WorkloadStore
from tests.support.counter import count_of, next_count, progress_of, start_counter
from tests.support.processes import Reaper, processes_mentioning, resident_bytes

MiB = 1 << 20


def test_dump_and_restore_continue_the_count_with_100_mb_of_state(
    tmp_path: Path, store: WorkloadStore, criu: CriuBackend, reaper: Reaper
) -> None:
    count_file = tmp_path / "count.json"
    workload = start_counter(
        store=store, reaper=reaper, count_file=count_file, backend="criu", state_mb=100
    )
    source_pid = workload.pid
    started_at = progress_of(count_file)["started_at"]

    image = criu.checkpoint(workload, tmp_path / "image")

    assert not procs.is_running(source_pid)
    assert store.load(workload.id).state is WorkloadState.checkpointed
    assert image.size_bytes >= 100 * MiB
    manifest = ImageManifest.model_validate_json((tmp_path / "image" / MANIFEST_NAME).read_text())
    assert manifest.files == image.files
    assert any(name.startswith("pages-") for name in image.files)
    assert all(len(entry.sha256) == 64 for entry in image.files.values())
    assert image.duration_s >= image.phases["dump"] > 0
    at_dump = count_of(count_file)

    restored = reaper.track(criu.restore(image))

    assert next_count(count_file, at_dump) > at_dump
    # The same process, memory and all: not a fresh start that happens to count.
    assert progress_of(count_file)["started_at"] == started_at
    assert resident_bytes(restored.pid) >= 100 * MiB
    assert procs.namespace_pids(restored.pid) == [restored.pid, source_pid]
    assert restored.namespace_pid == source_pid
    assert store.load(workload.id).pid == restored.pid

    criu.release(restored)
    assert not procs.is_running(restored.pid)
    assert not procs.is_running(restored.holder_pid)
    assert store.load(workload.id).state is WorkloadState.released


def occupy_pid(reaper: Reaper, pid: int) -> subprocess.Popen[bytes]:
    """Start a process that gets exactly `pid`, as another job on a target node might."""
    for _attempt in range(1000):
        Path("/proc/sys/kernel/ns_last_pid").write_text(str(pid - 1))
        process = reaper.popen(["sleep", "600"])
        if process.pid == pid:
            return process
        process.kill()
        process.wait()
    pytest.fail(f"could not start a process with PID {pid}")


def test_restore_into_a_new_pid_namespace_while_the_original_pid_is_taken(
    tmp_path: Path, store: WorkloadStore, criu_binary: str, reaper: Reaper
) -> None:
    count_file = tmp_path / "count.json"
    workload = start_counter(
        store=store, reaper=reaper, count_file=count_file, backend="criu", state_mb=5
    )
    source_pid = workload.pid
    image = CriuBackend(store=store, criu=criu_binary).checkpoint(workload, tmp_path / "image")
    at_dump = count_of(count_file)
    squatter = occupy_pid(reaper, source_pid)

    same_namespace = CriuBackend(store=store, criu=criu_binary, new_pid_namespace=False)
    with pytest.raises(RestoreFailed, match=f"PID {source_pid} from the image is taken"):
        same_namespace.restore(image)
    assert count_of(count_file) == at_dump

    restored = reaper.track(CriuBackend(store=store, criu=criu_binary).restore(image))

    assert restored.pid != source_pid
    assert procs.namespace_pids(restored.pid) == [restored.pid, source_pid]
    assert squatter.poll() is None and procs.is_running(source_pid)
    assert next_count(count_file, at_dump) > at_dump


def test_a_restored_workload_moves_again(
    tmp_path: Path, store: WorkloadStore, criu: CriuBackend, reaper: Reaper
) -> None:
    count_file = tmp_path / "count.json"
    workload = start_counter(
        store=store, reaper=reaper, count_file=count_file, backend="criu", state_mb=5
    )
    first = reaper.track(criu.restore(criu.checkpoint(workload, tmp_path / "first")))
    at_first = next_count(count_file, count_of(count_file))

    # Dumped from inside its PID namespace, restored into a fresh one.
    second = reaper.track(criu.restore(criu.checkpoint(first, tmp_path / "second")))

    assert not procs.is_running(first.pid) and not procs.is_running(first.holder_pid)
    assert second.namespace_pid == workload.pid
    assert next_count(count_file, count_of(count_file)) > at_first


def test_restore_in_the_same_pid_namespace_keeps_the_pid(
    tmp_path: Path, store: WorkloadStore, criu_binary: str, reaper: Reaper
) -> None:
    count_file = tmp_path / "count.json"
    workload = start_counter(
        store=store, reaper=reaper, count_file=count_file, backend="criu", state_mb=1
    )
    same_namespace = CriuBackend(store=store, criu=criu_binary, new_pid_namespace=False)
    image = same_namespace.checkpoint(workload, tmp_path / "image")
    at_dump = count_of(count_file)

    restored = reaper.track(same_namespace.restore(image))

    assert restored.pid == workload.pid and restored.namespace_pid is None
    assert procs.namespace_pids(restored.pid) == [workload.pid]
    assert next_count(count_file, at_dump) > at_dump
    same_namespace.release(restored)
    assert not procs.is_running(restored.pid) and not procs.is_running(restored.holder_pid)


def test_restore_on_a_node_without_the_workloads_log_file(
    tmp_path: Path, store: WorkloadStore, criu: CriuBackend, reaper: Reaper
) -> None:
    count_file = tmp_path / "count.json"
    workload = start_counter(
        store=store, reaper=reaper, count_file=count_file, backend="criu", state_mb=1
    )
    image = criu.checkpoint(workload, tmp_path / "image")
    log = Path(workload.spec.log_path)
    log_size = log.stat().st_size
    assert log_size > 0
    log.unlink()  # as on a target node, which never had it
    at_dump = count_of(count_file)

    reaper.track(criu.restore(image))

    assert log.stat().st_size == log_size  # recreated with the size CRIU expects
    assert next_count(count_file, at_dump) > at_dump


def corrupt_flip_a_byte(image_dir: Path) -> None:
    pages = max(image_dir.glob("pages-*.img"), key=lambda path: path.stat().st_size)
    with open(pages, "r+b") as stream:
        stream.seek(pages.stat().st_size // 2)
        byte = stream.read(1)
        stream.seek(-1, 1)
        stream.write(bytes([byte[0] ^ 0xFF]))


def corrupt_truncate(image_dir: Path) -> None:
    pages = max(image_dir.glob("pages-*.img"), key=lambda path: path.stat().st_size)
    with open(pages, "r+b") as stream:
        stream.truncate(pages.stat().st_size // 2)


def corrupt_remove_a_file(image_dir: Path) -> None:
    (image_dir / "inventory.img").unlink()


def corrupt_add_a_file(image_dir: Path) -> None:
    (image_dir / "core-1.img").write_bytes(b"not from this dump")


@pytest.mark.parametrize(
    ("corrupt", "reason"),
    [
        (corrupt_flip_a_byte, "fails its SHA-256 check"),
        (corrupt_truncate, "the manifest says"),
        (corrupt_remove_a_file, r"missing \['inventory.img'\]"),
        (corrupt_add_a_file, r"unexpected \['core-1.img'\]"),
    ],
)
def test_a_corrupted_image_is_refused_and_nothing_is_restored(
    tmp_path: Path,
    store: WorkloadStore,
    criu: CriuBackend,
    reaper: Reaper,
    corrupt: object,
    reason: str,
) -> None:
    count_file = tmp_path / "count.json"
    workload = start_counter(
        store=store, reaper=reaper, count_file=count_file, backend="criu", state_mb=5
    )
    image = criu.checkpoint(workload, tmp_path / "image")
    at_dump = count_of(count_file)
    damaged = tmp_path / "damaged"
    shutil.copytree(tmp_path / "image", damaged)
    corrupt(damaged)  # type: ignore[operator]

    with pytest.raises(ImageCorrupt, match=reason) as refused:
        criu.restore(image, image_dir=damaged)

    assert not refused.value.retryable
    # CRIU never ran (it would have left a restore log) and nothing of the workload runs.
    assert not list(store.workload_dir(workload.id).glob("restore-*.log"))
    assert processes_mentioning(str(count_file)) == []
    assert count_of(count_file) == at_dump
    assert store.load(workload.id).state is WorkloadState.checkpointed

    # The undamaged image restores: the refusal was about the damage.
    reaper.track(criu.restore(image))
    assert next_count(count_file, at_dump) > at_dump


def test_a_failed_dump_leaves_the_workload_running(
    tmp_path: Path, store: WorkloadStore, criu_binary: str, reaper: Reaper
) -> None:
    count_file = tmp_path / "count.json"
    workload = start_counter(
        store=store, reaper=reaper, count_file=count_file, backend="criu", state_mb=1
    )
    broken = CriuBackend(store=store, criu=criu_binary, dump_args=["--no-such-option"])

    with pytest.raises(CheckpointFailed, match="the workload keeps running"):
        broken.checkpoint(workload, tmp_path / "image")

    assert workload.is_running()
    assert next_count(count_file, count_of(count_file)) > 0
    assert store.load(workload.id).state is WorkloadState.running


def test_checkpointing_a_gone_workload_is_refused(
    tmp_path: Path, store: WorkloadStore, criu: CriuBackend, reaper: Reaper
) -> None:
    workload = start_counter(
        store=store,
        reaper=reaper,
        count_file=tmp_path / "count.json",
        backend="criu",
        state_mb=1,
    )
    criu.release(workload)

    with pytest.raises(WorkloadNotRunning, match=f"process {workload.pid} is not running"):
        criu.checkpoint(workload, tmp_path / "image")
    assert not (tmp_path / "image").exists()


def test_a_missing_or_old_criu_says_to_run_the_install_script(tmp_path: Path) -> None:
    with pytest.raises(BackendUnavailable, match="run scripts/install-criu.sh") as missing:
        find_criu(str(tmp_path / "no-criu"))
    assert "no-criu" in str(missing.value)

    old = tmp_path / "criu"
    old.write_text("#!/bin/sh\necho 'Version: 3.17.1'\n")
    old.chmod(0o755)
    with pytest.raises(BackendUnavailable, match="version 3.17 is too old.*install-criu.sh"):
        find_criu(str(old))


def test_the_registry_builds_every_backend(store: WorkloadStore) -> None:
    for name in ("criu", "signal", "sim"):
        backend = create_backend(name, store=store)
        assert isinstance(backend, CheckpointBackend)
        assert backend.name == name
    with pytest.raises(ValueError, match="unknown checkpoint backend 'cuda'"):
        create_backend("cuda", store=store)


def test_migrate_between_two_agents_with_a_copied_image(
    tmp_path: Path, criu_binary: str, reaper: Reaper
) -> None:
    node_a = WorkloadStore(tmp_path / "node-a")
    node_b = WorkloadStore(tmp_path / "node-b")
    count_file = tmp_path / "count.json"
    workload = start_counter(
        store=node_a, reaper=reaper, count_file=count_file, backend="criu", state_mb=5
    )
    image = CriuBackend(store=node_a, criu=criu_binary).checkpoint(workload, tmp_path / "a-img")
    at_dump = count_of(count_file)
    moved = tmp_path / "b-img"
    shutil.copytree(tmp_path / "a-img", moved)  # what the saga's transfer step does
    shutil.rmtree(tmp_path / "a-img")

    agent_b = CriuBackend(store=node_b, criu=criu_binary)
    restored = reaper.track(agent_b.restore(image, image_dir=moved))

    assert node_b.load(workload.id).pid == restored.pid
    assert restored.resumed_from == str(moved)
    assert next_count(count_file, at_dump) > at_dump
