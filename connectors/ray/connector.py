"""The Ray connector: telemetry from the head's REST APIs, actions through the Jobs API,
Serve's external scaler and the GCS.

Reads (connectors.ray.translate): the state API's nodes, placement groups, live actors
and running tasks, the Jobs API's submissions and Serve's applications, whole or not at
all. Actions, each idempotent:

==========================  ===============================================================
step                        Ray
==========================  ===============================================================
requeue(hold)               stop the job's submission and submit it again (a new
                            submission, ``shaper.io/attempt`` + 1), with
                            ``SHAPER_RESUME_FROM`` set to the step's checkpoint pointer, else
                            to the job's own ``shaper.io/checkpoint-dir``, and
                            ``shaper.io/gpus`` set to the GPUs it asked for (unless the job
                            set it); with ``hold`` it is kept (connectors.ray.held) until
                            ``start``/``release`` submits it
hold                        the same, held
start / release             submit a held job; one that runs or waits in Ray: nothing
cancel                      stop the job for good (and forget it if held)
resize(replicas)            a Serve deployment (``serve:<app>/<deployment>``): Serve's
                            external scaler, ``POST /api/v1/applications/…/scale``
drain_node (not a step)     the GCS's drain (connectors.ray.drain); no plan drives it yet
==========================  ===============================================================

Refused with a non-retryable :class:`ConnectorError` that says why: a requeue pinned to
nodes or away from them (Ray places a job's placement groups and actors itself; a job
can only be told where to go by its own code, so Shaper plans no moves on Ray:
app/actions/schedulers.py), resizing anything but a Serve deployment, resizing a
deployment whose application does not let an external scaler set its replicas
(``external_scaler_enabled: true`` in its Serve config), acting on a driver that was not
submitted through the Jobs API. ``suspend``, ``reserve`` and ``update_node_count`` are
not offered: Ray has none of them, and the executor refuses those steps itself.

A resubmission's submission id is fixed before anything is stopped
(``<job>.r<attempt>``) and kept with the held record, so a resent step submits the same
id, which Ray refuses as a duplicate: the job never runs twice. A step key
(``SupportsStepKey``) goes into the new submission's metadata, so a resend after the
record is gone finds the step done.
"""

from __future__ import annotations

import logging
import math
import re
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx

from connectors.base import ConnectorError
from connectors.ray import drain as gcs
from connectors.ray.client import RayDashboard, RayHttpError
from connectors.ray.config import RayConnectorConfig
from connectors.ray.held import HeldJob, HeldJobs
from connectors.ray.translate import (
    ATTEMPT_KEY,
    CHECKPOINT_DIR_KEY,
    GPUS_KEY,
    HELD_REASON,
    JOB_KEY,
    RESUBMITTING_REASON,
    RESUME_ENV,
    RESUME_KEY,
    STEP_KEY,
    RayNode,
    Submission,
    fit_to_nodes,
    gpu_use,
    job_report,
    node_reports,
    parse_serve_id,
    serve_reports,
    submissions,
)
from wire.telemetry import (
    TERMINAL_JOB_STATES,
    ClusterState,
    JobReport,
    NodeState,
    SchedulerKind,
)

logger = logging.getLogger(__name__)

# Fields of a Jobs API entry that a resubmission carries over as they were.
_CARRIED = (
    "entrypoint",
    "runtime_env",
    "entrypoint_num_cpus",
    "entrypoint_num_gpus",
    "entrypoint_memory",
    "entrypoint_resources",
    "entrypoint_label_selector",
)
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")
POLL_S = 0.25


class RayConnector:
    kind = SchedulerKind.ray

    def __init__(
        self,
        config: RayConnectorConfig,
        *,
        transport: httpx.BaseTransport | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        sleep: Callable[[float], object] = time.sleep,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.cluster = config.cluster
        self.ray = RayDashboard(config, transport=transport)
        self.held = HeldJobs(config.held_jobs_path())
        self._clock = clock
        self._sleep = sleep
        self._monotonic = monotonic
        # external id → what the executor handed over for the step that follows.
        self._resume_pointers: dict[str, str | None] = {}
        self._step_keys: dict[str, str] = {}

    def close(self) -> None:
        self.ray.close()

    def __enter__(self) -> RayConnector:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- reads -----------------------------------------------------------------------------

    def read_nodes(self) -> list[RayNode]:
        listed = self.ray.list_state("nodes")  # first: an unreachable head fails fast here
        draining = gcs.draining_nodes(self.config.gcs_address) if self.config.gcs_address else None
        return node_reports(listed, self.config, draining=draining or frozenset())

    def read_state(self) -> ClusterState:
        observed_at = self._clock()
        nodes = self.read_nodes()
        # Work is counted only on nodes that can hold it: a dead node's GPUs are nobody's.
        live = {n.node_id: n.report.name for n in nodes if n.report.state is not NodeState.down}
        node_gpus = {n.report.name: n.report.gpu_count for n in nodes}
        use = gpu_use(
            self.ray.list_state("placement_groups"),
            self.ray.list_state("actors"),
            self.ray.list_state("tasks"),
            live,
            self.config.gpu_resource,
        )
        held = self.held.all()
        jobs: list[JobReport] = []
        grouped = submissions(self.ray.list_jobs())
        for external_id, group in sorted(grouped.items()):
            latest = group[-1]
            record = held.get(external_id)
            waiting = record is not None and latest.state in TERMINAL_JOB_STATES
            if record is not None and waiting:
                # Its stopped submission's placement groups are gone: what it asks for is
                # in the metadata of the submission the connector keeps for it.
                latest = _with_metadata(latest, record.submission.get("metadata"))
            jobs.append(
                job_report(
                    latest,
                    use.get(latest.ray_job_id or ""),
                    self.config,
                    node_gpus=node_gpus,
                    held=waiting,
                    held_reason=RESUBMITTING_REASON
                    if record is not None and not record.hold
                    else HELD_REASON,
                    restarts=latest.attempt,
                )
            )
        for external_id, record in sorted(held.items()):
            if external_id not in grouped:  # Ray forgot the job (a new head): Shaper did not
                last = _with_metadata(
                    Submission(external_id, record.replaces, record.attempt - 1, record.last_seen),
                    record.submission.get("metadata"),
                )
                jobs.append(
                    job_report(
                        last,
                        None,
                        self.config,
                        node_gpus=node_gpus,
                        held=True,
                        restarts=last.attempt,
                    )
                )
        # Services first: a replica's GPU is the service's whole, a job's may be a fraction.
        services = serve_reports(self._serve(), self.config, node_names=live, node_gpus=node_gpus)
        jobs = fit_to_nodes([*services, *jobs], node_gpus)
        return ClusterState(observed_at=observed_at, nodes=[n.report for n in nodes], jobs=jobs)

    def _serve(self) -> dict[str, dict[str, Any]]:
        try:
            return self.ray.serve_applications()
        except RayHttpError as error:
            if error.status in (404, 501):  # Serve is not installed on the head
                return {}
            raise

    # --- what the executor hands over ------------------------------------------------------

    def set_resume_pointer(self, external_id: str, resume_from: str | None) -> None:
        """SupportsResumePointer: the next requeue's resubmission resumes from it."""
        self._resume_pointers[external_id] = resume_from

    def set_step_key(self, external_id: str, step_key: str) -> None:
        """SupportsStepKey: the next requeue's resubmission carries it in its metadata."""
        self._step_keys[external_id] = step_key

    # --- SupportsRequeue, SupportsHold, SupportsStart, SupportsCancel ----------------------

    def requeue(
        self,
        external_id: str,
        *,
        nodes: list[str] | None = None,
        exclude: list[str] | None = None,
        hold: bool = False,
    ) -> None:
        pointer = self._resume_pointers.pop(external_id, None)
        key = self._step_keys.pop(external_id, None)
        if nodes or exclude:
            raise _cannot(
                "requeue",
                external_id,
                "Ray places a job's placement groups and actors itself; it cannot be pinned "
                "to nodes or kept off them from outside (not supported yet)",
            )
        self._stop_and_resubmit(external_id, hold=hold, pointer=pointer, key=key)

    def hold(self, external_id: str) -> None:
        record = self.held.get(external_id)
        if record is not None:
            if not record.hold:
                self.held.put(record.model_copy(update={"hold": True}))
            self._stop(external_id, record.replaces)
            return
        self._stop_and_resubmit(external_id, hold=True, pointer=None, key=None)

    def release(self, external_id: str) -> None:
        self.start(external_id)

    def start(self, external_id: str, *, nodes: list[str] | None = None) -> None:
        """Submit a held job again. ``nodes``: Ray places it where its resources fit (the
        confirm that follows says where it went); its code may read them from
        ``SHAPER_NODES``."""
        record = self.held.get(external_id)
        if record is None:
            latest = self._latest(external_id, what="start")
            if latest.state in TERMINAL_JOB_STATES:
                raise _cannot(
                    "start",
                    external_id,
                    f"it has ended ({latest.raw.get('status')}) and Shaper does not hold it",
                )
            return  # it runs or waits for resources in Ray already
        if nodes:
            submission = dict(record.submission)
            runtime_env = dict(submission.get("runtime_env") or {})
            runtime_env["env_vars"] = {
                **(runtime_env.get("env_vars") or {}),
                "SHAPER_NODES": ",".join(nodes),
            }
            submission["runtime_env"] = runtime_env
            record = record.model_copy(update={"submission": submission})
        self._stop(external_id, record.replaces)  # done already, unless a stop was cut short
        self._submit(record)

    def cancel(self, external_id: str) -> None:
        record = self.held.get(external_id)
        if record is not None:
            self.held.drop(external_id)
        group = submissions(self.ray.list_jobs()).get(external_id)
        if group is None:
            if record is None:
                raise _cannot("cancel", external_id, "Ray has no such submitted job")
            return
        for submission in group:
            if submission.state not in TERMINAL_JOB_STATES:
                self._stop(external_id, submission.submission_id)

    # --- SupportsResize --------------------------------------------------------------------

    def resize(self, external_id: str, *, replicas: int) -> None:
        names = parse_serve_id(external_id)
        if names is None:
            raise _cannot(
                "resize",
                external_id,
                "only Ray Serve deployments (serve:<application>/<deployment>) have replicas",
            )
        if replicas < 0:
            raise _cannot("resize", external_id, f"replicas must be >= 0, got {replicas}")
        application, deployment = names
        try:
            self.ray.scale_deployment(application, deployment, replicas)
        except RayHttpError as error:
            if error.status == 412 and "external_scaler_enabled" in error.body:
                raise _cannot(
                    "resize",
                    external_id,
                    f"its application {application!r} does not let an external scaler set its "
                    "replicas: deploy it with external_scaler_enabled: true in its Serve config",
                ) from error
            if error.status == 404:
                raise _cannot("resize", external_id, "Serve has no such deployment") from error
            raise

    # --- draining (a library function: no saga step drives it yet) ------------------------

    def drain_node(
        self, node: str, *, message: str = "drained by Shaper", deadline_s: float | None = None
    ) -> None:
        """Ask Ray to place nothing new on ``node`` (by Shaper's name for it)."""
        if not self.config.gcs_address:
            raise ConnectorError(
                f"drain node {node}: set the connector's gcs_address (the head's GCS, "
                "host:port): Ray drains nodes through its GCS only",
                retryable=False,
            )
        by_name = {n.report.name: n for n in self.read_nodes()}
        target = by_name.get(node)
        if target is None:
            raise ConnectorError(f"drain node {node}: Ray has no such node", retryable=False)
        if target.report.state is NodeState.down:
            raise ConnectorError(f"drain node {node}: the node is down", retryable=False)
        gcs.drain(self.config.gcs_address, target.node_id, message=message, deadline_s=deadline_s)

    # --- the parts of a requeue --------------------------------------------------------------

    def _stop_and_resubmit(
        self, external_id: str, *, hold: bool, pointer: str | None, key: str | None
    ) -> None:
        record = self.held.get(external_id)
        if record is None:
            group = self._group(external_id, what="requeue")
            if key is not None and any(s.metadata.get(STEP_KEY) == key for s in group):
                logger.info(
                    "requeue of %s: done by an earlier delivery of step %s", external_id, key
                )
                return
            latest = group[-1]
            if latest.state in TERMINAL_JOB_STATES:
                raise _cannot("requeue", external_id, f"it has ended ({latest.raw.get('status')})")
            record = self._record(
                latest, hold=hold, pointer=pointer, key=key, gpus=self._asked_gpus(latest)
            )
            # Kept before anything stops: a connector that dies after the stop still
            # knows what to submit.
            self.held.put(record)
        elif record.hold != hold and key is not None and key != record.step_key:
            record = record.model_copy(update={"hold": hold, "step_key": key})
            self.held.put(record)
        self._stop(external_id, record.replaces)
        if not record.hold:
            self._submit(record)

    def _asked_gpus(self, submission: Submission) -> int:
        """The GPUs a running submission's driver asked for (its placement groups, GPU
        actors and tasks), read before it is stopped: they go when it does."""
        if GPUS_KEY in submission.metadata or submission.ray_job_id is None:
            return 0
        live = {
            n.node_id: n.report.name
            for n in self.read_nodes()
            if n.report.state is not NodeState.down
        }
        use = gpu_use(
            self.ray.list_state("placement_groups"),
            self.ray.list_state("actors"),
            self.ray.list_state("tasks"),
            live,
            self.config.gpu_resource,
        ).get(submission.ray_job_id)
        return math.ceil(use.asked - 1e-9) if use is not None else 0

    def _record(
        self,
        latest: Submission,
        *,
        hold: bool,
        pointer: str | None,
        key: str | None,
        gpus: int = 0,
    ) -> HeldJob:
        attempt = latest.attempt + 1
        metadata = {**latest.metadata, JOB_KEY: latest.external_id, ATTEMPT_KEY: str(attempt)}
        if gpus > 0:
            # Until the new submission's driver has made its placement groups (while it is
            # held, and after it is submitted), this is all that tells what it asks for:
            # a held job reported with no GPUs would never be planned to start again.
            metadata.setdefault(GPUS_KEY, str(gpus))
        metadata.pop(STEP_KEY, None)
        if key is not None:
            metadata[STEP_KEY] = key
        resume_from = pointer or metadata.get(CHECKPOINT_DIR_KEY)
        runtime_env = dict(latest.raw.get("runtime_env") or {})
        env_vars = dict(runtime_env.get("env_vars") or {})
        env_vars.pop(RESUME_ENV, None)
        metadata.pop(RESUME_KEY, None)
        if resume_from:
            env_vars[RESUME_ENV] = resume_from
            metadata[RESUME_KEY] = resume_from
        runtime_env["env_vars"] = env_vars
        body: dict[str, Any] = {
            field: latest.raw[field] for field in _CARRIED if latest.raw.get(field) is not None
        }
        body.update(
            runtime_env=runtime_env,
            metadata=metadata,
            submission_id=f"{_UNSAFE.sub('-', latest.external_id)}.r{attempt}",
        )
        return HeldJob(
            external_id=latest.external_id,
            submission=body,
            replaces=latest.submission_id,
            attempt=attempt,
            hold=hold,
            step_key=key,
            last_seen=latest.raw,
        )

    def _stop(self, external_id: str, submission_id: str) -> None:
        """Stop a submission and wait until Ray says it has ended."""
        try:
            self.ray.stop_job(submission_id)
        except RayHttpError as error:
            if error.status != 404:
                raise
            return  # gone from Ray: nothing runs
        deadline = self._monotonic() + self.config.stop_timeout_s
        while True:
            status = self._status(submission_id)
            if status is None or status in ("STOPPED", "SUCCEEDED", "FAILED"):
                return
            if self._monotonic() > deadline:
                raise ConnectorError(
                    f"stop {external_id}: Ray job {submission_id} is still {status} after "
                    f"{self.config.stop_timeout_s:.0f} s",
                    retryable=True,
                )
            self._sleep(POLL_S)

    def _status(self, submission_id: str) -> str | None:
        try:
            job = self.ray.request(
                "GET", f"/api/jobs/{submission_id}", what=f"read Ray job {submission_id}"
            )
        except RayHttpError as error:
            if error.status == 404:
                return None
            raise
        return str(job.get("status"))

    def _submit(self, record: HeldJob) -> None:
        try:
            self.ray.submit_job(record.submission)
        except RayHttpError as error:
            # The same submission id, submitted by an earlier delivery of this step.
            if "already exists" not in error.body:
                raise
            logger.info("submit %s: Ray has it already", record.submission["submission_id"])
        self.held.drop(record.external_id)

    def _group(self, external_id: str, *, what: str) -> list[Submission]:
        group = submissions(self.ray.list_jobs()).get(external_id)
        if not group:
            raise _cannot(
                what,
                external_id,
                "Ray has no such submitted job (drivers started without the Jobs API "
                "cannot be stopped and resubmitted)",
            )
        return group

    def _latest(self, external_id: str, *, what: str) -> Submission:
        return self._group(external_id, what=what)[-1]


def _with_metadata(submission: Submission, metadata: dict[str, Any] | None) -> Submission:
    if not metadata:
        return submission
    return Submission(
        submission.external_id,
        submission.submission_id,
        submission.attempt,
        {**submission.raw, "metadata": metadata},
    )


def _cannot(step: str, external_id: str, why: str) -> ConnectorError:
    return ConnectorError(f"cannot {step} Ray job {external_id}: {why}", retryable=False)


def create_ray_connector(**options: Any) -> RayConnector:
    """Registry factory: ``registry.create(SchedulerKind.ray, cluster=…, dashboard_url=…)``.
    Options are :class:`RayConnectorConfig` fields, plus the injectables of
    :class:`RayConnector` (``transport``, ``clock``, ``sleep``, ``monotonic``)."""
    runtime_keys = ("transport", "clock", "sleep", "monotonic")
    runtime = {key: options.pop(key) for key in runtime_keys if key in options}
    return RayConnector(RayConnectorConfig.model_validate(options), **runtime)
