"""The checkpoint backend interface, the image it produces, and the image checksums.

A backend turns a running workload into a CheckpointImage (a directory of files with a
SHA-256 manifest) and an image back into a running workload, on this node or another one
that can see the image directory. Every backend verifies the manifest before it restores,
so a damaged or partly copied image fails cleanly and starts nothing.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel

from agent.workload import (
    RunningWorkload,
    WorkloadSpec,
    WorkloadState,
    WorkloadStore,
    kill_workload,
)

MANIFEST_NAME = "shaper-manifest.json"


class BackendError(RuntimeError):
    """A checkpoint backend could not do what it was asked.

    retryable says whether trying the same step again may succeed; the saga uses it to
    choose between a retry and compensation.
    """

    retryable = False


class BackendUnavailable(BackendError):
    """The backend cannot run on this node (CRIU missing or too old)."""


class WorkloadNotRunning(BackendError):
    """The workload to checkpoint or release is not running (any more)."""


class CheckpointFailed(BackendError):
    """No usable image was produced; the workload keeps running where it was."""

    retryable = True


class CheckpointLost(BackendError):
    """The workload's process is gone and the dump it left is incomplete: its state is lost.

    Not retryable: there is nothing left to checkpoint. The dump is kept for forensics.
    """


class RestoreFailed(BackendError):
    """The image could not be restored; nothing of the workload runs here."""

    retryable = True


class ImageCorrupt(RestoreFailed):
    """The image's files do not match its manifest; restoring it again will not help."""

    retryable = False


class ImageFile(BaseModel):
    sha256: str
    size: int


class CheckpointImage(BaseModel):
    """A checkpoint on disk, and what is needed to start it again."""

    workload: WorkloadSpec
    backend: str
    image_dir: str
    # Relative path -> checksum and size, for every file of the image except the manifest.
    files: dict[str, ImageFile]
    size_bytes: int
    duration_s: float
    # Time spent per phase ("freeze_and_dump", "checksum", ...), for benchmarks.
    phases: dict[str, float] = {}
    created_at: datetime
    # Backend-specific facts (CRIU: the root PID in the image, the log file size).
    details: dict[str, Any] = {}


@runtime_checkable
class CheckpointBackend(Protocol):
    """One way to checkpoint and restore a workload. Implementations: criu, signal, sim."""

    name: str

    def checkpoint(self, workload: RunningWorkload, image_dir: Path) -> CheckpointImage:
        """Checkpoint a running workload into image_dir; the workload stops running.

        Returns only once the source process is gone, so a restore can never overlap it.
        Raises CheckpointFailed (the workload keeps running) or WorkloadNotRunning.
        """
        ...

    def recover_checkpoint(self, workload: RunningWorkload, image_dir: Path) -> CheckpointImage:
        """Seal the dump that an interrupted checkpoint of the workload left in image_dir.

        For a checkpoint whose agent died after the workload's process stopped and before
        the image was recorded: the dump is then the workload's only state. The backend
        decides, by its own mark of a finished dump, whether the dump is complete; if so it
        checksums it and returns the image, the workload recorded CHECKPOINTED, as
        checkpoint() would have. Raises CheckpointLost when the dump is incomplete (the
        directory is left as it is), CheckpointFailed while the process still runs.
        """
        ...

    def restore(
        self, image: CheckpointImage, *, image_dir: str | Path | None = None
    ) -> RunningWorkload:
        """Verify the image's checksums and start the workload from it.

        image_dir overrides image.image_dir when the image was copied elsewhere.
        Raises ImageCorrupt or RestoreFailed; in both cases nothing is left running.
        """
        ...

    def release(self, workload: RunningWorkload, *, timeout: float = 10.0) -> None:
        """Kill the workload and wait until it is gone; a gone workload is not an error."""
        ...


class ImageManifest(BaseModel):
    """What checksum_image writes to MANIFEST_NAME inside the image directory."""

    files: dict[str, ImageFile]


def _sha256(path: Path) -> str:
    with open(path, "rb") as stream:
        return hashlib.file_digest(stream, "sha256").hexdigest()


def _image_paths(image_dir: Path) -> list[Path]:
    """Files that make up the image: everything but the manifest and the logs."""
    return sorted(
        path
        for path in image_dir.rglob("*")
        if path.is_file() and MANIFEST_NAME not in path.name and path.suffix != ".log"
    )


def checksum_image(image_dir: Path) -> dict[str, ImageFile]:
    """SHA-256 and size of every file of the image, and write them to its manifest."""
    files = {
        str(path.relative_to(image_dir)): ImageFile(sha256=_sha256(path), size=path.stat().st_size)
        for path in _image_paths(image_dir)
    }
    temporary = image_dir / f".{MANIFEST_NAME}.tmp"
    temporary.write_text(ImageManifest(files=files).model_dump_json(indent=1))
    os.replace(temporary, image_dir / MANIFEST_NAME)
    return files


def verify_image(image: CheckpointImage, image_dir: Path) -> None:
    """Raise ImageCorrupt unless image_dir holds exactly the image's files, unchanged."""
    if not image_dir.is_dir():
        raise ImageCorrupt(f"workload {image.workload.id}: image directory {image_dir} is missing")
    found = {str(path.relative_to(image_dir)): path for path in _image_paths(image_dir)}
    missing = sorted(set(image.files) - set(found))
    unexpected = sorted(set(found) - set(image.files))
    if missing or unexpected:
        raise ImageCorrupt(
            f"workload {image.workload.id}: image {image_dir} does not match its manifest: "
            f"missing {missing or 'none'}, unexpected {unexpected or 'none'}"
        )
    for name, expected in image.files.items():
        path = found[name]
        size = path.stat().st_size
        if size != expected.size:
            raise ImageCorrupt(
                f"workload {image.workload.id}: image file {path} has {size} bytes, "
                f"the manifest says {expected.size}"
            )
        if _sha256(path) != expected.sha256:
            raise ImageCorrupt(
                f"workload {image.workload.id}: image file {path} fails its SHA-256 check"
            )


def image_size(files: dict[str, ImageFile]) -> int:
    return sum(entry.size for entry in files.values())


def require_running(workload: RunningWorkload) -> int:
    """The workload's PID; WorkloadNotRunning when it has none or that process is gone."""
    if workload.pid is None or not workload.is_running():
        raise WorkloadNotRunning(
            f"workload {workload.id}: process {workload.pid} is not running; nothing to checkpoint"
        )
    return workload.pid


def require_gone(workload: RunningWorkload) -> None:
    """Refuse to recover a checkpoint while the workload's process still runs: its dump may be
    older than its state, and checkpointing it again is the way."""
    if workload.is_running():
        raise CheckpointFailed(
            f"workload {workload.id}: process {workload.pid} still runs; checkpoint it again "
            "rather than recover an interrupted dump"
        )


def checkpoint_lost(workload: RunningWorkload, image_dir: Path, why: str) -> CheckpointLost:
    """The error for a workload whose process is gone with only an incomplete dump left."""
    return CheckpointLost(
        f"workload {workload.id}: its checkpoint was interrupted and its process is gone, "
        f"but the dump in {image_dir} is incomplete ({why}): the workload's state is lost. "
        "The directory is kept for inspection"
    )


def release_process(store: WorkloadStore, workload: RunningWorkload, *, timeout: float) -> None:
    """release() of the backends whose workload is a process on this node (criu, signal):
    kill it, wait until it is gone and record it released."""
    if not kill_workload(workload, timeout=timeout):
        raise BackendError(
            f"workload {workload.id}: PID {workload.pid} survived SIGKILL for {timeout} s"
        )
    workload.state = WorkloadState.released
    store.save(workload)


def fresh_image_dir(workload: RunningWorkload, image_dir: Path) -> Path:
    """The image directory, created and checked empty: one directory per checkpoint."""
    image_dir = Path(image_dir).resolve()
    image_dir.mkdir(parents=True, exist_ok=True)
    if any(image_dir.iterdir()):
        raise CheckpointFailed(
            f"workload {workload.id}: image directory {image_dir} is not empty; "
            "use a fresh directory per checkpoint"
        )
    return image_dir


def seal_image(
    *,
    backend: str,
    workload: RunningWorkload,
    image_dir: Path,
    started: float,
    phases: dict[str, float],
    clock: Callable[[], float],
    created_at: datetime,
    details: dict[str, Any] | None = None,
) -> CheckpointImage:
    """Checksum a finished checkpoint and describe it; ``phases`` gains the checksum time.

    Every backend ends a checkpoint this way, so every image carries the same manifest."""
    checksum_started = clock()
    files = checksum_image(image_dir)
    finished = clock()
    return CheckpointImage(
        workload=workload.spec,
        backend=backend,
        image_dir=str(image_dir),
        files=files,
        size_bytes=image_size(files),
        duration_s=finished - started,
        phases={**phases, "checksum": finished - checksum_started},
        created_at=created_at,
        details=details or {},
    )
