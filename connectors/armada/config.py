"""Per-cluster settings of the Armada connector: where Armada's gRPC API is, which job sets
to follow, the nodes of its executor clusters, and how its jobs map onto Shaper's fields.

Armada's public API has no call that lists a queue's job sets (Lookout has one; the gRPC
API only streams the events of a job set whose name the caller knows), so the job sets
Shaper follows are named here. Nor does it list nodes (executors report them to the
scheduler, not to clients): ``nodes`` is the inventory of the executor clusters, and a
node that only the events name (a job runs there) is reported with the GPUs its jobs hold.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from wire.telemetry import MAX_NODE_MEMORY_MIB, NAME_PATTERN, JobKind

# Armada's queue and job set names are free text on the wire; these bounds keep them
# storable as Shaper's queue names and as parts of a client id.
_QUEUE = Annotated[str, Field(min_length=1, max_length=128)]
_JOB_SET = Annotated[str, Field(min_length=1, max_length=255)]
# A Kubernetes namespace (a DNS-1123 label): where an executor runs a job's pod.
_NAMESPACE = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"


class _Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class JobSetRef(_Settings):
    queue: _QUEUE
    job_set: _JOB_SET


class ExecutorNode(_Settings):
    """One node of an executor cluster, as the operator declares it."""

    name: Annotated[str, Field(pattern=NAME_PATTERN)]
    executor: Annotated[str, Field(min_length=1, max_length=128)]
    gpu_model: Annotated[str, Field(min_length=1, max_length=64)] | None = None
    gpu_count: Annotated[int, Field(ge=0, le=1024)] = 0
    cpu_cores: Annotated[int, Field(ge=0, le=1_000_000)] = 0
    memory_mib: Annotated[int, Field(ge=0, le=MAX_NODE_MEMORY_MIB)] = 0
    labels: dict[str, str] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _gpus_need_a_model(self) -> ExecutorNode:
        if self.gpu_count > 0 and self.gpu_model is None:
            raise ValueError(f"node {self.name}: gpu_model is required when gpu_count > 0")
        return self


class ArmadaMapping(_Settings):
    """How an Armada job becomes a Shaper job. A job's own labels win over these defaults:
    ``shaper.io/team``, ``shaper.io/kind``, ``shaper.io/sla-class``, ``shaper.io/priority``
    (the same keys the Kubernetes connector reads: Armada jobs are Kubernetes pods)."""

    default_kind: JobKind = JobKind.training
    default_sla_class: Annotated[str, Field(min_length=1, max_length=64)] = "standard"
    # Shaper's priority per queue (higher: more important). Armada's own per-job priority
    # only orders jobs within their queue (lower first), so it is not Shaper's.
    queue_priorities: dict[str, Annotated[int, Field(ge=0, le=1_000_000)]] = Field(
        default_factory=dict
    )
    default_priority: Annotated[int, Field(ge=0, le=1_000_000)] = 0
    # Extended resources that count as GPUs, and the node-selector label naming the model.
    gpu_resources: tuple[str, ...] = ("nvidia.com/gpu", "amd.com/gpu")
    gpu_model_label: str = "nvidia.com/gpu.product"
    # The model of GPUs on nodes that only the events name.
    default_gpu_model: Annotated[str, Field(min_length=1, max_length=64)] = "gpu"


# Hosts a bearer token may go to over plain gRPC: it never leaves this machine.
_LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1"})


class ArmadaConnectorConfig(_Settings):
    """How to reach one Armada instance and what to follow there.

    ``hold_queue``: Armada has no held state, so a job that a plan stops and holds (a
    ``requeue`` with ``hold``) is parked in this queue, which the operator creates
    cordoned (Armada schedules nothing from a cordoned queue), and moved back to its own
    queue when a plan starts it. Unset: requeues with ``hold`` are refused.

    Federated moves (connectors.armada.moves): ``submit_specs`` makes jobs carry a
    ``SubmitSpec`` (connectors.armada.specs); a job moved here lands in a followed job set
    (its telemetry must report it): its own queue's (an Armada job) or its team's queue's
    when this connector follows one, else ``move_job_set``; with none, it is refused.
    ``portable_namespace``: the namespace a job from another scheduler's portable form runs
    in. ``accept_namespaces``: the Kubernetes namespaces a moved job may run in on this
    Armada's executors (its pods run with what that namespace holds: ServiceAccounts,
    Secrets, quotas, and the job names it itself), as the Kubernetes connector's setting of
    that name; empty (the default): this connector takes no moved job, and a submit is
    refused for good, naming the setting.
    """

    cluster: Annotated[str, Field(min_length=1, max_length=128)]
    # host:port of Armada's gRPC API (the server's ``grpcPort``).
    url: Annotated[str, Field(min_length=3, max_length=512)]
    tls: bool = False
    # Sent as ``authorization: Bearer <token>`` (Armada's OIDC or static-token auth); over
    # plain gRPC only to this machine, or with ``allow_insecure_token`` (anyone on the path
    # could read it and act as this connector on Armada).
    token: SecretStr | None = None
    allow_insecure_token: bool = False
    job_sets: list[JobSetRef] = Field(min_length=1)
    nodes: list[ExecutorNode] = Field(default_factory=list)
    hold_queue: _QUEUE | None = None
    # Node labels the connector pins jobs with (a node selector): the node's name, and the
    # executor cluster the operator labels each executor's nodes with.
    node_label: str = "kubernetes.io/hostname"
    executor_label: str = "shaper.io/armada-executor"
    timeout_s: Annotated[float, Field(gt=0)] = 20.0
    mapping: ArmadaMapping = Field(default_factory=ArmadaMapping)
    submit_specs: bool = True
    move_job_set: JobSetRef | None = None
    portable_namespace: Annotated[str, Field(pattern=_NAMESPACE)] = "default"
    accept_namespaces: list[Annotated[str, Field(pattern=_NAMESPACE)]] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> ArmadaConnectorConfig:
        if self.token is not None and not self.tls and not self.allow_insecure_token:
            host = self.url.rsplit(":", 1)[0].strip("[]")
            if host not in _LOOPBACK:
                raise ValueError(
                    f"token: would be sent in the clear over plain gRPC to {self.url}; set "
                    "tls: true, or allow_insecure_token: true to accept that"
                )
        names = [node.name for node in self.nodes]
        repeated = sorted({name for name in names if names.count(name) > 1})
        if repeated:
            raise ValueError(f"nodes named twice: {', '.join(repeated)}")
        if self.hold_queue is not None and any(
            ref.queue == self.hold_queue for ref in self.job_sets
        ):
            raise ValueError(f"hold_queue {self.hold_queue!r} is also a followed job set's queue")
        if self.move_job_set is not None and self.move_job_set not in self.job_sets:
            # A moved job must land where the connector reads events, or it is never seen.
            raise ValueError(
                f"move_job_set {self.move_job_set.queue}/{self.move_job_set.job_set} is not "
                "one of job_sets"
            )
        return self

    def node_labels(self, node: ExecutorNode) -> dict[str, str]:
        """The labels a job's node selector meets on ``node``: the declared ones, and those
        an executor's nodes carry anyway (its name, its executor, its GPU model)."""
        found = {self.node_label: node.name, self.executor_label: node.executor}
        if node.gpu_model is not None:
            found[self.mapping.gpu_model_label] = node.gpu_model
        return {**found, **node.labels}

    def selected_nodes(self, selector: dict[str, str]) -> list[ExecutorNode]:
        """The declared nodes whose labels satisfy ``selector``, in declared order."""
        return [
            node
            for node in self.nodes
            if all(self.node_labels(node).get(key) == value for key, value in selector.items())
        ]

    def followed(self) -> list[JobSetRef]:
        """Every job set whose events the connector reads: the configured ones, and their
        namesakes in the hold queue, where held jobs of those job sets wait."""
        refs = list(self.job_sets)
        if self.hold_queue is not None:
            refs += [JobSetRef(queue=self.hold_queue, job_set=ref.job_set) for ref in self.job_sets]
        return refs
