"""Options of the Ray connector: ``shaper connector run --kind ray --cluster lab --set
dashboard_url=http://head:8265 --set gcs_address=head:6379`` — every ``--set KEY=VALUE``
is a field here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from wire.telemetry import JobKind


class RayConnectorConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    cluster: Annotated[str, Field(min_length=1, max_length=128)]
    # The head's dashboard: the state API (/api/v0/...), the Jobs API (/api/jobs/) and
    # Serve's REST API all answer there.
    dashboard_url: Annotated[str, Field(min_length=1)] = "http://127.0.0.1:8265"
    # The GCS (``ray start --head --port``): draining a node needs it, and reading which
    # nodes drain; so does reading what a job's entrypoint asked for (CPUs, GPUs, memory,
    # resources: Ray's REST answers leave it out), which a requeue resubmits and a job's
    # submit spec carries. Without it nodes are reported up or down only, jobs report no
    # submit spec (they cannot move to another cluster), and a requeue's resubmission
    # asks for no entrypoint resources.
    gcs_address: str | None = None
    timeout_s: Annotated[float, Field(gt=0)] = 20.0
    # How long a requeue waits for Ray to stop the job it replaces (Ray sends SIGTERM,
    # then SIGKILL after RAY_JOB_STOP_WAIT_TIME_S, 3 s by default); past it the step is
    # answered "retry" and the resend carries on from where it stopped.
    stop_timeout_s: Annotated[float, Field(gt=0)] = 60.0
    # Where jobs that Shaper stopped and holds are kept until a plan starts them again:
    # Ray has no held job, so the connector keeps their submissions itself.
    state_dir: Path | None = None
    # The resource name Ray counts GPUs in: "GPU" on real GPU nodes, a custom resource
    # (``--resources '{"fake_gpu": 4}'``) on test clusters.
    gpu_resource: Annotated[str, Field(min_length=1, max_length=128)] = "GPU"
    # Node label naming a node for Shaper (``ray start --labels shaper.io/node=gpu-3``);
    # a node without it is named by its Ray node id. Ray's own node_name is its IP, which
    # several raylets on one host share.
    node_name_label: Annotated[str, Field(min_length=1)] = "shaper.io/node"
    # Node label naming the GPU model; else Ray's ``accelerator_type:<model>`` resource,
    # else default_gpu_model.
    gpu_model_label: Annotated[str, Field(min_length=1)] = "shaper.io/gpu-model"
    default_gpu_model: Annotated[str, Field(min_length=1, max_length=64)] = "gpu"
    # For jobs whose metadata says nothing of these (connectors/ray/translate.py).
    default_kind: JobKind = JobKind.other
    default_priority: Annotated[int, Field(ge=0, le=1_000_000)] = 0
    default_sla_class: Annotated[str, Field(min_length=1, max_length=64)] = "standard"
    # Serve deployments are elastic services: their replica range when they do not
    # autoscale (an autoscaling deployment's own min/max are used).
    serve_min_replicas: Annotated[int, Field(ge=0)] = 1
    serve_max_replicas: Annotated[int, Field(ge=1)] = 8
    serve_priority: Annotated[int, Field(ge=0, le=1_000_000)] = 100
    # Ray's state API returns at most this many entries of a kind per request (Ray's own
    # ceiling is 10,000); a cluster with more makes the read fail rather than be partial.
    list_limit: Annotated[int, Field(ge=1, le=10_000)] = 10_000

    def held_jobs_path(self) -> Path:
        directory = self.state_dir or Path("shaper-data") / f"ray-{self.cluster}"
        return directory / "held-jobs.json"
