"""Kubelet checkpoints as images: the resume pointer that names them, and the node agent's
HTTP call that takes one (issue 15, checkpoint-aware preemption on Kubernetes and Kueue).

The node agent (agent.kubelet, served by agent.api) checkpoints a pod's containers through
its node's kubelet, imports each archive into the node's containerd as a *checkpoint
image*, and answers with an :class:`ImageRestore` pointer; the Kubernetes and Kueue
connectors write the pointer on the Job, and their restore webhook
(connectors.kubernetes.restore_webhook) reads it back to give the new pod those images.
One definition of the pointer here, so that producer and reader agree on it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

RESTORE_BY_IMAGE = "checkpoint-image"
POINTER_PREFIX = f"{RESTORE_BY_IMAGE}:"

# The node agent's HTTP API (agent.api): POST a KubeletCheckpointRequest with
# ``Authorization: Bearer <the agent's API token>``; 200 answers a KubeletCheckpointAnswer,
# any other status ``{"error": "..."}`` naming the cause.
KUBELET_CHECKPOINT_PATH = "/v1/kubelet-checkpoints"

# A DNS-1123 label (container) or subdomain (namespace is a label, a pod a subdomain).
_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"

ContainerName = Annotated[str, Field(min_length=1, max_length=63, pattern=_LABEL)]


@dataclass(frozen=True)
class ImageRestore:
    """Where a pod's checkpoint images are (one node, no registry) and which they are."""

    node: str
    images: Mapping[str, str]

    def pointer(self) -> str:
        body = {"node": self.node, "images": dict(sorted(self.images.items()))}
        return POINTER_PREFIX + json.dumps(body, separators=(",", ":"))


def read_pointer(pointer: str | None) -> ImageRestore | None:
    """The checkpoint images a resume pointer names; None for any other pointer (a path the
    workload restores itself from). A malformed checkpoint-image pointer raises
    ``ValueError`` naming what is wrong. One reader, for the restore webhook that acts on
    the pointer and for the telemetry that reports the node it holds a job to."""
    if pointer is None or not pointer.startswith(POINTER_PREFIX):
        return None
    try:
        body = json.loads(pointer.removeprefix(POINTER_PREFIX))
    except (ValueError, RecursionError) as error:  # RecursionError: nested beyond reason
        raise ValueError(f"{POINTER_PREFIX} pointer is not JSON ({error})") from None
    if not isinstance(body, dict):
        raise ValueError(f"{POINTER_PREFIX} pointer is not a JSON object")
    node, images = body.get("node"), body.get("images")
    if not isinstance(node, str) or not node:
        raise ValueError(f"{POINTER_PREFIX} pointer has no node")
    if len(node) > 253 or not re.fullmatch(_SUBDOMAIN, node):
        raise ValueError(f"{POINTER_PREFIX} pointer's node {node[:64]!r} is not a node name")
    if (
        not isinstance(images, dict)
        or not images
        or not all(isinstance(k, str) and isinstance(v, str) and k and v for k, v in images.items())
    ):
        raise ValueError(
            f"{POINTER_PREFIX} pointer's images must map container names to image references"
        )
    return ImageRestore(node=node, images=images)


class KubeletCheckpointRequest(BaseModel):
    """Checkpoint these containers (default: all) of a pod running on the agent's node."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    namespace: Annotated[str, Field(min_length=1, max_length=63, pattern=_LABEL)]
    pod: Annotated[str, Field(min_length=1, max_length=253, pattern=_SUBDOMAIN)]
    # The pod the caller means: a pod of the same name that replaced it is refused (409).
    uid: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    containers: list[ContainerName] | None = Field(default=None, min_length=1, max_length=64)


class KubeletCheckpointAnswer(BaseModel):
    """The checkpoint images, imported into the node's containerd, and their pointer."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    node: str
    images: dict[str, str]
    pointer: str
    # The kubelet's part (checkpoint API) and the agent's (image written and imported).
    checkpoint_s: float
    import_s: float
