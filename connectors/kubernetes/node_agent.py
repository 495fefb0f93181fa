"""The checkpoint callback that asks a pod's node agent for a kubelet checkpoint (issue 15).

``connectors.kueue.actions.preempt_with_checkpoint`` (and a suspend of a plain Job,
``connectors.kubernetes.actions.suspend_job_to_resume``) take a ``checkpoint`` function of
the running pods that answers the resume pointer. :func:`agent_checkpoint` is that
function for pods restored from kubelet checkpoint images: it calls the agent on the pod's
node (``shaper agent api``, agent.api: ``POST /v1/kubelet-checkpoints`` with the agent's
Bearer token), which checkpoints the pod through its kubelet, imports the images into its
containerd and answers the ``checkpoint-image:`` pointer (wire.checkpoint_image). The
images are on that node only, so a Job whose pods run on several nodes, or are several,
is refused before anything is asked.

Errors are :class:`ConnectorError`: the agent's 4xx (the pod is not on that node, not
running, the token refused) are not retryable; a 5xx, a timeout or an agent that does not
answer are (nothing was stopped: the callback runs before the Workload is deactivated).
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Callable
from pathlib import Path

import httpx
from pydantic import ValidationError

from connectors.base import ConnectorError
from connectors.kubernetes.actions import PodOnNode
from connectors.kubernetes.config import KubernetesConnectorConfig
from wire.checkpoint_image import (
    KUBELET_CHECKPOINT_PATH,
    KubeletCheckpointAnswer,
    KubeletCheckpointRequest,
)

# The kubelet's checkpoint (CRIU freezes the process) and the image import of a large
# process take minutes; the agent bounds each of them itself.
AGENT_TIMEOUT_S = 600.0


def agent_checkpoint(
    *,
    agent_url: Callable[[str], str],
    token: str,
    timeout_s: float = AGENT_TIMEOUT_S,
    ca: Path | None = None,
    transport: httpx.BaseTransport | None = None,
) -> Callable[[list[PodOnNode]], str]:
    """The ``checkpoint`` callback: ``agent_url(node)`` is the base URL of the agent on a
    node (e.g. ``lambda node: f"https://{node}:8470"``), ``token`` its API token, ``ca``
    the CA bundle of agents served over TLS (None: the system's)."""
    verify = ssl.create_default_context(cafile=str(ca) if ca else None)

    def checkpoint(pods: list[PodOnNode]) -> str:
        if len(pods) != 1:
            where = ", ".join(f"{p.pod} on {p.node}" for p in pods)
            raise ConnectorError(
                f"a kubelet checkpoint restores one pod on one node; the work runs {where}",
                retryable=False,
            )
        (pod,) = pods
        base = agent_url(pod.node).rstrip("/")
        what = f"the checkpoint of pod {pod.namespace}/{pod.pod} by the agent of {pod.node}"
        body = KubeletCheckpointRequest(namespace=pod.namespace, pod=pod.pod, uid=pod.uid)
        try:
            with httpx.Client(timeout=timeout_s, verify=verify, transport=transport) as client:
                response = client.post(
                    base + KUBELET_CHECKPOINT_PATH,
                    content=body.model_dump_json(exclude_none=True),
                    headers={
                        "Authorization": f"Bearer {token}",
                        "Content-Type": "application/json",
                    },
                )
        except httpx.HTTPError as error:
            raise ConnectorError(
                f"{what}: {base} did not answer ({type(error).__name__}: {error})",
                retryable=True,
            ) from None
        if response.status_code != 200:
            try:
                said = str(response.json()["error"])
            except (ValueError, KeyError, TypeError):
                said = response.text.strip()[:500]
            raise ConnectorError(
                f"{what}: HTTP {response.status_code}: {said}",
                retryable=response.status_code >= 500 or response.status_code == 429,
            )
        try:
            answer = KubeletCheckpointAnswer.model_validate_json(response.content)
        except ValidationError as error:
            raise ConnectorError(f"{what}: not an answer ({error})", retryable=False) from None
        if answer.node != pod.node:
            raise ConnectorError(
                f"{what}: the agent at {base} is node {answer.node}'s, not {pod.node}'s",
                retryable=False,
            )
        return answer.pointer

    return checkpoint


def configured_agent_checkpoint(
    config: KubernetesConnectorConfig,
) -> Callable[[list[PodOnNode]], str] | None:
    """:func:`agent_checkpoint` as the connector's options say (``node_agent_url``, the
    token in ``node_agent_token_env``, ``node_agent_ca``); None when no agent URL is set.
    The token is read when a checkpoint is asked for, so a missing one fails that step,
    naming the variable, and not the connector's start."""
    template = config.node_agent_url
    if template is None:
        return None

    def checkpoint(pods: list[PodOnNode]) -> str:
        token = os.environ.get(config.node_agent_token_env)
        if not token:
            raise ConnectorError(
                f"${config.node_agent_token_env} must hold the node agents' API token "
                "(node_agent_url is set)",
                retryable=False,
            )
        call = agent_checkpoint(
            agent_url=lambda node: template.format(node=node),
            token=token,
            ca=config.node_agent_ca,
        )
        return call(pods)

    return checkpoint
