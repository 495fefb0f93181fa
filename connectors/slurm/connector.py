"""The Slurm connector: reads nodes and jobs, and acts on jobs through ``scontrol``/``scancel``.

Reads go to slurmrestd when ``rest_url`` is configured, else to ``squeue --json`` and
``sinfo --json``; both give the same :class:`ClusterState`. A read either returns the whole
state or raises :class:`ConnectorError` — never part of it.

Actions are idempotent where Slurm lets them be (cancelling a finished job, holding a held
job, suspending a suspended one succeed), so a retried task does no harm.

A plan's GPUs are held for its job by an advanced reservation of the job's target nodes
(see :mod:`connectors.slurm.reservations` for why whole nodes and which flags): ``reserve``
makes it, ``start`` and a pinned ``requeue`` put the job in it, ``unreserve`` (sent by the
control plane when the action it was for has ended) takes the job out and deletes it, and
``upkeep`` (run by the connector deployment every few seconds) deletes what is left:
reservations that ended or whose job has gone.

Federated moves (:mod:`connectors.slurm.submission` says what travels): pending and running
jobs that can move carry a ``SubmitSpec`` of their batch script and sbatch options, the
script read once per job and cached; ``submit`` sbatches such a spec here, idempotent by
the move's name, which the new job's comment carries — held and pinned to given nodes
when a running job moves (it waits for its checkpoint image, then a ``release``);
``withdraw`` cancels the job of that name, and ``check_arrival`` (a pending job's move
confirms its copy here) reads that one job; both judge whether it ran by
connectors.slurm.arrival's one rule.

Pins (``ReqNodeList``, set by ``requeue``, ``start`` and ``resize_job``) last one run:
each is stamped in the job's AdminComment, and a read gives a pending job requeued since
(by Slurm, a node failure, a partition's preemption) its own node list back
(:mod:`connectors.slurm.stamps` says why and how).

Nodes (an operator's drain, ``SupportsDrain``): ``drain_node`` sets the node DRAIN with the
operator's reason, ``undrain_node`` RESUMEs it (a node reported up is left alone).

Elastic training jobs (``--nodes=MIN-MAX`` or the tag ``shaper:nodes=MIN-MAX``,
:mod:`connectors.slurm.parse`): ``start`` sizes one to the nodes the plan starts it on;
``resize_job`` shrinks a running one where it runs, or restarts it held, pinned and sized
on the nodes it grows onto (``SupportsJobResize``).
"""

from __future__ import annotations

import logging
import os
import pwd
import re
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import httpx
from pydantic import ValidationError

from connectors.base import ConnectorError, check_move_name
from connectors.slurm import stamps
from connectors.slurm.arrival import (
    LISTED_FORMAT,
    QUEUED_STATES,
    ListedJob,
    check_listed,
    parse_listed,
    withdrawn,
)
from connectors.slurm.client import RunCommand, SlurmCli, SlurmRest
from connectors.slurm.config import SlurmConnectorConfig
from connectors.slurm.hostlist import expand_hostlist
from connectors.slurm.parse import SlurmJob, api_version, parse_jobs, parse_nodes
from connectors.slurm.reservations import (
    SlurmReservation,
    create_args,
    end_now_args,
    job_of,
    parse_reservations,
    reservation_name,
)
from connectors.slurm.submission import (
    TargetCluster,
    live_moved_jobs,
    moved_job,
    ran_moved_jobs,
    sbatch_request,
    submit_spec,
    submitted_id,
    withdrawn_comment,
    withdrawn_moved_jobs,
)
from connectors.slurm.versions import is_data_parser
from wire.telemetry import (
    MAX_SUBMIT_SPEC,
    TERMINAL_JOB_STATES,
    ClusterState,
    JobReport,
    JobState,
    NodeReport,
    NodeState,
    SchedulerKind,
    SubmitSpec,
)

logger = logging.getLogger(__name__)

_JOB_ID = re.compile(r"^\d+(?:_\d+)?(?:\+\d+)?$")
# Stale pins lifted in one read at most (connectors.slurm.stamps): after a mass requeue the
# rest wait for the next reads, which is no plan's loss (the reports already name their
# nodes before) and keeps each read short while slurmctld is busiest.
MAX_LIFTS_PER_READ = 50


def _already(message: str, *markers: str) -> bool:
    lowered = message.lower()
    return any(marker in lowered for marker in markers)


class SlurmConnector:
    kind = SchedulerKind.slurm

    def __init__(
        self,
        config: SlurmConnectorConfig,
        *,
        run: RunCommand = subprocess.run,
        http_transport: httpx.BaseTransport | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.cluster = config.cluster
        self._clock = clock
        self._cli = SlurmCli(config, run=run)
        # job id → the step key set_step_key handed over, until that step's requeue takes it.
        self._step_keys: dict[str, str] = {}
        # The AdminComment's stamps are read and written whole: the telemetry thread's
        # lifts and the action worker's pins and step stamps take turns (one process).
        self._stamps_lock = threading.RLock()
        # movable (pending or running) job id → its batch script (None: it has none that
        # can travel). A job's script never changes, so a job that starts keeps its entry.
        self._scripts: dict[str, str | None] = {}
        # Set once the CLI answered in a data_parser version (Slurm 23.11 and later): nodes
        # then come from `scontrol show nodes --json` (its sinfo --json prints another
        # shape) and one job from `scontrol show job ID --json` (connectors.slurm.versions).
        self._cli_data_parser = False
        self._rest = (
            SlurmRest(config, cli=self._cli, transport=http_transport, monotonic=monotonic)
            if config.rest_url
            else None
        )

    @property
    def mode(self) -> str:
        return "rest" if self._rest is not None else "cli"

    def close(self) -> None:
        if self._rest is not None:
            self._rest.close()

    def __enter__(self) -> SlurmConnector:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- reads -----------------------------------------------------------------------------

    def read_nodes(self) -> list[NodeReport]:
        mapping = self.config.mapping
        if self._rest is None:
            if self._cli_data_parser:
                return parse_nodes(self._scontrol_nodes(), mapping)
            document = self._cli.read_json(["sinfo", "--json"], what="sinfo")
            if "nodes" not in document and "sinfo" in document:
                # Slurm 23.02 and later: sinfo groups nodes by partition and state.
                self._cli_data_parser = True
                document = self._scontrol_nodes()
            return parse_nodes(document, mapping)
        nodes = self._rest.get("nodes")
        partitions = None
        if api_version(nodes, what="nodes") == "v0.0.36":
            partitions = self._rest.get("partitions")  # v0.0.36 nodes do not name them
        return parse_nodes(nodes, mapping, partitions_document=partitions)

    def _scontrol_nodes(self) -> dict[str, Any]:
        command = ["scontrol", "show", "nodes", "--json"]
        return self._cli.read_json(command, what="scontrol show nodes")

    def read_jobs(self) -> list[SlurmJob]:
        if self._rest is None:
            # Every state: Slurm 23.11 and later honour squeue's filters with --json, and its
            # default leaves out the jobs that ended, whose end the control plane must see
            # (22.05 lists every job whatever the options say).
            command = ["squeue", "--json", "--states=all"]
            document = self._cli.read_json(command, what="squeue")
            self._note_cli_version(document)
        else:
            document = self._rest.get("jobs")
        return parse_jobs(document, self.config.mapping)

    def _note_cli_version(self, document: dict[str, Any]) -> None:
        if not self._cli_data_parser:
            self._cli_data_parser = is_data_parser(api_version(document, what="squeue"))

    def read_state(self) -> ClusterState:
        observed_at = self._clock()
        nodes = self.read_nodes()
        jobs = self._lift_stale_pins(self.read_jobs())
        reports = self._with_submit_specs(jobs) if self.config.submit_specs else None
        return ClusterState(
            observed_at=observed_at,
            nodes=nodes,
            jobs=reports if reports is not None else [job.report for job in jobs],
        )

    # --- federated moves: what a movable job carries, and submitting one -----------------

    def _with_submit_specs(self, jobs: list[SlurmJob]) -> list[JobReport]:
        """The jobs' reports, those that can move (pending or running, connectors.slurm.parse
        says which) with their SubmitSpec.

        A script is read once per job (it never changes, and a job that starts or is
        requeued keeps it) and at most ``submit_scripts_per_read`` per read, pending jobs
        first (they are what a move takes most), so a queue of thousands costs a few reads'
        worth of scontrol calls once, not every read. The cache keeps only the jobs that
        can move now: one that ended, was suspended or left squeue is dropped (and read
        again should it become movable once more)."""
        movable = {job.report.external_id: job for job in jobs if job.submit_options is not None}
        for job_id in list(self._scripts):
            if job_id not in movable:
                del self._scripts[job_id]
        budget = self.config.submit_scripts_per_read
        unread = sorted(
            (job_id for job_id in movable if job_id not in self._scripts),
            key=lambda job_id: movable[job_id].report.state is not JobState.pending,
        )
        for job_id in unread[: max(budget, 0)]:
            self._read_script(job_id)
        reports = []
        for job in jobs:
            job_id = job.report.external_id
            script = self._scripts.get(job_id)
            if job.submit_options is None or script is None:
                reports.append(job.report)
                continue
            try:
                spec = submit_spec(script=script, options=job.submit_options, user=job.user)
            except ValidationError as error:  # above the wire's bound, with its options
                logger.warning("job %s carries no submit spec: %s", job_id, error)
                self._scripts[job_id] = None
                reports.append(job.report)
                continue
            reports.append(job.report.model_copy(update={"submit": spec}))
        return reports

    def _read_script(self, job_id: str) -> None:
        """Cache the job's batch script; None (never read again) when it has none, it is
        too long for the wire, or the job has gone. A transient failure leaves it unread,
        for the next read."""
        what = f"read the batch script of job {job_id}"
        try:
            script = self._cli.run(["scontrol", "write", "batch_script", job_id, "-"], what=what)
        except ConnectorError as error:
            if error.retryable:
                logger.info("%s: %s; again next read", what, error)
                return
            logger.info("%s: %s; the job reports no submit spec", what, error)
            self._scripts[job_id] = None
            return
        if len(script) > MAX_SUBMIT_SPEC:
            logger.warning(
                "%s: %d characters, more than the %d a submit spec may carry; the job "
                "cannot move to another cluster",
                what,
                len(script),
                MAX_SUBMIT_SPEC,
            )
            self._scripts[job_id] = None
            return
        self._scripts[job_id] = script

    def submit(
        self,
        spec: SubmitSpec,
        *,
        name: str,
        nodes: list[str] | None = None,
        hold: bool = False,
    ) -> str:
        """SupportsSubmit: sbatch ``spec`` here as move ``name``; the job's id.

        ``nodes``: pinned to these nodes (``--nodelist``, which wins over any node list of
        the source's: see connectors.slurm.submission); ``hold``: submitted held
        (``--hold``, Reason ``JobHeldUser``), so it waits for a ``release`` — a running
        job's move, whose checkpoint image must be staged on the node before it starts.

        Idempotent by name: the job's comment carries ``shaper-move:<name>``, and a job of
        this cluster that has it (in any state squeue still shows) is returned instead of
        submitting again — a resent step, or an sbatch whose answer was lost. It is left as
        it is: not held or pinned again (it may have been released since)."""
        check_move_name(name)
        what = f"submit {name} to {self.cluster}"
        listed = self._cli.run(["squeue", "-h", "-t", "all", "-o", "%i|%k"], what=what)
        existing = moved_job(listed, name)
        if existing is not None:
            logger.info("%s: job %s was submitted for it before", what, existing)
            return existing
        request = sbatch_request(
            spec,
            name=name,
            target=self._target(what),
            home_of=_home_of,
            nodes=nodes,
            hold=hold,
        )
        args = ["sbatch", "--parsable", *request.args]
        submitter = _effective_user()
        if request.user is None and submitter == "root":
            raise ConnectorError(
                f"{what}: the job names no user to run as, and this connector runs as root; "
                "set portable_user for jobs from another scheduler's portable form",
                retryable=False,
            )
        if request.user is not None and request.user != submitter:
            # Only root may submit as another user: Slurm says so if the connector is not.
            args.insert(2, f"--uid={request.user}")
        output = self._cli.run(args, what=what, input=request.script, clean_env=request.env)
        job_id = submitted_id(output, what=what)
        logger.info(
            "%s: submitted as job %s%s%s",
            what,
            job_id,
            f", pinned to {','.join(nodes)}" if nodes else "",
            ", held" if hold else "",
        )
        return job_id

    def withdraw(self, name: str) -> str | None:
        """SupportsSubmit: cancel the job submitted here as move ``name``; its id, or None.

        The job is found as ``submit`` finds it, by the ``shaper-move:<name>`` mark in its
        comment, but only among jobs that have not ended (squeue's ``%T``): an ended job
        stays listed for MinJobAge, and cancelling it again would change nothing. So a
        withdraw after the job ended, or one for a submit that never reached this cluster,
        cancels nothing and answers None; but before its ``scancel`` a withdraw stamps the
        job's comment (connectors.slurm.arrival.WITHDRAWN_MARK), so a resend (at-least-once
        delivery) answers with the job's id, as the first did. Two live jobs with the mark
        would be a bug elsewhere; both are cancelled (the move is undone whole) and the
        oldest's id is returned. A job of the move that already ran and ended here,
        cancelled after it ran by anyone but this withdraw too, is a non-retryable error:
        the move took place, and the saga must not release the source's copy to run a
        second time. "Ran" is the confirm's rule too (connectors.slurm.arrival.ran_here),
        so a copy the confirm rejected is withdrawn."""
        check_move_name(name, step="withdraw")
        what = f"withdraw {name} from {self.cluster}"
        listed = self._cli.run(["squeue", "-h", "-t", "all", "-o", LISTED_FORMAT], what=what)
        ran = ran_moved_jobs(listed, name)
        if ran:
            job_id, state = ran[0]
            raise ConnectorError(
                f"{what}: job {job_id} of this move already ran here and ended {state}: the "
                "move took place, so its source copy must not run again",
                retryable=False,
            )
        live = live_moved_jobs(listed, name)
        if not live:
            earlier = withdrawn_moved_jobs(listed, name)
            if earlier:
                logger.info("%s: job %s was withdrawn before", what, ",".join(earlier))
                return earlier[0]
            logger.info("%s: no job of that move waits or runs here", what)
            return None
        jobs = {job.job_id: job for job in parse_listed(listed)}
        for job_id in live:
            self._stamp_withdrawn(jobs[job_id], name, what=what)
            self.cancel(job_id)
        logger.info("%s: cancelled job %s", what, ",".join(live))
        return live[0]

    def _stamp_withdrawn(self, job: ListedJob, name: str, *, what: str) -> None:
        """Mark ``job``'s comment as cancelled by move ``name``'s withdraw, before the
        cancel (connectors.slurm.arrival). A job that ended since squeue listed it is not
        stamped: that end is not the withdraw's, and the retry judges it anew."""
        if withdrawn(job):
            return
        comment = withdrawn_comment(job.comment, name)
        try:
            self._cli.run(
                ["scontrol", "update", f"JobId={job.job_id}", f"Comment={comment}"], what=what
            )
        except ConnectorError as error:
            if not _already(str(error), "already completing or completed"):
                raise
            raise ConnectorError(
                f"{what}: job {job.job_id} ended while being withdrawn; judged again",
                retryable=True,
            ) from error

    def check_arrival(self, external_id: str) -> str:
        """SupportsArrivalCheck: whether the job a move submitted here runs here, from that
        one job's squeue line (connectors.slurm.arrival: the rule ``withdraw`` applies too),
        not from a read of the whole cluster. A job squeue no longer knows (purged
        MinJobAge after its end) is not known yet: the confirm gives up on it and the move
        is undone, which keeps the home copy.

        A copy that waits in the reservation its move made for it (a pending job's move
        holds the nodes it was planned onto: app.actions.recipes) is not known yet either:
        its GPUs are held, so it starts at once, and only once it runs are its home copy
        cancelled and the reservation given back (given back while it waited, B's own queue
        could take the nodes after all). One that never starts is given up on, and the
        move undone."""
        job_id = self._job_id(external_id)
        what = f"confirm the arrival of job {job_id}"
        try:
            listed = self._cli.run(
                ["squeue", "-h", "-t", "all", "-j", job_id, "-o", LISTED_FORMAT], what=what
            )
        except ConnectorError as error:
            if error.retryable or not _already(str(error), "invalid job id"):
                raise
            listed = ""
        found = next((job for job in parse_listed(listed) if job.job_id == job_id), None)
        seen = check_listed(found, job_id)
        if found is not None and found.state in QUEUED_STATES:
            name = reservation_name(self.config.reservation_prefix, job_id)
            reservation = self._reservations().get(name)
            if reservation is not None and reservation.state == "ACTIVE":
                raise ConnectorError(
                    f"{seen}: it has not started yet on {','.join(reservation.nodes)}, held "
                    f"for it (reservation {name})",
                    retryable=True,
                )
        return seen

    def _target(self, what: str) -> TargetCluster:
        """This cluster's partitions and its default one (``sinfo`` marks it with '*')."""
        output = self._cli.run(["sinfo", "-h", "-o", "%P"], what=what)
        names = list(dict.fromkeys(line.strip() for line in output.splitlines() if line.strip()))
        default = next((name.rstrip("*") for name in names if name.endswith("*")), None)
        return TargetCluster(
            name=self.cluster,
            partitions=tuple(name.rstrip("*") for name in names),
            default_partition=default,
            portable_workdir=str(self.config.portable_workdir),
            portable_user=self.config.portable_user,
        )

    # --- actions ---------------------------------------------------------------------------

    def _scontrol(self, *args: str, what: str, ok_if: tuple[str, ...] = ()) -> None:
        try:
            self._cli.run(["scontrol", *args], what=what)
        except ConnectorError as error:
            if ok_if and _already(str(error), *ok_if):
                logger.info("%s: already done (%s)", what, error)
                return
            raise

    @staticmethod
    def _job_id(external_id: str) -> str:
        if not _JOB_ID.match(external_id):
            raise ConnectorError(f"not a Slurm job id: {external_id!r}", retryable=False)
        return external_id

    def requeue(
        self,
        external_id: str,
        *,
        nodes: list[str] | None = None,
        exclude: list[str] | None = None,
        hold: bool = False,
    ) -> None:
        """Requeue a running job, optionally pinned to ``nodes`` / away from ``exclude``.

        ``requeuehold`` → update the node lists → ``release``, so the job cannot start
        elsewhere between the requeue and the pin. Slurm still waits ``cred_expire`` before
        it runs the job again. ``nodes=[]`` clears an earlier pin. A job that is already
        pending is only re-pinned. ``hold=True`` leaves it held (no ``release``): it runs
        again only when a plan starts it.

        With a step key (``set_step_key``) the job's AdminComment is stamped
        ``shaper-step:<key>:<restarts>`` (its restart count then) before it is requeued.
        A resend of the step that finds its stamp tells by the restart count whether the
        requeue happened: not yet → requeue; yes and the job still held → finish the pin
        and the release; yes and no longer held (released, run again since) → nothing, for
        requeueing it once more would throw that work away.
        """
        job_id = self._job_id(external_id)
        what = f"requeue job {job_id}"
        pin = nodes is not None or exclude is not None
        key = self._step_keys.pop(job_id, None)
        requeued = False
        if key is not None:
            with self._stamps_lock:  # the stamp is written from this read
                job = self._job(job_id, what=what)
                stamped_at = stamps.step_restarts(job.admin_comment, key)
                if stamped_at is not None and job.restart_count > stamped_at:
                    if not job.held:
                        logger.info("%s: done by an earlier delivery of this step", what)
                        return
                    requeued = True  # held by this step's requeuehold: finish below
                elif stamped_at is None:
                    word = f"{stamps.STEP}{key}:{job.restart_count}"
                    self._stamp_step(job_id, word, what=what, job=job)
        if not requeued:
            try:
                self._cli.run(["scontrol", "requeuehold", job_id], what=what)
            except ConnectorError as error:
                if not _already(str(error), "pending"):
                    raise
                if not pin and not hold:
                    return
                self._scontrol("hold", job_id, what=what)
        try:
            if nodes is not None:
                self._pin(job_id, nodes, what=what)
            if exclude is not None:
                self._scontrol(
                    "update", f"JobId={job_id}", f"ExcNodeList={','.join(exclude)}", what=what
                )
            if nodes:
                self._enter_reservation(job_id, nodes, what=what)
        finally:
            if not hold:
                self._scontrol("release", job_id, what=what)

    def set_step_key(self, external_id: str, step_key: str) -> None:
        """SupportsStepKey: a requeue stamps its job's AdminComment with the key."""
        if any(c.isspace() for c in step_key):
            raise ConnectorError(f"a step key with white space: {step_key!r}", retryable=False)
        self._step_keys[self._job_id(external_id)] = step_key

    def _stamp_step(
        self, job_id: str, word: str, *, what: str, job: SlurmJob | None = None
    ) -> None:
        """Write a step's stamp, the job's other stamps kept: from ``job`` when the caller
        read it holding the lock that the pins' writes take, else read again under it, so
        that no thread's stamp is lost to another's."""
        with self._stamps_lock:
            current = job or self._job(job_id, what=what)
            comment = stamps.with_stamp(current.admin_comment, stamps.STEP, word)
            self._scontrol("update", f"JobId={job_id}", f"AdminComment={comment}", what=what)

    def _pin(
        self,
        job_id: str,
        nodes: list[str],
        *more: str,
        what: str,
        job: SlurmJob | None = None,
    ) -> None:
        """Pin a pending job to ``nodes`` (``ReqNodeList``, with ``more`` fields of the same
        update) for its next run, stamped with that run's restart count, the nodes and the
        node list it had before Shaper's first pin (connectors.slurm.stamps says why);
        ``nodes=[]`` gives it that list back (none, without a stamp). ``job``: the job as
        the caller read it holding the lock, else it is read again under it."""
        with self._stamps_lock:
            job = job or self._job(job_id, what=what)
            pin = stamps.read_pin(
                job.admin_comment, moved=job.moved, required_nodes=job.required_nodes
            )
            where = ",".join(nodes)
            word: str | None = None
            if nodes:
                before = pin.before if pin is not None else job.required_nodes
                word = stamps.Pin(restarts=job.restart_count, before=before, pinned=where).word
            else:
                where = pin.before if pin is not None else ""
            comment = stamps.with_stamp(job.admin_comment, stamps.PIN, word)
            fields = [f"ReqNodeList={where}", *more]
            if comment != job.admin_comment:
                fields.append(f"AdminComment={comment}")
            self._scontrol("update", f"JobId={job_id}", *fields, what=what)

    def _lift_stale_pins(self, jobs: list[SlurmJob]) -> list[SlurmJob]:
        """Give the jobs requeued since Shaper pinned them their own node lists back, at
        most ``MAX_LIFTS_PER_READ`` a read; ``jobs`` with the reports of those lifted
        saying the list written. The jobs are read again first, under the lock the steps'
        pins and stamps take: a plan's ``start`` may have pinned one anew since (it stamps
        the run it pins for). A node list Slurm refuses (a node since removed) is cleared
        instead. A failure is logged and left for the next read: the report already names
        the nodes before, so no plan waits on the pin."""
        stale = [job.report.external_id for job in jobs if job.stale_pin is not None]
        if not stale:
            return jobs
        what = "lift Shaper's pins of jobs requeued since"
        written: dict[str, str] = {}
        with self._stamps_lock:
            try:
                current = {job.report.external_id: job for job in self.read_jobs()}
            except ConnectorError as error:
                logger.warning("%s: %s; again next read", what, error)
                return jobs
            for job_id in stale[:MAX_LIFTS_PER_READ]:
                job = current.get(job_id)
                where = self._lift(job) if job is not None and job.stale_pin else None
                if where is not None:
                    written[job_id] = where
        return [
            replace(
                job,
                report=job.report.model_copy(
                    update={"required_nodes": expand_hostlist(written[job.report.external_id])}
                ),
            )
            if job.report.external_id in written
            else job
            for job in jobs
        ]

    def _lift(self, job: SlurmJob) -> str | None:
        """Lift one stale pin; the node list written, None if none was."""
        assert job.stale_pin is not None
        job_id, pin = job.report.external_id, job.stale_pin
        what = f"lift Shaper's pin of job {job_id}, requeued since"
        comment = stamps.with_stamp(job.admin_comment, stamps.PIN, None)
        for where in dict.fromkeys([pin.before, ""]):
            try:
                self._scontrol(
                    "update",
                    f"JobId={job_id}",
                    f"ReqNodeList={where}",
                    f"AdminComment={comment}",
                    what=what,
                )
            except ConnectorError as error:
                if error.retryable or not where:
                    logger.warning("%s: %s; again next read", what, error)
                    return None
                logger.warning("%s: Slurm refuses its own node list %s (%s)", what, where, error)
                continue
            logger.info(
                "%s: it may run on %s again (pinned to %s for restart %d; now restart %d)",
                what,
                where or "any node",
                job.required_nodes,
                pin.restarts,
                job.restart_count,
            )
            return where
        return None

    def start(
        self,
        external_id: str,
        *,
        nodes: list[str] | None = None,
        replicas: int | None = None,
        gpus: dict[str, int] | None = None,
    ) -> None:
        """Start a pending or held job, pinned to ``nodes`` (in its reservation when it has
        one there); a suspended one resumes. A running job is left as it is: the confirm
        that follows says whether it runs where the plan wanted. An elastic training job
        (``replicas`` given, or a node range still reported) is sized: ``NumNodes=N-N``,
        N = ``replicas`` (else the nodes named), so that Slurm gives it what the plan did
        and not what it finds of its range. ``gpus`` (the plan's per node) is not needed:
        Slurm gives each node the job's GRES per node."""
        job_id = self._job_id(external_id)
        what = f"start job {job_id}"
        # Read once, under the lock the pins' stamps take: the pin is written from it.
        with self._stamps_lock:
            job = self._job(job_id, what=what)
            state = job.report.state
            if state is JobState.suspended:
                self.resume(job_id)
                return
            if state is JobState.running and not job.held:
                return
            # Running but held: requeued held a moment ago (a gang's move) and still shown
            # completing on its old nodes; it is pinned and released like a pending one.
            if state in TERMINAL_JOB_STATES:
                raise ConnectorError(
                    f"{what}: the job has ended ({job.slurm_state})", retryable=False
                )
            if not nodes:
                self.release(job_id)
                return
            # Held while re-pinned, so that Slurm cannot start it elsewhere in between.
            self._scontrol("hold", job_id, what=what)
            try:
                size = replicas or (len(nodes) if job.report.max_replicas else None)
                sized = [f"NumNodes={size}-{size}"] if size else []
                self._pin(job_id, nodes, *sized, what=what, job=job)
                self._enter_reservation(job_id, nodes, what=what, job=job)
            finally:
                self._scontrol("release", job_id, what=what)

    def resize_job(
        self,
        external_id: str,
        *,
        nodes: list[str],
        replicas: int,
        gpus: dict[str, int] | None = None,  # one replica per node: the nodes say it all
    ) -> None:
        """SupportsJobResize: an elastic training job to ``replicas`` nodes, ``nodes``
        among them (Slurm runs one replica per node: where a plan put more than one on a
        node, Slurm picks the other nodes itself).

        Running on more nodes, and on all of ``nodes``, it shrinks where it runs
        (``scontrol update NodeList=``: ``nodes`` and as many of its other nodes as it
        needs; Slurm ends its tasks on the rest, and the job's elastic runtime goes on with
        fewer); to grow, or onto other nodes, it is requeued held and pinned there (as
        ``requeue`` does, stamped with the step's key), sized ``NumNodes=N-N`` and
        released: it starts again there and resumes from its own checkpoint. A resend finds
        the job at that size on ``nodes`` and leaves it, or finishes a restart it finds
        held."""
        job_id = self._job_id(external_id)
        where = ",".join(nodes)
        what = f"resize job {job_id} to {replicas} node(s) {where}"
        key = self._step_keys.pop(job_id, None)
        if not nodes or len(set(nodes)) > replicas:
            raise ConnectorError(
                f"{what}: {replicas} replica(s) cannot run on {len(set(nodes))} node(s)",
                retryable=False,
            )
        job = self._job(job_id, what=what)
        state = job.report.state
        if state in TERMINAL_JOB_STATES or state is JobState.suspended:
            raise ConnectorError(f"{what}: the job is {job.slurm_state}", retryable=False)
        if state is JobState.running and set(nodes) <= set(job.nodes):
            if len(job.nodes) == replicas:
                logger.info("%s: it runs there already", what)
                return
            if len(job.nodes) > replicas:
                others = [n for n in job.nodes if n not in nodes]
                kept = [*nodes, *others[: replicas - len(nodes)]]
                self._scontrol("update", f"JobId={job_id}", f"NodeList={','.join(kept)}", what=what)
                return
        if state is JobState.running:
            if key is not None:
                self._step_keys[job_id] = key
            self.requeue(job_id, nodes=list(nodes), hold=True)
            # Held now, unless an earlier delivery restarted it and it was released since
            # (Slurm may still show it completing on its old nodes: its hold tells).
            if not self._job(job_id, what=what).held:
                return
        # Pending: held by the requeue above (or by an earlier delivery of this step).
        self._scontrol("hold", job_id, what=what)
        try:
            self._pin(job_id, list(nodes), f"NumNodes={replicas}-{replicas}", what=what)
        finally:
            self.release(job_id)

    def hold(self, external_id: str) -> None:
        job_id = self._job_id(external_id)
        self._scontrol("hold", job_id, what=f"hold job {job_id}")

    def release(self, external_id: str) -> None:
        """Let a held job run; in its reservation when Shaper holds nodes for it (a running
        job's move reserves its target node between the held submit and this release:
        Slurm starts a job on reserved nodes only when it names the reservation)."""
        job_id = self._job_id(external_id)
        what = f"release job {job_id}"
        name = reservation_name(self.config.reservation_prefix, job_id)
        reservation = self._reservations().get(name)
        if reservation is not None:
            try:
                self._scontrol("update", f"JobId={job_id}", f"ReservationName={name}", what=what)
            except ConnectorError as error:
                if error.retryable:
                    raise
                # Slurm refused it (the job runs already, say): the release still goes out.
                logger.info("%s: not put in reservation %s (%s)", what, name, error)
        self._scontrol("release", job_id, what=what)

    def suspend(self, external_id: str) -> None:
        job_id = self._job_id(external_id)
        # Idempotent as it is (a suspended job stays suspended): no stamp, and the key the
        # executor handed over for it is not kept.
        self._step_keys.pop(job_id, None)
        self._scontrol(
            "suspend", job_id, what=f"suspend job {job_id}", ok_if=("already suspended",)
        )

    def resume(self, external_id: str) -> None:
        job_id = self._job_id(external_id)
        self._scontrol("resume", job_id, what=f"resume job {job_id}", ok_if=("not suspended",))

    def cancel(self, external_id: str) -> None:
        job_id = self._job_id(external_id)
        what = f"cancel job {job_id}"
        try:
            self._cli.run(["scancel", job_id], what=what)
        except ConnectorError as error:
            if _already(str(error), "already completing or completed"):
                return
            raise

    def cancel_moved(self, external_id: str, *, key: str) -> None:
        """SupportsMovedCancel: the job's AdminComment is stamped ``shaper-step:<key>``
        before ``scancel``, so a resend tells its own cancel from someone else's."""
        job_id = self._job_id(external_id)
        what = f"cancel job {job_id}, moved to another cluster"
        try:
            job = self._job(job_id, what=what)
        except ConnectorError as error:
            if error.retryable or not _already(str(error), "has no job"):
                raise
            # Purged after MinJobAge: whoever ended it, the target's copy is the only one.
            logger.warning("%s: Slurm no longer knows the job; the move stands", what)
            return
        stamp = f"{stamps.STEP}{key}"
        if stamps.stamp(job.admin_comment, stamps.STEP) != stamp:
            state = job.slurm_state.upper()
            if state != "PENDING":
                raise ConnectorError(
                    f"{what}: it is {state} and this move did not cancel it: it was "
                    f"{'ended' if state != 'RUNNING' else 'released and started'} at "
                    "home by someone else during the move, which is undone",
                    retryable=False,
                )
            self._stamp_step(job_id, stamp, what=what, job=job)
        self.cancel(job_id)

    def update_node_count(self, external_id: str, *, nodes: int) -> None:
        if nodes < 1:
            raise ConnectorError(f"node count must be >= 1, got {nodes}", retryable=False)
        job_id = self._job_id(external_id)
        self._scontrol(
            "update",
            f"JobId={job_id}",
            f"NumNodes={nodes}-{nodes}",
            what=f"set node count of job {job_id} to {nodes}",
        )

    # --- nodes (SupportsDrain: the ``drain`` and ``undrain`` steps) ---------------------------

    def drain_node(self, node: str, *, reason: str = "drained by Shaper") -> None:
        """``scontrol update NodeName=<node> State=DRAIN Reason=<reason>``: Slurm places no
        new job there and its jobs run on. Draining a drained node again only rewrites
        its reason."""
        name = _node_name(node, "drain")
        # Slurm keeps a reason per node, one line: the operator's, or Shaper's word.
        why = " ".join((reason or "").split())[:200] or "drained by Shaper"
        self._scontrol(
            "update", f"NodeName={name}", "State=DRAIN", f"Reason={why}", what=f"drain node {name}"
        )

    def undrain_node(self, node: str) -> None:
        """``scontrol update NodeName=<node> State=RESUME``; a node Slurm reports up (not
        drained) is left as it is, for Slurm refuses to resume it."""
        name = _node_name(node, "undrain")
        report = next((n for n in self.read_nodes() if n.name == name), None)
        if report is None:
            raise ConnectorError(f"undrain node {name}: Slurm has no such node", retryable=False)
        if report.state is NodeState.up:
            logger.info("undrain node %s: it is up already", name)
            return
        self._scontrol("update", f"NodeName={name}", "State=RESUME", what=f"undrain node {name}")

    # --- reservations ----------------------------------------------------------------------

    def reserve(
        self,
        external_id: str,
        *,
        gpus: dict[str, int],
        ttl_s: float,
        counts_on: list[str] | None = None,
    ) -> None:
        """Reserve the nodes of ``gpus`` for the job (replacing its earlier reservation).

        A running job (one that will move) also keeps its own nodes reserved, so that if
        the move fails it has somewhere to come back to; all are given back when the
        plan's action ends (``unreserve``). The job enters the reservation when the plan
        puts it there: at its ``start``, or when a move requeues it. ``counts_on``: see
        ``SupportsReservation``.
        """
        job_id = self._job_id(external_id)
        what = f"reserve {','.join(sorted(gpus))} for job {job_id}"
        jobs = {job.report.external_id: job for job in self.read_jobs()}
        job = jobs.get(job_id)
        if job is None:
            raise ConnectorError(f"{what}: Slurm has no job {job_id}", retryable=False)
        if job.report.state in TERMINAL_JOB_STATES:
            raise ConnectorError(f"{what}: the job has ended ({job.slurm_state})", retryable=False)
        sizes = {node.name: node.gpu_count for node in self.read_nodes()}
        unknown = sorted(set(gpus) - set(sizes))
        if unknown:
            raise ConnectorError(f"{what}: no such nodes {unknown}", retryable=False)
        if counts_on is not None:
            _check_reservable(job_id, gpus, {*counts_on, job_id}, jobs.values(), sizes)
        nodes = sorted(set(gpus) | set(job.nodes))
        name = reservation_name(self.config.reservation_prefix, job_id)
        if name in self._reservations():
            self._leave_and_delete(job_id, name, job=job)
        user = job.user or self.config.rest_user
        self._scontrol(*create_args(name, nodes=nodes, user=user, ttl_s=ttl_s), what=what)

    def unreserve(self, external_id: str) -> None:
        """Give the job's reserved nodes back to Slurm (nothing to do if none are held).

        The job is taken out of the reservation, which is then deleted. Should Slurm keep
        the job in it (its delete answers "in use"), the reservation is ended now instead
        (a second from now, the soonest Slurm takes: see ``end_now_args``): its nodes are
        free for anyone within a second, the job runs on (FLEX),
        and the upkeep deletes what is left once the job has gone. So a give-back is
        answered at once, never "not now" for as long as the job runs: a move's last step
        is sent until answered, and would keep the move running until then."""
        job_id = self._job_id(external_id)
        name = reservation_name(self.config.reservation_prefix, job_id)
        if name in self._reservations():
            self._leave_and_delete(job_id, name, end_if_in_use=True)

    def upkeep(self) -> list[str]:
        """Delete what is left of Shaper's reservations: those whose job has gone, and those
        that have ended (their time to live ran out before the plan gave them back; the job
        leaves it first and, thanks to FLEX, keeps running; Slurm would purge such a FLEX
        reservation itself at its next periodic check, up to half a minute later, and the
        upkeep does not wait for that). A reservation in use stays
        until its plan's action ends: a move's also holds the way home. One that cannot be
        tidied now is left for the next round, the others are still tidied."""
        prefix = self.config.reservation_prefix
        ours = [r for r in self._reservations().values() if job_of(prefix, r.name)]
        if not ours:
            return []
        jobs = {job.report.external_id: job for job in self.read_jobs()}
        tidied: list[str] = []
        for reservation in ours:
            job_id = job_of(prefix, reservation.name) or ""
            job = jobs.get(job_id)
            try:
                if job is None or job.report.state in TERMINAL_JOB_STATES:
                    self._delete_reservation(reservation.name, what=f"tidy {reservation.name}")
                    tidied.append(f"deleted reservation {reservation.name}: job {job_id} has gone")
                elif reservation.state == "INACTIVE":
                    self._leave_and_delete(job_id, reservation.name, job=job)
                    tidied.append(
                        f"deleted reservation {reservation.name}: it ended before job "
                        f"{job_id}'s plan gave it back"
                    )
            except ConnectorError as error:
                logger.warning("upkeep of %s: %s; again next round", reservation.name, error)
        return tidied

    def _reservations(self) -> dict[str, SlurmReservation]:
        output = self._cli.run(
            ["scontrol", "show", "reservation", "--oneliner"], what="read reservations"
        )
        return {r.name: r for r in parse_reservations(output)}

    def _job(self, job_id: str, *, what: str) -> SlurmJob:
        """One job as Slurm has it now: through slurmrestd, its own read; through the CLI
        of Slurm 23.11 and later, ``scontrol show job ID --json``; else from the whole queue
        (Slurm 22.05's ``squeue --json`` lists every job, ignoring ``-j``, and its
        ``scontrol`` has no ``--json``; the first read of a connector that has read nothing
        yet too, which tells the CLI's version)."""
        found = self._rest_job(job_id) if self._rest is not None else self._cli_job(job_id)
        if found is not None:
            return found
        for job in self.read_jobs():
            if job.report.external_id == job_id:
                return job
        raise ConnectorError(f"{what}: Slurm has no job {job_id}", retryable=False)

    def _cli_job(self, job_id: str) -> SlurmJob | None:
        """The job from ``scontrol show job ID --json`` (Slurm 23.11 and later); None
        before the CLI's version is known, or when scontrol names no such job: the whole
        queue's read then says why."""
        if not self._cli_data_parser or not _JOB_ID.match(job_id):
            return None
        try:
            document = self._cli.read_json(
                ["scontrol", "show", "job", job_id, "--json"], what=f"scontrol show job {job_id}"
            )
        except ConnectorError as error:
            if error.retryable:
                raise
            logger.debug("scontrol's read of job %s: %s; reading the queue", job_id, error)
            return None
        return self._named(document, job_id)

    def _named(self, document: dict[str, Any], job_id: str) -> SlurmJob | None:
        """The job ``job_id`` of a one-job read's answer; None when it names none."""
        jobs = parse_jobs(document, self.config.mapping)
        return next((job for job in jobs if job.report.external_id == job_id), None)

    def _rest_job(self, job_id: str) -> SlurmJob | None:
        """The job from slurmrestd's ``GET job/{id}``: the document ``GET jobs`` gives, for
        one job (measured on the test Slurm with 503 jobs: 3.9 kB in 2-10 ms, where the
        whole queue is 3.1 MB in 140-160 ms). None when that read fails or names no such
        job (slurmrestd answers one that left the queue with a 500): the whole queue's read
        then says why."""
        if self._rest is None or not job_id.isdigit():
            return None
        try:
            document = self._rest.get(f"job/{job_id}")
        except ConnectorError as error:
            logger.debug("slurmrestd's read of job %s: %s; reading the queue", job_id, error)
            return None
        return self._named(document, job_id)

    def _enter_reservation(
        self, job_id: str, nodes: list[str], *, what: str, job: SlurmJob | None = None
    ) -> None:
        """Put a pending job in its reservation when that holds ``nodes``; a reservation
        elsewhere (a move sent home) is given back."""
        name = reservation_name(self.config.reservation_prefix, job_id)
        reservation = self._reservations().get(name)
        if reservation is None:
            logger.info("%s: no reservation holds %s for it", what, ",".join(nodes))
            return
        if not set(nodes) <= set(reservation.nodes):
            self._leave_and_delete(job_id, name, job=job)
            return
        if job is None or job.reservation != name:
            self._scontrol("update", f"JobId={job_id}", f"ReservationName={name}", what=what)

    def _leave_and_delete(
        self,
        job_id: str,
        name: str,
        *,
        job: SlurmJob | None = None,
        end_if_in_use: bool = False,
    ) -> None:
        what = f"give back reservation {name}"
        if job is None:
            job = next((j for j in self.read_jobs() if j.report.external_id == job_id), None)
        if job is not None and job.reservation == name:
            try:
                # A running job may leave its reservation; it keeps running (FLEX or not).
                self._scontrol("update", f"JobId={job_id}", "ReservationName=", what=what)
            except ConnectorError as error:
                if error.retryable:
                    raise
                logger.info("%s: job %s could not leave it (%s)", what, job_id, error)
        self._delete_reservation(name, what=what, end_if_in_use=end_if_in_use)

    def _delete_reservation(self, name: str, *, what: str, end_if_in_use: bool = False) -> None:
        """Delete the reservation; one a job still runs in is ended now instead when
        ``end_if_in_use`` (see :meth:`unreserve`), else "not now" (retryable)."""
        try:
            self._cli.run(["scontrol", "delete", "reservation", name], what=what)
        except ConnectorError as error:
            if _already(str(error), "reservation is invalid"):
                return  # gone already
            if not _already(str(error), "in use"):
                raise
            if not end_if_in_use:
                raise ConnectorError(
                    f"{what}: a job still runs in it ({error})", retryable=True
                ) from None
            try:
                self._scontrol(*end_now_args(name), what=what)
            except ConnectorError as refused:
                # Should Slurm refuse that end too (the reservation made from a host whose
                # clock is ahead, see end_now_args): "not now", retryable; a resent
                # give-back asks again, the reservation's time to live ends it.
                raise ConnectorError(
                    f"{what}: a job still runs in it ({error}); ending it now was refused "
                    f"({refused})",
                    retryable=True,
                ) from None
            logger.warning(
                "%s: Slurm kept a job in it (%s); ended it now instead, the upkeep deletes "
                "it once the job has gone",
                what,
                error,
            )


def _check_reservable(
    job_id: str,
    gpus: dict[str, int],
    leaving: set[str],
    jobs: Iterable[SlurmJob],
    sizes: dict[str, int],
) -> None:
    """The GPUs can come free for the job: jobs outside ``leaving`` leave enough."""
    for node, wanted in sorted(gpus.items()):
        others: dict[str, int] = {}
        for job in jobs:
            if job.report.external_id in leaving or job.report.state in TERMINAL_JOB_STATES:
                continue
            held = sum(
                len(a.gpu_indices) or (a.gpu_count or 0)
                for a in job.report.allocations
                if a.node == node
            )
            if held:
                others[job.report.external_id] = held
        if sizes[node] - sum(others.values()) < wanted:
            names = ", ".join(f"{j} ({g})" for j, g in sorted(others.items()))
            why = f"held by {names}" if names else f"the node has {sizes[node]}"
            raise ConnectorError(
                f"cannot hold {wanted} GPUs on {node} for {job_id}: {why}", retryable=False
            )


# One Slurm node name (no hostlist expression, nothing scontrol would read as a keyword).
_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,254}$")


def _node_name(node: str, what: str) -> str:
    if not isinstance(node, str) or not _NODE_NAME.match(node):
        raise ConnectorError(f"{what}: not a Slurm node name: {node!r}", retryable=False)
    return node


def _home_of(user: str) -> str | None:
    try:
        return pwd.getpwnam(user).pw_dir
    except KeyError:
        return None


def _effective_user() -> str:
    try:
        return pwd.getpwuid(os.geteuid()).pw_name
    except KeyError:
        return str(os.geteuid())


def create_slurm_connector(**options: Any) -> SlurmConnector:
    """Registry factory: ``registry.create(SchedulerKind.slurm, cluster=…, rest_url=…)``.

    Options are :class:`SlurmConnectorConfig` fields, plus the injectables of
    :class:`SlurmConnector` (``run``, ``http_transport``, ``clock``, ``monotonic``).
    """
    runtime_keys = ("run", "http_transport", "clock", "monotonic")
    runtime = {key: options.pop(key) for key in runtime_keys if key in options}
    return SlurmConnector(SlurmConnectorConfig.model_validate(options), **runtime)
