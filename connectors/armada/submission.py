"""A new Armada job in Shaper's terms (:class:`NewJob`), and the submission it becomes.

Enough for the jobs Shaper itself starts (one container, its GPUs, CPU and memory, node
selector, labels and annotations); a richer pod is submitted with Armada's own tools and
then followed like any other job.
"""

from __future__ import annotations

from typing import Annotated

from armada_client.armada import submit_pb2
from armada_client.k8s.io.api.core.v1 import generated_pb2 as core_v1
from armada_client.k8s.io.apimachinery.pkg.api.resource import generated_pb2 as resource
from pydantic import BaseModel, ConfigDict, Field

_QUANTITY = r"^[0-9]+(\.[0-9]+)?(m|k|Ki|M|Mi|G|Gi|T|Ti)?$"


class NewJob(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    image: Annotated[str, Field(min_length=1, max_length=1024)]
    command: list[str] = Field(default_factory=list)
    args: list[str] = Field(default_factory=list)
    gpus: Annotated[int, Field(ge=0, le=1024)] = 0
    gpu_resource: str = "nvidia.com/gpu"
    # Kubernetes quantities: Armada requires requests equal to limits, so both are set.
    cpu: Annotated[str, Field(pattern=_QUANTITY)] = "1"
    memory: Annotated[str, Field(pattern=_QUANTITY)] = "1Gi"
    # Armada's per-job priority: lower runs first within the queue.
    priority: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 0.0
    namespace: str = "default"
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    node_selector: dict[str, str] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    # Armada answers a resend with the same client id with the job it made the first time.
    client_id: Annotated[str, Field(max_length=255)] = ""


def new_job_item(job: NewJob) -> submit_pb2.JobSubmitRequestItem:
    amounts = {"cpu": job.cpu, "memory": job.memory}
    if job.gpus:
        amounts[job.gpu_resource] = str(job.gpus)
    quantities = {name: resource.Quantity(string=value) for name, value in amounts.items()}
    container = core_v1.Container(
        name="main",
        image=job.image,
        command=job.command,
        args=job.args,
        env=[core_v1.EnvVar(name=name, value=value) for name, value in sorted(job.env.items())],
        resources=core_v1.ResourceRequirements(requests=quantities, limits=quantities),
    )
    pod = core_v1.PodSpec(
        containers=[container], nodeSelector=job.node_selector, restartPolicy="Never"
    )
    return submit_pb2.JobSubmitRequestItem(
        priority=job.priority,
        namespace=job.namespace,
        client_id=job.client_id,
        labels=job.labels,
        annotations=job.annotations,
        pod_specs=[pod],
    )
