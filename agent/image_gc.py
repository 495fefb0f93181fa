"""Garbage collection of the checkpoint images the node agent imported (agent.kubelet).

A kubelet checkpoint becomes an image in the node's containerd (``k8s.io``), named
``<repository>/<namespace>/<pod>/<container>:ckpt-<when>Z``; a restored pod runs from it
once, and nothing else removes it (the kubelet's own image GC acts only under disk
pressure). A sweep (:meth:`CheckpointImageCollector.sweep`: ``shaper agent api`` every
``SHAPER_CHECKPOINT_IMAGE_GC_INTERVAL_S``, ``shaper agent gc-checkpoints`` once) removes
such an image when

* no container and no pod of the node uses it: not a container of containerd's (running,
  created or exited: ``ctr containers ls``), not an image a pod of the kubelet names in its
  spec or its containers' status (``GET /pods``: a pod bound here, started or not, ended or
  not, until it is deleted); and
* its **TTL** passed since the checkpoint (``SHAPER_CHECKPOINT_IMAGE_TTL_S``, 24 h; the time
  is the tag's).

An image is not removed sooner once its restored pod has run and gone: the Job still names
it as its resume pointer, and a Workload that Kueue evicts on its own (a PodsReady timeout,
a preemption of its own) is restored from it again on re-admission, pinned to this node with
``imagePullPolicy: Never`` — with the image gone it would wait for ever (a review found the
earlier "consumed" rule doing that). The TTL is how long a preempted Workload may wait for
re-admission with its checkpoint.

Never an image in use, whatever its age; never an image the agent did not import (one not
under its repository, or whose tag :func:`agent.kubelet.checkpoint_tag` did not write).
With a TTL of 0 nothing is removed. When the node cannot say what is in use (the kubelet
or containerd does not answer) the sweep removes nothing. Each removal is logged with its
reason.
"""

from __future__ import annotations

import fcntl
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from agent.kubelet import CheckpointFailed, tagged_at

log = logging.getLogger(__name__)

LOCK_FILE = "checkpoint-images.lock"
EXPIRED = "ttl"  # unused, its TTL passed


class Node(Protocol):
    """What a sweep asks of the node (agent.kubelet.KubeletCheckpointer does it)."""

    repository: str

    def images(self) -> list[str]: ...

    def container_images(self) -> set[str]: ...

    def pod_images(self) -> set[str]: ...

    def remove_image(self, name: str) -> None: ...


@dataclass(frozen=True)
class Sweep:
    """What a sweep did: removed images and why (``ttl``), kept ones and
    why, removals that failed and their error; ``error`` when it removed nothing because
    the node could not say what is in use."""

    removed: dict[str, str] = field(default_factory=dict)
    kept: dict[str, str] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)
    error: str | None = None


def imported_at(name: str, repository: str) -> float | None:
    """When the agent took the checkpoint image ``name``; None for an image it did not
    import (not under ``repository``, or a tag it does not write)."""
    path, _, tag = name.rpartition(":")
    if not path.startswith(repository.rstrip("/") + "/") or "/" in tag:
        return None
    return tagged_at(tag)


def decide(
    images: list[str],
    *,
    repository: str,
    in_use: set[str],
    now: float,
    ttl_s: float,
) -> tuple[dict[str, str], dict[str, str]]:
    """(remove, keep): the agent's images to remove and why, and those kept and why."""
    remove: dict[str, str] = {}
    keep: dict[str, str] = {}
    for name in images:
        taken = imported_at(name, repository)
        if taken is None:
            continue  # not the agent's
        if name in in_use:
            keep[name] = "in use"
        elif ttl_s <= 0:
            keep[name] = "removal off (TTL 0)"
        elif now - taken >= ttl_s:
            remove[name] = EXPIRED
        else:
            keep[name] = f"unused, kept for a restore ({now - taken:.0f} s of {ttl_s:.0f} s)"
    return remove, keep


class CheckpointImageCollector:
    def __init__(
        self,
        node: Node,
        *,
        state_dir: Path,
        ttl_s: float,
        now: Callable[[], float] = time.time,
    ) -> None:
        self.node = node
        self.state_dir = state_dir
        self.ttl_s = ttl_s
        self._now = now

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """One sweep at a time on this node (the API's and the command's)."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with (self.state_dir / LOCK_FILE).open("a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            yield

    def sweep(self, *, dry_run: bool = False) -> Sweep:
        with self._locked():
            try:
                images = self.node.images()
                # The node's containers first: a pod deleted between the two questions
                # still has its containers in the first answer.
                in_use = self.node.container_images() | self.node.pod_images()
            except CheckpointFailed as unanswered:
                log.warning("checkpoint image sweep: nothing removed: %s", unanswered)
                return Sweep(error=str(unanswered))
            remove, keep = decide(
                images,
                repository=self.node.repository,
                in_use=in_use,
                now=self._now(),
                ttl_s=self.ttl_s,
            )
            removed: dict[str, str] = {}
            failed: dict[str, str] = {}
            for name, why in remove.items():
                if dry_run:
                    removed[name] = why
                    continue
                try:
                    self.node.remove_image(name)
                except CheckpointFailed as error:
                    log.warning("checkpoint image %s not removed: %s", name, error)
                    failed[name] = str(error)
                    continue
                removed[name] = why
                log.info("removed checkpoint image %s (TTL passed, unused)", name)
            return Sweep(removed=removed, kept=keep, failed=failed)


def start_sweeping(
    collector: CheckpointImageCollector, interval_s: float
) -> tuple[threading.Thread, threading.Event]:
    """A sweep now and every ``interval_s`` in a daemon thread, until the event is set."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            try:
                collector.sweep()
            except Exception:  # a sweep that failed is logged; the next one tries again
                log.exception("checkpoint image sweep failed")
            stop.wait(interval_s)

    thread = threading.Thread(target=loop, name="checkpoint-image-gc", daemon=True)
    thread.start()
    return thread, stop
