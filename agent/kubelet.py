"""Kubelet checkpoints as images: the node agent's part of checkpoint-aware preemption on
Kubernetes and Kueue (issue 15, kubernetes-sigs/kueue#477).

For a pod running on this node, :meth:`KubeletCheckpointer.checkpoint`:

1. finds the pod among the kubelet's own (``GET /pods``): a pod on another node, one
   that is not running, or one whose uid is not the caller's is refused before anything;
2. checks that containerd answers (``ctr version``), so that no checkpoint is taken that
   could not be imported;
3. for each container, the kubelet's checkpoint API
   (``POST /checkpoint/<namespace>/<pod>/<container>``, feature gate ContainerCheckpoint;
   the client — a certificate, or a bearer token file such as a ServiceAccount's — needs
   ``create`` on ``nodes/checkpoint``): the container keeps running and
   the kubelet writes an archive under its root-dir (read here, so the agent must see the
   kubelet's files: it runs on the node);
4. writes each archive as a checkpoint image (agent.oci_image) and imports it into
   containerd's ``k8s.io`` namespace with ``ctr images import``; the kubelet's archive is
   removed once imported (the image carries it, byte for byte);
5. answers the images and their pointer (wire.checkpoint_image.ImageRestore), which the
   restore webhook reads when the pod is recreated.

All or nothing: when a container's checkpoint or import fails, the images already imported
for the others are removed and no pointer is answered. Every failure is a
:class:`CheckpointFailed` with the HTTP status the agent's API answers and a message
naming the cause; the kubelet's client key and the API token are never logged.
"""

from __future__ import annotations

import calendar
import logging
import os
import re
import shutil
import ssl
import subprocess
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from agent.oci_image import checkpointed_container, write_checkpoint_image
from wire.checkpoint_image import ImageRestore, KubeletCheckpointAnswer, KubeletCheckpointRequest

log = logging.getLogger(__name__)

# containerd's namespace for the CRI's images (those the kubelet's pods can use).
CRI_NAMESPACE = "k8s.io"
# How long the kubelet may take to checkpoint one container (its ?timeout=, seconds).
KUBELET_CHECKPOINT_TIMEOUT_S = 60
CTR_TIMEOUT_S = 300.0
_ANSWER_LIMIT = 500  # characters of a refusal's body quoted in an error


# The tag of a checkpoint image: when it was taken, to the millisecond (UTC). The image
# garbage collection (agent.image_gc) reads it back: an image under the agent's repository
# with such a tag is one the agent imported.
_TAG = re.compile(r"^ckpt-(\d{8}T\d{6})(\d{3})Z$")


def checkpoint_tag(now: float) -> str:
    return f"ckpt-{time.strftime('%Y%m%dT%H%M%S', time.gmtime(now))}{int(now * 1000) % 1000:03d}Z"


def tagged_at(tag: str) -> float | None:
    """When a checkpoint image of this tag was taken (epoch seconds); None for a tag that
    :func:`checkpoint_tag` did not write."""
    found = _TAG.match(tag)
    if found is None:
        return None
    try:
        taken = calendar.timegm(time.strptime(found.group(1), "%Y%m%dT%H%M%S"))
    except ValueError:
        return None
    return taken + int(found.group(2)) / 1000


class CheckpointFailed(Exception):
    """A checkpoint that was not taken; ``status`` is the HTTP status the agent's API
    answers (4xx: the request, 5xx: the kubelet or containerd), the message says why."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class KubeletAccess:
    """How to reach this node's kubelet: its URL, the name its serving certificate has,
    and the credentials (paths only; nothing here is a secret's content)."""

    url: str
    server_name: str | None = None
    ca: Path | None = None
    client_cert: Path | None = None
    client_key: Path | None = None
    # A bearer token instead of a client certificate: a file, read at each call (a
    # ServiceAccount's projected token, which the kubelet rotates), which the kubelet
    # authenticates by a TokenReview (its authentication.webhook).
    token_file: Path | None = None
    insecure: bool = False  # tests only: the serving certificate is not checked
    timeout_s: float = KUBELET_CHECKPOINT_TIMEOUT_S + 30.0

    def headers(self) -> dict[str, str]:
        if self.token_file is None:
            return {}
        try:
            token = self.token_file.read_text().strip()
        except OSError as error:
            raise CheckpointFailed(
                500, f"the kubelet token file {self.token_file} cannot be read: {error.strerror}"
            ) from None
        return {"Authorization": f"Bearer {token}"}

    def tls(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca) if self.ca else None)
        if self.insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if self.client_cert is not None and self.client_key is not None:
            context.load_cert_chain(str(self.client_cert), str(self.client_key))
        return context


@dataclass(frozen=True)
class _Pod:
    namespace: str
    name: str
    uid: str
    phase: str
    containers: tuple[str, ...]


class KubeletCheckpointer:
    def __init__(
        self,
        *,
        node: str,
        kubelet: KubeletAccess,
        ctr: str,
        containerd_address: str,
        repository: str,
        work_dir: Path,
        transport: httpx.BaseTransport | None = None,
        now: Callable[[], float] = time.time,
    ) -> None:
        self.node = node
        self.kubelet = kubelet
        self.ctr = ctr
        self.containerd_address = containerd_address
        self.repository = repository
        self.work_dir = work_dir
        self._client = httpx.Client(
            base_url=kubelet.url.rstrip("/"),
            verify=kubelet.tls(),
            timeout=kubelet.timeout_s,
            transport=transport,
        )
        self._now = now
        # One checkpoint at a time: CRIU freezes the process and the node's disk is shared.
        self._lock = threading.Lock()

    def close(self) -> None:
        self._client.close()

    def checkpoint(self, request: KubeletCheckpointRequest) -> KubeletCheckpointAnswer:
        with self._lock:
            return self._checkpoint(request)

    # -- the steps -------------------------------------------------------------------------

    def _checkpoint(self, request: KubeletCheckpointRequest) -> KubeletCheckpointAnswer:
        what = f"pod {request.namespace}/{request.pod}"
        pod = self._pod(request.namespace, request.pod, what=what)
        if request.uid is not None and pod.uid != request.uid:
            raise CheckpointFailed(
                409, f"uid: {what} on node {self.node} is {pod.uid}, not {request.uid}"
            )
        if pod.phase != "Running":
            raise CheckpointFailed(409, f"{what} is {pod.phase} on node {self.node}, not Running")
        containers = list(request.containers or pod.containers)
        unknown = sorted(set(containers) - set(pod.containers))
        if unknown:
            raise CheckpointFailed(
                400,
                f"containers: {what} has no container {', '.join(unknown)} "
                f"(it has {', '.join(pod.containers)})",
            )
        self._containerd_answers()
        tag = checkpoint_tag(self._now())
        started = time.monotonic()
        archives: dict[str, Path] = {}
        try:
            for container in containers:
                archives[container] = self._kubelet_checkpoint(pod, container, what=what)
            checkpointed = time.monotonic()
            images = self._import_all(pod, archives, tag=tag, what=what)
        finally:
            # The kubelet's archives: imported ones are in their images now, the others are
            # of a checkpoint that is not answered.
            for archive in archives.values():
                archive.unlink(missing_ok=True)
        done = time.monotonic()
        restore = ImageRestore(node=self.node, images=images)
        log.info(
            "checkpointed %s (%s) as %s: kubelet %.2f s, images %.2f s",
            what,
            ", ".join(containers),
            ", ".join(images.values()),
            checkpointed - started,
            done - checkpointed,
        )
        return KubeletCheckpointAnswer(
            node=self.node,
            images=dict(images),
            pointer=restore.pointer(),
            checkpoint_s=round(checkpointed - started, 3),
            import_s=round(done - checkpointed, 3),
        )

    def _pod(self, namespace: str, name: str, *, what: str) -> _Pod:
        """The pod as this node's kubelet runs it (``GET /pods``: the pods bound here)."""
        listed = self._kubelet("GET", "/pods", what=f"the pods of node {self.node}")
        for item in listed.get("items") or []:
            metadata = item.get("metadata") or {}
            if metadata.get("namespace") == namespace and metadata.get("name") == name:
                return _Pod(
                    namespace=namespace,
                    name=name,
                    uid=str(metadata.get("uid")),
                    phase=str((item.get("status") or {}).get("phase")),
                    containers=tuple(
                        str(c.get("name")) for c in (item.get("spec") or {}).get("containers", [])
                    ),
                )
        raise CheckpointFailed(
            404, f"{what} is not on node {self.node} (its kubelet has no such pod)"
        )

    def _kubelet_checkpoint(self, pod: _Pod, container: str, *, what: str) -> Path:
        path = "/checkpoint/" + "/".join(quote(p, safe="") for p in (pod.namespace, pod.name))
        path += f"/{quote(container, safe='')}?timeout={KUBELET_CHECKPOINT_TIMEOUT_S}"
        answer = self._kubelet("POST", path, what=f"the checkpoint of {what} container {container}")
        items = answer.get("items")
        if not isinstance(items, list) or len(items) != 1 or not isinstance(items[0], str):
            raise CheckpointFailed(
                502, f"the kubelet's answer to the checkpoint of {what} names no archive: {answer}"
            )
        archive = Path(items[0])
        # The agent runs as root and removes the archive after the import: only a file the
        # kubelet writes (``<root-dir>/checkpoints/checkpoint-….tar``), never a link, is
        # taken from its answer.
        if not (
            archive.is_absolute()
            and archive.parent.name == "checkpoints"
            and archive.name.startswith("checkpoint-")
            and archive.suffix == ".tar"
            and ".." not in archive.parts
            and not archive.is_symlink()
        ):
            raise CheckpointFailed(
                502,
                f"the kubelet's answer to the checkpoint of {what} names {archive}, not a "
                "checkpoint archive of its checkpoints folder: not read, not removed",
            )
        if not os.access(archive, os.R_OK):
            raise CheckpointFailed(
                500,
                f"the kubelet wrote {what}'s checkpoint to {archive}, which this agent cannot "
                "read: run the agent on the node, with the kubelet's root-dir visible",
            )
        return archive

    def _kubelet(self, method: str, path: str, *, what: str) -> dict[str, Any]:
        where = f"the kubelet at {self.kubelet.url}"
        extensions = {"sni_hostname": self.kubelet.server_name or self.node}
        try:
            response = self._client.request(
                method, path, headers=self.kubelet.headers(), extensions=extensions
            )
        except httpx.HTTPError as error:
            raise CheckpointFailed(
                502, f"{what}: {where} did not answer ({type(error).__name__}: {error})"
            ) from None
        if response.status_code >= 400:
            raise CheckpointFailed(
                502,
                f"{what}: {where} refused: HTTP {response.status_code}: "
                f"{response.text.strip()[:_ANSWER_LIMIT]}",
            )
        try:
            body = response.json()
        except ValueError:
            raise CheckpointFailed(502, f"{what}: {where} answered no JSON") from None
        if not isinstance(body, dict):
            raise CheckpointFailed(502, f"{what}: {where} answered no JSON object")
        return body

    # -- containerd ------------------------------------------------------------------------

    def _ctr(
        self, *args: str, timeout_s: float = CTR_TIMEOUT_S
    ) -> subprocess.CompletedProcess[str]:
        binary = shutil.which(self.ctr)
        if binary is None:
            raise CheckpointFailed(
                503, f"containerd's client {self.ctr!r} is not installed (SHAPER_CTR)"
            )
        command = [binary, "--address", self.containerd_address, "-n", CRI_NAMESPACE, *args]
        try:
            return subprocess.run(
                command, capture_output=True, text=True, timeout=timeout_s, check=False
            )
        except subprocess.TimeoutExpired:
            raise CheckpointFailed(
                504, f"ctr {' '.join(args[:2])} took more than {timeout_s:.0f} s"
            ) from None

    def _containerd_answers(self) -> None:
        done = self._ctr("version", timeout_s=30.0)
        if done.returncode != 0:
            raise CheckpointFailed(
                503,
                f"containerd at {self.containerd_address} does not answer "
                f"(SHAPER_CONTAINERD_ADDRESS): {done.stderr.strip()[:_ANSWER_LIMIT]}",
            )

    def _import_all(
        self, pod: _Pod, archives: dict[str, Path], *, tag: str, what: str
    ) -> dict[str, str]:
        images: dict[str, str] = {}
        try:
            for container, archive in archives.items():
                name = f"{self.repository}/{pod.namespace}/{pod.name}/{container}:{tag}"
                self._import(name, archive, container=container, what=what)
                images[container] = name
        except BaseException:
            for name in images.values():
                removed = self._ctr("images", "rm", "--sync", name)
                if removed.returncode != 0:
                    log.warning("could not remove image %s: %s", name, removed.stderr.strip())
            raise
        return images

    def _import(self, name: str, archive: Path, *, container: str, what: str) -> None:
        self.work_dir.mkdir(parents=True, exist_ok=True)
        handle, path = tempfile.mkstemp(prefix="checkpoint-", suffix=".tar", dir=self.work_dir)
        os.close(handle)
        oci = Path(path)
        try:
            try:
                # The container's name as the archive records it (containerd restores by it).
                recorded = checkpointed_container(archive) or container
                write_checkpoint_image(oci, name, archive=archive, container=recorded)
            except (OSError, ValueError, tarfile.TarError) as error:
                raise CheckpointFailed(
                    500, f"writing the checkpoint image of {what} container {container}: {error}"
                ) from None
            done = self._ctr("images", "import", str(oci))
        finally:
            oci.unlink(missing_ok=True)
        if done.returncode != 0:
            # An import that failed half-way may have left the name behind.
            self._ctr("images", "rm", "--sync", name)
            raise CheckpointFailed(
                500,
                f"importing the checkpoint image of {what} container {container} into "
                f"containerd failed: {done.stderr.strip()[:_ANSWER_LIMIT]}",
            )

    # -- what agent.image_gc asks of the node ----------------------------------------------

    def images(self) -> list[str]:
        """The names of containerd's images in the CRI's namespace (not their ids)."""
        done = self._ctr("images", "ls", "-q", timeout_s=60.0)
        if done.returncode != 0:
            raise CheckpointFailed(
                503, f"ctr images ls failed: {done.stderr.strip()[:_ANSWER_LIMIT]}"
            )
        return [name for name in done.stdout.split() if not name.startswith("sha256:")]

    def container_images(self) -> set[str]:
        """The images of containerd's containers in the CRI's namespace, running or only
        created (``ctr containers ls``: CONTAINER IMAGE RUNTIME)."""
        done = self._ctr("containers", "ls", timeout_s=60.0)
        if done.returncode != 0:
            raise CheckpointFailed(
                503, f"ctr containers ls failed: {done.stderr.strip()[:_ANSWER_LIMIT]}"
            )
        images = set()
        for line in done.stdout.splitlines()[1:]:
            columns = line.split()
            if len(columns) == 3:  # a container without an image has two
                images.add(columns[1])
        return images

    def pod_images(self) -> set[str]:
        """The images this node's kubelet's pods name, in their spec or their containers'
        status: a pod bound here that has not yet started, or has ended and is not yet
        deleted, counts."""
        listed = self._kubelet("GET", "/pods", what=f"the pods of node {self.node}")
        images: set[str] = set()
        for item in listed.get("items") or []:
            spec, status = item.get("spec") or {}, item.get("status") or {}
            for key in ("containers", "initContainers", "ephemeralContainers"):
                images.update(str(c.get("image")) for c in spec.get(key) or [] if c.get("image"))
            for key in ("containerStatuses", "initContainerStatuses"):
                images.update(str(c.get("image")) for c in status.get(key) or [] if c.get("image"))
        return images

    def remove_image(self, name: str) -> None:
        done = self._ctr("images", "rm", "--sync", name)
        if done.returncode != 0:
            raise CheckpointFailed(
                500, f"ctr images rm {name} failed: {done.stderr.strip()[:_ANSWER_LIMIT]}"
            )
