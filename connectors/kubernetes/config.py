"""Options of the Kubernetes connector (and of the Kueue connector, which adds none yet).

``shaper connector run --kind kubernetes --cluster gpu-a --set kubeconfig=/path`` — every
``--set KEY=VALUE`` is a field here. Without ``kubeconfig`` the connector runs in the
cluster, with its Pod's ServiceAccount (deploy/kubernetes/).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator


class KubernetesConnectorConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    cluster: Annotated[str, Field(min_length=1, max_length=128)]
    # None: in the cluster (the ServiceAccount's token and CA).
    kubeconfig: Path | None = None
    context: str | None = None
    # Only pods, Jobs, Deployments … of these namespaces become jobs; empty: all. The
    # connector still watches all namespaces (one stream per resource, not one per
    # namespace) and filters here.
    namespaces: list[Annotated[str, Field(min_length=1, max_length=63)]] = Field(
        default_factory=list
    )
    # Jobs whose pods ask for no GPU (controllers, DNS, the connector itself) are left out
    # unless this is set: Shaper places GPU work.
    include_cpu_only: bool = False
    # GFD product label (nvidia.com/gpu.product) → catalogue name, over the built-in
    # families, e.g. {"NVIDIA-L4": "L4"}.
    gpu_model_aliases: dict[str, str] = Field(default_factory=dict)
    # Model of GPUs on nodes without a product label.
    default_gpu_model: Annotated[str, Field(min_length=1, max_length=64)] = "gpu"
    # NoSchedule/NoExecute taints that do not make a node draining: "GPU pods only"
    # taints that sites put on every GPU node.
    ignored_taints: list[str] = Field(default_factory=lambda: ["nvidia.com/gpu", "amd.com/gpu"])
    # How long the first list of every collection may take before read_state says so.
    sync_timeout_s: Annotated[float, Field(gt=0)] = 60.0
    page_size: Annotated[int, Field(ge=1, le=10_000)] = 500
    # List by a streaming list (watch with sendInitialEvents) where the API server offers
    # one, else in pages of page_size (connectors.kubernetes.informer).
    stream_list: bool = True
    # Report with each pending or running Job the spec that moves it to another cluster of
    # its federation group (connectors.kubernetes.submission).
    submit_specs: bool = True
    # Where a Job submitted from another scheduler's portable form is created (the form
    # names no namespace); on Kueue, the LocalQueue it queues in (none: such a job is
    # refused, as Kueue would not admit it).
    portable_namespace: Annotated[str, Field(min_length=1, max_length=63)] = "default"
    # The namespaces a job moved here from another cluster may be created in. A moved Job
    # runs with what its namespace holds (ServiceAccounts, Secrets, quotas) and names that
    # namespace itself, so the operator says which may take one; empty (the default): this
    # connector takes no moved job, and a submit is refused saying so.
    accept_namespaces: list[Annotated[str, Field(min_length=1, max_length=63)]] = Field(
        default_factory=list
    )
    portable_queue: Annotated[str, Field(min_length=1, max_length=63)] | None = None
    # The node agents' HTTP API (``shaper agent api``, agent.api), as a URL with ``{node}``
    # where the node's name goes, e.g. ``https://{node}:8470``. Set, a Kueue suspend that
    # the saga handed no checkpoint for asks the agent on the pod's node for a kubelet
    # checkpoint (connectors.kubernetes.node_agent); None (the default): the connector
    # never calls an agent, and such a suspend is refused.
    node_agent_url: Annotated[str, Field(min_length=1, max_length=512)] | None = None
    # The environment variable holding the agents' API token (never a --set value: it
    # would show in the process list).
    node_agent_token_env: Annotated[str, Field(min_length=1, max_length=128)] = (
        "SHAPER_NODE_AGENT_TOKEN"
    )
    # The CA bundle of agents served over TLS; None: the system's.
    node_agent_ca: Path | None = None
    # Place each pod of an elastic Indexed Job that Shaper resizes or starts on the node the
    # plan gives it (connectors.kubernetes.pod_placement: a scheduling gate the connector
    # lifts), and move a Deployment's replicas off the nodes a plan names (its shrink takes
    # the pods there, marked with the lowest pod-deletion-cost: ``resize_off``; reported as
    # ``replicas_movable``). Needs patch on pods, which
    # deploy/kubernetes/components/pod-placement grants (and sets this), its admission
    # policy holding the right to those two changes: off, the pods are pinned to the plan's
    # nodes as a set, and the scheduler may stack pods smaller than a node otherwise than
    # planned; a Deployment shrinks where its ReplicaSet chooses, and no plan moves its
    # replicas.
    pod_placement: bool = False

    @field_validator("node_agent_url")
    @classmethod
    def _agent_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        try:
            example = value.format(node="node-1")
        except (KeyError, IndexError, ValueError):
            raise ValueError("may hold {node} and no other braces") from None
        if not example.startswith(("http://", "https://")):
            raise ValueError("must be an http:// or https:// URL")
        # The agents' Bearer token goes with every call: never in clear across a network.
        host = urlsplit(example).hostname or ""
        if example.startswith("http://") and host not in ("127.0.0.1", "::1", "localhost"):
            raise ValueError(
                "must be https:// (the agents' token would cross the network in clear); "
                "http:// only for an agent on this host (127.0.0.1)"
            )
        return value
