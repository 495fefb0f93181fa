"""Resume pointers: "when the scheduler starts workload W on this node, restore it from here".

On a cluster whose scheduler owns the jobs (Slurm), a job cannot be moved behind the
scheduler's back: the saga checkpoints the workload, copies the image to the target node,
*stages* it there (this module), and asks the scheduler to requeue the job pinned to the
target. When the scheduler starts the job there, its batch script runs
``shaper agent exec --wait -- CMD`` again; exec finds the pointer and restores the
workload from the image instead of starting CMD from zero.

A pointer (``<state>/images/<workload>/resume.json``) names the image, the directory that
holds it on this node, and the saga's generation. It is taken under the workload's fence
lock and only when its generation is not older than the fence: a pointer left by a saga
that has since been superseded (compensation released this node at a newer generation)
is refused, so a stale checkpoint is never resumed. Taking a pointer consumes it: a later
start of the same job (a requeue for another reason) does not restore the same image a
second time behind a newer one.
"""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel

from agent.backends.base import CheckpointImage
from agent.fencing import FenceStore

POINTER_NAME = "resume.json"


class ResumePointer(BaseModel):
    workload_id: str
    generation: int
    image: CheckpointImage
    image_dir: str


class StaleResume(RuntimeError):
    """The staged image belongs to a saga that has been superseded on this node."""


def pointer_path(images_dir: Path, workload_id: str) -> Path:
    return images_dir / workload_id / POINTER_NAME


def stage(images_dir: Path, pointer: ResumePointer) -> Path:
    """Write the pointer atomically; the caller holds the workload's fence."""
    path = pointer_path(images_dir, pointer.workload_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{POINTER_NAME}.tmp")
    temporary.write_text(pointer.model_dump_json())
    os.replace(temporary, path)
    return path


def read(images_dir: Path, workload_id: str) -> ResumePointer | None:
    try:
        return ResumePointer.model_validate_json(pointer_path(images_dir, workload_id).read_text())
    except FileNotFoundError:
        return None


def take(fences: FenceStore, images_dir: Path, workload_id: str) -> ResumePointer | None:
    """The staged pointer for a start of the workload here, consumed; None when none is.

    Raises StaleResume (and drops the pointer) when the fence has moved past it.
    """
    with fences.hold(workload_id) as fence:
        pointer = read(images_dir, workload_id)
        if pointer is None:
            return None
        path = pointer_path(images_dir, workload_id)
        if pointer.generation < fence.generation:
            path.unlink(missing_ok=True)
            raise StaleResume(
                f"workload {workload_id}: the staged checkpoint is from generation "
                f"{pointer.generation}, this node has seen generation {fence.generation}"
            )
        os.replace(path, path.with_name(f"{POINTER_NAME}.taken"))
        return pointer


def still_wanted(fences: FenceStore, workload_id: str, pointer: ResumePointer) -> bool:
    """Whether the fence is still at the pointer's generation once the workload has been
    restored from it. :func:`take` holds the fence only while it takes the pointer, so a
    step of a newer saga (a compensation's release here) may have run while the restore
    did, found nothing to stop, and fenced the workload off: then the restored copy must
    not run (it would run here and where that saga sends the job)."""
    with fences.hold(workload_id) as fence:
        left = fence.left_at is not None and fence.left_at > pointer.generation
        return fence.generation <= pointer.generation and not left
