"""A Ray job as a ``wire.telemetry.SubmitSpec``, and such a spec as a Jobs API submission.

A federated move (issue 16) submits a pending job of one Ray cluster to another Ray
cluster of its group. The source's connector reports, with every pending or running job
submitted through the Jobs API (and every job it holds), ``SubmitSpec(scheduler=ray,
native=…)`` whose ``native`` is :class:`RayNative`: the fields of a Jobs API submission
(``POST /api/jobs/``, what ``JobSubmissionClient.submit_job`` sends) that say what the
job is, as the source's Jobs API lists them:

* ``entrypoint``: the command its driver runs;
* ``runtime_env``: its environment (pip/conda packages, env_vars, a remote working_dir);
* ``metadata``: its own metadata, ``shaper.io/priority``, ``shaper.io/kind``… included
  (connectors/ray/translate.py), so the target reports it as the source did;
* ``entrypoint_num_cpus``, ``entrypoint_num_gpus``, ``entrypoint_memory``,
  ``entrypoint_resources``, ``entrypoint_label_selector``: what its driver needs.

Left out, as the source cluster's own: the submission id, the Ray job id and driver
details, status and times; the metadata the connector keeps per cluster (``shaper.io/job``,
``shaper.io/attempt``, ``shaper.io/step``, ``shaper.io/resume-from``) and the runtime
environment's ``SHAPER_RESUME_FROM`` and ``SHAPER_NODES``: a pending job that moves starts
over there, with no checkpoint of the source's, and its job id there is its new submission
id; a label selector's node keys (``shaper.io/node``'s label, ``ray.io/node-id``), which
name the source's nodes. A job whose runtime environment names a package in the source's
GCS (``gcs://``: a local working_dir or py_modules that ``ray job submit`` uploaded there)
reports no spec: the target cannot fetch it, so the job cannot move (:func:`not_movable`).

The target's connector submits it (:func:`submission_body`) under a submission id derived
from the move's name (:func:`move_submission_id`): Ray refuses a second submission with
that id, so a resent submit never runs the job twice, and a ``withdraw`` finds the job by
it. ``nodes`` pins the job's driver to those nodes with an entrypoint label selector on
``ray.io/node-id`` and tells its code where it was sent (``SHAPER_NODES``, as ``start``
does): Ray places a driver's placement groups and actors itself. A spec of another
scheduler runs here through its portable form only: its command as the entrypoint, its
GPUs reserved for the entrypoint; a container image is refused.
"""

from __future__ import annotations

import hashlib
import re
import shlex
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from connectors.base import ConnectorError
from connectors.ray.config import RayConnectorConfig
from connectors.ray.translate import (
    ATTEMPT_KEY,
    GPUS_KEY,
    JOB_KEY,
    RESUME_ENV,
    RESUME_KEY,
    STEP_KEY,
)
from wire.telemetry import PortableSpec, SchedulerKind, SubmitSpec

NODES_ENV = "SHAPER_NODES"
NODE_ID_LABEL = "ray.io/node-id"
# The metadata that names the move a submission was made for (a person reading Ray's
# dashboard sees where the job came from; the connector finds it by its submission id).
MOVE_KEY = "shaper.io/move"
_CLUSTER_METADATA = (JOB_KEY, ATTEMPT_KEY, STEP_KEY, RESUME_KEY, MOVE_KEY)
_CLUSTER_ENV = (RESUME_ENV, NODES_ENV)
# A submission id goes into the Jobs API's URL paths: only these characters, as is.
_NOT_IN_A_SUBMISSION_ID = re.compile(r"[^A-Za-z0-9._-]")
_LOCAL_PACKAGE = "gcs://"
# Ray's error types of a FAILED submission whose entrypoint never ran (JobErrorType).
_NEVER_STARTED = frozenset(
    {
        "RUNTIME_ENV_SETUP_FAILURE",
        "JOB_SUPERVISOR_ACTOR_START_TIMEOUT",
        "JOB_SUPERVISOR_ACTOR_START_FAILURE",
        "JOB_SUPERVISOR_ACTOR_UNSCHEDULABLE",
        "JOB_ENTRYPOINT_COMMAND_START_ERROR",
    }
)


class RayNative(BaseModel):
    """``SubmitSpec.native`` of a Ray job: a Jobs API submission without its id. Nothing
    else is accepted, so a spec (data from another cluster) cannot choose the submission
    id or smuggle in fields Ray would take."""

    model_config = ConfigDict(extra="forbid")

    entrypoint: Annotated[str, Field(min_length=1)]
    runtime_env: dict[str, Any] = Field(default_factory=dict)
    metadata: dict[str, str] = Field(default_factory=dict)
    entrypoint_num_cpus: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    entrypoint_num_gpus: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    entrypoint_memory: Annotated[int, Field(ge=0)] | None = None
    entrypoint_resources: dict[str, Annotated[float, Field(ge=0)]] | None = None
    entrypoint_label_selector: dict[str, str] | None = None


# --- the source side: a submission → a spec ----------------------------------------------------


def not_movable(submission: Mapping[str, Any]) -> str | None:
    """Why a job (a Jobs API entry, or a submission the connector holds) cannot move to
    another Ray cluster; None when it can."""
    if not submission.get("entrypoint"):
        return "it has no entrypoint (a driver not submitted through the Jobs API)"
    local = sorted(_local_packages(submission.get("runtime_env") or {}))
    if local:
        return (
            f"its runtime environment names {', '.join(local)} in this cluster's GCS, which "
            "another cluster cannot fetch"
        )
    return None


def submit_spec(submission: Mapping[str, Any], config: RayConnectorConfig) -> SubmitSpec:
    """The spec a job carries in telemetry (see the module docstring); raises
    ``ValidationError`` when it is above the wire's bound."""
    runtime_env = dict(submission.get("runtime_env") or {})
    if isinstance(runtime_env.get("env_vars"), dict):
        env_vars = {k: v for k, v in runtime_env["env_vars"].items() if k not in _CLUSTER_ENV}
        if env_vars:
            runtime_env["env_vars"] = env_vars
        else:
            del runtime_env["env_vars"]
    metadata = {
        str(k): str(v)
        for k, v in (submission.get("metadata") or {}).items()
        if k not in _CLUSTER_METADATA
    }
    native: dict[str, Any] = {
        "entrypoint": submission["entrypoint"],
        "runtime_env": runtime_env,
        "metadata": metadata,
    }
    for field in (
        "entrypoint_num_cpus",
        "entrypoint_num_gpus",
        "entrypoint_memory",
        "entrypoint_resources",
    ):
        if submission.get(field) is not None:
            native[field] = submission[field]
    selector = {
        k: v
        for k, v in (submission.get("entrypoint_label_selector") or {}).items()
        if k not in (config.node_name_label, NODE_ID_LABEL)
    }
    if selector:
        native["entrypoint_label_selector"] = selector
    return SubmitSpec(scheduler=SchedulerKind.ray, native=native)


def _local_packages(value: Any) -> set[str]:
    """The ``gcs://`` URIs anywhere in a runtime environment (working_dir, py_modules…)."""
    if isinstance(value, str):
        return {value} if value.startswith(_LOCAL_PACKAGE) else set()
    if isinstance(value, Mapping):
        return set().union(*(_local_packages(v) for v in value.values()))
    if isinstance(value, list):
        return set().union(*(_local_packages(v) for v in value))
    return set()


# --- the target side: a spec → a submission ----------------------------------------------------


def move_submission_id(name: str) -> str:
    """The submission id of move ``name``'s job: the same on every resend. The name as it
    is when it has only characters a URL path takes as they are; else those replaced and
    a digest of the whole name added, so two names never share an id."""
    safe = _NOT_IN_A_SUBMISSION_ID.sub("-", name)
    if safe == name:
        return name
    return f"{safe}-{hashlib.sha256(name.encode()).hexdigest()[:12]}"


def submission_body(
    spec: SubmitSpec,
    *,
    name: str,
    submission_id: str,
    config: RayConnectorConfig,
    nodes: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The Jobs API body that submits ``spec`` here as move ``name``. ``nodes``: Shaper's
    name → Ray's node id of each node the driver is pinned to."""
    what = f"submit {name} to Ray cluster {config.cluster}"
    if spec.scheduler is SchedulerKind.ray:
        try:
            native = RayNative.model_validate(spec.native)
        except ValidationError as error:
            raise ConnectorError(
                f"{what}: native is not a Ray job: {error}", retryable=False
            ) from None
    elif spec.portable is not None:
        native = _from_portable(spec.portable, what=what, config=config)
    else:
        raise ConnectorError(
            f"{what}: a {spec.scheduler.value} job cannot run on Ray: its spec has no "
            "portable form (a command with its resources)",
            retryable=False,
        )
    body = native.model_dump(exclude_none=True)
    body["metadata"] = {**native.metadata, MOVE_KEY: name}
    body["submission_id"] = submission_id
    if nodes:
        runtime_env = dict(native.runtime_env)
        env_vars = {**(runtime_env.get("env_vars") or {}), NODES_ENV: ",".join(nodes)}
        runtime_env["env_vars"] = env_vars
        body["runtime_env"] = runtime_env
        # Over any selector of the spec's: the pin is the target connector's, as Slurm's
        # --nodelist is (connectors.base.SupportsSubmit).
        body["entrypoint_label_selector"] = {
            **(native.entrypoint_label_selector or {}),
            NODE_ID_LABEL: f"in({','.join(nodes.values())})",
        }
    return body


def ran(entry: Mapping[str, Any]) -> bool:
    """Whether a Jobs API entry ran its entrypoint to an end of its own: SUCCEEDED, or
    FAILED after it started (not a runtime environment or a driver that never came up)."""
    status = entry.get("status")
    if status == "SUCCEEDED":
        return True
    return status == "FAILED" and entry.get("error_type") not in _NEVER_STARTED


def _from_portable(portable: PortableSpec, *, what: str, config: RayConnectorConfig) -> RayNative:
    if portable.image:
        raise ConnectorError(
            f"{what}: the portable form needs the container image {portable.image!r}, and "
            "the Ray connector submits plain commands only",
            retryable=False,
        )
    if not portable.command:
        raise ConnectorError(f"{what}: the portable form has no command", retryable=False)
    native = RayNative(
        entrypoint=shlex.join(portable.command),
        runtime_env={"env_vars": dict(portable.env)} if portable.env else {},
        # Nothing in a plain command asks Ray for GPUs: the entrypoint holds them, and
        # the metadata says how many the job wants before it runs.
        metadata={GPUS_KEY: str(portable.gpus)} if portable.gpus else {},
        entrypoint_num_cpus=portable.cpus or None,
        entrypoint_memory=portable.memory_mib * 2**20 or None,
    )
    if portable.gpus and config.gpu_resource == "GPU":
        native.entrypoint_num_gpus = portable.gpus
    elif portable.gpus:
        native.entrypoint_resources = {config.gpu_resource: portable.gpus}
    return native
