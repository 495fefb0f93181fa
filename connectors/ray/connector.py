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
hold                        the same, held, for a job that waits (PENDING in Ray); a
                            running one is left running: a hold keeps a job from
                            starting and stops none (a move's hold reads it back, finds
                            it running and gives the move up)
start / release             submit a held job; one that runs or waits in Ray: nothing
cancel                      stop the job for good (and forget it if held)
submit(name, nodes, hold)   a job of another Ray cluster moved here (SupportsSubmit): its
                            spec submitted as ``move_submission_id(name)``; with ``hold``
                            kept until ``release``, with ``nodes`` its driver pinned there
withdraw(name)              the job of that move stopped (or its held record dropped)
check_arrival               a moved job's confirm (SupportsArrivalCheck): accepted once
                            its entrypoint runs (or ran), rejected if it ended before
resize(replicas)            a Serve deployment (``serve:<app>/<deployment>``): Serve's
                            external scaler, ``POST /api/v1/applications/…/scale``
drain (a node)              the GCS's drain (connectors.ray.drain), reason *preemption*
                            with the operator's reason as its message; a node already
                            draining, or gone (Ray lets an idle drained node go), is left
                            as it is
undrain (a node)            refused: Ray has no undrain (a drain ends with the node gone;
                            ``ray start`` on the machine brings it back as a new node)
==========================  ===============================================================

Telemetry puts a ``SubmitSpec`` on every pending, held and running job that can move to
another Ray cluster of its federation group; connectors.ray.submission says what its
``native`` holds and which jobs cannot move.

Refused with a non-retryable :class:`ConnectorError` that says why: a requeue pinned to
nodes or away from them (Ray places a job's placement groups and actors itself; a job
can only be told where to go by its own code, so Shaper plans no moves on Ray:
app/actions/schedulers.py), resizing anything but a Serve deployment, resizing a
deployment whose application does not let an external scaler set its replicas
(``external_scaler_enabled: true`` in its Serve config), acting on a driver that was not
submitted through the Jobs API. ``suspend``, ``reserve`` and ``update_node_count`` are
not offered: Ray has none of them, and the executor refuses those steps itself.

Ray cannot stop a job whose driver waits for its entrypoint's resources (PENDING in Ray:
the stop waits on its supervisor actor, which Ray has not placed yet); so a requeue, hold
or withdraw of such a job answers "retry" after ``stop_timeout_s`` until they come free
(or until Ray's own start timeout fails the job), and a move of one is given up.

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
from pydantic import ValidationError

from connectors.arrival import not_yet, rejected
from connectors.base import ConnectorError, check_move_name
from connectors.ray import drain as gcs
from connectors.ray.client import RayDashboard, RayHttpError
from connectors.ray.config import RayConnectorConfig
from connectors.ray.gcs_jobs import entrypoint_requests
from connectors.ray.held import HeldJob, HeldJobs
from connectors.ray.submission import (
    move_submission_id,
    not_movable,
    ran,
    submission_body,
    submit_spec,
)
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
    JobState,
    NodeState,
    SchedulerKind,
    SubmitSpec,
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
        # Jobs whose telemetry carries no submit spec, and why: logged once, not each read.
        self._unmovable: dict[str, str] = {}
        # Submission id → what its entrypoint asked for (connectors.ray.gcs_jobs); a
        # submission's never changes, so each is read from the GCS once.
        self._entrypoints: dict[str, dict[str, Any]] = {}

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
        # External id → the submission it moves as, or why it cannot say.
        specs: dict[str, dict[str, Any] | str] = {}
        listed: dict[str, Submission] = {}  # those Ray lists: their specs are read below
        grouped = submissions(self.ray.list_jobs())
        for external_id, group in sorted(grouped.items()):
            latest = group[-1]
            record = held.get(external_id)
            waiting = record is not None and latest.state in TERMINAL_JOB_STATES
            if record is not None and waiting:
                # Its stopped submission's placement groups are gone: what it asks for is
                # in the metadata of the submission the connector keeps for it.
                latest = _with_metadata(latest, record.submission.get("metadata"))
                specs[external_id] = record.submission
            elif latest.state not in TERMINAL_JOB_STATES:
                listed[external_id] = latest
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
            # Ray forgot the job (a new head), or never had it (moved in held): Shaper did not.
            if external_id not in grouped:
                specs[external_id] = record.submission
                last = _with_metadata(_last_seen(record), record.submission.get("metadata"))
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
        specs.update(self._listed_specs(listed))
        # Services first: a replica's GPU is the service's whole, a job's may be a fraction.
        services = serve_reports(self._serve(), self.config, node_names=live, node_gpus=node_gpus)
        jobs = fit_to_nodes([*services, *self._with_specs(jobs, specs)], node_gpus)
        return ClusterState(observed_at=observed_at, nodes=[n.report for n in nodes], jobs=jobs)

    def _listed_specs(self, latest: dict[str, Submission]) -> dict[str, dict[str, Any] | str]:
        """By external id: the latest submission as Ray lists it, with what its entrypoint
        asked for (connectors.ray.gcs_jobs), or why that cannot be read."""
        if not self.config.gcs_address:
            why = (
                "the connector has no gcs_address, and Ray's REST answers leave out what a "
                "job's entrypoint asked for (its CPUs, GPUs, memory, resources)"
            )
            return dict.fromkeys(latest, why)
        wanted = {s.submission_id for s in latest.values()}
        self._entrypoints = {k: v for k, v in self._entrypoints.items() if k in wanted}
        unread = wanted - self._entrypoints.keys()
        why = "the GCS has no record of its submission"
        try:
            self._entrypoints.update(entrypoint_requests(self.config.gcs_address, unread))
        except ConnectorError as error:
            # Telemetry goes on without the specs it could not complete: a job that cannot
            # move for a while is better than a cluster not seen at all.
            logger.warning("submit specs of %d Ray jobs left out: %s", len(unread), error)
            why = f"its submission could not be read from the GCS ({error})"
        specs: dict[str, dict[str, Any] | str] = {}
        for external_id, submission in latest.items():
            asked = self._entrypoints.get(submission.submission_id)
            specs[external_id] = why if asked is None else {**submission.raw, **asked}
        return specs

    def _with_specs(
        self, jobs: list[JobReport], specs: dict[str, dict[str, Any] | str]
    ) -> list[JobReport]:
        """The jobs, each pending or running one with the spec it moves by when it can."""
        unmovable: dict[str, str] = {}
        reported = []
        for job in jobs:
            submission = specs.get(job.external_id)
            if submission is None or job.state not in (JobState.pending, JobState.running):
                reported.append(job)
                continue
            spec, why = _spec_of(submission, self.config)
            if spec is not None:
                reported.append(job.model_copy(update={"submit": spec}))
                continue
            if self._unmovable.get(job.external_id) != why:
                logger.info("job %s carries no submit spec (cannot move): %s", job.external_id, why)
            unmovable[job.external_id] = why
            reported.append(job)
        self._unmovable = unmovable
        return reported

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
        latest = self._latest(external_id, what="hold")
        if latest.state is JobState.running:
            # Its driver runs (maybe waiting for its placement groups): stopping it would lose
            # what it did, which a hold, unlike a requeue, is not asked to.
            logger.info("hold %s: it runs in Ray; left running", external_id)
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

    # --- SupportsSubmit (a federated move) --------------------------------------------------

    def submit(
        self,
        spec: SubmitSpec,
        *,
        name: str,
        nodes: list[str] | None = None,
        hold: bool = False,
    ) -> str:
        """SupportsSubmit: submit ``spec`` here as move ``name``; the job's id (its
        submission id, :func:`~connectors.ray.submission.move_submission_id`).

        ``hold``: kept by the connector (connectors.ray.held: Ray has no held job) and
        reported pending and held until ``release`` submits it. ``nodes``: its driver is
        pinned to those nodes (connectors.ray.submission). Idempotent by name: a job that
        Ray has, or the connector holds, under the move's submission id is returned as it
        is (not held or pinned again), and Ray refuses a duplicate submission id should
        two submits race."""
        check_move_name(name, step="submit")
        what = f"submit {name} to Ray cluster {self.cluster}"
        submission_id = move_submission_id(name)
        if self.held.get(submission_id) is not None or submission_id in submissions(
            self.ray.list_jobs()
        ):
            logger.info("%s: job %s was submitted for it before", what, submission_id)
            return submission_id
        body = submission_body(
            spec,
            name=name,
            submission_id=submission_id,
            config=self.config,
            nodes=self._node_ids(nodes, what=what) if nodes else None,
        )
        record = HeldJob(
            external_id=submission_id,
            submission=body,
            replaces=None,
            attempt=0,
            hold=True,
            last_seen={**body, "status": "PENDING"},
        )
        if hold:
            self.held.put(record)
        else:
            self._submit(record)
        logger.info(
            "%s: submitted as job %s%s%s",
            what,
            submission_id,
            f", pinned to {','.join(nodes)}" if nodes else "",
            ", held" if hold else "",
        )
        return submission_id

    def withdraw(self, name: str) -> str | None:
        """SupportsSubmit: stop the job submitted here as move ``name`` (or drop it, held);
        its id, or None when no job of that move waits or runs here — it never arrived, a
        withdraw stopped it already, or Ray failed it before its entrypoint ran. One that
        ran here and ended on its own (SUCCEEDED, or FAILED once started) is a
        non-retryable error: the move took place, and the saga must not release the
        source's copy to run a second time."""
        check_move_name(name, step="withdraw")
        what = f"withdraw {name} from Ray cluster {self.cluster}"
        submission_id = move_submission_id(name)
        record = self.held.get(submission_id)
        group = submissions(self.ray.list_jobs()).get(submission_id, [])
        live = [s for s in group if s.state not in TERMINAL_JOB_STATES]
        if record is None and not live:
            latest = group[-1] if group else None
            if latest is not None and ran(latest.raw):
                raise ConnectorError(
                    f"{what}: job {submission_id} of this move already ran here and ended "
                    f"{latest.raw.get('status')}: the move took place, so its source copy "
                    "must not run again",
                    retryable=False,
                )
            logger.info("%s: no job of that move waits or runs here", what)
            return None
        if record is not None:
            self.held.drop(submission_id)
        for submission in live:
            self._stop(submission_id, submission.submission_id)
        logger.info("%s: withdrew job %s", what, submission_id)
        return submission_id

    def check_arrival(self, external_id: str) -> str:
        """SupportsArrivalCheck: whether Ray runs the job a move submitted here.

        Ray takes any Jobs API submission and builds the job's runtime environment while it
        is PENDING, failing it there when it cannot (a package that does not install, a
        working_dir it cannot fetch, a supervisor that cannot be placed): so PENDING is not
        yet known, RUNNING is accepted, and so is an end after the entrypoint ran
        (:func:`ran`: its failure then is its own, and ``withdraw`` refuses it too); an end
        before it ran (FAILED with such an error, STOPPED) was a rejection. Ray has no queue
        that keeps a runnable job waiting for long — the move was planned where its GPUs are
        free — so waiting for the entrypoint costs seconds; one still PENDING after all of
        the confirm's polls is undone. A copy the connector holds (a running job's move,
        submitted to Ray on its release) is accepted: it is not Ray's yet."""
        what = f"job {external_id}"
        if self.held.get(external_id) is not None:
            return f"{what} is held by the connector until its release"
        group = submissions(self.ray.list_jobs()).get(external_id)
        if not group:
            raise not_yet(f"Ray does not list {what}")
        latest = group[-1].raw
        status = latest.get("status")
        seen = f"{what} is {status}"
        if latest.get("error_type"):
            seen += f" ({latest['error_type']}: {str(latest.get('message') or '')[:200]})"
        if status == "RUNNING" or ran(latest):
            return seen
        if status == "PENDING":
            raise not_yet(f"{seen}: its entrypoint has not started")
        raise rejected(f"{seen} before its entrypoint ran")

    def _node_ids(self, nodes: list[str], *, what: str) -> dict[str, str]:
        """Shaper's name → Ray's node id of each node, all of them live."""
        live = {
            n.report.name: n.node_id for n in self.read_nodes() if n.report.state is NodeState.up
        }
        unknown = [node for node in nodes if node not in live]
        if unknown:
            raise ConnectorError(
                f"{what}: Ray has no live node named {', '.join(unknown)} to pin it to",
                retryable=False,
            )
        return {node: live[node] for node in nodes}

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

    # --- draining (SupportsDrain: the ``drain`` and ``undrain`` steps) ----------------------

    def drain_node(
        self, node: str, *, reason: str = "drained by Shaper", deadline_s: float | None = None
    ) -> None:
        """Ask Ray to place nothing new on ``node`` (by Shaper's name for it); ``reason``
        is the drain's message in Ray. Idempotent: a node that drains already, or has gone
        (an idle drained node leaves at once), is left alone."""
        if not self.config.gcs_address:
            raise ConnectorError(
                f"drain node {node}: set the connector's gcs_address (the head's GCS, "
                "host:port): Ray drains nodes through its GCS only",
                retryable=False,
            )
        target = self._node(node, "drain")
        if target.report.state is not NodeState.up:
            logger.info("drain node %s: already %s", node, target.report.state.value)
            return
        gcs.drain(self.config.gcs_address, target.node_id, message=reason, deadline_s=deadline_s)

    def undrain_node(self, node: str) -> None:
        """Ray has no undrain: a node that is up is left as it is, any other refused."""
        target = self._node(node, "undrain")
        if target.report.state is NodeState.up:
            return
        raise ConnectorError(
            f"undrain node {node}: Ray has no undrain (the node is "
            f"{target.report.state.value}; a drained Ray node leaves the cluster once idle: "
            "run `ray start --address <head>` on that machine to bring it back as a new node)",
            retryable=False,
        )

    def _node(self, node: str, what: str) -> RayNode:
        target = {n.report.name: n for n in self.read_nodes()}.get(node)
        if target is None:
            raise ConnectorError(f"{what} node {node}: Ray has no such node", retryable=False)
        return target

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
        if self.config.gcs_address:
            # What Ray's REST listing leaves out (connectors.ray.gcs_jobs); without a GCS,
            # the resubmission's driver asks for nothing beyond Ray's defaults.
            asked = entrypoint_requests(self.config.gcs_address, [latest.submission_id])
            body.update(asked.get(latest.submission_id, {}))
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

    def _stop(self, external_id: str, submission_id: str | None) -> None:
        """Stop a submission and wait until Ray says it has ended. None: there is none to
        stop (a job moved in held)."""
        if submission_id is None:
            return
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


def _spec_of(
    submission: dict[str, Any] | str, config: RayConnectorConfig
) -> tuple[SubmitSpec | None, str]:
    """The spec a job moves by, or why it has none (``submission`` may be that already)."""
    if isinstance(submission, str):
        return None, submission
    why = not_movable(submission)
    if why is not None:
        return None, why
    try:
        return submit_spec(submission, config), ""
    except ValidationError as error:  # above the wire's bound
        return None, f"its spec is too large for telemetry ({error.errors()[0]['msg']})"


def _last_seen(record: HeldJob) -> Submission:
    """What the connector last saw of a held job that Ray has not (any more)."""
    if record.replaces is None:  # moved in held: its own submission, not yet made
        submission_id = str(record.submission["submission_id"])
        return Submission(record.external_id, submission_id, record.attempt, record.last_seen)
    return Submission(record.external_id, record.replaces, record.attempt - 1, record.last_seen)


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
